//! The faces' one rule on real servers (`scripts/test-postgres.sh`): a
//! PostgreSQL URL given as endpoints, with the password beside it, connects
//! a client; [`Reader`] shows its holder as `dlock show` does; [`migrate`]
//! creates the schema or names what is missing.

use std::time::Duration;

use dlock::{BackendConfig, Client, ClientConfig, Endpoints, Error, Options, Reader, migrate};
use dlock_testkit::pg;

/// The URL without its password: the password goes beside it.
fn without_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, host) = rest.rsplit_once('@').unwrap();
    let user = auth.split_once(':').map_or(auth, |(u, _)| u);
    format!("{scheme}://{user}@{host}")
}

fn endpoints(url: &str, password: &str) -> Endpoints {
    let mut e = Endpoints::new([without_password(url)]);
    e.password = Some(password.to_string());
    e.request_timeout = Some(Duration::from_secs(3));
    e
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn endpoints_with_a_password_beside_connect_and_the_reader_shows_the_holder() {
    let s = pg::servers();
    let e = endpoints(&s.url, &s.password);
    // Without the password the server refuses: the one beside is the one used.
    let mut nopass = e.clone();
    nopass.password = None;
    let refused = Client::connect(ClientConfig {
        backend: nopass.backend().unwrap(),
        ..ClientConfig::from_env()
    });
    assert!(
        matches!(&refused, Err(Error::Backend(m)) if m.contains("PostgreSQL at")),
        "{refused:?}"
    );

    let backend = e.clone().backend().unwrap();
    assert!(matches!(backend, BackendConfig::Postgres(_)));
    let options = Options {
        ttl: Duration::from_secs(8),
        ..Options::default()
    };
    let client = Client::connect(ClientConfig {
        backend,
        ..ClientConfig::from_env().with_options(options)
    })
    .unwrap();
    let name = format!("pg/endpoints-{}", std::process::id());
    let lock = client.lock(&name).unwrap();
    let token = lock.acquire(Duration::from_secs(10)).unwrap();

    let reader = Reader::connect(e).unwrap();
    assert!(!reader.lists_waiters());
    let keys = reader.lock_keys(&format!("{name}/")).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].name, name);
    assert_eq!(keys[0].create_revision, token.get() as i64);
    assert_eq!(keys[0].key, dlock::lock_key(&name, keys[0].lease));
    let ttl = reader.lease_ttl(keys[0].lease).unwrap();
    assert_eq!(ttl.granted_s, 8);
    assert!((1..=8).contains(&ttl.left_s), "{ttl:?}");

    lock.release().unwrap();
    assert!(reader.lock_keys(&format!("{name}/")).unwrap().is_empty());
    assert_eq!(reader.lease_ttl(-1).unwrap().left_s, -1);
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn migrate_creates_the_schema_or_names_what_is_missing() {
    let s = pg::servers();
    assert_eq!(
        migrate(endpoints(&s.url, &s.password)).unwrap(),
        dlock::SCHEMA_VERSION
    );
    // Idempotent.
    assert_eq!(
        migrate(endpoints(&s.url, &s.password)).unwrap(),
        dlock::SCHEMA_VERSION
    );
    // A role without CREATE on its database: the privilege named.
    let r = migrate(Endpoints::new([format!(
        "{}?dlock_single_node=true",
        s.nocreate_url
    )]));
    assert!(
        matches!(&r, Err(Error::Backend(m)) if m.contains("CREATE on the database")),
        "{r:?}"
    );
    // A server without a synchronous standby: refused as a client is.
    let r = migrate(Endpoints::new([s.lone_url.clone()]));
    assert!(
        matches!(&r, Err(Error::Backend(m)) if m.contains("synchronous")),
        "{r:?}"
    );
    // etcd has no schema.
    let r = migrate(Endpoints::new(["127.0.0.1:2379"]));
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("PostgreSQL URL")),
        "{r:?}"
    );
}

