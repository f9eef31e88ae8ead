//! The parity suite on PostgreSQL (see `dlock_testkit::parity`): the same bodies
//! as `parity.rs` on the embedded backend and `etcd_parity.rs` on etcd. Run
//! by `scripts/test-postgres.sh`.

use dlock_testkit::parity;
use dlock_testkit::pg;

use dlock::{Client, ClientConfig, PostgresConfig};

fn client() -> Client {
    let config = PostgresConfig::parse(&pg::servers().url).unwrap();
    Client::connect(ClientConfig::postgres(config).with_options(parity::options())).unwrap()
}

dlock_testkit::parity_tests!(#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]);
