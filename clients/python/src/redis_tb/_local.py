"""In-memory token buckets: what `fail="local"` limits with while Redis fails for a call. The rule is docs/clients.md
("When Redis fails") and its data `fixtures/local.json`: one process admits at most `burst + rate * t` per key over
any interval `t`, however Redis fails or flaps.

- Per key: a call that fails is decided by its own keys' buckets; an answer for one key never touches another's.
- `observe` remembers each Redis answer: the bucket holds `burst - rate * reset_after_ms / 1000` tokens as of the
  moment it arrived (negative in debt), less what this process admitted in memory and Redis has not seen yet.
- What a bucket admits is owed to Redis. While a key is diverged (something owed, or covered by a charge-back whose
  outcome is not known), every call for it that goes to Redis is preceded by its own charge-back, `TB.LOWER key
  rate burst <tokens>`: `tokens` is the in-memory bucket now, and Redis's bucket is brought down to it, never
  lower. A minimum is idempotent, so charge-backs in parallel or sent again charge nothing twice. The one that
  finds something owed covers it (its `covers`); the caller reports each as `charged` (in Redis now),
  `charge_failed` (owed again) or `charge_refused` (dropped: Redis will not take it).
- At most `capacity` keys. A new key that finds the table full takes the place of one of the `EVICTION_WINDOW`
  least recently used keys that is full again and owes nothing (nothing is lost: a key it does not know starts
  full); when none is, the key is limited by its limit's overflow bucket, which every such key shares and whose
  admissions are not charged back. A flood of identities thus shares one limit rather than going unlimited.

The arithmetic is the module's in floating point (refill `rate` per second up to `burst`; a cost above the burst
never fits; all of a call's costs or none): `Bucket`, `cost_fits` and `bucket_result`, which the `limits`
strategy's in-memory buckets (`redis_tb.limits.MemoryBuckets`) are made of too. Here it runs on a clock that only
moves forward (`time.monotonic` by default): a stepped wall clock neither refills nor drains the buckets.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .limit import Limit
from .replies import Acquired, AcquiredEach, BucketResult

#: Keys kept per process unless told otherwise (the middleware's `local_capacity`).
CAPACITY = 10_000
#: How many of the least recently used keys a new key may take the place of.
EVICTION_WINDOW = 16
#: Milliseconds this close above a whole number are that number (the refill is computed in doubles).
MS_SLACK = 1e-6
#: Tokens closer than this below a whole number count as that number, for the same reason.
EPSILON = 1e-9
#: Where the module's waits saturate (i64::MAX milliseconds).
MAX_MS = 2**63 - 1
#: The deepest debt TB.LOWER accepts, in seconds of refill (a day, as for TB.CHARGE).
DEBT_DAY_S = 86_400


@dataclass
class Bucket:
    """One bucket's state. `tokens <= burst` (negative: in debt), as of the clock reading `at` (seconds)."""

    tokens: float
    at: float
    rate: float
    burst: float
    #: Admitted in memory, covered by no charge-back sent yet.
    owed: float = 0.0
    #: Admitted in memory, covered by the charge-backs in flight (their `covers`, summed).
    charging: float = 0.0
    #: Charge-backs of this key sent and not reported yet: `charging` is exactly 0 when none is.
    in_flight: int = 0
    #: Everything admitted in memory, summed; only grows.
    admitted: float = 0.0
    #: The largest `through` of a charge-back Redis took: Redis has seen this much of `admitted`.
    confirmed: float = 0.0
    #: A limit's overflow bucket: what it admits is not charged back (no key of its own to charge).
    overflow: bool = False

    def held(self, now: float) -> float:
        return min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)

    def diverged(self) -> bool:
        """Redis's bucket may hold more than this one: something admitted here is not known to be in Redis."""
        return self.owed > 0 or self.charging > 0

    def free(self, now: float) -> bool:
        """Full again, owing nothing and no charge-back out: forgetting it loses nothing."""
        return not self.diverged() and self.in_flight == 0 and self.held(now) >= self.burst


