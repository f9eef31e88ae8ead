"""Metrics through the Python face (issue 22): the collector in a real
prometheus_client registry, scraped with generate_latest and read back with
prometheus_client's own parser; the same families as the core's text."""

from pathlib import Path
from typing import Any, Dict

import dlock
from dlock.prometheus import Collector, text
from prometheus_client import CollectorRegistry, generate_latest
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
    own = families(text(client))
    assert own.keys() == scraped.keys()
    for name, f in own.items():
        assert scraped[name].type == f.type, name
        got = sorted((s.name, sorted(s.labels.items())) for s in scraped[name].samples)
        want = sorted((s.name, sorted(s.labels.items())) for s in f.samples)
        assert got == want, name

    def value(name: str, **labels: str) -> float:
        fam = scraped[name]
        for s in fam.samples:
            if s.labels == labels and s.name in (name, name + "_total", name + "_count"):
                return s.value
        raise AssertionError(f"{name}{labels} not in {fam.samples}")

    assert scraped["dlock_lock_held"].type == "gauge"
    assert value("dlock_lock_held", lock="py/metrics") == 1
    assert value("dlock_lock_token", lock="py/metrics") == token
    assert scraped["dlock_fences"].type == "counter"
    assert value("dlock_fences", reason="lock_lost") == 0
    assert scraped["dlock_acquire_wait_seconds"].type == "histogram"
    assert value("dlock_acquire_wait_seconds", outcome="acquired") == 1
    assert "dlock_lock_held{lock=\"py/metrics\"} 1" in client.metrics_text()
    assert lock.healthy(0.0)
    lock.release()


#: Families a face without elections cannot fill (no samples, so no label
#: names to read); their names and types are still checked.
NO_ELECTIONS = {"dlock_election_leader"}


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
    registry = CollectorRegistry()
    registry.register(Collector(client))
    got: Dict[str, Any] = {}
    for f in text_string_to_metric_families(generate_latest(registry).decode()):
        # The parser names a counter without `_total`; the list with it.
        name = f.name + "_total" if f.type == "counter" else f.name
        labels = {tuple(k for k in s.labels if k != "le") for s in f.samples}
        assert len(labels) <= 1, (name, labels)
        if not labels:
            assert name in NO_ELECTIONS, f"{name} has no sample"
            got[name] = (f.type, fixture()[name][1])
        else:
            got[name] = (f.type, list(labels.pop()))
    assert got == fixture()
    lock.release()


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
