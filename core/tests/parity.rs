//! The parity suite on the embedded backend (see `common/parity.rs`); the
//! same bodies run on etcd in `etcd_parity.rs`.

#[path = "common/parity.rs"]
mod parity;

use dlock::{Client, ClientConfig, MemoryService};

fn client() -> Option<Client> {
    // One service per process, a link per client: like two processes on
    // one lock service.
    static SERVICE: std::sync::OnceLock<MemoryService> = std::sync::OnceLock::new();
    let service = SERVICE.get_or_init(MemoryService::new).clone();
    let config = ClientConfig::embedded_in(service).with_options(parity::options());
    Some(Client::connect(config).unwrap())
}

parity_tests!();
