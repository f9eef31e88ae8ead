//! Clients, their options, the embedded service and its fault switches.

use std::ffi::{c_char, c_uint};
use std::path::PathBuf;
use std::time::Duration;

use dlock_core::{
    BackendConfig, Client, ClientConfig, Endpoints, EtcdConfig, MemoryBackend, MemoryService,
    Options, PartialOptions,
};

use crate::{Fail, arg, boxed, ffi, key_bytes, opt_text, out, text};

/// The version of `struct lk_client_options` this header describes. A
/// library accepts every version from 1 up to its own (fields are only
/// ever added at the end), so a program built against this header keeps
/// working with later libraries.
pub const LK_CLIENT_OPTIONS_VERSION: c_uint = 2;
/// A timing field (`*_ms`) left out: the core derives it from the ones
/// given (docs/design.md §14). `LK_CLIENT_OPTIONS_INIT` and
/// `lk_client_options_init()` start every timing field so.
pub const LK_UNSET_MS: u64 = u64::MAX;
/// Default lease TTL (ms): the TTL when no timing field is given.
pub const LK_DEFAULT_TTL_MS: u64 = 15_000;
/// Default time between keepalives (ms).
pub const LK_DEFAULT_KEEPALIVE_INTERVAL_MS: u64 = 5_000;
/// Default keepalive timeout (ms).
pub const LK_DEFAULT_KEEPALIVE_TIMEOUT_MS: u64 = 2_000;
/// Default time between keepalive retries while draining (ms).
pub const LK_DEFAULT_RETRY_INTERVAL_MS: u64 = 1_000;
/// Default safety margin subtracted from every deadline (ms).
pub const LK_DEFAULT_MARGIN_MS: u64 = 1_000;
/// Default time to open a connection to one etcd member (ms).
pub const LK_DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Default time for one etcd request (ms).
pub const LK_DEFAULT_REQUEST_TIMEOUT_MS: u64 = 3_000;

/// Longest lock or election name, in bytes (the core's `MAX_NAME_LEN`):
/// a longer or empty one is `LK_INVALID_ARGUMENT`.
pub const LK_MAX_NAME_LEN: usize = 1_024;
const _: () = assert!(LK_MAX_NAME_LEN == dlock_core::MAX_NAME_LEN);
/// Longest key of a guarded write, in bytes (the core's `MAX_KEY_LEN`).
pub const LK_MAX_KEY_LEN: usize = 2_048;
const _: () = assert!(LK_MAX_KEY_LEN == dlock_core::MAX_KEY_LEN);
/// Per-lock series `lk_client_metrics_text` keeps by default (the core's
/// `DEFAULT_LOCK_SERIES`); the rest are folded into one `_other` series.
pub const LK_DEFAULT_LOCK_SERIES: usize = 100;
const _: () = assert!(LK_DEFAULT_LOCK_SERIES == dlock_core::metrics::DEFAULT_LOCK_SERIES);
/// The `max_overdue_ms` to pass to `lk_lock_healthy` when the caller has
/// no reason to choose: the core's default, the one Python and Node use.
pub const LK_DEFAULT_MAX_OVERDUE_MS: u64 = 0;
const _: () =
    assert!(LK_DEFAULT_MAX_OVERDUE_MS as u128 == dlock_core::DEFAULT_MAX_OVERDUE.as_millis());

