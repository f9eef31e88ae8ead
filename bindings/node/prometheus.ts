// `require('dlock/prometheus')`: the metrics of every client of the
// process, as one, in the application's own prom-client Registry (issue
// 22, issue 32, docs/metrics.md). Every family,
// name, type, label and bucket comes from the core's snapshot through the
// addon (`metricFamilies`); nothing here names a metric. prom-client is an
// optional peer dependency, loaded when `register` is called. Compiled by
// `npm run build` (tsc) into prometheus.js and prometheus.d.ts.

import type { Counter, Gauge, Histogram, Metric, Registry } from 'prom-client';
import { Client, InvalidArgumentError, _native } from './index';
import type * as N from './native';

/** Per-lock series kept by default; the rest are folded into `lock="_other"`: the core's (100), as in every face. */
export const DEFAULT_LOCK_SERIES: number = _native.constants().defaultLockSeries;

export interface RegisterOptions {
  /** At most this many per-lock series (default 100); the rest are folded into one. */
  maxLocks?: number;
}

/** A histogram's value as prom-client keeps it (per-bucket counts). */
interface HistogramEntry {
  labels: Record<string, string>;
  bucketValues: Record<number, number>;
  sum: number;
  count: number;
}

/** The metrics made in each registry, by name: one set per registry, for every client. */
const made = new WeakMap<Registry, { metrics: Metric[]; names: string[] }>();

/**
 * Registers gauges, counters and histograms for every client of the
 * process (their sessions and locks, as one: sums, as a client's are over
 * its sessions; a client or lock dropped keeps its counts, so no counter
 * goes down) in `registry` (a prom-client `Registry`, e.g. its default
 * `register`); each scrape's `collect()` reads the core's snapshot once.
 * Registering again in the same registry, for another client, returns the
 * metrics already made (one page, each family once; the first `maxLocks`
 * stays). Returns the metrics (`registry.removeSingleMetric(m.name)` undoes
 * it). No HTTP server: serve `registry.metrics()` as usual.
 */
export function register(client: Client, registry: Registry, options?: RegisterOptions): Metric[] {
  if (!(client instanceof Client)) throw new TypeError('register needs a dlock Client');
  if (registry === null || typeof registry !== 'object' || typeof registry.registerMetric !== 'function') {
    throw new TypeError('registry must be a prom-client Registry');
  }
  const maxLocks = options?.maxLocks ?? DEFAULT_LOCK_SERIES;
  if (!Number.isSafeInteger(maxLocks) || maxLocks < 0 || maxLocks > 0xffffffff) {
    throw new InvalidArgumentError('invalid_argument', `options.maxLocks must be an integer >= 0, got ${maxLocks}`);
  }
  const already = made.get(registry);
  if (already !== undefined && already.names.every((n, i) => registry.getSingleMetric(n) === already.metrics[i])) {
    return already.metrics;
  }
  const prom = require('prom-client') as typeof import('prom-client');
  const families = (): N.NativeFamily[] => _native.processMetricFamilies(maxLocks);

  // One snapshot per scrape: prom-client calls every metric's collect()
  // in one synchronous pass, so the first reads and the rest reuse it.
  let scrape: Map<string, N.NativeFamily> | null = null;
  const series = (name: string): N.NativeSeries[] => {
    if (scrape === null) {
      scrape = new Map(families().map((f) => [f.name, f]));
      queueMicrotask(() => {
        scrape = null;
      });
    }
    return scrape.get(name)?.series ?? [];
  };

  const metrics: Metric[] = [];
  const names: string[] = [];
  for (const f of families()) {
    names.push(f.name);
    const { name, help, labelNames } = f;
    const labels = (values: string[]): Record<string, string> =>
      Object.fromEntries(labelNames.map((l, i) => [l, values[i]]));
    const common = { name, help, labelNames, registers: [registry] };
    if (f.kind === 'counter') {
      metrics.push(
        new prom.Counter({
          ...common,
          collect(this: Counter<string>) {
            this.reset();
            for (const s of series(name)) this.inc(labels(s.labels), s.value ?? 0);
          },
        }),
      );
    } else if (f.kind === 'gauge') {
      metrics.push(
        new prom.Gauge({
          ...common,
          collect(this: Gauge<string>) {
            this.reset();
            const now = series(name);
            // A gauge the core leaves out (no slack without a lock held)
            // is left out here too, not shown as 0.
            if (labelNames.length === 0 && now.length === 0) this.remove({});
            for (const s of now) this.set(labels(s.labels), s.value ?? 0);
          },
        }),
      );
    } else {
      const buckets = f.series[0]?.bounds ?? [];
      metrics.push(
        new prom.Histogram({
          ...common,
          buckets,
          collect(this: Histogram<string>) {
            this.reset();
            const map = (this as unknown as { hashMap: Record<string, HistogramEntry> }).hashMap;
            for (const s of series(name)) {
              const l = labels(s.labels);
              // prom-client has no setter for a whole histogram: zero()
              // makes the entry, filled from the core's cumulative counts.
              this.zero(l);
              const entry = Object.values(map).find((e) => e.labels === l);
              if (entry === undefined) throw new Error(`dlock: prom-client kept no entry for ${name}`);
              const cumulative = s.cumulative ?? [];
              let before = 0;
              (s.bounds ?? []).forEach((b, i) => {
                entry.bucketValues[b] = cumulative[i] - before;
                before = cumulative[i];
              });
              entry.count = s.count ?? 0;
              entry.sum = s.sum ?? 0;
            }
          },
        }),
      );
    }
  }
  made.set(registry, { metrics, names });
  return metrics;
}

/**
 * The Prometheus text format of `client`'s snapshot, rendered by the core
 * (no prom-client needed); without a client, of every client of the
 * process (what `register` exports).
 */
export function text(client?: Client): string {
  if (client === undefined) return _native.processMetricsText();
  if (!(client instanceof Client)) throw new TypeError('text needs a dlock Client');
  return _native.metricsText(client._n);
}
