"""dlock metrics for ``prometheus_client`` (issue 22; docs/metrics.md).

``prometheus_client`` is an optional extra (``pip install dlock[prometheus]``)
imported only when a collector is made::

    from prometheus_client import REGISTRY
    from dlock.prometheus import Collector
    REGISTRY.register(Collector(client))

Every scrape reads the client's snapshot from the core: the names, types and
labels are the core's, the same as every other face's.

Multiprocess mode (gunicorn with ``PROMETHEUS_MULTIPROC_DIR``) does not
support custom collectors. Each worker has its own client and locks, so
either serve each worker's own registry on its own port, or write the
core's text (``dlock.prometheus.text(client)``) to a file per worker for
node_exporter's textfile collector, as ``dlock run --metrics-textfile`` does.
"""

from __future__ import annotations

from typing import Any, Iterator, List

from . import _dlock

#: Per-lock series kept; the rest are folded into ``lock="_other"``.
DEFAULT_LOCK_SERIES = 100


def text(client: _dlock.Client) -> str:
    """The Prometheus text format of ``client``'s snapshot."""
    return _dlock.metrics_text(client)


class Collector:
    """A ``prometheus_client`` custom collector of ``client``'s sessions and
    locks; register it in the application's registry."""

    def __init__(self, client: _dlock.Client, max_locks: int = DEFAULT_LOCK_SERIES) -> None:
        import prometheus_client.core  # noqa: F401  (the optional extra)

        self._client = client
        self._max_locks = max_locks

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        for name, help_, kind, labels, series in _dlock.metrics_families(
            self._client, self._max_locks
        ):
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
