"""Soak of the Python face (issue 23; scripts/soak.sh, docs/testing.md "Soak").

The run of core/tests/soak.rs through ``import dlock``: DLOCK_SOAK_CYCLES
acquire/release cycles (default 100,000), each on a lock of its own name
(``client.lock``, ``acquire``, one permit, ``release``, the handle
dropped), and DLOCK_SOAK_PERMITS permits (default 1,000,000) on one held
lock; embedded, or etcd with DLOCK_ENDPOINTS set. A tenth of each warms
up, then ten slices, each followed by ``gc.collect()`` and a sample of the
RSS, open descriptors and threads (/proc/self). Exit 1 unless the RSS stays
under DLOCK_SOAK_RSS_MIB (default 4) above the warm-up's and the
descriptors and threads equal the warm-up's. Prints one SOAK|... line
first. Not collected by pytest (the name): too slow for CI.
"""

import gc
import os
import sys
import time

import dlock


def env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "")
    return int(v) if v else default


def status_field(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name):
                return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def sample() -> dict:
    gc.collect()
    # os.listdir holds one descriptor of its own while it reads.
    return {
        "rss_kib": status_field("VmRSS:"),
        "fds": len(os.listdir("/proc/self/fd")) - 1,
        "threads": status_field("Threads:"),
    }


def main() -> int:
    cycles = env_int("DLOCK_SOAK_CYCLES", 100_000) // 10
    permits = env_int("DLOCK_SOAK_PERMITS", 1_000_000) // 10
    bound_mib = env_int("DLOCK_SOAK_RSS_MIB", 4)
    backend = "etcd" if os.environ.get("DLOCK_ENDPOINTS") else "memory"
    client = dlock.Client()
    pid = os.getpid()
    held = client.lock(f"soak/python/{pid}/held")
    held.on_fence(lambda token, in_flight: None)
    held.acquire(10.0)
    counter = iter(range(sys.maxsize))

    def run() -> None:
        for _ in range(cycles):
            lock = client.lock(f"soak/python/{pid}/{next(counter)}")
            token = lock.acquire(10.0)
            with lock.permit() as p:
                assert p.token == token
            lock.release()
        for _ in range(permits):
            held.permit().end()

    run()
    warm = sample()
    t0 = time.monotonic()
    samples = []
    for _ in range(10):
        run()
        samples.append(sample())
    seconds = time.monotonic() - t0
    end = samples[-1]
    growth = max(max(s["rss_kib"] - warm["rss_kib"] for s in samples), 0)
    print(
        f"SOAK|python|{backend}|{cycles * 10}|{permits * 10}|{seconds:.1f}|{warm['rss_kib']}|{end['rss_kib']}"
        f"|{growth}|{warm['fds']}|{end['fds']}|{warm['threads']}|{end['threads']}|{bound_mib}",
        flush=True,
    )
    ok = True
    if growth >= bound_mib * 1024:
        print(f"soak_cycles.py: RSS grew {growth} KiB after the warm-up (bound {bound_mib} MiB): {samples}", file=sys.stderr)
        ok = False
    for i, s in enumerate(samples):
        if (s["fds"], s["threads"]) != (warm["fds"], warm["threads"]):
            print(f"soak_cycles.py: slice {i}: {s}; warm-up {warm}", file=sys.stderr)
            ok = False
    if held.in_flight != 0:
        print(f"soak_cycles.py: {held.in_flight} permits in flight", file=sys.stderr)
        ok = False
    held.release()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
