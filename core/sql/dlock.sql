-- dlock's schema on PostgreSQL, version 3 (docs/postgres.md): version 1
-- (locks, leases, tokens, the guard), then version 2 (elections), then
-- version 3 (read/write locks, holder identity).
--
-- The library runs this file itself when the `dlock` schema is missing or
-- older and its role may create it (CREATE on the database); otherwise a
-- DBA runs it once:  psql "$URL" -v ON_ERROR_STOP=1 -f dlock.sql
-- It is idempotent and serialised by an advisory lock, so concurrent
-- clients can all try.
--
-- Every decision about time is made by this server's clock
-- (clock_timestamp(), read at each statement): a lease is alive while
-- expires_at > clock_timestamp(), and a keepalive extends only a live
-- lease, so a late keepalive never revives an expired one.

BEGIN;
SELECT pg_advisory_xact_lock(7236784521049);

CREATE SCHEMA IF NOT EXISTS dlock;

CREATE TABLE IF NOT EXISTS dlock.schema_version (
    version int PRIMARY KEY
);
-- The oldest library version that may use this schema version: a version
-- that only adds (as 2 does to 1) keeps older clients working through a
-- rolling upgrade; one that does not raises it. (Version 2.)
ALTER TABLE dlock.schema_version ADD COLUMN IF NOT EXISTS oldest_library int;

-- A session's lease. Rows are deleted by revoke, or by a contender that
-- finds them expired (with their locks: ON DELETE CASCADE).
CREATE TABLE IF NOT EXISTS dlock.leases (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ttl interval NOT NULL,
    expires_at timestamptz NOT NULL
);
-- Who holds the lease (version 3): a small JSON object written once with
-- the lease ({host, pid, started, face, version, description}: never an
-- environment or a command line); NULL from a library older than that.
ALTER TABLE dlock.leases ADD COLUMN IF NOT EXISTS holder jsonb;

-- One row per lock name ever locked: the row an acquisition locks FOR
-- UPDATE before drawing a token, and dlock.guard locks FOR SHARE, so a
-- takeover waits for a guarded transaction to end.
CREATE TABLE IF NOT EXISTS dlock.names (
    name text COLLATE "C" PRIMARY KEY
);

-- Fencing tokens: one sequence, CACHE 1, drawn only under the name's row
-- lock, so a later acquisition of a name always draws a higher token.
CREATE SEQUENCE IF NOT EXISTS dlock.tokens AS bigint CACHE 1;

-- A held lock. `key` is `<name>/<lease in hex>`, as etcd's lock protocol
-- names it; names nest: every key under `<name>/` blocks `<name>`.
CREATE TABLE IF NOT EXISTS dlock.locks (
    key text COLLATE "C" PRIMARY KEY,
    name text COLLATE "C" NOT NULL,
    lease bigint NOT NULL REFERENCES dlock.leases (id) ON DELETE CASCADE,
    token bigint NOT NULL UNIQUE,
    -- An election candidate's value (version 2); NULL for a plain lock.
    value bytea
);
ALTER TABLE dlock.locks ADD COLUMN IF NOT EXISTS value bytea;
CREATE INDEX IF NOT EXISTS locks_lease ON dlock.locks (lease);

-- The key-value table of guarded_put / guarded_delete.
CREATE TABLE IF NOT EXISTS dlock.kv (
    key bytea PRIMARY KEY,
    value bytea NOT NULL
);

-- A lock row deleted or changed: NOTIFY dlock '<token> <D|L>' (D: deleted
-- while its lease lives, an operator or a release; L: with its lease).
-- Waiters wake on it; a holder's key watch fences on it. A change of the
-- value alone (an election's proclaim) is '<token> V': observers wake on
-- it, the holder is not fenced.
CREATE OR REPLACE FUNCTION dlock.locks_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    why text := 'D';
BEGIN
    IF TG_OP = 'UPDATE' AND NEW IS NOT DISTINCT FROM OLD THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND (NEW.key, NEW.name, NEW.lease, NEW.token)
                            IS NOT DISTINCT FROM (OLD.key, OLD.name, OLD.lease, OLD.token) THEN
        PERFORM pg_notify('dlock', NEW.token || ' V');
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM dlock.leases
                   WHERE id = OLD.lease AND expires_at > clock_timestamp()) THEN
        why := 'L';
    END IF;
    PERFORM pg_notify('dlock', OLD.token || ' ' || why);
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER locks_changed AFTER DELETE OR UPDATE ON dlock.locks
    FOR EACH ROW EXECUTE FUNCTION dlock.locks_changed();

