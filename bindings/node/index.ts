// The Node face of dlock: `require('dlock')`. This file converts
// JavaScript to the native addon's calls (src/lib.rs) and decides nothing
// about leases, deadlines or tokens: the Rust core does. Compiled by
// `npm run build` (tsc) into index.js and index.d.ts. Guide: docs/node.md.

import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type * as N from './native';

// The addon: beside this file first (a build from the repository, or a
// package that carries it), then the platform package npm installed as an
// optional dependency (napi-rs's layout: dlock-fence-linux-x64-gnu, ...).
function loadAddon(): typeof N {
  const override = process.env.DLOCK_NODE_ADDON;
  if (override) return require(override);
  const libc =
    process.platform !== 'linux'
      ? ''
      : (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header
            ?.glibcVersionRuntime
        ? 'gnu'
        : 'musl';
  const platform = [process.platform, process.arch, libc].filter(Boolean).join('-');
  const names = [
    `dlock.${process.platform}-${process.arch}-gnu.node`,
    `dlock.${process.platform}-${process.arch}-musl.node`,
    `dlock.${process.platform}-${process.arch}.node`,
  ];
  for (const n of names) {
    const p = join(__dirname, n);
    if (existsSync(p)) return require(p);
  }
  const pkg = `dlock-fence-${platform}`;
  try {
    return require(pkg);
  } catch (e) {
    if ((e as { code?: string }).code !== 'MODULE_NOT_FOUND') throw e;
  }
  throw new Error(
    `dlock: no native addon for ${platform}: none in ${__dirname} and no package ${pkg} ` +
      '(npm skips an optional dependency built for another platform; from the repository: ' +
      '`npm install && npm run build` in bindings/node)',
  );
}

const native = loadAddon();
// A process that exits while holding lets the next holder in at once: the
// core's shutdown on the way out (the end of the script and `process.exit`;
// the addon's cleanup hook covers an embedder's teardown).
process.on('exit', () => native.shutdown());
const WORDS: string[] = native.codeWords();
const CONSTANTS = native.constants();

/** The longest lock or election name, in bytes: the core's, as in every face. */
export const MAX_NAME_LEN: number = CONSTANTS.maxNameLen;
/** The longest key of a guarded write, in bytes: the core's. */
export const MAX_KEY_LEN: number = CONSTANTS.maxKeyLen;
/** Milliseconds `lock.healthy()` allows past the deadline when given none: the core's (0), as in every face. */
export const DEFAULT_MAX_OVERDUE_MS: number = CONSTANTS.defaultMaxOverdueMs;

// ---------------------------------------------------------------- errors

/** Every error dlock throws; `code` is the core's code word. */
export class DlockError extends Error {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.code = code;
    this.name = new.target.name;
  }
}
/** `permit()`: a keepalive failed; no new work until one is confirmed. */
export class DrainingError extends DlockError {}
/** `permit()`: the deadline passed or the lease was lost; a guarded write's token no longer holds. */
export class FencedError extends DlockError {}
/** The lock was released or closed. */
export class ReleasedError extends DlockError {}
/** `permit()`: the lock is not held. */
export class NotHeldError extends DlockError {}
/** The wait for one's turn ran out. */
export class TimeoutError extends DlockError {}
/** `tryAcquire()`: another holder has the lock. */
export class WouldBlockError extends DlockError {}
/** This handle holds the lock, or an acquire of it is in progress. */
export class AlreadyHeldError extends DlockError {}
/** A setting breaks a rule (docs/design.md §14). */
export class InvalidOptionError extends DlockError {}
/** An argument is not acceptable. */
export class InvalidArgumentError extends DlockError {}
/** The lock service failed or could not be reached. */
export class BackendError extends DlockError {}
/** The driver thread is gone (the process is shutting down). */
export class ShutdownError extends DlockError {}
/** Called in a child of `fork()`. */
export class ForkedError extends DlockError {}
/** `FenceGate.admit`: a higher token was already seen. */
export class StaleError extends DlockError {
  readonly token: bigint;
  readonly highest: bigint;
  constructor(code: string, message: string, token: bigint, highest: bigint) {
    super(code, message);
    this.token = token;
    this.highest = highest;
  }
}

const ERRORS: Record<string, new (code: string, message: string) => DlockError> = {
  draining: DrainingError,
  fenced: FencedError,
  released: ReleasedError,
  not_held: NotHeldError,
  timeout: TimeoutError,
  would_block: WouldBlockError,
  already_held: AlreadyHeldError,
  invalid_option: InvalidOptionError,
  invalid_argument: InvalidArgumentError,
  backend: BackendError,
  shutdown: ShutdownError,
  forked: ForkedError,
};

function errorOf(code: string, message: string): DlockError {
  const E = ERRORS[code] ?? DlockError;
  return new E(code, message);
}

/** Calls the addon; a core error it throws becomes its typed error. */
function call<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw converted(e);
  }
}

function converted(e: unknown): unknown {
  if (e instanceof Error && typeof e.message === 'string') {
    const sep = e.message.indexOf('\u001f');
    if (sep > 0) return errorOf(e.message.slice(0, sep), e.message.slice(sep + 1));
  }
  return e;
}

function settle(o: N.Outcome): bigint | undefined {
  if (o.code === 'ok') return o.token ?? undefined;
  throw errorOf(o.code, o.message);
}

// ------------------------------------------------------------ arguments

function checkMs(name: string, v: unknown, nullable = false): number | undefined {
  if (v === undefined || (nullable && v === null)) return undefined;
  if (typeof v !== 'number') {
    throw new TypeError(`${name} must be a number of milliseconds, got ${typeof v}`);
  }
  // NaN, infinite, negative: the core's error (invalid_option for a
  // setting, invalid_argument for an argument), as in every face.
  return v;
}

function checkObject(name: string, v: unknown, keys: readonly string[]): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) {
    throw new TypeError(`${name} must be an object, got ${Array.isArray(v) ? 'array' : typeof v}`);
  }
  for (const k of Object.keys(v)) {
    if (!keys.includes(k)) {
      // The core's invalid_option, as in every face.
      call(() => native.unknownSetting(`${name}.${k}`, [...keys]));
    }
  }
  return v as Record<string, unknown>;
}

function checkString(name: string, v: unknown): string {
  if (typeof v !== 'string') throw new TypeError(`${name} must be a string, got ${typeof v}`);
  return v;
}

