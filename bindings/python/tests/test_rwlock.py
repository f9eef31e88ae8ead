"""Read/write locks in the Python face (issue 30, docs/design.md §27): the
face converts, the core decides. On the embedded engine: readers on two
clients hold together, a writer excludes both ways, a downgrade keeps the
token and lets a queued reader in, an upgrade and a plain lock's downgrade
are `InvalidArgument`, and the gate's two watermarks; README.md's Python
block as written; on the etcd test cluster (DLOCK_TEST_ETCD) the keys'
values a writer, a downgrade and readers leave. Readers that share
run on clients of their own: two holders on one session exclude each
other whatever their modes."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path
from typing import List, Optional

import pytest

import dlock
from shared import etcdctl

WITHIN = 10.0


def clients(n: int) -> List[dlock.Client]:
    svc = dlock.MemoryService()
    return [dlock.Client(memory=svc) for _ in range(n)]


def test_reader_and_writer_are_locks_with_a_mode() -> None:
    (c,) = clients(1)
    rw = c.rwlock("cfg")
    assert rw.name == "cfg"
    r, w = rw.reader(), rw.writer()
    assert isinstance(r, dlock.Lock) and isinstance(w, dlock.Lock)
    assert (r.mode, w.mode, r.name, w.name) == ("read", "write", "cfg", "cfg")
    assert c.lock("cfg").mode is None
    s = c.session()
    assert s.rwlock("cfg").reader().mode == "read"
    with pytest.raises(TypeError):
        c.rwlock(3)  # type: ignore[arg-type]


def test_readers_on_two_clients_share_and_a_writer_waits() -> None:
    a, b, c = clients(3)
    r1 = a.rwlock("cfg").reader()
    r2 = b.rwlock("cfg").reader()
    t1 = r1.acquire(timeout=WITHIN)
    t2 = r2.acquire(timeout=WITHIN)
    assert t2 > t1 and r1.state is r2.state is dlock.State.HOLDING
    with r1.permit() as p:
        assert p.token == t1
    w = c.rwlock("cfg").writer()
    with pytest.raises(dlock.WouldBlock):
        w.try_acquire()
    with pytest.raises(dlock.Timeout):
        w.acquire(timeout=0.2)
    r1.release()
    r2.release()
    assert w.acquire(timeout=WITHIN) > t2
    w.release()


def test_a_writer_excludes_readers_and_writers() -> None:
    a, b, c = clients(3)
    w = a.rwlock("cfg").writer()
    token = w.acquire(timeout=WITHIN)
    r = b.rwlock("cfg").reader()
    with pytest.raises(dlock.WouldBlock):
        r.try_acquire()
    with pytest.raises(dlock.WouldBlock):
        c.rwlock("cfg").writer().try_acquire()
    with pytest.raises(dlock.WouldBlock):
        c.lock("cfg").try_acquire()  # a plain lock is a writer
    w.release()
    assert r.try_acquire() > token
    r.release()


def test_downgrade_keeps_the_token_and_lets_a_queued_reader_in() -> None:
    a, b = clients(2)
    w = a.rwlock("cfg").writer()
    with w:
        token = w.token
        r = b.rwlock("cfg").reader()
        got: List[Optional[int]] = []
        waiter = threading.Thread(target=lambda: got.append(r.acquire(timeout=WITHIN)))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and got == []  # waits behind the writer
        w.downgrade()  # releases the GIL: the waiter's thread runs meanwhile
        waiter.join(WITHIN)
        assert got and got[0] is not None and got[0] > token
        assert (w.mode, w.token, w.state) == ("read", token, dlock.State.HOLDING)
        with w.permit() as p:
            assert p.token == token
        w.downgrade()  # a reader's downgrade does nothing
        assert w.token == token
        r.release()


def test_downgrade_async() -> None:
    (c,) = clients(1)
    w = c.rwlock("cfg").writer()

    async def main() -> None:
        async with w:
            token = w.token
            await w.downgrade_async()
            assert (w.mode, w.token) == ("read", token)

    asyncio.run(main())


def test_upgrade_and_misuse_are_invalid_argument() -> None:
    (c,) = clients(1)
    r = c.rwlock("cfg").reader()
    r.acquire(timeout=WITHIN)
    with pytest.raises(dlock.InvalidArgument) as e:
        r.upgrade()
    assert e.value.code == "invalid_argument" and "release the reader" in str(e.value)
    assert r.mode == "read"
    r.release()
    plain = c.lock("plain")
    plain.acquire(timeout=WITHIN)
    with pytest.raises(dlock.InvalidArgument):
        plain.downgrade()
    with pytest.raises(dlock.InvalidArgument):
        plain.upgrade()
    plain.release()
    # a writer not held has nothing to downgrade
    with pytest.raises(dlock.NotHeld):
        c.rwlock("cfg").writer().downgrade()


def test_gate_keeps_two_watermarks() -> None:
    gate = dlock.FenceGate()
    assert gate.watermarks("cfg") == (None, None)
    gate.admit_read("cfg", 5)
    gate.admit_read("cfg", 3)  # readers never refuse each other
    assert gate.watermarks("cfg") == (None, 5)
    with pytest.raises(dlock.Stale) as e:
        gate.admit_write("cfg", 4)  # under a later reader's grant
    assert e.value.code == "stale"
    gate.admit_write("cfg", 7)
    assert gate.watermarks("cfg") == (7, 5)
    with pytest.raises(dlock.Stale):
        gate.admit_read("cfg", 6)  # a read older than the write admitted
    gate.admit_read("cfg", 8)
    assert gate.watermarks("cfg") == (7, 8)
    assert gate.highest("cfg") == 8
    with pytest.raises(dlock.Stale):
        gate.admit("cfg", 7)  # admit is a write
    with pytest.raises(dlock.InvalidArgument):
        gate.admit_read("cfg", -1)


def test_gate_with_real_tokens() -> None:
    a, b = clients(2)
    gate = dlock.FenceGate()
    w = a.rwlock("cfg").writer()
    with w:
        assert w.token is not None
        gate.admit_write("cfg", w.token)
        w.downgrade()
        r = b.rwlock("cfg").reader()
        with r:
            gate.admit_read("cfg", w.token)
            read_token = r.token
            assert read_token is not None
            gate.admit_read("cfg", read_token)
    w2 = b.rwlock("cfg").writer()
    with w2:
        assert w2.token is not None
        gate.admit_write("cfg", w2.token)
    with pytest.raises(dlock.Stale):
        gate.admit_read("cfg", read_token)  # an old reader after a later write


def test_the_readme_block_runs_as_written() -> None:
    """README.md's Python block under ``## Read/write locks``: the writer
    writes, downgrades and reads with one token; the reader comes later."""
    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = text.split("\n## Read/write locks\n", 1)[1].split("\n## ", 1)[0]
    assert "```python\n" in section, "README.md's Read/write locks section has no python block"
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    svc = dlock.MemoryService()
    gate = dlock.FenceGate()
    seen: List[tuple] = []

    def write_config(token: int) -> None:
        assert svc.holder("config") == token
        seen.append(("write", token))

    def read_config(token: int) -> None:
        seen.append(("read", token))

    ns: dict = {"client": dlock.Client(memory=svc), "gate": gate, "write_config": write_config, "read_config": read_config}
    exec(compile(code, "README.md", "exec"), ns)
    assert [m for m, _ in seen] == ["write", "read", "read"], seen
    assert seen[0][1] == seen[1][1] < seen[2][1], seen
    assert gate.watermarks("config") == (seen[0][1], seen[2][1])
    assert svc.holder("config") is None, "the block left a holder"


@pytest.mark.skipif(not os.environ.get("DLOCK_TEST_ETCD"), reason="no etcd test cluster (DLOCK_TEST_ETCD unset)")
def test_on_etcd_readers_share_and_a_downgrade_marks_the_key() -> None:
    members = os.environ["DLOCK_TEST_MEMBERS"]
    fast = dict(ttl=4.0, keepalive_interval=1.0, keepalive_timeout=0.5, retry_interval=0.5, margin=1.0)
    c = dlock.Client(members, **fast)  # type: ignore[arg-type]
    name = f"py-test/rw-{uuid.uuid4().hex[:12]}"

    def values() -> List[str]:
        """The values of `name`'s lock keys, oldest first."""
        return etcdctl(members, "get", "--prefix", "--print-value-only", f"{name}/", timeout=WITHIN).splitlines()

    w = c.session().rwlock(name).writer()
    token = w.acquire(timeout=WITHIN)
    r = c.session().rwlock(name).reader()
    with pytest.raises(dlock.WouldBlock):
        r.try_acquire()
    assert values() == [""]  # a writer's key is empty, as etcdctl lock puts
    w.downgrade()
    assert values() == ["dlock:read"] and (w.mode, w.token) == ("read", token)
    other = c.session().rwlock(name).reader()
    assert other.acquire(timeout=WITHIN) > token  # readers share
    assert values() == ["dlock:read", "dlock:read"]
    with pytest.raises(dlock.WouldBlock):
        c.session().rwlock(name).writer().try_acquire()
    other.release()
    w.release()
