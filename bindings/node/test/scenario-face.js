// The JavaScript face of the shared scenarios (scenarios/README.md): the
// runner crate (built into the test addon, feature `scenarios`) calls
// `ask(what, json)` for every step; this face performs it through the
// public API of `dlock` only and answers with `scenarioReply`. Trace lines
// come from the locks' (and election candidates') listeners and the
// observers' `change` and `reconnecting` listeners.
'use strict';

const dlock = require('..');

const native = dlock._native;

function answer(promise) {
  Promise.resolve(promise).then(
    (v) => native.scenarioReply(true, JSON.stringify(v ?? null)),
    (e) => native.scenarioReply(false, String(e?.stack ?? e)),
  );
}

function line(e) {
  switch (e.kind) {
    case 'state':
      return `state ${e.from}->${e.to} ${e.reason}`;
    case 'fence':
      return `fence token=${e.token} in_flight=${e.inFlight}`;
    case 'acquired':
      return `acquired token=${e.token}`;
    default:
      return e.kind;
  }
}

function withTimeout(promise, ms) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no event within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// A lock's (or a slot's) events as trace lines.
function listen(lock, push) {
  lock.on('stateChange', (c) => push(`state ${c.from}->${c.to} ${c.reason}`));
  lock.on('acquired', (t) => push(`acquired token=${t}`));
  lock.on('fence', (t, n) => push(`fence token=${t} in_flight=${n}`));
  lock.on('drained', () => push('drained'));
}

const num = (t) => (t === null || t === undefined ? null : Number(t));

// A step answered "ok" or the status word: a DlockError's `code`.
async function okOrCode(call) {
  try {
    await call();
    return { kind: 'word', word: 'ok' };
  } catch (e) {
    if (!(e instanceof dlock.DlockError)) throw e;
    return { kind: 'word', word: e.code };
  }
}

class Face {
  constructor() {
    this.generation = 0;
    this.reset();
  }

  reset() {
    this.service = null;
    this.holders = new Map(); // holder -> { client, lock }
    this.permits = new Map();
    this.pending = [];
  }

  ask(what, json) {
    const arg = JSON.parse(json);
    switch (what) {
      case 'warm_up':
        return answer(this.warmUp());
      case 'setup':
        return answer(this.setup(arg));
      case 'perform':
        return answer(this.perform(arg));
      case 'teardown':
        return answer(this.teardown());
      default:
        return answer(Promise.reject(new Error(`unknown request ${what}`)));
    }
  }

  async warmUp() {
    const service = new dlock.Service();
    const client = new dlock.Client({ service });
    const lock = client.lock('scenario/warm-up');
    lock.on('acquired', () => {});
    await lock.acquire({ timeout: 1000 });
    lock.permit().end();
    await lock.close();
  }

  setup(s) {
    const generation = ++this.generation;
    this.service = new dlock.Service();
    const clients = new Map();
    const sessions = new Map();
    for (const p of s.placements) {
      let client = clients.get(p.client);
      if (!client) {
        client = new dlock.Client({ service: this.service, ...s.settings });
        clients.set(p.client, client);
      }
      const key = `${p.client}\u0000${p.session}`;
      let session = sessions.get(key);
      if (!session) {
        session = p.defaultSession ? client.defaultSession : client.session(s.settings);
        sessions.set(key, session);
      }
      const h = p.holder;
      const push = (line) => {
        if (this.generation === generation) native.scenarioTrace(`${h} ${line}`);
      };
      if (p.role === 'observe') {
        // An observer: `observe` starts it (client.observe) on this client.
        this.holders.set(h, { client, observes: p.lock, push });
        continue;
      }
      if (p.role === 'semaphore') {
        // No lock until its acquire wins a slot (took).
        const semaphore = session.semaphore(p.lock, p.limit);
        this.holders.set(h, { client, session, semaphore, lock: null, push });
        continue;
      }
      // An election candidate, a reader and a writer are Locks too: the
      // same listeners and steps.
      let lock;
      if (p.role === 'election') lock = session.election(p.lock);
      else if (p.role === 'read') lock = session.rwlock(p.lock).reader();
      else if (p.role === 'write') lock = session.rwlock(p.lock).writer();
      else lock = session.lock(p.lock);
      listen(lock, push);
      // The pull-style stream, opened before anything happens.
      this.holders.set(h, { client, lock, events: lock.events() });
    }
  }