-- What dlock.acquire and dlock.acquire_rw do first: lock the name's row
-- (false: a guarded transaction holds it, look again shortly), then check
-- that lease `p_lease` is alive, locking it against a concurrent expiry
-- sweep (SQLSTATE DL002 if not). The locks last until the caller's
-- transaction ends.
CREATE OR REPLACE FUNCTION dlock.enter_name(p_name text, p_lease bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        BEGIN
            PERFORM 1 FROM dlock.names WHERE name = p_name FOR UPDATE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RETURN false;
        END;
        EXIT WHEN FOUND;
        INSERT INTO dlock.names (name) VALUES (p_name) ON CONFLICT DO NOTHING;
    END LOOP;
    PERFORM 1 FROM dlock.leases WHERE id = p_lease AND expires_at > clock_timestamp() FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'DL002', MESSAGE = 'dlock: lease ' || p_lease || ' not found';
    END IF;
    RETURN true;
END $$;

-- Deletes the expired leases holding rows under `p_name` (their rows go
-- with them). The holders' leases are read first with a lock that waits
-- for an in-flight keepalive, so a lease being extended is never taken as
-- expired.
CREATE OR REPLACE FUNCTION dlock.sweep(p_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM dlock.leases l
        WHERE l.id IN (SELECT k.lease FROM dlock.locks k
                       WHERE k.key >= p_name || '/' AND k.key < p_name || '0')
        ORDER BY l.id FOR SHARE;
    DELETE FROM dlock.leases l
        WHERE l.id IN (SELECT k.lease FROM dlock.locks k
                       WHERE k.key >= p_name || '/' AND k.key < p_name || '0')
          AND l.expires_at <= clock_timestamp();
END $$;

-- Acquires `p_name` (key `p_key`) under lease `p_lease`, without waiting:
-- token set: held (also when this key already held); token NULL: busy,
-- retry_ms is when to look again (the holder's remaining TTL, or a short
-- pause while the name's row is locked by a guarded transaction).
-- SQLSTATE DL002: the lease is not alive.
CREATE OR REPLACE FUNCTION dlock.acquire(p_name text, p_key text, p_lease bigint,
                                         OUT token bigint, OUT retry_ms float8)
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT dlock.enter_name(p_name, p_lease) THEN
        retry_ms := 20;
        RETURN;
    END IF;
    SELECT k.token INTO token FROM dlock.locks k WHERE k.key = p_key AND k.lease = p_lease;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM dlock.sweep(p_name);
    SELECT extract(epoch FROM min(l.expires_at) - clock_timestamp()) * 1000
        INTO retry_ms
        FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease
        WHERE k.key >= p_name || '/' AND k.key < p_name || '0';
    IF retry_ms IS NOT NULL THEN
        retry_ms := greatest(retry_ms, 1);
        RETURN;
    END IF;
    token := nextval('dlock.tokens');
    INSERT INTO dlock.locks (key, name, lease, token) VALUES (p_key, p_name, p_lease, token);
END $$;

-- A candidate's campaign: dlock.acquire, then the value on the row won
-- (also when this key already held: etcd's Campaign on its own key).
CREATE OR REPLACE FUNCTION dlock.campaign(p_name text, p_key text, p_lease bigint, p_value bytea,
                                          OUT token bigint, OUT retry_ms float8)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT a.token, a.retry_ms INTO token, retry_ms FROM dlock.acquire(p_name, p_key, p_lease) a;
    IF token IS NOT NULL THEN
        UPDATE dlock.locks k SET value = p_value
            WHERE k.key = p_key AND k.token = campaign.token
              AND k.value IS DISTINCT FROM p_value;
    END IF;
END $$;

-- A guarded write to dlock.kv: commits only while `p_key` (the lock key
-- of `p_name`) holds `p_token` on a live lease. false: fenced.
CREATE OR REPLACE FUNCTION dlock.guarded_write(p_name text, p_key text, p_token bigint,
                                               p_kv bytea, p_value bytea)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM dlock.names WHERE name = p_name FOR SHARE;
    PERFORM 1 FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease
        WHERE k.key = p_key AND k.token = p_token AND l.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_value IS NULL THEN
        DELETE FROM dlock.kv WHERE key = p_kv;
    ELSE
        INSERT INTO dlock.kv (key, value) VALUES (p_kv, p_value)
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    END IF;
    RETURN true;
END $$;

-- The guard an application calls first in its own transaction:
--   BEGIN; SELECT dlock.guard('jobs', 42); UPDATE my_table ...; COMMIT;
-- It holds the name's row (FOR SHARE) until that transaction ends, so a
-- takeover waits for it, and raises SQLSTATE DL001 when `p_token` no longer
-- holds `p_name` on a live lease: the transaction is then refused.
CREATE OR REPLACE FUNCTION dlock.guard(p_name text, p_token bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM dlock.names WHERE name = p_name FOR SHARE;
    PERFORM 1 FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease
        WHERE k.name = p_name AND k.token = p_token AND l.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'DL001',
            MESSAGE = format('dlock: token %s no longer holds lock %L', p_token, p_name),
            HINT = 'a later holder may have taken the lock: do not write';
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS locks_name ON dlock.locks (name);

-- The timeline this server was last seen on. After a promotion the new
-- primary's clock takes over: every lease row is extended to at least
-- now + its TTL (as etcd's new leader extends every lease), so a clock
-- ahead of the old primary's cannot expire a lease before its holder's
-- deadline. dlock calls this on every connection it opens.
CREATE TABLE IF NOT EXISTS dlock.timeline (
    id bigint NOT NULL
);

CREATE OR REPLACE FUNCTION dlock.check_timeline() RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    tl bigint := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
    seen bigint;
BEGIN
    SELECT id INTO seen FROM dlock.timeline;
    IF seen = tl THEN
        RETURN false;
    END IF;
    LOCK TABLE dlock.timeline IN EXCLUSIVE MODE;
    SELECT id INTO seen FROM dlock.timeline;
    IF NOT FOUND THEN
        INSERT INTO dlock.timeline (id) VALUES (tl);
        RETURN false;
    END IF;
    IF seen = tl THEN
        RETURN false;
    END IF;
    UPDATE dlock.timeline SET id = tl;
    UPDATE dlock.leases SET expires_at = greatest(expires_at, clock_timestamp() + ttl);
    RETURN true;
END $$;

-- Version 2 only adds (a nullable column, a function, a notification that
-- names tokens no version-1 client holds): version-1 libraries keep working.
INSERT INTO dlock.schema_version (version, oldest_library) VALUES (2, 1)
    ON CONFLICT (version) DO UPDATE SET oldest_library = excluded.oldest_library;

-- Version 3: read/write locks (docs/design.md §27). A holder's row is the
-- lock's row with the mode in `value`: a reader's holds the read marker
-- ('dlock:read'), anything else (NULL: a plain lock) is a writer. Readers
-- and writers queue in one order: a row is put at once, its token drawn
-- from the sequence under the name's row lock, and it holds when no
-- earlier row under `<name>/` blocks it (a writer: no earlier row at all;
-- a reader: no earlier writer's). So a queued writer blocks later readers,
-- and a plain dlock.acquire (which any row blocks) sees every reader and
-- queued row as exclusive.

-- Whether the row of `p_token` under `p_name` holds in its mode.
CREATE OR REPLACE FUNCTION dlock.rw_holds(p_name text, p_token bigint, p_read boolean)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM dlock.locks k
        WHERE k.key >= p_name || '/' AND k.key < p_name || '0'
          AND k.token < p_token
          AND (NOT p_read OR k.value IS DISTINCT FROM 'dlock:read'::bytea))
$$;

-- Queues `p_key` for `p_name` under `p_lease` in mode `p_read` (once: a
-- row already there is read again, and a reader's gets the marker), then
-- says whether it holds. held false: `retry_ms` is when to look again (the
-- earliest expiry among the rows before it, or a short pause while the
-- name's row is locked); without `p_wait` the row is deleted again.
-- SQLSTATE DL002: the lease is not alive.
CREATE OR REPLACE FUNCTION dlock.acquire_rw(p_name text, p_key text, p_lease bigint,
                                            p_read boolean, p_wait boolean,
                                            OUT token bigint, OUT held boolean,
                                            OUT retry_ms float8)
LANGUAGE plpgsql AS $$
DECLARE
    v_value bytea := CASE WHEN p_read THEN 'dlock:read'::bytea END;
BEGIN
    held := false;
    IF NOT dlock.enter_name(p_name, p_lease) THEN
        retry_ms := 20;
        RETURN;
    END IF;
    PERFORM dlock.sweep(p_name);
    SELECT k.token INTO token FROM dlock.locks k WHERE k.key = p_key AND k.lease = p_lease;
    IF NOT FOUND THEN
        token := nextval('dlock.tokens');
        INSERT INTO dlock.locks (key, name, lease, token, value)
            VALUES (p_key, p_name, p_lease, token, v_value);
    ELSIF p_read THEN
        UPDATE dlock.locks k SET value = v_value
            WHERE k.key = p_key AND k.value IS DISTINCT FROM v_value;
    END IF;
    IF dlock.rw_holds(p_name, token, p_read) THEN
        held := true;
        RETURN;
    END IF;
    IF NOT p_wait THEN
        DELETE FROM dlock.locks k WHERE k.key = p_key AND k.token = acquire_rw.token;
        token := NULL;
        RETURN;
    END IF;
    SELECT greatest(extract(epoch FROM min(l.expires_at) - clock_timestamp()) * 1000, 1)
        INTO retry_ms
        FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease
        WHERE k.key >= p_name || '/' AND k.key < p_name || '0'
          AND k.token < acquire_rw.token;
END $$;

-- The guards of read/write locks, called first in the application's own
-- transaction as dlock.guard is: they hold the name's row (FOR SHARE)
-- until the transaction ends, and raise SQLSTATE DL001 unless `p_token`
-- holds `p_name` on a live lease in a mode that may do it: guard_read
-- admits a reader or a writer, guard_write only a writer (a guarded write
-- from a read holder is refused).
CREATE OR REPLACE FUNCTION dlock.guard_rw(p_name text, p_token bigint, p_write boolean)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_value bytea;
BEGIN
    PERFORM 1 FROM dlock.names WHERE name = p_name FOR SHARE;
    SELECT k.value INTO v_value FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease
        WHERE k.name = p_name AND k.token = p_token AND l.expires_at > clock_timestamp();
    IF NOT FOUND OR NOT dlock.rw_holds(p_name, p_token,
                                       v_value IS NOT DISTINCT FROM 'dlock:read'::bytea) THEN
        RAISE EXCEPTION USING ERRCODE = 'DL001',
            MESSAGE = format('dlock: token %s no longer holds lock %L', p_token, p_name),
            HINT = 'a later holder may have taken the lock: do not write';
    END IF;
    IF p_write AND v_value IS NOT DISTINCT FROM 'dlock:read'::bytea THEN
        RAISE EXCEPTION USING ERRCODE = 'DL001',
            MESSAGE = format('dlock: token %s holds lock %L for reading, not writing', p_token, p_name),
            HINT = 'a reader may not write: acquire a writer';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION dlock.guard_read(p_name text, p_token bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT dlock.guard_rw(p_name, p_token, false)
$$;

CREATE OR REPLACE FUNCTION dlock.guard_write(p_name text, p_token bigint) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT dlock.guard_rw(p_name, p_token, true)
$$;

-- Version 3 only adds (functions; rows with a value version-2 clients
-- already treat as holders; a nullable column, the leases' holder):
-- older libraries keep working (their leases have no holder).
INSERT INTO dlock.schema_version (version, oldest_library) VALUES (3, 1)
    ON CONFLICT (version) DO UPDATE SET oldest_library = excluded.oldest_library;
COMMIT;