/// Settings of a client. Start from `LK_CLIENT_OPTIONS_INIT` or
/// `lk_client_options_init()`, then change fields: the timing fields start
/// `LK_UNSET_MS` and the core derives the ones left out from the ones given
/// (with none given, the `LK_DEFAULT_*_MS`), the others start at the
/// core's defaults, and `version` lets later releases add fields.
///
/// The timing rules (checked by `lk_client_new`, `LK_INVALID_OPTION`):
/// ttl >= 2000 and > keepalive_interval + margin; 0 < keepalive_timeout <
/// keepalive_interval; retry_interval > 0; margin < ttl.
#[repr(C)]
pub struct lk_client_options {
    /// `LK_CLIENT_OPTIONS_VERSION`.
    pub version: c_uint,
    /// Lease TTL asked of the server (ms).
    pub ttl_ms: u64,
    /// Time between keepalives while holding (ms).
    pub keepalive_interval_ms: u64,
    /// How long a keepalive may take before it counts as failed (ms).
    pub keepalive_timeout_ms: u64,
    /// Time between keepalive retries while draining (ms).
    pub retry_interval_ms: u64,
    /// Subtracted from every deadline (ms).
    pub margin_ms: u64,
    /// Acquire again (new lease, higher token) after a fence.
    pub reacquire: bool,
    /// Comma-separated etcd endpoints (`host:port` or `https://host:port`),
    /// or one PostgreSQL URL (`postgresql://user@host:5432/db?...`);
    /// NULL: the embedded in-process service (`memory`).
    pub endpoints: *const c_char,
    /// CA certificate file (PEM), or NULL: turns TLS on (PostgreSQL: unless
    /// the URL's `sslmode` turns it off, which is refused).
    pub ca_file: *const c_char,
    /// etcd: client certificate file (PEM) for mutual TLS, or NULL.
    pub cert_file: *const c_char,
    /// etcd: client key file (PEM) for mutual TLS, or NULL.
    pub key_file: *const c_char,
    /// User name (PostgreSQL: instead of the URL's), or NULL.
    pub user: *const c_char,
    /// Password (PostgreSQL: instead of the URL's), or NULL.
    pub password: *const c_char,
    /// etcd: allow sending the password without TLS (loopback tests only);
    /// PostgreSQL ignores it (SCRAM never sends the password).
    pub allow_plaintext_password: bool,
    /// Time to open one connection (ms).
    pub connect_timeout_ms: u64,
    /// Time for one request (ms).
    pub request_timeout_ms: u64,
    /// Embedded backend only: the service to link to; NULL: the
    /// process-wide one (`lk_memory_named("")`).
    pub memory: *const lk_memory,
    /// Version 2. Who this client is, recorded beside each of its
    /// sessions' leases with the host, pid and process start, for
    /// `lk_lock_holder` and `dlock show` in other processes (UTF-8, at most
    /// 256 bytes, no control characters: else `LK_INVALID_OPTION`), or NULL.
    pub description: *const c_char,
    /// Version 2. The face recorded with it: NULL is "c"; `dlock.hpp`
    /// sets "cpp".
    pub face: *const c_char,
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn as_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The version-1 defaults: every timing field unset (the core derives
/// them), the core's etcd settings.
fn defaults() -> lk_client_options {
    let d = Options::default();
    let etcd = EtcdConfig::new(Vec::<String>::new());
    lk_client_options {
        version: LK_CLIENT_OPTIONS_VERSION,
        ttl_ms: LK_UNSET_MS,
        keepalive_interval_ms: LK_UNSET_MS,
        keepalive_timeout_ms: LK_UNSET_MS,
        retry_interval_ms: LK_UNSET_MS,
        margin_ms: LK_UNSET_MS,
        reacquire: d.reacquire,
        endpoints: std::ptr::null(),
        ca_file: std::ptr::null(),
        cert_file: std::ptr::null(),
        key_file: std::ptr::null(),
        user: std::ptr::null(),
        password: std::ptr::null(),
        allow_plaintext_password: etcd.allow_plaintext_password,
        connect_timeout_ms: as_ms(etcd.connect_timeout),
        request_timeout_ms: as_ms(etcd.request_timeout),
        memory: std::ptr::null(),
        description: std::ptr::null(),
        face: std::ptr::null(),
    }
}

/// The size of the options struct of each version (index = version): a
/// struct of an earlier version is a prefix of the current one.
const VERSION_SIZES: [usize; 3] = [
    0,
    std::mem::offset_of!(lk_client_options, description),
    size_of::<lk_client_options>(),
];
const _: () = assert!(VERSION_SIZES.len() == LK_CLIENT_OPTIONS_VERSION as usize + 1);

fn version_size(version: c_uint, what: &str) -> Result<usize, Fail> {
    match usize::try_from(version).ok().filter(|v| *v >= 1) {
        Some(v) if v < VERSION_SIZES.len() => Ok(VERSION_SIZES[v]),
        _ => Err(Fail::invalid(format!(
            "{what} version {version}: this library knows 1 to {LK_CLIENT_OPTIONS_VERSION}; start from LK_CLIENT_OPTIONS_INIT"
        ))),
    }
}

/// Fills `opts` with the defaults of `version` (1 up to
/// `LK_CLIENT_OPTIONS_VERSION`): only the fields that version has are
/// written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_options_init(
    opts: *mut lk_client_options,
    version: c_uint,
) -> crate::lk_status {
    ffi!({
        if opts.is_null() {
            return Err(Fail::null("opts"));
        }
        let size = version_size(version, "options")?;
        let mut d = defaults();
        d.version = version;
        // SAFETY: the caller's struct has at least the fields of `version`
        // (header rules); a prefix of the current layout.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&d as *const lk_client_options).cast::<u8>(),
                opts.cast::<u8>(),
                size,
            )
        };
        Ok(())
    })
}