@dataclass(frozen=True)
class ChargeBack:
    """`TB.LOWER key rate burst tokens`: Redis's bucket brought down to the key's in-memory bucket."""

    key: str
    rate: float
    burst: float
    #: The in-memory bucket's tokens when the charge-back was made, no lower than `-(rate * DEBT_DAY_S)` (the debt
    #: TB.LOWER accepts).
    tokens: float
    #: What this charge-back covers of the admitted-in-memory (0 when another in flight covers it all): `charging`
    #: while it is out, then gone (`charged`, `charge_refused`) or owed again (`charge_failed`).
    covers: float = 0.0
    #: Everything the bucket had admitted when it was made (its `admitted`): the floor covers all of it, so once
    #: Redis takes it, Redis has seen that much, whatever becomes of earlier charge-backs.
    through: float = 0.0


class LocalBuckets:
    """One process's in-memory buckets; thread-safe (WSGI servers call from several threads)."""

    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"local_capacity must be a positive integer (keys kept in memory), not {capacity!r}")
        self.capacity = capacity
        self.clock = clock
        #: key -> bucket, least recently used first.
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()
        #: (limit name, rate, burst) -> the bucket shared by the keys of that limit that found no place.
        self._overflow: dict[tuple[str, float, float], Bucket] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def acquire_each(self, limits: Sequence[Limit], keys: Sequence[str]) -> AcquiredEach:
        """Each limit's cost from its key's bucket, all or none: `TB.ACQUIREEACH`'s reply, computed here. What a
        key's own bucket admits is owed to Redis."""
        with self._lock:
            now = self.clock()
            buckets = [self._bucket(key, limit, now, keys) for key, limit in zip(keys, limits, strict=True)]
            held = [bucket.held(now) for bucket in buckets]
            fits = [cost_fits(tokens, limit.burst, limit.cost) for limit, tokens in zip(limits, held, strict=True)]
            allowed = all(fits)
            if allowed:
                held = [tokens - limit.cost for limit, tokens in zip(limits, held, strict=True)]
            for bucket, tokens, limit in zip(buckets, held, limits, strict=True):
                bucket.tokens, bucket.at = tokens, now
                if allowed and not bucket.overflow:
                    bucket.owed += limit.cost
                    bucket.admitted += limit.cost
        results = tuple(
            bucket_result(tokens, limit.rate, limit.burst, limit.cost, fit)
            for limit, tokens, fit in zip(limits, held, fits, strict=True)
        )
        return AcquiredEach(allowed, limiting_index(results, allowed), results)

    def observe(self, limits: Sequence[Limit], keys: Sequence[str], reply: Acquired | AcquiredEach) -> None:
        """Redis answered a call for `keys`: each bucket continues from the state Redis reported, as of now."""
        results: Sequence[Acquired | BucketResult] = reply.buckets if isinstance(reply, AcquiredEach) else (reply,)
        with self._lock:
            now = self.clock()
            for key, limit, result in zip(keys, limits, results, strict=True):
                bucket = self._buckets.get(key)
                if bucket is None:
                    if not self._make_room(now, keys):
                        continue  # not remembered: the key starts full next time
                    bucket = self._buckets[key] = Bucket(limit.burst, now, limit.rate, limit.burst)
                self._buckets.move_to_end(key)
                # What this process admitted and Redis has not taken yet is not in the answer. A floor Redis took
                # covers the shares of earlier charge-backs still out (their outcome can be known later): those
                # are in the answer already, not taken twice.
                unseen = min(bucket.owed + bucket.charging, bucket.admitted - bucket.confirmed)
                bucket.tokens = limit.burst - limit.rate * result.reset_after_ms / 1000 - unseen
                bucket.at, bucket.rate, bucket.burst = now, limit.rate, limit.burst

    def charge_backs(self, keys: Sequence[str]) -> list[ChargeBack]:
        """The charge-backs to send before a call for `keys` goes to Redis, in call order: one per diverged key,
        each bringing Redis down to the key's in-memory bucket now and covering what is owed. Each is then in
        flight until reported as `charged`, `charge_failed` or `charge_refused`."""
        found: list[ChargeBack] = []
        with self._lock:
            now = self.clock()
            for key in keys:
                bucket = self._buckets.get(key)
                if bucket is None or not bucket.diverged():
                    continue
                floor = max(bucket.held(now), -bucket.rate * DEBT_DAY_S)
                found.append(ChargeBack(key, bucket.rate, bucket.burst, floor, bucket.owed, bucket.admitted))
                bucket.charging += bucket.owed
                bucket.owed = 0.0
                bucket.in_flight += 1
        return found

    def charged(self, charge: ChargeBack) -> None:
        """Redis took the charge-back: what it covered is in Redis's bucket, and all that was admitted before it."""
        self._settle(charge, owed_again=False, took=True)

    def charge_failed(self, charge: ChargeBack) -> None:
        """The charge-back failed like a fault (or was never sent): what it covered is owed again, for the next call
        that reaches Redis."""
        self._settle(charge, owed_again=True)

    def charge_refused(self, charge: ChargeBack) -> None:
        """Redis refused the charge-back for good (a configuration error): what it covered is dropped."""
        self._settle(charge, owed_again=False)

    def _settle(self, charge: ChargeBack, owed_again: bool, took: bool = False) -> None:
        with self._lock:
            bucket = self._buckets.get(charge.key)
            if bucket is None:  # never: a key with a charge-back in flight is not evicted
                return
            if took:
                bucket.confirmed = max(bucket.confirmed, charge.through)
            bucket.in_flight = max(0, bucket.in_flight - 1)
            # Summed and taken back in floating point: with nothing in flight, exactly nothing is being charged.
            bucket.charging = max(0.0, bucket.charging - charge.covers) if bucket.in_flight else 0.0
            if owed_again:
                bucket.owed += charge.covers

    def _bucket(self, key: str, limit: Limit, now: float, call: Sequence[str]) -> Bucket:
        """The key's bucket (moved to the most recently used end), a new full one where there is room, else the
        limit's overflow bucket."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets.move_to_end(key)
            return bucket
        if self._make_room(now, call):
            bucket = self._buckets[key] = Bucket(limit.burst, now, limit.rate, limit.burst)
            return bucket
        shape = (limit.name, limit.rate, limit.burst)
        overflow = self._overflow.get(shape)
        if overflow is None:
            overflow = self._overflow[shape] = Bucket(limit.burst, now, limit.rate, limit.burst, overflow=True)
        return overflow

    def _make_room(self, now: float, call: Sequence[str]) -> bool:
        """Whether a new key fits: the table has room, or one of its least recently used keys (none of `call`'s)
        is full again and owes nothing, and goes."""
        if len(self._buckets) < self.capacity:
            return True
        for key, bucket in itertools.islice(self._buckets.items(), EVICTION_WINDOW):
            if key not in call and bucket.free(now):
                del self._buckets[key]
                return True
        return False


def _ceil_ms(value: float) -> int:
    """Rounded up, saturating as the module does at 2^63 - 1 (a wait beyond a double, rate 1e-300, is infinite)."""
    return math.ceil(value - MS_SLACK) if value < MAX_MS else MAX_MS


def cost_fits(held: float, burst: float, cost: float) -> bool:
    """Whether a bucket holding `held` tokens gives `cost` now (never when the cost exceeds the burst)."""
    return cost <= burst and cost <= held + EPSILON


def bucket_result(held: float, rate: float, burst: float, cost: float, fits: bool) -> BucketResult:
    """The reply fields of a bucket left holding `held` tokens after a call for `cost` that `fits` or not."""
    reset_after_ms = max(0, _ceil_ms((burst - held) / rate * 1000))
    if fits:
        retry_after_ms = 0
    elif cost > burst:
        retry_after_ms = -1
    else:
        retry_after_ms = max(1, _ceil_ms((cost - held) / rate * 1000))
    return BucketResult(fits, max(0, math.floor(held + EPSILON)), retry_after_ms, reset_after_ms)


def limiting_index(results: Sequence[BucketResult], allowed: bool) -> int:
    """As the module chooses it: refused, the first bucket whose cost exceeds its burst, else the first with the
    longest wait; allowed, the first with the fewest tokens left."""
    if allowed:
        return min(range(len(results)), key=lambda index: results[index].remaining)
    never = [index for index, result in enumerate(results) if result.retry_after_ms == -1]
    if never:
        return never[0]
    return max(range(len(results)), key=lambda index: (results[index].retry_after_ms, -index))
