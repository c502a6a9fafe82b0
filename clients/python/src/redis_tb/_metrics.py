"""The middleware's Prometheus metrics (docs/operating.md, "Watching the middleware"), kept by `prometheus_client`
when it is installed (`pip install redis-tb[prometheus]`).

One `Metrics` per registry, made on first use and shared by every middleware of the process that counts into that
registry: `prometheus_client` refuses to register a name twice, and two middlewares of one app (ASGI and WSGI, or
one per route) are meant to add to the same series. Label values are fixed words and limit names only, never an
identity: the number of series is bounded by the configuration. The fixed values are made at once, so that they
are scraped from 0 (a rate over a series that appears with its first event misses that event).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

try:
    import prometheus_client
except ImportError:  # the extra is not installed: no metrics by default
    prometheus_client = None  # type: ignore[assignment]

#: Upper bounds of `redis_tb_call_duration_seconds`'s buckets: 0.5 ms to 2.5 s.
DURATION_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("allowed", "refused", "shadow_refused", "skipped")
SOURCES = ("module", "function", "script", "local", "open", "closed")


class _Default:
    """The `metrics` option's default: the default registry when `prometheus_client` is installed, else none."""

    def __repr__(self) -> str:
        return "DEFAULT_REGISTRY"


DEFAULT_REGISTRY: Any = _Default()


class Metrics:
    """The five metrics of one registry, with the children of the fixed label values bound once (`labels()` takes a
    lock and a dict lookup each time it is called)."""

    def __init__(self, registry: Any) -> None:
        assert prometheus_client is not None
        counter, histogram = prometheus_client.Counter, prometheus_client.Histogram
        requests = counter(
            "redis_tb_requests",
            "Requests the rate-limit middleware saw, by outcome",
            ["outcome"],
            registry=registry,
        )
        self._refusals = counter(
            "redis_tb_refusals",
            "Per refused or shadow-refused request, each limit whose bucket did not fit",
            ["limit"],
            registry=registry,
        )
        decisions = counter(
            "redis_tb_decisions",
            "Limiter calls by what decided: the backend that answered or the fail mode",
            ["source"],
            registry=registry,
        )
        self._failures = counter(
            "redis_tb_redis_failures",
            "Limiter calls that failed, by the failure table's class",
            ["class"],
            registry=registry,
        )
        self.duration = histogram(
            "redis_tb_call_duration_seconds",
            "The limiter call: the Redis round trip, or the fail mode's answer",
            buckets=DURATION_BOUNDS_S,
            registry=registry,
        )
        self.requests = {outcome: requests.labels(outcome) for outcome in OUTCOMES}
        self.decisions = {source: decisions.labels(source) for source in SOURCES}
        self._by_limit: dict[str, Any] = {}
        self._by_class: dict[str, Any] = {}

    def refused(self, limits: tuple[str, ...]) -> None:
        for name in limits:
            child = self._by_limit.get(name)
            if child is None:
                child = self._by_limit[name] = self._refusals.labels(name)
            child.inc()

    def failed(self, class_: str) -> None:
        child = self._by_class.get(class_)
        if child is None:
            child = self._by_class[class_] = self._failures.labels(class_)
        child.inc()


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
            metrics = _registries[option] = Metrics(option)
        return metrics