/// The longest TTL the options allow (`MAX_TTL`, about 285 years) fits
/// PostgreSQL's `interval` and `timestamptz`: granted and kept alive as
/// given, no overflow (a TTL above it is refused by the options, before
/// anything connects).
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn the_longest_ttl_fits_postgres_interval() {
    let s = pg::servers();
    let options = Options {
        ttl: dlock::MAX_TTL,
        ..Options::default()
    };
    let backend = endpoints(&s.url, &s.password).backend().unwrap();
    let client = Client::connect(ClientConfig {
        backend: backend.clone(),
        ..ClientConfig::from_env().with_options(options)
    })
    .unwrap();
    let name = format!("pg/max-ttl-{}", std::process::id());
    let lock = client.lock(&name).unwrap();
    let token = lock.acquire(Duration::from_secs(10)).unwrap();
    let reader = Reader::connect(endpoints(&s.url, &s.password)).unwrap();
    let key = &reader.lock_keys(&format!("{name}/")).unwrap()[0];
    assert_eq!(key.create_revision, token.get() as i64);
    let ttl = reader.lease_ttl(key.lease).unwrap();
    assert_eq!(ttl.granted_s as u64, dlock::MAX_TTL.as_secs());
    assert!(ttl.left_s as u64 > dlock::MAX_TTL.as_secs() - 60, "{ttl:?}");
    lock.release().unwrap();

    let too_long = Options {
        ttl: dlock::MAX_TTL + Duration::from_secs(1),
        ..Options::default()
    };
    let r = Client::connect(ClientConfig {
        backend,
        ..ClientConfig::from_env().with_options(too_long)
    });
    assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
}

/// A database on the first schema (version 1, as an earlier dlock made
/// it: core/tests/fixtures/dlock-schema-v1.sql) with a lock held on it is
/// upgraded in place by the next client's connect: the held row keeps its
/// token, and elections (version 2) work there.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_version_1_schema_is_upgraded_in_place() {
    let s = pg::servers();
    let db = pg::ScratchDb::new(&s.url, "dlock_v1");
    let url = db.url.clone();
    let old = pg::Sql::connect(&url);
    old.batch(include_str!("fixtures/dlock-schema-v1.sql"))
        .unwrap();
    let held: i64 = old
        .query(
            "WITH l AS (INSERT INTO dlock.leases (ttl, expires_at) \
                        VALUES ('1 hour', clock_timestamp() + interval '1 hour') RETURNING id) \
             SELECT token FROM l, dlock.acquire('v1/held', 'v1/held/' || to_hex(l.id), l.id)",
            &[],
        )
        .unwrap()[0]
        .get(0);

    let client = Client::connect(ClientConfig {
        backend: Endpoints::new([url.clone()]).backend().unwrap(),
        ..ClientConfig::from_env()
    })
    .unwrap();
    let version: i32 = old
        .query("SELECT max(version) FROM dlock.schema_version", &[])
        .unwrap()[0]
        .get(0);
    assert_eq!(version, dlock::SCHEMA_VERSION);
    let token: i64 = old
        .query("SELECT token FROM dlock.locks WHERE name = 'v1/held'", &[])
        .unwrap()[0]
        .get(0);
    assert_eq!(token, held, "the held row kept its token");
    let e = client.election("v1/elected").unwrap();
    let t = e
        .campaign(b"after the upgrade", Duration::from_secs(10))
        .unwrap();
    assert!(t.get() as i64 > held);
    assert_eq!(e.leader().unwrap().unwrap().value, b"after the upgrade");
    e.resign(Duration::ZERO).unwrap();
    drop(e);
    client.shutdown();
    drop(old);
    drop(db);
}

/// A newer schema admits this library when it says it only added (its
/// `oldest_library` at or below this library's version: a rolling
/// upgrade), and is refused, naming the version needed, when it does not.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_newer_schema_is_used_only_when_it_admits_this_library() {
    let s = pg::servers();
    let db = pg::ScratchDb::new(&s.url, "dlock_v3");
    let url = db.url.clone();
    assert_eq!(
        migrate(Endpoints::new([url.clone()])).unwrap(),
        dlock::SCHEMA_VERSION
    );
    let sql = pg::Sql::connect(&url);
    let next = dlock::SCHEMA_VERSION + 1;
    sql.batch(&format!(
        "INSERT INTO dlock.schema_version (version, oldest_library) VALUES ({next}, {})",
        dlock::SCHEMA_VERSION
    ))
    .unwrap();
    let connect = || {
        Client::connect(ClientConfig {
            backend: Endpoints::new([url.clone()]).backend().unwrap(),
            ..ClientConfig::from_env()
        })
    };
    let client = connect().expect("a newer schema that admits this library");
    let lock = client.lock("v3/works").unwrap();
    lock.acquire(Duration::from_secs(10)).unwrap();
    lock.release().unwrap();
    client.shutdown();
    sql.batch(&format!(
        "UPDATE dlock.schema_version SET oldest_library = {next} WHERE version = {next}"
    ))
    .unwrap();
    match connect() {
        Err(Error::Backend(m)) => assert!(
            m.contains(&format!("needs a library of version {next}")),
            "{m}"
        ),
        other => panic!("{:?}", other.map(|_| ())),
    }
    drop(sql);
    drop(db);
}