function checkBool(name: string, v: unknown): boolean | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'boolean') throw new TypeError(`${name} must be a boolean, got ${typeof v}`);
  return v;
}

function checkToken(name: string, v: unknown): bigint {
  if (typeof v === 'bigint') {
    if (v < 0n || v > 0xffff_ffff_ffff_ffffn) {
      throw new RangeError(`${name} must be from 0 to 2^64-1, got ${v}`);
    }
    return v;
  }
  if (typeof v === 'number') {
    if (!Number.isSafeInteger(v) || v < 0) {
      throw new RangeError(`${name} must be a non-negative safe integer or a bigint, got ${v}`);
    }
    return BigInt(v);
  }
  throw new TypeError(`${name} must be a bigint (or a safe integer), got ${typeof v}`);
}

function checkBytes(name: string, v: unknown): Buffer {
  if (typeof v === 'string') return Buffer.from(v);
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  throw new TypeError(`${name} must be a string, a Buffer or a Uint8Array, got ${typeof v}`);
}

function checkSignal(v: unknown): AbortSignal | undefined {
  if (v === undefined || v === null) return undefined;
  if (!(v instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
  return v;
}

// --------------------------------------------------------------- options

/** Timing settings in milliseconds (as `setTimeout` takes them). */
export interface TimingOptions {
  /** Lease TTL asked for (default 15000; >= 2000 and > keepaliveInterval + margin). */
  ttl?: number;
  /** Default 5000. */
  keepaliveInterval?: number;
  /** Default 2000; < keepaliveInterval. */
  keepaliveTimeout?: number;
  /** Default 1000. */
  retryInterval?: number;
  /** Safety margin subtracted from the deadline (default 1000; < ttl). */
  margin?: number;
  /** Acquire again after a fence (default true). */
  reacquire?: boolean;
}

export interface ClientOptions extends TimingOptions {
  /** etcd endpoints (`"http://127.0.0.1:2379"`, a comma-separated string or a list), or one PostgreSQL URL (`"postgresql://user@host/db"`). None: the `DLOCK_*` environment, else the embedded service. */
  endpoints?: string | string[];
  /** An embedded service of one's own (tests with fault switches). */
  service?: Service;
  caFile?: string;
  certFile?: string;
  keyFile?: string;
  user?: string;
  password?: string;
  allowPlaintextPassword?: boolean;
  /** Milliseconds. */
  connectTimeout?: number;
  /** Milliseconds. */
  requestTimeout?: number;
  /** Who this client is, recorded beside each of its sessions' leases with the host, pid and process start (at most 256 bytes, one line): `lock.holder()` and `dlock show` in other processes read it. */
  description?: string;
}

const TIMING_KEYS = [
  'ttl',
  'keepaliveInterval',
  'keepaliveTimeout',
  'retryInterval',
  'margin',
  'reacquire',
] as const;
const CLIENT_KEYS = [
  ...TIMING_KEYS,
  'endpoints',
  'service',
  'caFile',
  'certFile',
  'keyFile',
  'user',
  'password',
  'allowPlaintextPassword',
  'connectTimeout',
  'requestTimeout',
  'description',
] as const;

function timing(name: string, o: Record<string, unknown>): N.NativeOptions {
  return {
    ttl: checkMs(`${name}.ttl`, o.ttl),
    keepaliveInterval: checkMs(`${name}.keepaliveInterval`, o.keepaliveInterval),
    keepaliveTimeout: checkMs(`${name}.keepaliveTimeout`, o.keepaliveTimeout),
    retryInterval: checkMs(`${name}.retryInterval`, o.retryInterval),
    margin: checkMs(`${name}.margin`, o.margin),
    reacquire: checkBool(`${name}.reacquire`, o.reacquire),
  };
}

function optionalString(name: string, v: unknown): string | undefined {
  return v === undefined ? undefined : checkString(name, v);
}

// --------------------------------------------------------------- service

/** An embedded lock service of one's own, with the service's fault switches. */
export class Service {
  /** @internal */
  readonly _n: N.NativeService = new native.NativeService();
  /** Pauses (true) or resumes server-side lease expiry. */
  freezeExpiry(frozen = true): void {
    this._n.freezeExpiry(checkBool('frozen', frozen) ?? true);
  }
  /** The whole service down (true) or up. */
  outage(down = true): void {
    this._n.outage(checkBool('down', down) ?? true);
  }
  /** Deletes the key holding `name`, its lease living on (as `etcdctl del`); false if nobody holds it. */
  deleteLockKey(name: string): boolean {
    return this._n.deleteLockKey(checkString('name', name));
  }
  /** Revokes a lease (as `etcdctl lease revoke`); false if there is none. */
  revokeLease(lease: bigint): boolean {
    if (typeof lease !== 'bigint') throw new TypeError('lease must be a bigint');
    return call(() => this._n.revokeLease(lease));
  }
  /** The token holding `name`, if any. */
  holder(name: string): bigint | null {
    return this._n.holder(checkString('name', name)) ?? null;
  }
  /** A value of the service's key-value store (guarded writes). */
  get(key: string | Uint8Array): Buffer | null {
    return this._n.get(checkBytes('key', key)) ?? null;
  }
}

/** The embedded link of one client (every session of it): its fault switches. */
export class Link {
  /** @internal */
  constructor(private readonly _l: N.NativeLink) {}
  partition(): void {
    this._l.partition();
  }
  heal(): void {
    this._l.heal();
  }
  dropKeepaliveReplies(on = true): void {
    this._l.dropKeepaliveReplies(checkBool('on', on) ?? true);
  }
  /** Delays keepalive replies by `ms` (0 ends it). */
  delayKeepaliveReplies(ms: number): void {
    call(() => this._l.delayKeepaliveReplies(checkMs('ms', ms) ?? 0));
  }
  /** Keepalives fail at once (`on` false: they work again). */
  failKeepalives(on = true): void {
    this._l.failKeepalives(checkBool('on', on) === false ? null : 'injected failure');
  }
  declareLeaseLost(): void {
    this._l.declareLeaseLost();
  }
}

/**
 * Ends every session of every client of this process at once, bounded by
 * one keepalive timeout in total (the core's shutdown). dlock calls it by
 * itself on `process.on('exit')`; handles behave as closed afterwards.
 */
export function shutdown(): void {
  native.shutdown();
}

/** Blocks dlock's driver thread for `ms` without blocking the caller (tests of a starved keepalive). */
export function stallDriver(ms: number): void {
  call(() => native.stallDriver(checkMs('ms', ms) ?? 0));
}

// ---------------------------------------------------------------- client

export interface AcquireOptions {
  /** Milliseconds to wait for one's turn; absent: as long as it takes; 0: try once. */
  timeout?: number;
  /** Aborting it cancels the acquire (the core's cancel: nothing stays held, even if it completed meanwhile). */
  signal?: AbortSignal;
}

export interface WithLockContext {
  /** The fencing token to write with. */
  token: bigint;
  /** Aborts at the fence (reason: a `FencedError`) or when the caller's signal aborts. */
  signal: AbortSignal;
  /** The lock (permits, state). */
  lock: Lock;
}

/** A connection to a lock service; its locks share one default session. */
export class Client {
  /** @internal */
  readonly _n: N.NativeClient;
  readonly link: Link | null;

  constructor(options?: ClientOptions) {
    const o = checkObject('options', options, CLIENT_KEYS);
    const t = timing('options', o);
    let list: string[] | undefined;
    if (o.endpoints !== undefined) {
      const e = o.endpoints;
      // The core splits and decides (a PostgreSQL URL may hold commas).
      list =
        typeof e === 'string'
          ? [e]
          : Array.isArray(e)
            ? e.map((s, i) => checkString(`options.endpoints[${i}]`, s))
            : undefined;
      if (list === undefined) throw new TypeError('options.endpoints must be a string or a list of strings');
    }
    // Always passed: TLS or credentials without endpoints are the core's
    // invalid_argument, not ignored.
    const etcd: N.NativeEtcd = {
      endpoints: list,
      caFile: optionalString('options.caFile', o.caFile),
      certFile: optionalString('options.certFile', o.certFile),
      keyFile: optionalString('options.keyFile', o.keyFile),
      user: optionalString('options.user', o.user),
      password: optionalString('options.password', o.password),
      allowPlaintextPassword: checkBool('options.allowPlaintextPassword', o.allowPlaintextPassword),
      connectTimeout: checkMs('options.connectTimeout', o.connectTimeout),
      requestTimeout: checkMs('options.requestTimeout', o.requestTimeout),
    };
    let service: N.NativeService | undefined;
    if (o.service !== undefined) {
      if (!(o.service instanceof Service)) throw new TypeError('options.service must be a dlock Service');
      service = o.service._n;
    }
    const description = optionalString('options.description', o.description);
    this._n = call(() => native.NativeClient.connect(t, etcd, service, description));
    const link = this._n.link();
    this.link = link ? new Link(link) : null;
  }

  /** A handle on the lock `name` on the default session, not acquired yet. */
  lock(name: string): Lock {
    const n = checkString('name', name);
    return new Lock(call(() => this._n.lock(n)));
  }

  /** A candidate in the election `name` on the default session, not campaigning yet. */
  election(name: string): Election {
    return this.defaultSession.election(name);
  }

  /**
   * The semaphore `name` of `limit` slots on the default session (at most
   * `limit` holders at once, each on its own slot). Its first handle
   * anywhere records `limit`; another limit on the same name throws
   * `InvalidArgumentError` naming both, as do 0 and limits over
   * `MAX_SEMAPHORE_LIMIT`. Makes that one request synchronously.
   */
  semaphore(name: string, limit: number): Semaphore {
    const n = checkString('name', name);
    const l = checkLimit(limit);
    return new Semaphore(call(() => native.NativeSemaphore.ofClient(this._n, n, l)));
  }

  /**
   * The read/write lock `name` on the default session (see `RwLock`).
   * Readers that share a name need sessions (or clients) of their own:
   * two holders on one session exclude each other.
   */
  rwlock(name: string): RwLock {
    const n = checkString('name', name);
    return new RwLock(call(() => native.NativeRwLock.ofClient(this._n, n)));
  }

  /**
   * Observes the election `name` (no lease, no key of its own): an async
   * iterator of `Leader | undefined` and an EventEmitter (`'change'`).
   * Its first event is the current state. `close()` ends it.
   */
  observe(name: string): Observer {
    const n = checkString('name', name);
    return new Observer(call(() => native.NativeObserver.start(this._n, n, dispatchObserved)));
  }

  /** The default session (shared by `client.lock(...)`). */
  get defaultSession(): Session {
    return new Session(this._n.defaultSession());
  }

  /** A session of its own (its own lease), for locks that must not share the default session's fate. */
  session(options?: TimingOptions): Session {
    const o = checkObject('options', options, TIMING_KEYS);
    const t = timing('options', o);
    return new Session(call(() => this._n.session(t)));
  }

  /**
   * Ends every session of this client at once (every held lock's key
   * deleted, bounded by one keepalive timeout): what the process's exit
   * does for every client. Its locks then behave as closed.
   */
  shutdown(): void {
    this._n.shutdown();
  }

  /** The effective settings, in milliseconds. */
  get options(): Required<TimingOptions> {
    return this._n.options() as Required<TimingOptions>;
  }

  /**
   * Acquires `name`, runs `fn`, releases. `fn` gets the token and a signal
   * that aborts at the fence (before another holder can take the lock),
   * with a `FencedError` as its reason; pass it on (`fetch(url, { signal })`).
   */
  async withLock<T>(
    name: string,
    options: AcquireOptions | ((ctx: WithLockContext) => Promise<T> | T),
    fn?: (ctx: WithLockContext) => Promise<T> | T,
  ): Promise<T> {
    if (typeof options === 'function') {
      fn = options;
      options = {};
    }
    if (typeof fn !== 'function') throw new TypeError('withLock needs a function to run');
    const o = checkObject('options', options, ['timeout', 'signal']);
    const outer = checkSignal(o.signal);
    const lock = this.lock(name);
    const ac = new AbortController();
    const onFence = (token: bigint) => {
      ac.abort(new FencedError('fenced', native.fencedMessage(token)));
    };
    const onOuter = () => ac.abort(outer?.reason);
    lock.on('fence', onFence);
    outer?.addEventListener('abort', onOuter, { once: true });
    try {
      const token = await lock.acquire({ timeout: o.timeout as number | undefined, signal: outer });
      return await fn({ token, signal: ac.signal, lock });
    } finally {
      outer?.removeEventListener('abort', onOuter);
      lock.off('fence', onFence);
      await lock.close();
    }
  }
}

export interface SessionStats {
  lease: bigint | null;
  keepalivesSent: number;
  locks: number;
  /** Milliseconds. */
  lastKeepaliveRtt: number | null;
}

/** One lease and its keepalive loop; locks of a session drain and fence together. */
export class Session {
  /** @internal */
  readonly _n: N.NativeSession;
  /** @internal */
  constructor(n: N.NativeSession) {
    this._n = n;
  }
  lock(name: string): Lock {
    const n = checkString('name', name);
    return new Lock(call(() => this._n.lock(n)));
  }
  /** A candidate in the election `name` on this session, not campaigning yet. */
  election(name: string): Election {
    const n = checkString('name', name);
    return new Election(call(() => native.NativeElection.ofSession(this._n, n)));
  }
  /** The semaphore `name` of `limit` slots, its slots held on this session (see `Client.semaphore`). */
  semaphore(name: string, limit: number): Semaphore {
    const n = checkString('name', name);
    const l = checkLimit(limit);
    return new Semaphore(call(() => native.NativeSemaphore.ofSession(this._n, n, l)));
  }
  /** The read/write lock `name`, its holders held on this session (see `Client.rwlock`). */
  rwlock(name: string): RwLock {
    const n = checkString('name', name);
    return new RwLock(call(() => native.NativeRwLock.ofSession(this._n, n)));
  }
  get lease(): bigint | null {
    return this._n.lease ?? null;
  }
  get isDefault(): boolean {
    return this._n.isDefault;
  }
  stats(): SessionStats {
    const s = this._n.stats();
    return {
      lease: s.lease ?? null,
      keepalivesSent: s.keepalivesSent,
      locks: s.locks,
      lastKeepaliveRtt: s.lastKeepaliveRtt ?? null,
    };
  }
  /** Releases every lock of the session and revokes its lease. */
  async close(): Promise<void> {
    settle(await this._n.close());
  }
}

// ------------------------------------------------------------------ lock

/**
 * An acquisition (`lock.acquire`, `election.campaign`) started by
 * `start`: resolves with the token. An aborted `signal` rejects with its
 * reason and calls the core's cancel (a wait ends, a lock won meanwhile is
 * let go); an abort once the promise has settled changes nothing.
 */
async function acquisition(
  signal: AbortSignal | undefined,
  start: (handle?: N.NativeAcquisition) => Promise<N.Outcome>,
): Promise<bigint> {
  if (signal === undefined) return settle(await call(() => start()))!;
  const handle = new native.NativeAcquisition();
  return (await cancellable(signal, handle, call(() => start(handle))))!;
}

/**
 * `pending` (an acquisition's outcome) settled; an aborted `signal`
 * rejects with its reason and calls `handle.cancel()`, the core's cancel.
 */
async function cancellable(
  signal: AbortSignal | undefined,
  handle: { cancel(): void },
  pending: Promise<N.Outcome>,
): Promise<bigint | undefined> {
  if (signal === undefined) return settle(await pending);
  return new Promise<bigint | undefined>((resolve, reject) => {
    const onAbort = () => {
      reject(signal.reason);
      // The core's cancel: a wait ends, a lock won meanwhile is let go.
      handle.cancel();
    };
    signal.addEventListener('abort', onAbort, { once: true });
    pending.then(
      (outcome) => {
        signal.removeEventListener('abort', onAbort);
        if (signal.aborted) return;
        try {
          resolve(settle(outcome));
        } catch (e) {
          reject(e);
        }
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

export type State = 'Idle' | 'Acquiring' | 'Holding' | 'Draining' | 'Fenced' | 'Reacquiring' | 'Released';

export interface StateChange {
  from: State;
  to: State;
  /** `keepalive_timeout`, `deadline`, `lease_lost`, `lock_lost`, `resumed`, ... */
  reason: string;
}

export interface LockStats {
  acquisitions: number;
  drains: number;
  resumes: number;
  fencesDeadline: number;
  fencesLeaseLost: number;
  fencesLockLost: number;
  /** Milliseconds. */
  lastKeepaliveRtt: number | null;
  /** Deadline - now while holding or draining, in milliseconds. */
  slack: number | null;
  inFlight: number;
}

/** One event of a lock, as `lock.events()` gives it. */
export type LockEvent =
  | { kind: 'state'; from: State; to: State; reason: string }
  | { kind: 'fence'; token: bigint; inFlight: number }
  | { kind: 'acquired'; token: bigint }
  | { kind: 'drained' };

export interface LockEvents {
  fence: [token: bigint, inFlight: number];
  stateChange: [change: StateChange];
  acquired: [token: bigint];
  drained: [];
  error: [error: unknown];
}

const KINDS = new Set(['fence', 'stateChange', 'acquired', 'drained']);

/** Locks with listeners, by the id their events carry. */
const listening = new Map<number, WeakRef<Lock>>();
const forget = new FinalizationRegistry<number>((id) => listening.delete(id));

/** Every lock's events, on the JavaScript thread, in the core's order. */
/**
 * Calls every listener of `event` on `emitter` (a lock's or an
 * observer's): a throwing one goes to 'error' (or a warning) and the
 * others still run.
 */
function callListeners(emitter: EventEmitter, event: string | symbol, args: unknown[]): void {
  for (const f of emitter.rawListeners(event) as ((...a: unknown[]) => unknown)[]) {
    try {
      f.apply(emitter, args);
    } catch (err) {
      if (emitter.listenerCount('error') > 0) {
        try {
          emitter.emit('error', err);
        } catch (again) {
          process.emitWarning(again instanceof Error ? again : String(again));
        }
      } else {
        process.emitWarning(err instanceof Error ? err : String(err));
      }
    }
  }
}

function dispatch(e: N.NativeEvent): void {
  const lock = listening.get(e.lock)?.deref();
  if (lock === undefined) return;
  try {
    switch (e.kind) {
      case 'state':
        lock._deliver('stateChange', [{ from: e.from as State, to: e.to as State, reason: e.reason ?? '' }]);
        break;
      case 'fence':
        lock._deliver('fence', [e.token!, e.inFlight ?? 0]);
        break;
      case 'acquired':
        lock._deliver('acquired', [e.token!]);
        break;
      case 'drained':
        lock._deliver('drained', []);
        break;
      case 'closed':
        lock._closed();
        break;
    }
  } catch (err) {
    process.emitWarning(err instanceof Error ? err : String(err));
  }
}
call(() => native.setEventSink(dispatch));

/**
 * One named lock. Events (`fence`, `stateChange`, `acquired`, `drained`)
 * come from the core's callback thread, in order; a listener that throws
 * is reported through `'error'` (if there is an `'error'` listener) or
 * `process.emitWarning`, and changes nothing.
 */
export class Lock extends EventEmitter<LockEvents> {
  /** @internal */
  readonly _n: N.NativeLock;
  /** @internal The open `events()` streams. */
  readonly _streams = new Set<EventQueue>();

  /** @internal */
  constructor(n: N.NativeLock) {
    super({ captureRejections: false });
    this._n = n;
    (this as EventEmitter).on('newListener', (event: string | symbol) => {
      if (typeof event === 'string' && KINDS.has(event)) this._listen();
    });
  }

  /** @internal Turns the lock's events on (once). */
  _listen(): void {
    if (!listening.has(this._n.id)) {
      listening.set(this._n.id, new WeakRef(this));
      forget.register(this, this._n.id);
      call(() => this._n.listen());
    }
  }

  /** @internal The lock was closed: every event is delivered, the streams end. */
  _closed(): void {
    for (const q of this._streams) q.end();
    this._streams.clear();
  }

  /**
   * The lock's events from now on, pulled: `for await (const e of
   * lock.events())`, in the order the listeners get them. The stream ends
   * when the lock is closed; events wait in it until read.
   */
  events(): AsyncIterableIterator<LockEvent> {
    const q = new EventQueue(() => this._streams.delete(q));
    if (this._n.closed) q.end();
    else {
      this._listen();
      this._streams.add(q);
    }
    return q;
  }

  /** @internal Calls every listener of `event`; a throwing one changes nothing. */
  _deliver<K extends keyof LockEvents>(event: K, args: LockEvents[K]): void {
    if (this._streams.size > 0) {
      const e = toEvent(event, args);
      if (e) for (const q of this._streams) q.push(e);
    }
    callListeners(this, event, args);
    // `once` listeners remove themselves when called through rawListeners.
  }

  get name(): string {
    return this._n.name;
  }
  /** The semaphore slot this lock is (`semaphore.acquire()`'s lock), else null. */
  get slot(): number | null {
    return this._n.slot ?? null;
  }
  /** `'read'` or `'write'` for a read/write lock's holder, else null (a plain lock). */
  get mode(): 'read' | 'write' | null {
    return this._n.mode ?? null;
  }
  get session(): Session {
    return new Session(this._n.session());
  }

  /** Who holds the lock now, read from the service (any process); `undefined` when nothing holds it. */
  async holder(): Promise<Holder | undefined> {
    const o = await this._n.holder();
    if (o.code !== 'ok') throw errorOf(o.code, o.message);
    if (!o.holder) return undefined;
    const h = o.holder;
    const i = h.identity;
    return {
      key: h.key,
      token: h.token,
      lease: h.lease,
      identity: i
        ? {
            host: i.host,
            pid: i.pid,
            started: i.started ?? null,
            face: i.face,
            version: i.version,
            description: i.description ?? null,
          }
        : null,
    };
  }
  get state(): State {
    return this._n.state as State;
  }
  /** The token held, while Holding or Draining. */
  get token(): bigint | null {
    return this._n.token ?? null;
  }
  /** Milliseconds before the deadline, while Holding or Draining. */
  get timeLeft(): number | null {
    return this._n.timeLeft ?? null;
  }
  get inFlight(): number {
    return this._n.inFlight;
  }
  get closed(): boolean {
    return this._n.closed;
  }
  /**
   * Readiness (client-go's leader-election `Check`): false once the lock is
   * still Holding or Draining more than `maxOverdueMs` past its deadline,
   * i.e. the fence that was due did not happen. Not held: true.
   */
  healthy(maxOverdueMs = DEFAULT_MAX_OVERDUE_MS): boolean {
    const m = checkMs('maxOverdueMs', maxOverdueMs) ?? DEFAULT_MAX_OVERDUE_MS;
    return call(() => native.lockHealthy(this._n, m));
  }
  stats(): LockStats {
    const s = this._n.stats();
    return {
      acquisitions: s.acquisitions,
      drains: s.drains,
      resumes: s.resumes,
      fencesDeadline: s.fencesDeadline,
      fencesLeaseLost: s.fencesLeaseLost,
      fencesLockLost: s.fencesLockLost,
      lastKeepaliveRtt: s.lastKeepaliveRtt ?? null,
      slack: s.slack ?? null,
      inFlight: s.inFlight,
    };
  }

  /**
   * Acquires the lock; resolves with the fencing token. An aborted
   * `signal` rejects with its reason and cancels the acquisition (the
   * core's cancel), so no lock is left behind; an abort once the promise
   * has settled changes nothing.
   */
  async acquire(options?: AcquireOptions): Promise<bigint> {
    const o = checkObject('options', options, ['timeout', 'signal']);
    const timeout = checkMs('options.timeout', o.timeout, true);
    const signal = checkSignal(o.signal);
    signal?.throwIfAborted();
    return acquisition(signal, (handle) => this._n.acquire(timeout ?? null, handle));
  }

  /** Acquires if nobody holds the lock, else rejects with `WouldBlockError`. */
  async tryAcquire(): Promise<bigint> {
    return settle(await this._n.tryAcquire())!;
  }

  /** Releases (deletes the lock key); every permit is invalid from now on. */
  async release(): Promise<void> {
    settle(await this._n.release());
  }

  /**
   * A held writer becomes a reader, keeping its key and token; queued
   * readers hold. A reader's does nothing; a plain lock's rejects with
   * `InvalidArgumentError`, a writer not held with `NotHeldError`.
   */
  async downgrade(): Promise<void> {
    settle(await this._n.downgrade());
  }

  /**
   * Always throws `InvalidArgumentError` (two upgrading readers would wait
   * for each other): release the reader and acquire a writer instead.
   */
  upgrade(): void {
    call(() => this._n.upgrade());
  }

  /** Releases and ends the lock's events; closing twice is harmless. */
  async close(): Promise<void> {
    // Events decided before the close are still delivered; the core sends
    // none after it.
    settle(await this._n.close());
  }

  /**
   * Permission to start one unit of work, granted only while Holding and
   * before the deadline (the core reads the clock). Throws a
   * `DrainingError`, `FencedError`, `ReleasedError` or `NotHeldError`.
   * End it (`end()`, or `using`).
   */
  permit(): Permit {
    const slot = this._n.permit();
    if (slot < 0) {
      const word = WORDS[-slot] ?? 'panic';
      throw errorOf(word, this._n.refusal());
    }
    return new Permit(this._n, slot);
  }

  /** Puts `key` = `value` only while `token` holds the lock, decided by the service. */
  async guardedPut(token: bigint | number, key: string | Uint8Array, value: string | Uint8Array): Promise<void> {
    const t = checkToken('token', token);
    const k = checkBytes('key', key);
    const v = checkBytes('value', value);
    settle(await call(() => this._n.guardedPut(t, k, v)));
  }

  /** Deletes `key` only while `token` holds the lock. */
  async guardedDelete(token: bigint | number, key: string | Uint8Array): Promise<void> {
    const t = checkToken('token', token);
    const k = checkBytes('key', key);
    settle(await call(() => this._n.guardedDelete(t, k)));
  }
}

// ------------------------------------------------------------- semaphore

/** The most slots a semaphore may have: the core's, as in every face. */
export const MAX_SEMAPHORE_LIMIT: number = CONSTANTS.maxSemaphoreLimit;

function checkLimit(v: unknown): number {
  // Not a whole number, or out of range: the core's invalid_argument.
  if (typeof v !== 'number') throw new TypeError(`limit must be a number, got ${typeof v}`);
  return v;
}

/**
 * A counting semaphore (docs/design.md §26): at most `limit` holders at
 * once, each holding one slot, an ordinary lock named `<name>/slot/<i>`
 * with tokens of its own (a resource fences per slot: `FenceGate` and
 * guarded writes take the slot's name and token). Made by
 * `client.semaphore(name, limit)` or `session.semaphore(name, limit)`;
 * holds nothing itself. The core decides everything: the slot, the wait,
 * the cancel.
 */
export class Semaphore {
  /** @internal */
  readonly _n: N.NativeSemaphore;
  /** @internal */
  constructor(n: N.NativeSemaphore) {
    this._n = n;
  }
  get name(): string {
    return this._n.name;
  }
  /** How many holders it admits at once. */
  get limit(): number {
    return this._n.limit;
  }

  /**
   * Takes a slot, waiting up to `timeout` ms for one to be free (absent:
   * as long as it takes; 0: one try); resolves with its `Lock`, held
   * (`lock.slot`, `lock.name`, `permit()`, `release()`: the whole lock
   * API). Rejects with `TimeoutError` (nothing held). An aborted `signal`
   * rejects with its reason and cancels the acquire in the core: nothing
   * stays held, even a slot won just then.
   */
  async acquire(options?: AcquireOptions): Promise<Lock> {
    const o = checkObject('options', options, ['timeout', 'signal']);
    const timeout = checkMs('options.timeout', o.timeout, true);
    const signal = checkSignal(o.signal);
    signal?.throwIfAborted();
    const handle = new native.NativeSemaphoreAcquisition();
    await cancellable(signal, handle, call(() => this._n.acquire(timeout ?? null, handle)));
    return new Lock(handle.take()!);
  }

  /** Takes a free slot (its `Lock`, held), else rejects with `WouldBlockError`. */
  async tryAcquire(): Promise<Lock> {
    const handle = new native.NativeSemaphoreAcquisition();
    settle(await call(() => this._n.tryAcquire(handle)));
    return new Lock(handle.take()!);
  }
}

// ---------------------------------------------------------- read/write

/**
 * Many readers or one writer on a name (docs/design.md §27); made by
 * `client.rwlock(name)` or `session.rwlock(name)`, holds nothing itself.
 * `reader()` and `writer()` are ordinary `Lock`s, not acquired yet, with
 * `mode` `'read'` or `'write'`: acquire, permits, fencing and events are
 * a lock's. A resource fences them with `FenceGate.admitRead` /
 * `admitWrite`.
 */
export class RwLock {
  /** @internal */
  readonly _n: N.NativeRwLock;
  /** @internal */
  constructor(n: N.NativeRwLock) {
    this._n = n;
  }
  get name(): string {
    return this._n.name;
  }
  /** A reader: holds together with other readers, never with a writer. */
  reader(): Lock {
    return new Lock(call(() => this._n.reader()));
  }
  /** A writer: holds alone. */
  writer(): Lock {
    return new Lock(call(() => this._n.writer()));
  }
}

function toEvent(event: keyof LockEvents, args: unknown[]): LockEvent | undefined {
  switch (event) {
    case 'stateChange': {
      const c = args[0] as StateChange;
      return { kind: 'state', from: c.from, to: c.to, reason: c.reason };
    }
    case 'fence':
      return { kind: 'fence', token: args[0] as bigint, inFlight: args[1] as number };
    case 'acquired':
      return { kind: 'acquired', token: args[0] as bigint };
    case 'drained':
      return { kind: 'drained' };
    default:
      return undefined;
  }
}

/** The queue behind one `lock.events()`. */
class EventQueue implements AsyncIterableIterator<LockEvent> {
  private readonly items: LockEvent[] = [];
  private readonly waiting: ((r: IteratorResult<LockEvent>) => void)[] = [];
  private ended = false;

  constructor(private readonly onReturn: () => void) {}

  push(e: LockEvent): void {
    const w = this.waiting.shift();
    if (w) w({ value: e, done: false });
    else this.items.push(e);
  }

  end(): void {
    this.ended = true;
    for (const w of this.waiting.splice(0)) w({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<LockEvent>> {
    const e = this.items.shift();
    if (e !== undefined) return Promise.resolve({ value: e, done: false });
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  return(): Promise<IteratorResult<LockEvent>> {
    this.items.length = 0;
    this.end();
    this.onReturn();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<LockEvent> {
    return this;
  }
}

/** One unit of work, counted in flight until ended. */
export class Permit implements Disposable {
  private _token: bigint | undefined;
  private _ended = false;

  /** @internal */
  constructor(
    private readonly _n: N.NativeLock,
    private readonly _slot: number,
  ) {}

  /** The token to send with every write of this unit of work. */
  get token(): bigint {
    if (this._token === undefined) {
      if (this._ended) throw new ReleasedError('released', 'the permit has ended; read its token before end()');
      this._token = this._n.permitToken(this._slot);
    }
    return this._token;
  }

  /** Whether the work may still commit: the token still holds and the deadline has not passed. */
  valid(): boolean {
    return !this._ended && this._n.permitValid(this._slot);
  }

  /** Milliseconds left while the token still holds, else 0. */
  get remaining(): number {
    return this._ended ? 0 : this._n.permitRemaining(this._slot);
  }

  /** Ends the unit of work; ending twice is harmless. */
  end(): void {
    if (!this._ended) {
      this._ended = true;
      this._n.permitEnd(this._slot);
    }
  }

  [Symbol.dispose](): void {
    this.end();
  }
}


// -------------------------------------------------------------- elections

/** The leader of an election as the service sees it. */
export interface Leader {
  /** The leader's key, `<name>/<lease hex>` (etcd's election key). */
  key: string;
  /** The value it campaigned with or last proclaimed (bytes; `String(value)` decodes UTF-8). */
  value: Buffer;
  /** The key's create revision: the leader's fencing token, unchanged by a proclaim. */
  token: bigint;
  /** The lease the key is held under. */
  lease: bigint;
}

/** Who holds a lease, as its session recorded it (never an environment or a command line). */
export interface Identity {
  host: string;
  pid: number;
  /** When the process started, Unix seconds (null where unknown). */
  started: number | null;
  /** The face that made the client: `'node'`, `'python'`, `'rust'`, `'c'`, `'cpp'`, `'cli'`. */
  face: string;
  version: string;
  description: string | null;
}

/** A lock's holder as the service sees it (`lock.holder()`). */
export interface Holder {
  /** The holder's key, `<name>/<lease hex>`. */
  key: string;
  /** Its fencing token. */
  token: bigint;
  /** The lease it is held under. */
  lease: bigint;
  /** Who holds that lease; null for a holder that records none (`etcdctl lock`). */
  identity: Identity | null;
}

export interface ResignOptions {
  /** Milliseconds to wait for the permits in flight before the key is deleted (default `RESIGN_GRACE_MS`, 5000, as in every face). */
  grace?: number;
}

/** The grace of a resign that names none, in ms: the core's, the same in every face. */
export const RESIGN_GRACE_MS: number = native.resignGraceMs();

/** The longest value a candidate may carry, in bytes (1 MiB, on every engine): with the longest name a campaign still fits etcd's request limit. */
export const MAX_VALUE_LEN: number = native.maxValueLen();

function leaderOf(l: N.NativeLeader): Leader {
  return { key: l.key, value: l.value, token: l.token, lease: l.lease };
}

/**
 * A candidate in one election: a `Lock` (permits, events, `onFence`,
 * stats, close) that carries a value. Drain = stop starting leader work;
 * fence = stopped leading, before the service can elect anyone else; with
 * `reacquire` (the default) a fenced leader campaigns again with its last
 * value. Values are bytes: a string is encoded as UTF-8.
 */
export class Election extends Lock {
  /** @internal */
  readonly _e: N.NativeElection;

  /** @internal */
  constructor(e: N.NativeElection) {
    super(e.lock());
    this._e = e;
  }

  /**
   * Campaigns with `value` and resolves with the leader's token once
   * elected; never resolves without leadership (the core re-reads its own
   * key after every wait). `timeout` (ms) runs out with a `TimeoutError`,
   * nothing held; an aborted `signal` rejects with its reason and cancels
   * the campaign (the core's cancel), as `acquire` does.
   */
  async campaign(value: string | Uint8Array, options?: AcquireOptions): Promise<bigint> {
    const v = checkBytes('value', value);
    const o = checkObject('options', options, ['timeout', 'signal']);
    const timeout = checkMs('options.timeout', o.timeout, true);
    const signal = checkSignal(o.signal);
    signal?.throwIfAborted();
    return acquisition(signal, (handle) => this._e.campaign(v, timeout ?? null, handle));
  }

  /**
   * Puts a new value in the leader's key, guarded by its token (the token
   * does not change). `FencedError` once the leadership was lost,
   * `NotHeldError` when not leading.
   */
  async proclaim(value: string | Uint8Array): Promise<void> {
    const v = checkBytes('value', value);
    settle(await call(() => this._e.proclaim(v)));
  }

  /**
   * Steps down: no permit from now on; the key is deleted once the
   * permits in flight end, or after `grace` ms (default `RESIGN_GRACE_MS`)
   * with some still running, so the next leader starts after this one's
   * work. Resolves once the delete had its first try. Campaigning again is
   * allowed.
   */
  async resign(options?: ResignOptions): Promise<void> {
    const o = checkObject('options', options, ['grace']);
    const grace = checkMs('options.grace', o.grace) ?? RESIGN_GRACE_MS;
    settle(await call(() => this._e.resign(grace)));
  }

  /** The current leader, read from the service; `undefined` when nobody leads. */
  async leader(): Promise<Leader | undefined> {
    const o = await this._e.leader();
    if (o.code !== 'ok') throw errorOf(o.code, o.message);
    return o.leader ? leaderOf(o.leader) : undefined;
  }
}

/** What changed, as the second argument of `'change'`. */
export type ObservedKind = 'leader' | 'proclaimed' | 'no-leader';

export interface ObserverEvents {
  /** A new leader (`kind` `'leader'`), a new value of the same leader (`'proclaimed'`), or nobody leads (`undefined`, `'no-leader'`). */
  change: [leader: Leader | undefined, kind: ObservedKind];
  /** The watch failed and is being opened again; the state then follows, even if unchanged. */
  reconnecting: [];
  error: [error: unknown];
}

/** Open observers by the id their events carry (held until closed, as a socket is). */
const observers = new Map<number, Observer>();

/** The core's bound of what an observer keeps unread. */
const OBSERVER_BACKLOG: N.NativeBacklog = native.observerBacklog();

/** Every observer's events, on the JavaScript thread. */
function dispatchObserved(e: N.NativeObserved): void {
  const o = observers.get(e.observer);
  if (o === undefined) return;
  try {
    o._observed(e);
  } catch (err) {
    process.emitWarning(err instanceof Error ? err : String(err));
  }
}

/**
 * An election's leaders (`client.observe(name)`): `for await (const
 * leader of observer)` yields a `Leader`, or `undefined` while nobody
 * leads; `observer.on('change', (leader, kind) => ...)` gets the same.
 * The first is the current state. Never a leader whose key is already
 * gone. It keeps the process alive only while someone awaits its next
 * event; listeners alone do not. `close()` (or leaving a `for await`)
 * ends it.
 */
export class Observer
  extends EventEmitter<ObserverEvents>
  implements AsyncIterableIterator<Leader | undefined>
{
  /** @internal */
  readonly _n: N.NativeObserver;
  private readonly _items: (Leader | undefined)[] = [];
  /** The core's `backlogBytes` of each of `_items`, and their sum. */
  private readonly _itemBytes: number[] = [];
  private _bytes = 0;
  private readonly _waiting: ((r: IteratorResult<Leader | undefined>) => void)[] = [];
  private _closed = false;

  /** @internal */
  constructor(n: N.NativeObserver) {
    super({ captureRejections: false });
    this._n = n;
    observers.set(n.id, this);
  }

  /** @internal One event of the core's observer. */
  _observed(e: N.NativeObserved): void {
    if (this._closed) return;
    if (e.kind === 'reconnecting') {
      this._emit('reconnecting', []);
      return;
    }
    const leader = e.leader ? leaderOf(e.leader) : undefined;
    const w = this._waiting.shift();
    if (w) {
      if (this._waiting.length === 0) this._n.hold(false);
      w({ value: leader, done: false });
    } else {
      this._keep(leader, e.bytes);
    }
    this._emit('change', [leader, e.kind as ObservedKind]);
  }

  /**
   * Keeps a state for `next()` within the core's bound (issue 32): past it
   * the oldest go, so an observer used only through listeners, or read
   * late, holds a few states, never every change; the newest is kept.
   */
  private _keep(leader: Leader | undefined, bytes: number): void {
    this._items.push(leader);
    this._itemBytes.push(bytes);
    this._bytes += bytes;
    while (
      this._items.length > OBSERVER_BACKLOG.events ||
      (this._bytes > OBSERVER_BACKLOG.bytes && this._items.length > 1)
    ) {
      this._items.shift();
      this._bytes -= this._itemBytes.shift() ?? 0;
    }
  }

  /** Calls every listener; a throwing one changes nothing (as a lock's). */
  private _emit<K extends keyof ObserverEvents>(event: K, args: ObserverEvents[K]): void {
    callListeners(this, event, args);
  }

  get closed(): boolean {
    return this._closed;
  }

  /** The next state: a `Leader`, or `undefined` while nobody leads; done once closed. */
  next(): Promise<IteratorResult<Leader | undefined>> {
    if (this._items.length > 0) {
      this._bytes -= this._itemBytes.shift() ?? 0;
      return Promise.resolve({ value: this._items.shift(), done: false });
    }
    if (this._closed) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => {
      this._waiting.push(resolve);
      // Someone awaits: the process stays alive, as for a pending read.
      this._n.hold(true);
    });
  }

  /** Leaving a `for await`: closes the observer. */
  return(): Promise<IteratorResult<Leader | undefined>> {
    this._items.length = 0;
    this._itemBytes.length = 0;
    this._bytes = 0;
    this.close();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<Leader | undefined> {
    return this;
  }

  /**
   * Ends the observation (the core observer and its watch): waiting
   * `next()` calls resolve as done; states already queued can still be
   * read. Closing twice is harmless.
   */
  close(): void {
    if (this._closed) return;
    this._closed = true;
    observers.delete(this._n.id);
    this._n.close();
    for (const w of this._waiting.splice(0)) w({ value: undefined, done: true });
  }
}

// ------------------------------------------------------------ fence gate

/** The resource side: accepts a write only if its token is >= the highest seen for that name. */
export class FenceGate {
  private readonly _n = new native.NativeFenceGate();
  /** Throws `StaleError` if a higher token was seen for `name`. */
  admit(name: string, token: bigint | number): void {
    const n = checkString('name', name);
    const t = checkToken('token', token);
    const stale = call(() => this._n.admit(n, t));
    if (stale !== null && stale !== undefined) {
      throw new StaleError('stale', stale.message, t, stale.highest);
    }
  }
  /** A read: throws `StaleError` if a higher write token was admitted for `name`. */
  admitRead(name: string, token: bigint | number): void {
    const n = checkString('name', name);
    const t = checkToken('token', token);
    const stale = call(() => this._n.admitRead(n, t));
    if (stale !== null && stale !== undefined) {
      throw new StaleError('stale', stale.message, t, stale.highest);
    }
  }
  /** A write (as `admit`): throws `StaleError` if a higher write or read token was admitted. */
  admitWrite(name: string, token: bigint | number): void {
    const n = checkString('name', name);
    const t = checkToken('token', token);
    const stale = call(() => this._n.admitWrite(n, t));
    if (stale !== null && stale !== undefined) {
      throw new StaleError('stale', stale.message, t, stale.highest);
    }
  }
  highest(name: string): bigint | null {
    return this._n.highest(checkString('name', name)) ?? null;
  }
  /** `[W, R]`: the highest write and read tokens admitted for `name` (null: none yet). */
  watermarks(name: string): [bigint | null, bigint | null] {
    const [w, r] = this._n.watermarks(checkString('name', name));
    return [w ?? null, r ?? null];
  }
}

// ------------------------------------------------------------------- log

/** One record of the core's log. */
export interface LogRecord {
  level: 'error' | 'warn' | 'info' | 'debug' | 'trace';
  /** Where it comes from (`dlock::driver`, ...). */
  target: string;
  /** The message, then its fields as `name=value`. */
  message: string;
}

/**
 * Sends the core's log (acquired, resumed at `info`; draining, fenced at
 * `warn`; keepalive failures at `debug`) to `fn` on the main thread, in
 * order; `null` stops. Never keeps the process alive. A throwing `fn`
 * becomes a process warning.
 */
export function onLog(fn: ((record: LogRecord) => void) | null): void {
  if (fn !== null && typeof fn !== 'function') throw new TypeError('onLog needs a function or null');
  call(() =>
    native.setLogSink(
      fn === null
        ? null
        : (r) => {
            try {
              fn(r as LogRecord);
            } catch (e) {
              process.emitWarning(e instanceof Error ? e : String(e));
            }
          },
    ),
  );
}

/** @internal The addon, for the test suite's scenario runner. */
export const _native = native;