/// The caller's options as the current struct: the fields of its version
/// copied over the defaults of the fields added since.
///
/// # Safety
/// `o` points to an options struct of the version it states.
unsafe fn read_options(o: *const lk_client_options) -> Result<lk_client_options, Fail> {
    // SAFETY: `version` is the first field of every version.
    let version = unsafe { (*o).version };
    let size = version_size(version, "lk_client_options")?;
    let mut full = defaults();
    // SAFETY: `size` bytes are readable (the struct of that version).
    unsafe {
        std::ptr::copy_nonoverlapping(
            o.cast::<u8>(),
            (&mut full as *mut lk_client_options).cast::<u8>(),
            size,
        )
    };
    Ok(full)
}

/// The timing fields given (`LK_UNSET_MS`: left out) and `reacquire`.
fn timing(o: &lk_client_options) -> PartialOptions {
    let given = |v: u64| (v != LK_UNSET_MS).then(|| ms(v));
    PartialOptions {
        ttl: given(o.ttl_ms),
        keepalive_interval: given(o.keepalive_interval_ms),
        keepalive_timeout: given(o.keepalive_timeout_ms),
        retry_interval: given(o.retry_interval_ms),
        margin: given(o.margin_ms),
        reacquire: Some(o.reacquire),
    }
}

/// The caller's options (any known version), or the defaults for NULL.
///
/// # Safety
/// `o` is NULL or points to an options struct of the version it states.
unsafe fn options_or_defaults(o: *const lk_client_options) -> Result<lk_client_options, Fail> {
    match o.is_null() {
        true => Ok(defaults()),
        // SAFETY: the caller's rule.
        false => unsafe { read_options(o) },
    }
}

/// Stores a new client handle in `dest`; the first client of the process
/// registers the shutdown at exit (both `lk_client_new` and
/// `lk_client_from_env`).
fn install(dest: &mut *mut lk_client, client: Client) {
    boxed(dest, lk_client { client });
    crate::at_exit::shutdown_at_exit();
}

/// The timing and `reacquire` fields of the caller's options, of any
/// known version, the ones left out derived over `base` (the client's
/// options, for `lk_session_new`).
///
/// # Safety
/// `o` points to an options struct of the version it states.
pub(crate) unsafe fn timing_of(
    o: *const lk_client_options,
    base: &Options,
) -> Result<Options, Fail> {
    // SAFETY: the caller's rule.
    Ok(timing(&unsafe { read_options(o) }?).resolve_over(base)?)
}

/// The description and face of the caller's options (a version-1
/// struct's are NULL: none, and "c"); the core checks them.
fn identity(o: &lk_client_options) -> Result<dlock_core::IdentityOptions, Fail> {
    Ok(dlock_core::IdentityOptions {
        description: unsafe { opt_text(o.description, "description") }?.map(str::to_string),
        face: unsafe { opt_text(o.face, "face") }?.unwrap_or("c").into(),
        version: env!("CARGO_PKG_VERSION").into(),
        record: true,
    })
}

fn path(p: Option<&str>) -> Option<PathBuf> {
    p.map(PathBuf::from)
}

/// A connection to a lock service with the settings its locks share.
/// Locks outlive their client: freeing the client frees only this handle.
pub struct lk_client {
    pub(crate) client: Client,
}

/// `e` with the TLS files and the credentials of `o` (each NULL: none).
unsafe fn with_tls_and_auth(o: &lk_client_options, mut e: Endpoints) -> Result<Endpoints, Fail> {
    e.ca_file = path(unsafe { opt_text(o.ca_file, "ca_file") }?);
    e.cert_file = path(unsafe { opt_text(o.cert_file, "cert_file") }?);
    e.key_file = path(unsafe { opt_text(o.key_file, "key_file") }?);
    e.user = unsafe { opt_text(o.user, "user") }?.map(str::to_string);
    e.password = unsafe { opt_text(o.password, "password") }?.map(str::to_string);
    Ok(e)
}

