"""The Python face on the test etcd cluster (scripts/etcd-cluster.sh):
guarded writes, a fence on `etcdctl del`, TLS with client certificates and
user auth. Skipped (reported as skipped, never passed) unless
DLOCK_TEST_ETCD says the cluster exists (target/etcd/env sets it;
scripts/test-python.sh sources it); then a missing cluster fails."""

from __future__ import annotations

import os
import threading
import uuid
from typing import List, Tuple

import pytest

import dlock
import shared

if not os.environ.get("DLOCK_TEST_ETCD"):
    pytest.skip("no etcd test cluster (DLOCK_TEST_ETCD unset: source target/etcd/env)", allow_module_level=True)
MEMBERS = os.environ["DLOCK_TEST_MEMBERS"]

FAST = dict(ttl=4.0, keepalive_interval=1.0, keepalive_timeout=0.5, retry_interval=0.5, margin=1.0)
WITHIN = 15.0


def name() -> str:
    return f"py-test/{uuid.uuid4().hex[:12]}"


def etcdctl(*args: str) -> str:
    return shared.etcdctl(MEMBERS, *args, timeout=WITHIN)


def test_acquire_exclusion_and_guarded_writes() -> None:
    c = dlock.Client(MEMBERS, **FAST)  # type: ignore[arg-type]
    n = name()
    key = f"{n}-result"
    a, b = c.lock(n), c.session().lock(n)
    token = a.acquire(5)
    with pytest.raises(dlock.WouldBlock):
        b.try_acquire()
    with a.permit() as p:
        a.guarded_put(p.token, key, b"from a")
    assert etcdctl("get", key, "--print-value-only").strip() == "from a"
    a.release()
    t2 = b.acquire(5)
    assert t2 > token
    # the old token's late write is refused by etcd itself
    with pytest.raises(dlock.Fenced) as e:
        a.guarded_put(token, key, b"stale")
    assert e.value.code == "fenced"
    b.guarded_put(t2, key, "from b")
    assert etcdctl("get", key, "--print-value-only").strip() == "from b"
    b.guarded_delete(t2, key)
    assert etcdctl("get", key, "--print-value-only").strip() == ""
    b.release()


def test_etcdctl_del_fences_at_once_and_reacquires() -> None:
    c = dlock.Client(MEMBERS.split(","), **FAST)  # type: ignore[arg-type]
    n = name()
    lock = c.lock(n)
    fences: List[Tuple[int, int]] = []
    reasons: List[str] = []
    again = threading.Event()
    lock.on_fence(lambda t, f: fences.append((t, f)))
    lock.on_state_change(lambda old, new, why: reasons.append(why))

    @lock.on_acquired
    def acquired(t: int) -> None:
        if fences:
            again.set()

    token = lock.acquire(5)
    etcdctl("del", "--prefix", f"{n}/")
    assert again.wait(WITHIN)
    assert fences == [(token, 0)] and "lock_lost" in reasons
    with pytest.raises(dlock.Fenced):
        lock.guarded_put(token, f"{n}-x", b"late")
    assert lock.token is not None and lock.token > token
    lock.close()


def test_the_longest_name_with_the_longest_value_campaigns() -> None:
    """Issue 32, 6: a campaign with the longest name and the longest value
    fits etcd's request limit (a 1,024-byte name with a value under the old
    limit made etcd answer "request is too large", retried until the
    timeout); a value over `MAX_VALUE_LEN` is `InvalidArgument` naming the
    limit, before anything is sent."""
    assert (dlock.MAX_NAME_LEN, dlock.MAX_VALUE_LEN) == (1024, 1024 * 1024)
    c = dlock.Client(MEMBERS)
    prefix = name()
    longest = prefix + "n" * (dlock.MAX_NAME_LEN - len(prefix.encode()))
    e = c.election(longest)
    with e.campaign(b"v" * dlock.MAX_VALUE_LEN, WITHIN):
        e.proclaim(b"w" * dlock.MAX_VALUE_LEN)
        with pytest.raises(dlock.InvalidArgument) as err:
            e.proclaim(b"w" * (dlock.MAX_VALUE_LEN + 1))
        assert "1048576" in str(err.value) and err.value.code == "invalid_argument"
    with pytest.raises(dlock.InvalidArgument, match="1048576"):
        c.election(name()).campaign(b"v" * (dlock.MAX_VALUE_LEN + 1), WITHIN)


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLOCK_ENDPOINTS", MEMBERS or "")
    c = dlock.Client(**FAST)  # type: ignore[arg-type]
    assert c.link is None
    with c.lock(name()) as lock:
        assert lock.state is dlock.State.HOLDING


def test_unreachable_cluster_is_backend_error() -> None:
    with pytest.raises(dlock.BackendError) as e:
        dlock.Client("http://127.0.0.1:9", connect_timeout=0.3)
    assert e.value.code == "backend"


def test_tls_client_certificate_and_user() -> None:
    endpoint = os.environ.get("DLOCK_TEST_TLS_ENDPOINT")
    if not endpoint:
        pytest.skip("no TLS member")
    c = dlock.Client(
        endpoint,
        ca_file=os.environ["DLOCK_TEST_CA"],
        cert_file=os.environ["DLOCK_TEST_CERT"],
        key_file=os.environ["DLOCK_TEST_KEY"],
        user=os.environ["DLOCK_TEST_USER"],
        password=os.environ["DLOCK_TEST_PASSWORD"],
        **FAST,  # type: ignore[arg-type]
    )
    with c.lock(name()) as lock:
        with lock.permit() as p:
            assert p.valid()
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client(endpoint, cert_file=os.environ["DLOCK_TEST_CERT"])  # a certificate without its key
