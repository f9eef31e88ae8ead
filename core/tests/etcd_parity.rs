//! The parity suite on the etcd test cluster (see `common/parity.rs`): the
//! same bodies as `parity.rs` on the embedded backend. Run by
//! `scripts/test-etcd.sh`.

#[path = "common/etcd.rs"]
mod etcd_cluster;
#[path = "common/parity.rs"]
mod parity;

use dlock::{Client, ClientConfig, EtcdConfig, Options};

fn client() -> Option<Client> {
    let cluster = etcd_cluster::cluster()?;
    let ms = std::time::Duration::from_millis;
    let options = Options {
        ttl: ms(4000),
        keepalive_interval: ms(1000),
        keepalive_timeout: ms(500),
        retry_interval: ms(250),
        margin: ms(1000),
        reacquire: true,
    };
    Some(
        Client::connect(ClientConfig::etcd(EtcdConfig::new(cluster.members)).with_options(options))
            .unwrap(),
    )
}

parity_tests!();