/// A client of what `opts->endpoints` names (one `postgres://` URL:
/// PostgreSQL; else etcd endpoints), or of the embedded service
/// (`endpoints` NULL, `opts->memory` or the process-wide one); `opts` NULL:
/// embedded with the defaults. Connecting to etcd blocks. `opts->version`
/// may be any version from 1 to `LK_CLIENT_OPTIONS_VERSION`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_new(
    opts: *const lk_client_options,
    client_out: *mut *mut lk_client,
) -> crate::lk_status {
    ffi!({
        let dest = unsafe { out(client_out, "client_out") }?;
        let o = unsafe { options_or_defaults(opts) }?;
        let backend = match unsafe { opt_text(o.endpoints, "endpoints") }? {
            None => {
                // TLS or credentials without endpoints: refused by the
                // core, as in every face (the other connection fields
                // always hold a value in C).
                let e = unsafe { with_tls_and_auth(&o, Endpoints::default()) }?;
                e.check_without_list()?;
                BackendConfig::Embedded(match unsafe { o.memory.as_ref() } {
                    Some(m) => m.service.clone(),
                    None => MemoryService::shared(),
                })
            }
            Some(endpoints) => {
                // The core decides: one PostgreSQL URL, or etcd endpoints.
                let mut e = unsafe { with_tls_and_auth(&o, Endpoints::new([endpoints])) }?;
                e.allow_plaintext_password = Some(o.allow_plaintext_password);
                e.connect_timeout = Some(ms(o.connect_timeout_ms));
                e.request_timeout = Some(ms(o.request_timeout_ms));
                e.backend()?
            }
        };
        let config = ClientConfig {
            options: timing(&o).resolve()?,
            backend,
            clock: None,
            identity: identity(&o)?,
        };
        install(dest, Client::connect(config)?);
        Ok(())
    })
}

/// What the environment variable `DLOCK_ENDPOINTS` names (PostgreSQL for a
/// `postgres://` URL, else etcd; the other `DLOCK_*` variables for TLS
/// and auth), else the process-wide
/// embedded service (whose fault switches `lk_link_*` then apply). Only the
/// timing fields of `opts` are used (NULL: defaults).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_from_env(
    opts: *const lk_client_options,
    client_out: *mut *mut lk_client,
) -> crate::lk_status {
    ffi!({
        let dest = unsafe { out(client_out, "client_out") }?;
        let o = unsafe { options_or_defaults(opts) }?;
        let mut config = ClientConfig::from_env().with_options(timing(&o).resolve()?);
        config.identity = identity(&o)?;
        install(dest, Client::connect(config)?);
        Ok(())
    })
}

/// Frees a client handle (NULL: nothing). Its locks and sessions go on;
/// once the last handle of the client is freed (the client, its sessions
/// and locks), its sessions end as with `lk_client_shutdown`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_free(client: *mut lk_client) {
    ffi!(value { unsafe { crate::free_handle(client) } })
}

/// An embedded lock service: leases, server-side expiry, tokens and fault
/// switches, in this process. Handles to one service share it.
pub struct lk_memory {
    service: MemoryService,
}

/// Stores a new handle on `service` in `*memory_out`.
unsafe fn new_memory(memory_out: *mut *mut lk_memory, service: MemoryService) -> crate::Res {
    boxed(
        unsafe { out(memory_out, "memory_out") }?,
        lk_memory { service },
    );
    Ok(())
}

/// A new, isolated embedded service.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_new(memory_out: *mut *mut lk_memory) -> crate::lk_status {
    ffi!({ unsafe { new_memory(memory_out, MemoryService::new()) } })
}

/// The process-wide embedded service called `name` (created on first use);
/// `""` is the one clients with no `memory` option use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_named(
    name: *const c_char,
    memory_out: *mut *mut lk_memory,
) -> crate::lk_status {
    ffi!({
        let name = unsafe { text(name, "name") }?;
        unsafe { new_memory(memory_out, MemoryService::named(name)) }
    })
}

