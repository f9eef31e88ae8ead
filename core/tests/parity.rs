//! The parity suite on the embedded backend (see `common/parity.rs`); the
//! same bodies run on etcd in `etcd_parity.rs`.

#[path = "common/parity.rs"]
mod parity;

use dlock::{Client, ClientConfig, MemoryService, Options};

fn client() -> Option<Client> {
    // One service per process, a link per client: like two processes on
    // one lock service.
    static SERVICE: std::sync::OnceLock<MemoryService> = std::sync::OnceLock::new();
    let service = SERVICE.get_or_init(MemoryService::new).clone();
    Some(Client::connect(ClientConfig::embedded_in(service).with_options(options())).unwrap())
}

fn options() -> Options {
    let ms = std::time::Duration::from_millis;
    Options {
        ttl: ms(4000),
        keepalive_interval: ms(1000),
        keepalive_timeout: ms(500),
        retry_interval: ms(250),
        margin: ms(1000),
        reacquire: true,
    }
}

parity_tests!();
