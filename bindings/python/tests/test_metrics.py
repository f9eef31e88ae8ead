"""Metrics through the Python face (issue 22): the collector in a real
prometheus_client registry, scraped with generate_latest and read back with
prometheus_client's own parser; the same families as the core's text."""

import gc
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import dlock
import pytest
from dlock.prometheus import Collector, text
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families


def families(payload: str) -> Dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(payload)}


def test_the_collector_scrapes_the_cores_families() -> None:
    svc = dlock.MemoryService()
    client = dlock.Client(memory=svc)
    lock = client.lock("py/metrics")
    token = lock.acquire(5)
    registry = CollectorRegistry()
    registry.register(Collector(client))
    scraped = families(generate_latest(registry).decode())
    # The collector exports every client of the process (issue 32, 2): the
    # process's page, which other tests' clients also feed.
    page = families(text())
    assert page.keys() == scraped.keys()

    def mine(samples: Any) -> List[Any]:
        # Other tests' handles may go (a GC, a drop on the driver) between
        # the two reads: compare this client's series and the unnamed ones.
        return sorted(
            (s.name, sorted(s.labels.items()))
            for s in samples
            if s.labels.get("lock", "py/metrics") == "py/metrics"
            and "election" not in s.labels
            and "semaphore" not in s.labels
            and "mode" not in s.labels
        )

    for name, f in page.items():
        assert scraped[name].type == f.type, name
        assert mine(scraped[name].samples) == mine(f.samples), name
    own = families(text(client))

    def value(fams: Dict[str, Any], name: str, **labels: str) -> float:
        fam = fams[name]
        for s in fam.samples:
            if s.labels == labels and s.name in (name, name + "_total", name + "_count"):
                return s.value
        raise AssertionError(f"{name}{labels} not in {fam.samples}")

    assert scraped["dlock_lock_held"].type == "gauge"
    assert value(scraped, "dlock_lock_held", lock="py/metrics") == 1
    assert value(scraped, "dlock_lock_token", lock="py/metrics") == token
    assert scraped["dlock_fences"].type == "counter"
    # This client's own counts: the process's include other tests' clients.
    assert value(own, "dlock_fences", reason="lock_lost") == 0
    assert scraped["dlock_acquire_wait_seconds"].type == "histogram"
    assert value(own, "dlock_acquire_wait_seconds", outcome="acquired") == 1
    assert "dlock_lock_held{lock=\"py/metrics\"} 1" in client.metrics_text()
    assert lock.healthy(0.0)
    lock.release()


def fixture() -> Dict[str, Any]:
    """core/tests/fixtures/metric-families.txt: name -> (type, label names)."""
    path = Path(__file__).resolve().parents[3] / "core" / "tests" / "fixtures" / "metric-families.txt"
    out: Dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, kind, *labels = line.split()
        out[name] = (kind, labels)
    return out


def test_the_families_are_the_fixtures() -> None:
    """generate_latest, read by prometheus_client's parser: every family of
    the checked-in list, typed and labelled alike, and no other."""
    client = dlock.Client(memory=dlock.MemoryService())
    lock = client.lock("py/fixture")
    lock.acquire(5)
    # An election led, so `dlock_election_leader` has a sample (and its
    # label names are read like every other family's).
    lead = client.election("py/fixture-election").campaign("me", timeout=5)
    slot = client.semaphore("py/fixture-semaphore", 2).acquire(timeout=5)  # dlock_semaphore_*
    reader = client.rwlock("py/fixture-rwlock").reader()  # dlock_rwlock_held
    reader.acquire(5)
    registry = CollectorRegistry()
    registry.register(Collector(client))
    got: Dict[str, Any] = {}
    for f in text_string_to_metric_families(generate_latest(registry).decode()):
        # The parser names a counter without `_total`; the list with it.
        name = f.name + "_total" if f.type == "counter" else f.name
        labels = {tuple(k for k in s.labels if k != "le") for s in f.samples}
        assert len(labels) <= 1, (name, labels)
        assert labels, f"{name} has no sample"
        got[name] = (f.type, list(labels.pop()))
    assert got == fixture()
    reader.release()
    slot.release()
    lead.resign()
    lock.release()


def value_of(payload: str, name: str, **labels: str) -> float:
    """The sample `name` (a counter with `_total`) with exactly `labels`."""
    for f in text_string_to_metric_families(payload):
        for s in f.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise AssertionError(f"{name}{labels} not in the page")


