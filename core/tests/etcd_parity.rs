//! The parity suite on the etcd test cluster (see `dlock_testkit::parity`): the
//! same bodies as `parity.rs` on the embedded backend. Run by
//! `scripts/test-etcd.sh`.

use dlock_testkit::etcd as etcd_cluster;
use dlock_testkit::parity;

use dlock::{Client, ClientConfig, EtcdConfig};

fn client() -> Client {
    let cluster = etcd_cluster::cluster();
    let config =
        ClientConfig::etcd(EtcdConfig::new(cluster.members)).with_options(parity::options());
    Client::connect(config).unwrap()
}

dlock_testkit::parity_tests!();
