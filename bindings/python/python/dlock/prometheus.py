"""dlock metrics for ``prometheus_client`` (issue 22; docs/metrics.md).

``prometheus_client`` is an optional extra (``pip install
'dlock-fence[prometheus]'``) imported only when a collector is made::

    from prometheus_client import REGISTRY
    from dlock.prometheus import Collector
    REGISTRY.register(Collector())

One collector exports every client of the process as one (issue 32): its
counters and gauges are the sums over the clients, as a client's are over
its sessions, and a client or lock dropped keeps its counts, so no counter
goes down. Every ``Collector`` is equal to every other with the same
``max_locks``, so registering one per client (``Collector(client)``, as
before) leaves one in the registry and the page stays valid.

Every scrape reads the core's snapshot: the names, types and labels are the
core's, the same as every other face's.

Multiprocess mode (gunicorn with ``PROMETHEUS_MULTIPROC_DIR``) does not
support custom collectors. Each worker has its own client and locks, so
either serve each worker's own registry on its own port, or write the
core's text (``dlock.prometheus.text(client)``) to a file per worker for
node_exporter's textfile collector, as ``dlock run --metrics-textfile`` does.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional

from . import _dlock

#: Per-lock series kept; the rest are folded into ``lock="_other"``: the
#: core's value, the same in every face.
DEFAULT_LOCK_SERIES: int = _dlock.DEFAULT_LOCK_SERIES


def text(client: Optional[_dlock.Client] = None) -> str:
    """The Prometheus text format of ``client``'s snapshot; without a client,
    of every client of the process (what ``Collector`` exports)."""
    if client is None:
        return _dlock.process_metrics_text()
    return _dlock.metrics_text(client)


class Collector:
    """A ``prometheus_client`` custom collector of every client of the
    process (their sessions and locks, as one); register it in the
    application's registry. ``client`` is accepted and changes nothing:
    every client is exported."""

    def __init__(self, client: Optional[_dlock.Client] = None, max_locks: int = DEFAULT_LOCK_SERIES) -> None:
        import prometheus_client.core  # noqa: F401  (the optional extra)

        if client is not None and not isinstance(client, _dlock.Client):
            raise TypeError(f"Collector takes a dlock.Client or nothing, not {type(client).__name__}")
        self._max_locks = max_locks

    # A registry keeps its collectors by equality: collectors of the same
    # process are one, so a second registration adds no second family.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Collector) and other._max_locks == self._max_locks

    def __hash__(self) -> int:
        return hash((Collector, self._max_locks))

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        for name, help_, kind, labels, series in _dlock.metrics_families(None, self._max_locks):
            family: Any
            if kind == "counter":
                family = CounterMetricFamily(name, help_, labels=labels)
            elif kind == "gauge":
                family = GaugeMetricFamily(name, help_, labels=labels)
            else:
                family = HistogramMetricFamily(name, help_, labels=labels)
            for values, number, hist in series:
                if hist is None:
                    family.add_metric(values, number)
                else:
                    bounds, cumulative, _count, total = hist
                    les: List[str] = [repr(float(b)) for b in bounds] + ["+Inf"]
                    family.add_metric(
                        values, [(le, float(c)) for le, c in zip(les, cumulative)], total
                    )
            yield family

    def describe(self) -> List[Any]:
        # Nothing to check at registration (and no scrape there).
        return []