  // A semaphore holder's slot won: kept (a step on it may follow a `wait`
  // on the line at once), traced `took slot=I lock=NAME`, then its events
  // traced as a lock's.
  took(h, lock) {
    if (h.lock) {
      lock.release().catch(() => {});
      throw new Error('a second slot for one holder');
    }
    h.lock = lock;
    h.push(`took slot=${lock.slot} lock=${lock.name}`);
    listen(lock, h.push);
  }

  // The steps a semaphore holder takes through its handle; undefined for
  // the others (a lock step on the slot won, a fault on its link).
  semaphoreStep(step) {
    const h = this.holder(step.holder);
    switch (step.do) {
      case 'acquire': {
        const acquired = h.semaphore.acquire({ timeout: 10_000 }).then(
          (lock) => this.took(h, lock),
          (e) => h.push(`acquire failed: ${e.code ?? e}`),
        );
        this.pending.push(acquired.catch(() => {}));
        return { kind: 'done' };
      }
      case 'try_acquire':
        // A refusal is no acquire that failed: not traced.
        return okOrCode(async () => this.took(h, await h.semaphore.tryAcquire()));
      case 'slot':
        return { kind: 'slot', slot: h.lock ? h.lock.slot : null, lock: h.lock ? h.lock.name : null };
      case 'semaphore':
        // Another handle of the name on the holder's session.
        return okOrCode(() => h.session.semaphore(h.semaphore.name, step.limit));
      default:
        if (!h.lock && step.do !== 'fault' && step.do !== 'shutdown') {
          throw new Error(`${step.holder} has won no slot yet`);
        }
        return undefined;
    }
  }

  holder(name) {
    const h = this.holders.get(name);
    if (!h) throw new Error(`no holder ${name}`);
    return h;
  }

  permit(label) {
    const p = this.permits.get(label);
    if (!p) throw new Error(`no permit ${label}`);
    return p;
  }