def test_counters_never_go_down_when_handles_are_dropped() -> None:
    """Issue 32, item 1: lock handles dropped (garbage-collected) keep
    their counts in the client's counters: `dlock_acquisitions_total` and
    `dlock_fences_total` never go down for the client's lifetime."""
    svc = dlock.MemoryService()
    client = dlock.Client(memory=svc)
    locks = [client.lock(f"py/gone/{i}") for i in range(5)]
    again = threading.Event()
    locks[0].on_acquired(lambda t: again.set() if locks[0].stats().acquisitions == 2 else None)
    for lock in locks:
        lock.acquire(5)
    assert svc.delete_lock_key("py/gone/0")  # a `lock_lost` fence, then a reacquisition
    assert again.wait(10)
    before = client.metrics_text()
    assert value_of(before, "dlock_acquisitions_total") == 6
    assert value_of(before, "dlock_fences_total", reason="lock_lost") == 1
    del lock, locks
    gc.collect()
    # No event says a handle's last reference is gone in the core: wait for
    # the gauge of live locks to say so.
    end = time.monotonic() + 10
    while value_of(client.metrics_text(), "dlock_session_locks") != 0:
        assert time.monotonic() < end, "the dropped locks never went"
        time.sleep(0.01)
    after = client.metrics_text()
    assert value_of(after, "dlock_acquisitions_total") == 6
    assert value_of(after, "dlock_fences_total", reason="lock_lost") == 1
    registry = CollectorRegistry()
    registry.register(Collector(client))
    assert value_of(generate_latest(registry).decode(), "dlock_acquisitions_total") >= 6


def test_several_clients_export_one_valid_page() -> None:
    """Issue 32, item 2: two clients, each registered with its own
    Collector in one registry, make one page that strict parsers accept
    (each family once), with both clients' locks in it."""
    gc.collect()
    clients = [dlock.Client(memory=dlock.MemoryService()) for _ in range(2)]
    locks: List[Any] = []
    registry = CollectorRegistry()
    for i, c in enumerate(clients):
        lock = c.lock(f"py/page/{i}")
        lock.acquire(5)
        locks.append(lock)
        registry.register(Collector(c))
    page = generate_latest(registry).decode()
    helps = [line for line in page.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps)), "a family twice"
    names = [f.name for f in text_string_to_metric_families(page)]
    assert len(names) == len(set(names)) and "dlock_lock_held" in names
    for i in range(2):
        assert value_of(page, "dlock_lock_held", lock=f"py/page/{i}") == 1
    # OpenMetrics' parser refuses a family that comes twice ("Clashing name").
    strict = openmetrics.generate_latest(registry).decode()
    assert [f.name for f in openmetrics_parser.text_string_to_metric_families(strict)]
    for lock in locks:
        lock.release()


def test_healthy_refuses_a_bad_duration_with_its_code() -> None:
    """Issue 32, item 10: a bad `max_overdue` is the dlock error with
    `.code`, like every other bad input."""
    lock = dlock.Client(memory=dlock.MemoryService()).lock("py/healthy")
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(dlock.InvalidArgument) as err:
            lock.healthy(bad)
        assert err.value.code == "invalid_argument"


def test_the_cores_log_goes_to_logging(caplog: Any) -> None:
    """The core's tracing events reach the ``dlock`` logger, levels mapped:
    acquired at INFO, a drain at WARNING."""
    import logging
    import time

    caplog.set_level(logging.DEBUG, logger="dlock")
    # Keepalives every 0.5 s: the blip below drains within one interval
    # (the default 5 s interval outlasted the 5 s wait).
    client = dlock.Client(
        memory=dlock.MemoryService(),
        ttl=2.0,
        keepalive_interval=0.5,
        keepalive_timeout=0.2,
        retry_interval=0.2,
        margin=0.5,
    )
    lock = client.lock("py/log")
    lock.acquire(5)

    def seen(level: int, word: str) -> bool:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if any(
                r.name == "dlock" and r.levelno == level and word in r.getMessage()
                for r in caplog.records
            ):
                return True
            time.sleep(0.01)
        return False

    assert seen(logging.INFO, "acquired"), caplog.records
    assert seen(logging.INFO, "py/log"), "the lock's name is in the record"
    link = client.link
    assert link is not None
    link.fail_keepalives("blip")
    assert seen(logging.WARNING, "draining"), caplog.records
    link.fail_keepalives(None)
    lock.release()
