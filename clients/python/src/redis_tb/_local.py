"""In-memory token buckets: what `fail="local"` limits with while Redis fails. One process's buckets, with the
limits and keys the Redis ones have, so a fault never means "unlimited"; they are forgotten once Redis answers.

The arithmetic is the module's in floating point (refill `rate` per second up to `burst`; a cost above the burst
never fits), with `time.monotonic` as the clock: a stepped wall clock neither refills nor drains them. At most
`capacity` buckets are kept, the least recently used going first, so a flood of identities cannot grow memory
without bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from .limit import Limit
from .replies import AcquiredEach, BucketResult

CAPACITY = 10_000


class LocalBuckets:
    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.clock = clock
        #: key -> (tokens, at): 0 <= tokens <= burst, as of the clock reading `at` (seconds).
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()  # WSGI servers call from several threads

    def __len__(self) -> int:
        return len(self._buckets)

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()

    def acquire_each(self, limits: Sequence[Limit], keys: Sequence[str]) -> AcquiredEach:
        """Each limit's cost from its bucket, all or none: `TB.ACQUIREEACH`'s reply, computed here."""
        with self._lock:
            now = self.clock()
            tokens = [self._tokens(key, limit, now) for key, limit in zip(keys, limits, strict=True)]
            fits = [limit.cost <= held for limit, held in zip(limits, tokens, strict=True)]
            allowed = all(fits)
            if allowed:
                tokens = [held - limit.cost for limit, held in zip(limits, tokens, strict=True)]
            for key, held in zip(keys, tokens, strict=True):
                self._buckets[key] = (held, now)
                self._buckets.move_to_end(key)
            while len(self._buckets) > self.capacity:
                self._buckets.popitem(last=False)
        results = tuple(_result(limit, held, fit) for limit, held, fit in zip(limits, tokens, fits, strict=True))
        return AcquiredEach(allowed, limiting_index(results, allowed), results)

    def _tokens(self, key: str, limit: Limit, now: float) -> float:
        stored = self._buckets.get(key)
        if stored is None:
            return float(limit.burst)
        held, at = stored
        return min(float(limit.burst), held + max(0.0, now - at) * limit.rate)


def _result(limit: Limit, held: float, fits: bool) -> BucketResult:
    reset_after_ms = math.ceil((limit.burst - held) / limit.rate * 1000)
    if fits:
        retry_after_ms = 0
    elif limit.cost > limit.burst:
        retry_after_ms = -1
    else:
        retry_after_ms = math.ceil((limit.cost - held) / limit.rate * 1000)
    return BucketResult(fits, max(0, math.floor(held)), retry_after_ms, reset_after_ms)


def limiting_index(results: Sequence[BucketResult], allowed: bool) -> int:
    """As the module chooses it: refused, the first bucket whose cost exceeds its burst, else the first with the
    longest wait; allowed, the first with the fewest tokens left."""
    if allowed:
        return min(range(len(results)), key=lambda index: results[index].remaining)
    never = [index for index, result in enumerate(results) if result.retry_after_ms == -1]
    if never:
        return never[0]
    return max(range(len(results)), key=lambda index: (results[index].retry_after_ms, -index))