  async perform(step) {
    if (step.holder && this.holder(step.holder).semaphore) {
      const done = await this.semaphoreStep(step);
      if (done) return done;
    }
    switch (step.do) {
      case 'acquire': {
        const acquired = this.holder(step.holder).lock.acquire({ timeout: 10_000 });
        this.pending.push(acquired.catch(() => {}));
        return { kind: 'done' };
      }
      case 'acquire_start': {
        // Cancellable the JavaScript way: a signal; `cancel` aborts it.
        const h = this.holder(step.holder);
        h.abort = new AbortController();
        const acquired = h.lock.acquire({ timeout: 10_000, signal: h.abort.signal });
        this.pending.push(acquired.catch(() => {}));
        return { kind: 'done' };
      }
      case 'cancel': {
        const h = this.holder(step.holder);
        if (!h.abort) throw new Error(`no acquire_start of ${step.holder}`);
        h.abort.abort();
        return { kind: 'done' };
      }
      case 'shutdown':
        this.holder(step.holder).client.shutdown();
        return { kind: 'done' };
      case 'campaign': {
        const campaigned = this.holder(step.holder).lock.campaign(step.value, { timeout: 10_000 });
        this.pending.push(campaigned.catch(() => {}));
        return { kind: 'done' };
      }
      case 'proclaim':
        return okOrCode(() => this.holder(step.holder).lock.proclaim(step.value));
      case 'resign': {
        const resigned = this.holder(step.holder).lock.resign({ grace: step.ms });
        this.pending.push(resigned.catch(() => {}));
        return { kind: 'done' };
      }
      case 'leader': {
        const l = await this.holder(step.holder).lock.leader();
        return { kind: 'leader', value: l ? String(l.value) : null, token: l ? num(l.token) : null };
      }
      case 'observe': {
        const h = this.holder(step.holder);
        h.observer = h.client.observe(h.observes);
        h.observer.on('change', (l, kind) =>
          h.push(l ? `observed ${kind} value=${String(l.value)} token=${l.token}` : 'observed no-leader'),
        );
        h.observer.on('reconnecting', () => h.push('observed reconnecting'));
        return { kind: 'done' };
      }
      case 'try_acquire':
        return okOrCode(() => this.holder(step.holder).lock.tryAcquire());
      case 'downgrade':
        return okOrCode(() => this.holder(step.holder).lock.downgrade());
      case 'mode': {
        const { mode } = this.holder(step.holder).lock;
        if (mode === null) throw new Error(`${step.holder} is not a read/write lock holder`);
        return { kind: 'word', word: mode };
      }
      case 'permit': {
        let p;
        try {
          p = this.holder(step.holder).lock.permit();
        } catch (e) {
          if (!(e instanceof dlock.DlockError)) throw e;
          return { kind: 'permit', word: e.code, token: null };
        }
        const token = num(p.token);
        if (step.label) this.permits.set(step.label, p);
        else p.end();
        return { kind: 'permit', word: 'granted', token };
      }
      case 'end':
        this.permit(step.permit).end();
        this.permits.delete(step.permit);
        return { kind: 'done' };
      case 'valid':
        return { kind: 'bool', flag: this.permit(step.permit).valid() };
      case 'state':
        return { kind: 'word', word: this.holder(step.holder).lock.state };
      case 'token':
        return { kind: 'token', token: num(this.holder(step.holder).lock.token) };
      case 'release':
        await this.holder(step.holder).lock.release();
        return { kind: 'done' };
      case 'close':
        await this.holder(step.holder).lock.close();
        return { kind: 'done' };
      case 'stall_driver':
        dlock.stallDriver(step.ms);
        return { kind: 'done' };
      case 'fault':
        this.fault(step);
        return { kind: 'done' };
      case 'events': {
        // The next `count` events of the stream, as trace lines without
        // the holder.
        const { events } = this.holder(step.holder);
        const lines = [];
        while (lines.length < step.count) {
          const r = await withTimeout(events.next(), 10_000);
          if (r.done) break;
          lines.push(line(r.value));
        }
        return { kind: 'events', lines };
      }
      default:
        throw new Error(`unknown step ${step.do}`);
    }
  }

  fault(step) {
    const { client, lock } = this.holder(step.holder);
    const link = client.link;
    switch (step.fault) {
      case 'partition':
        return link.partition();
      case 'heal':
        return link.heal();
      case 'drop_replies':
        return link.dropKeepaliveReplies(true);
      case 'keep_replies':
        return link.dropKeepaliveReplies(false);
      case 'delay_replies':
        return link.delayKeepaliveReplies(step.ms ?? 0);
      case 'fail_keepalives':
        return link.failKeepalives(true);
      case 'stop_failing':
        return link.failKeepalives(false);
      case 'lease_lost':
        return link.declareLeaseLost();
      case 'freeze_expiry':
        return this.service.freezeExpiry(true);
      case 'thaw_expiry':
        return this.service.freezeExpiry(false);
      case 'delete_key':
        if (!this.service.deleteLockKey(lock.name)) throw new Error(`delete_key: nobody holds ${lock.name}`);
        return;
      case 'revoke_lease': {
        const lease = lock.session.lease;
        if (lease === null) throw new Error('revoke_lease: the holder has no lease');
        if (!this.service.revokeLease(lease)) throw new Error(`revoke_lease: no lease ${lease}`);
        return;
      }
      default:
        throw new Error(`unknown fault ${step.fault}`);
    }
  }

  async teardown() {
    this.generation++;
    for (const p of this.permits.values()) p.end();
    for (const h of this.holders.values()) h.observer?.close();
    await Promise.all([...this.holders.values()].map((h) => h.lock?.close().catch(() => {})));
    await Promise.all(this.pending);
    this.reset();
  }
}

module.exports = { Face };