/// The embedded service an embedded client is linked to (a new handle to
/// free); `LK_INVALID_ARGUMENT` for an etcd client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_memory(
    client: *const lk_client,
    memory_out: *mut *mut lk_memory,
) -> crate::lk_status {
    ffi!({
        let link = link(unsafe { arg(client, "client") }?)?;
        unsafe { new_memory(memory_out, link.service().clone()) }
    })
}

/// Frees a service handle (NULL: nothing). Clients linked to it go on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_free(memory: *mut lk_memory) {
    ffi!(value { unsafe { crate::free_handle(memory) } })
}

/// Stops (`true`) or restarts server-side expiry, as a paused leader would.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_freeze_expiry(
    memory: *const lk_memory,
    frozen: bool,
) -> crate::lk_status {
    ffi!({
        unsafe { arg(memory, "memory") }?
            .service
            .freeze_expiry(frozen);
        Ok(())
    })
}

/// `LK_NOT_HELD`: the service has no holder of `name`.
fn nobody_holds(name: &str) -> Fail {
    Fail::new(
        crate::lk_status::LK_NOT_HELD,
        format!("nobody holds `{name}`"),
    )
}

/// The token of the current holder of the lock `name`, as the service sees
/// it; `LK_NOT_HELD` if nobody holds it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_holder(
    memory: *const lk_memory,
    name: *const c_char,
    token_out: *mut u64,
) -> crate::lk_status {
    ffi!({
        let memory = unsafe { arg(memory, "memory") }?;
        let name = unsafe { text(name, "name") }?;
        let dest = unsafe { out(token_out, "token_out") }?;
        *dest = memory
            .service
            .holder(name)
            .ok_or_else(|| nobody_holds(name))?
            .get();
        Ok(())
    })
}

/// Deletes the lock key of `name` while its holder's lease lives on, as an
/// operator running `etcdctl del` would: the holder fences at once (reason
/// `LK_REASON_LOCK_LOST`). `LK_NOT_HELD` if nobody held it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_delete_lock_key(
    memory: *const lk_memory,
    name: *const c_char,
) -> crate::lk_status {
    ffi!({
        let memory = unsafe { arg(memory, "memory") }?;
        let name = unsafe { text(name, "name") }?;
        match memory.service.delete_lock_key(name) {
            true => Ok(()),
            false => Err(nobody_holds(name)),
        }
    })
}

/// Revokes `lease` on the service, as an operator running `etcdctl lease
/// revoke` would: every lock held under it fences (reason
/// `LK_REASON_LEASE_LOST`), the locks of other leases go on. `*found_out`
/// (may be NULL) says whether the lease existed. Lease ids:
/// `lk_session_lease`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_revoke_lease(
    memory: *const lk_memory,
    lease: i64,
    found_out: *mut bool,
) -> crate::lk_status {
    ffi!({
        let memory = unsafe { arg(memory, "memory") }?;
        let found = memory.service.revoke_lease(lease);
        // SAFETY: NULL or a valid out-parameter (header rules).
        if let Some(f) = unsafe { found_out.as_mut() } {
            *f = found;
        }
        Ok(())
    })
}

/// Reads `key` from the service's key-value store (what guarded writes
/// wrote). On success `*found_out` says whether the key exists and
/// `*len_out` is the value's length (0 if not found); the first
/// `min(len, cap)` bytes are copied to `buf` (NULL when `cap` is 0; call
/// with cap 0 to learn the length). `*len_out > cap`: the copy was cut short.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_memory_get(
    memory: *const lk_memory,
    key: *const u8,
    key_len: usize,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
    found_out: *mut bool,
) -> crate::lk_status {
    ffi!({
        let memory = unsafe { arg(memory, "memory") }?;
        let key = unsafe { key_bytes(key, key_len, "key") }?;
        if buf.is_null() && cap > 0 {
            return Err(Fail::null("buf"));
        }
        let len = unsafe { out(len_out, "len_out") }?;
        let found = unsafe { out(found_out, "found_out") }?;
        let value = memory.service.get(key);
        let v = value.as_deref().unwrap_or_default();
        let n = v.len().min(cap);
        if n > 0 {
            // SAFETY: `cap` writable bytes at `buf`, not overlapping `v`.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), buf, n) };
        }
        *len = v.len();
        *found = value.is_some();
        Ok(())
    })
}

