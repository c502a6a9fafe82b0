"""The middleware's Prometheus metrics (docs/operating.md, "Watching the middleware"), kept by `prometheus_client`
when it is installed (`pip install redis-tb[prometheus]`).

One `Metrics` per registry, made on first use and shared by every middleware of the process that counts into that
registry: `prometheus_client` refuses to register a name twice, and two middlewares of one app (ASGI and WSGI, or
one per route) are meant to add to the same series. Label values are fixed words and limit names only, never an
identity: the number of series is bounded by the configuration. The fixed values are made at once, so that they
are scraped from 0 (a rate over a series that appears with its first event misses that event).
"""

from __future__ import annotations

import bisect
import threading
import weakref
from typing import Any

try:
    import prometheus_client
    import prometheus_client.core
except ImportError:  # the extra is not installed: no metrics by default
    prometheus_client = None  # type: ignore[assignment]

#: Upper bounds of `redis_tb_call_duration_seconds`'s buckets: 0.5 ms to 2.5 s.
DURATION_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("allowed", "refused", "shadow_refused", "skipped")
SOURCES = ("module", "function", "script", "lease", "local", "open", "closed")


class _Default:
    """The `metrics` option's default: the default registry when `prometheus_client` is installed, else none."""

    def __repr__(self) -> str:
        return "DEFAULT_REGISTRY"


DEFAULT_REGISTRY: Any = _Default()


class Metrics:
    """The counts of one registry, kept here and read by `prometheus_client` at each scrape (a custom collector, its
    documented way to export values an application holds). A request costs one lock and a few additions here;
    `prometheus_client`'s own Counter and Histogram take a lock per value and per call, which made the middleware's
    own work per request 5% longer (scripts/bench_python.py, section 3)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = dict.fromkeys(OUTCOMES, 0)
        self._refusals: dict[str, int] = {}
        self._decisions = dict.fromkeys(SOURCES, 0)
        self._failures: dict[str, int] = {}
        #: Calls per duration bucket (not cumulative), the last one beyond the largest bound.
        self._durations = [0] * (len(DURATION_BOUNDS_S) + 1)
        self._duration_sum_s = 0.0

    def request(self, outcome: str, refused: tuple[str, ...] = ()) -> None:
        """A request's outcome, and the limits whose bucket did not fit (refused or shadow-refused)."""
        with self._lock:
            self._requests[outcome] += 1
            for name in refused:
                self._refusals[name] = self._refusals.get(name, 0) + 1

    def decided(self, source: str, seconds: float) -> None:
        """A limiter call ended, answered by `source` after `seconds`."""
        with self._lock:
            self._decisions[source] += 1
            self._durations[bisect.bisect_left(DURATION_BOUNDS_S, seconds)] += 1
            self._duration_sum_s += seconds

    def failed(self, class_: str) -> None:
        with self._lock:
            self._failures[class_] = self._failures.get(class_, 0) + 1

    def describe(self) -> list[Any]:
        return self.collect()

    def collect(self) -> list[Any]:
        """The metric families as they are now, for `prometheus_client` to write out."""
        assert prometheus_client is not None
        core = prometheus_client.core
        with self._lock:
            requests, refusals = dict(self._requests), dict(self._refusals)
            decisions, failures = dict(self._decisions), dict(self._failures)
            durations, duration_sum_s = list(self._durations), self._duration_sum_s
        families: list[Any] = []
        for name, help_text, label, counts in (
            ("redis_tb_requests", "Requests the rate-limit middleware saw, by outcome", "outcome", requests),
            (
                "redis_tb_refusals",
                "Per refused or shadow-refused request, each limit whose bucket did not fit",
                "limit",
                refusals,
            ),
            (
                "redis_tb_decisions",
                "Limiter calls by what decided: the backend that answered or the fail mode",
                "source",
                decisions,
            ),
            ("redis_tb_redis_failures", "Limiter calls that failed, by the failure table's class", "class", failures),
        ):
            family = core.CounterMetricFamily(name, help_text, labels=[label])
            for value, count in counts.items():
                family.add_metric([value], count)
            families.append(family)
        cumulative, buckets = 0, []
        for bound, count in zip((*(str(bound) for bound in DURATION_BOUNDS_S), "+Inf"), durations, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        families.append(
            core.HistogramMetricFamily(
                "redis_tb_call_duration_seconds",
                "The limiter call: the Redis round trip, or the fail mode's answer",
                buckets=buckets,
                sum_value=duration_sum_s,
            )
        )
        return families


_registries: weakref.WeakKeyDictionary[Any, Metrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def metrics_for(option: Any) -> Metrics | None:
    """The `metrics` option as the metrics to count into: None (no metrics), a registry, or the default (the
    default registry when `prometheus_client` is installed, else none)."""
    if option is None:
        return None
    if option is DEFAULT_REGISTRY:
        if prometheus_client is None:
            return None
        option = prometheus_client.REGISTRY
    elif prometheus_client is None or not isinstance(option, prometheus_client.CollectorRegistry):
        raise ValueError(
            f"metrics must be a prometheus_client CollectorRegistry or None (pip install redis-tb[prometheus]), "
            f"not {option!r}"
        )
    with _lock:
        metrics = _registries.get(option)
        if metrics is None:
            metrics = _registries[option] = Metrics()
            option.register(metrics)
        return metrics
