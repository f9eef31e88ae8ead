//! The parity suite on the embedded backend (see `dlock_testkit::parity`); the
//! same bodies run on etcd in `etcd_parity.rs`.

use dlock_testkit::parity;

use dlock::{Client, ClientConfig, MemoryService};

fn client() -> Client {
    // One service per process, a link per client: like two processes on
    // one lock service.
    static SERVICE: std::sync::OnceLock<MemoryService> = std::sync::OnceLock::new();
    let service = SERVICE.get_or_init(MemoryService::new).clone();
    let config = ClientConfig::embedded_in(service).with_options(parity::options());
    Client::connect(config).unwrap()
}

dlock_testkit::parity_tests!();