fn link(client: &lk_client) -> Result<&MemoryBackend, Fail> {
    client
        .client
        .link()
        .ok_or_else(|| Fail::invalid("fault switches need a client of the embedded service"))
}

/// The body of a fault switch: `set` on `client`'s link to its embedded
/// service (`LK_INVALID_ARGUMENT` for a client of another backend).
unsafe fn switch(client: *const lk_client, set: impl FnOnce(&MemoryBackend)) -> crate::Res {
    set(link(unsafe { arg(client, "client") }?)?);
    Ok(())
}

/// Cuts this client's link to its embedded service: requests wait until
/// `lk_link_heal`, then arrive late.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_link_partition(client: *const lk_client) -> crate::lk_status {
    ffi!({ unsafe { switch(client, MemoryBackend::partition) } })
}

/// Heals a partition: held requests go through, late.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_link_heal(client: *const lk_client) -> crate::lk_status {
    ffi!({ unsafe { switch(client, MemoryBackend::heal) } })
}

/// While `on`, keepalives renew the lease on the service but their replies
/// are lost.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_link_drop_keepalive_replies(
    client: *const lk_client,
    on: bool,
) -> crate::lk_status {
    ffi!({ unsafe { switch(client, |l| l.drop_keepalive_replies(on)) } })
}

/// Keepalive replies arrive `delay_ms` late (0: on time).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_link_delay_keepalive_replies(
    client: *const lk_client,
    delay_ms: u64,
) -> crate::lk_status {
    ffi!({ unsafe { switch(client, |l| l.delay_keepalive_replies(ms(delay_ms))) } })
}

/// Keepalives fail at once with the message `error` (NULL: they work again).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_link_fail_keepalives(
    client: *const lk_client,
    error: *const c_char,
) -> crate::lk_status {
    ffi!({
        let link = link(unsafe { arg(client, "client") }?)?;
        link.fail_keepalives(unsafe { opt_text(error, "error") }?);
        Ok(())
    })
}

/// The service drops every lease this client's link was granted: the next
/// keepalive is told the lease is lost, and the lock fences at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_link_declare_lease_lost(client: *const lk_client) -> crate::lk_status {
    ffi!({ unsafe { switch(client, MemoryBackend::declare_lease_lost) } })
}

/// Blocks dlock's driver thread for `ms` without blocking the caller, as a
/// starved process would: no keepalive, no timer meanwhile. `lk_permit`
/// still refuses after the deadline (it reads the clock itself).
#[unsafe(no_mangle)]
pub extern "C" fn lk_stall_driver(ms: u64) -> crate::lk_status {
    ffi!({
        dlock_core::memory::stall_driver(self::ms(ms));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's defaults (`LK_CLIENT_OPTIONS_INIT`): timing left to the
    /// core, whose derivation from nothing is the `LK_DEFAULT_*_MS`.
    #[test]
    fn header_defaults_are_the_cores() {
        let o = defaults();
        let d = timing(&o).resolve().unwrap();
        assert_eq!(as_ms(d.ttl), LK_DEFAULT_TTL_MS);
        assert_eq!(
            as_ms(d.keepalive_interval),
            LK_DEFAULT_KEEPALIVE_INTERVAL_MS
        );
        assert_eq!(as_ms(d.keepalive_timeout), LK_DEFAULT_KEEPALIVE_TIMEOUT_MS);
        assert_eq!(as_ms(d.retry_interval), LK_DEFAULT_RETRY_INTERVAL_MS);
        assert_eq!(as_ms(d.margin), LK_DEFAULT_MARGIN_MS);
        assert_eq!(d, Options::default());
        // The case, as a C program would write it.
        let mut o = defaults();
        o.ttl_ms = 6000;
        o.keepalive_interval_ms = 2000;
        let d = timing(&o).resolve().unwrap();
        assert_eq!(
            (as_ms(d.keepalive_timeout), as_ms(d.retry_interval)),
            (800, 400)
        );
        assert_eq!(o.connect_timeout_ms, LK_DEFAULT_CONNECT_TIMEOUT_MS);
        assert_eq!(o.request_timeout_ms, LK_DEFAULT_REQUEST_TIMEOUT_MS);
        assert!(o.reacquire);
        assert!(!o.allow_plaintext_password);
    }
}
