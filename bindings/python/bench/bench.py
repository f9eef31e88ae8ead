"""Benchmarks of the Python face (figures, not tests): medians of several
runs, each beside its baseline measured in the same run.

1. ``with lock.permit(): pass`` beside ``with threading.Lock(): pass``
   (target <= 250 ns median), on the embedded backend.
2. Uncontended acquire + release per second on the test etcd
   (``DLOCK_TEST_MEMBERS``), beside the floor (one put + one delete through
   python-etcd3's raw client) and python-etcd3's own lock (target >= 0.9x
   the floor). Skipped without the cluster or python-etcd3.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import timeit
import uuid

import dlock

RUNS = 9


def per_op_ns(stmt: str, setup_globals: dict, number: int) -> float:
    t = timeit.Timer(stmt, globals=setup_globals)
    return min(t.repeat(repeat=3, number=number)) / number * 1e9


def bench_permit() -> None:
    c = dlock.Client(memory=dlock.MemoryService())
    lock = c.lock("bench")
    lock.acquire()
    tl = threading.Lock()
    g = {"lock": lock, "tl": tl}
    n = 200_000
    empty, permit, tlock = [], [], []
    for _ in range(RUNS):
        empty.append(per_op_ns("pass", g, n))
        permit.append(per_op_ns("with lock.permit(): pass", g, n))
        tlock.append(per_op_ns("with tl: pass", g, n))
    e, p, t = (statistics.median(x) for x in (empty, permit, tlock))
    print("permit (ns per op, median of %d runs; the timeit loop's own cost is shown, not subtracted)" % RUNS)
    print(f"  empty loop                     {e:7.1f} ns")
    print(f"  with threading.Lock(): pass    {t:7.1f} ns")
    print(f"  with lock.permit(): pass       {p:7.1f} ns   ({p / t:.2f}x threading.Lock; target <= 250 ns)")
    lock.close()


def rate(f, seconds: float = 2.0) -> float:
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        f()
        n += 1
    return n / (time.perf_counter() - start)


def bench_etcd() -> None:
    members = os.environ.get("DLOCK_TEST_MEMBERS")
    if not members:
        print("etcd: skipped (no DLOCK_TEST_MEMBERS: source target/etcd/env)")
        return
    try:
        import etcd3  # type: ignore[import-untyped]
    except ImportError:
        print("etcd: python-etcd3 missing (scripts/bench-python.sh installs it)")
        return
    first = members.split(",")[0].replace("http://", "")
    host, port = first.rsplit(":", 1)
    raw = etcd3.client(host=host, port=int(port))
    c = dlock.Client(members)
    name = f"bench/{uuid.uuid4().hex[:8]}"
    lock = c.lock(name)
    lease = raw.lease(15)
    key = f"{name}-floor"

    def floor() -> None:
        raw.put(key, "x", lease=lease)
        raw.delete(key)

    def dlock_cycle() -> None:
        lock.acquire(5)
        lock.release()

    e3lock = raw.lock(f"{name}-e3", ttl=15)

    def etcd3_cycle() -> None:
        e3lock.acquire(timeout=5)
        e3lock.release()

    dlock_cycle()  # the session's lease is granted on the first acquire
    results: dict = {"floor": [], "dlock": [], "etcd3": []}
    for _ in range(5):
        results["floor"].append(rate(floor, 1.0))
        results["dlock"].append(rate(dlock_cycle, 1.0))
        results["etcd3"].append(rate(etcd3_cycle, 1.0))
    f, d, e = (statistics.median(results[k]) for k in ("floor", "dlock", "etcd3"))
    print("etcd, uncontended acquire + release per second (median of 5 one-second runs, 3-member test cluster)")
    print(f"  floor: one put + one delete    {f:8.0f} /s")
    print(f"  dlock lock.acquire + release   {d:8.0f} /s   ({d / f:.2f}x the floor; target >= 0.9x)")
    print(f"  python-etcd3 lock              {e:8.0f} /s   ({e / f:.2f}x the floor)")
    lock.close()
    lease.revoke()


if __name__ == "__main__":
    bench_permit()
    bench_etcd()
