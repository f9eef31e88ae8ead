//! The parity suite on the etcd test cluster (see `common/parity.rs`): the
//! same bodies as `parity.rs` on the embedded backend. Run by
//! `scripts/test-etcd.sh`.

#[path = "common/etcd.rs"]
mod etcd_cluster;
#[path = "common/parity.rs"]
mod parity;

use dlock::{Client, ClientConfig, EtcdConfig};

fn client() -> Option<Client> {
    let cluster = etcd_cluster::cluster()?;
    let config =
        ClientConfig::etcd(EtcdConfig::new(cluster.members)).with_options(parity::options());
    Some(Client::connect(config).unwrap())
}

parity_tests!();
