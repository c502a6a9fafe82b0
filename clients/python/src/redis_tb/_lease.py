"""A lease: tokens a process takes from a shared bucket in batches (`TB.ACQUIREATMOST`) and spends in memory,
without giving up `burst + rate * t` over all processes together. The rule is docs/clients.md ("How a leased limit
decides") and its data `fixtures/leases.json`, which the Rust workspace's core decides by too.

- A bucket that refills toward its burst forgets what was taken from it. A grant answered with `reset_after_ms` left
  the bucket full again that long after the call was sent (less the millisecond of the reply's rounding), so of
  the grant's tokens a process may spend at most `rate * (reset - now)` at `now`, and drops the rest.
- The request whose call asked for a grant is decided by that grant when the reply arrives, from its tokens as they
  were when Redis granted them: a grant of at least its cost admits it, however long the round trip took.
- One refill is in flight per lease; the requests meanwhile wait for it. A refusal is remembered until its retry
  time. Where a grant would lose its worth within `MIN_WORTH_US` (the bucket nearly full), requests are decided by
  calls of their own until a reply says leasing pays again.

Time is the caller's monotonic clock in integer microseconds. Pure: no I/O, no clock, no lock (the caller holds
its own around each lease).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: A lease covers about this long of the process's own recent use.
LEASE_HORIZON_US = 50_000
#: A lease whose limit has not been used for this long is due to be given back.
LEASE_IDLE_US = 100_000
#: One lease takes at most this share of the burst (and at least one token, or the request's cost).
MAX_LEASE_SHARE = 0.1
#: A grant the bucket counts for less than this from when it was asked for is not worth leasing.
MIN_WORTH_US = 5_000
#: Grants kept at once; a further grant drops the one closest to its reset (dropping is always safe).
MAX_GRANTS = 4
#: The largest `max` of `TB.ACQUIREATMOST`: 2**53, so that a grant converts to a float exactly.
MAX_AT_MOST = 2**53
#: A refusal that holds for ever (the burst is below one token).
FOREVER_US = 2**63 - 1

_MICROS_PER_SEC = 1_000_000.0
_MICROS_PER_MS = 1_000


@dataclass(frozen=True)
class Call:
    """The lease is short: send `TB.ACQUIREATMOST key rate burst max` now, then `Lease.answered` (which decides this
    request) or `Lease.failed` (after which the request is admitted again)."""

    max: int


@dataclass(frozen=True)
class Refused:
    """Refused: by a refusal Redis gave less than its retry time ago, or by the reply to this request's own call.
    Retry after `retry_after_ms` (rounded up; -1: never, the burst is below one token)."""

    retry_after_ms: int


#: `"spent"`: admitted with leased tokens, no Redis call. `"wait"`: a refill is in flight, admit the request again
#: (`admit_again`) when it has ended. `"direct"`: leasing does not pay now, decide the request by a call of its own
#: (`TB.ACQUIRE`) and give its reply to `Lease.observed`.
Admit = Literal["spent", "wait", "direct"] | Call | Refused


@dataclass
class _Held:
    """The tokens left of one grant, the instant (µs) from which the bucket counts none of them, its number."""

    tokens: float
    reset_us: int
    number: int

    def worth(self, now_us: int, rate: float) -> float:
        left_s = max(self.reset_us - now_us, 0) / _MICROS_PER_SEC
        return max(min(self.tokens, left_s * rate), 0.0)


class Lease:
    """One process's lease on one limit's bucket of `rate` tokens a second up to `burst`, created at `now_us`."""

    def __init__(self, rate: float, burst: float, now_us: int) -> None:
        if not (math.isfinite(rate) and rate > 0 and math.isfinite(burst) and burst > 0):
            raise ValueError(f"a lease needs a finite rate and burst above 0, not {rate!r} and {burst!r}")
        self.rate = rate
        self.burst = burst
        #: Closest to its reset first, spent ones dropped.
        self._grants: list[_Held] = []
        #: The number of the latest grant (0: none yet).
        self._latest = 0
        self._in_flight = False
        #: The cost of the request whose admission sent the refill in flight: the reply decides it.
        self._asking: float | None = None
        #: Redis's last refusal holds until then (µs).
        self._refused_until_us: int | None = None
        #: Tokens asked for since `_demand_since_us`: the process's own recent rate.
        self._demand = 0.0
        self._demand_since_us = now_us
        self._last_use_us = now_us
        #: The latest reply left the bucket within `MIN_WORTH_US` of full: requests make calls of their own.
        self._direct = False
        #: The cost of the latest request: what `observed` sizes a lease for.
        self._cost = 1.0
        #: When the call of the newest reply so far was sent.
        self._newest_sent_us = -(2**63)
        #: The cost of the requests told to wait on the refill in flight.
        self._waiting = 0.0
        #: The cost of the requests that waited on the refill that ended last and have not been admitted again: a
        #: refill asked for meanwhile covers them too, however long ago they were counted.
        self._waking = 0.0

    @property
    def in_flight(self) -> bool:
        """Whether a refill has been sent and not yet answered."""
        return self._in_flight

    def max_lease(self) -> int:
        """The most tokens one lease asks for: `MAX_LEASE_SHARE` of the burst, at least one."""
        return min(max(math.floor(self.burst * MAX_LEASE_SHARE), 1), MAX_AT_MOST)

    def admit(self, now_us: int, cost: float) -> Admit:
        """Decides one request of `cost` tokens (at most the burst, checked by the caller) at `now_us`."""
        return self._decide(now_us, cost, counted=False)

    def admit_again(self, now_us: int, cost: float) -> Admit:
        """`admit` for a request that waited on a refill: it was counted toward the next lease's size then."""
        return self._decide(now_us, cost, counted=True)

    def admit_held(self, now_us: int, cost: float) -> Admit | None:
        """`admit`'s decision when it needs no call: `"spent"` from the leased tokens, or a remembered refusal;
        None (nothing changed) when the request must wait for the refill in flight or send one."""
        return self._held(now_us, cost, cost)

    def _decide(self, now_us: int, cost: float, *, counted: bool) -> Admit:
        self._cost = cost
        count = 0.0 if counted else cost
        if counted:
            self._waking = max(self._waking - cost, 0.0)
        decided = self._held(now_us, cost, count)
        if decided is not None:
            return decided
        if self._in_flight:
            # The requests that wait on a refill are the process's demand as much as those it decides.
            self._used(now_us, count)
            self._waiting += cost
            return "wait"
        if self._direct:
            self._used(now_us, count)
            return "direct"
        if counted:
            # The size counts the asking request once.
            self._demand = max(self._demand - cost, 0.0)
        self._in_flight = True
        self._asking = cost
        return Call(self.next_size(now_us, cost))

    def _held(self, now_us: int, cost: float, count: float) -> Admit | None:
        """`"spent"` from the leased tokens or a remembered refusal; `None` (nothing changed) otherwise."""
        if self.spend(now_us, cost):
            self._used(now_us, count)
            return "spent"
        if self._in_flight:
            return None
        refused = self._refused(now_us)
        if refused is None:
            return None
        self._used(now_us, count)
        return refused

    def answered(
        self, sent_us: int, now_us: int, granted: int, retry_after_ms: int, reset_after_ms: int
    ) -> Admit | None:
        """The reply `[granted, remaining, retry_after_ms, reset_after_ms]` of `TB.ACQUIREATMOST`, arrived at
        `now_us`, to the refill sent at `sent_us`. Returns the decision of the request that asked (`None` when none
        did): `"spent"` when the grant, with the leased tokens worth something now, covers its cost (the grant's
        own tokens first and whole), else a `Refused`."""
        self._ended()
        asking = self._asking
        self._asking = None
        worth_us = _counted_for_us(reset_after_ms)
        reset_us = sent_us + worth_us
        newest = self._newest(sent_us)
        if newest:
            self._direct = granted > 0 and worth_us < MIN_WORTH_US
        if granted <= 0:
            until_us = _refused_until(sent_us, retry_after_ms)
            if newest:
                self._refused_until_us = until_us
            if asking is None:
                return None
            self._used(now_us, asking)
            return _refusal(until_us, now_us)
        if newest:
            self._refused_until_us = None
        tokens = float(granted)
        self._latest += 1
        decision: Admit | None = None
        if asking is not None:
            # Counted as every decided request is: counting only those admitted from held tokens, a lease the
            # asking request takes whole would never grow.
            self._used(now_us, asking)
            own = min(tokens, asking)
            if own >= asking or self.spend(now_us, asking - own):
                tokens -= own
                decision = "spent"
            else:
                # Redis held fewer whole tokens than the cost: the part missing, at the bucket's rate.
                missing = asking - tokens - self.spendable(now_us)
                decision = Refused(max(math.ceil(missing / self.rate * 1_000.0), 1))
        if tokens > 0.0:
            if len(self._grants) >= MAX_GRANTS:
                self._grants.pop(0)
            self._grants.append(_Held(tokens, reset_us, self._latest))
            # Spent closest to their reset first: those lose their worth soonest.
            self._grants.sort(key=lambda held: held.reset_us)
        return decision

    def failed(self) -> None:
        """The refill failed: nothing is known to be granted, and tokens Redis may have granted are never spent."""
        self._ended()
        # The requests that waited are decided by the tokens held, then calls of their own: none asks again.
        self._waking = 0.0
        self._asking = None

    def dropped(self) -> None:
        """The refill was dropped before its reply (its request went away): nothing is known to be granted, and the
        requests that waited on it are admitted again (`admit_again`), the first of them sending a refill that covers
        the others."""
        self._ended()
        self._asking = None

    def _ended(self) -> None:
        """The refill in flight ended: the requests that waited on it are to be admitted again."""
        self._in_flight = False
        self._waking, self._waiting = self._waiting, 0.0

    def observed(self, sent_us: int, now_us: int, allowed: bool, retry_after_ms: int, reset_after_ms: int) -> None:
        """The reply `[allowed, remaining, retry_after_ms, reset_after_ms]`, arrived at `now_us`, to a request's own
        call sent at `sent_us`. A refusal is remembered until `sent + retry_after`; leasing pays again once a lease
        taken now would be worth `MIN_WORTH_US`. An older reply than one already given changes nothing."""
        if not self._newest(sent_us):
            return
        if allowed:
            self._refused_until_us = None
        elif retry_after_ms > 0:
            self._refused_until_us = _refused_until(sent_us, retry_after_ms)
        refill_us = int(self._size_for(now_us, self._cost) / self.rate * _MICROS_PER_SEC)
        self._direct = _counted_for_us(reset_after_ms) + refill_us < MIN_WORTH_US

    def idle(self, now_us: int) -> bool:
        """Whether the limit has not been used for `LEASE_IDLE_US` at `now_us`."""
        return now_us - self._last_use_us >= LEASE_IDLE_US

    def spendable(self, now_us: int) -> float:
        """Tokens the process may spend at `now_us`: over its grants, `min(held, rate * (reset - now))`."""
        total = 0.0
        for held in self._grants:  # added left to right, as the Rust core does (sum() compensates on 3.12)
            total += held.worth(now_us, self.rate)
        return total

    def spend(self, now_us: int, cost: float) -> bool:
        """Spends `cost` leased tokens at `now_us` if the lease holds that many, the grants closest to their reset
        first; otherwise spends nothing. Each grant first drops what the bucket no longer counts."""
        for held in self._grants:
            held.tokens = held.worth(now_us, self.rate)
        self._grants = [held for held in self._grants if held.tokens > 0.0]
        if self.spendable(now_us) < cost:
            return False
        owed = cost
        for held in self._grants:
            take = min(held.tokens, owed)
            held.tokens -= take
            owed -= take
        self._grants = [held for held in self._grants if held.tokens > 0.0]
        return True

    def refund_due(self, now_us: int) -> bool:
        """Whether the lease is due to be given back: it holds tokens, no refill is in flight, and it is idle."""
        return not self._in_flight and self.idle(now_us) and self.refundable(now_us) > 0.0

    def refundable(self, now_us: int) -> float:
        """The part of the latest grant the bucket still counts at `now_us` (0 once that grant is spent)."""
        for held in self._grants:
            if held.number == self._latest:
                return held.worth(now_us, self.rate)
        return 0.0

    def give_back(self, now_us: int, unchanged: bool) -> float:
        """Ends the lease at `now_us` and drops every held token; returns the amount to send as `TB.REFUND` (0: send
        nothing). Only when `unchanged` (the bucket is as the latest grant left it) is anything refunded: any other
        refund could raise the bucket under tokens other processes still hold."""
        amount = self.refundable(now_us) if unchanged else 0.0
        self._grants.clear()
        return amount

    def next_size(self, now_us: int, cost: float) -> int:
        """The next lease's size at `now_us` for a request of `cost`, starting a new measuring window."""
        size = self._size_for(now_us, cost)
        self._demand = 0.0
        self._demand_since_us = now_us
        # This refill covers the requests still to be admitted; those told to wait on it count in `_waiting`.
        self._waking = 0.0
        return size

    def _size_for(self, now_us: int, cost: float) -> int:
        window_us = max(now_us - self._demand_since_us, LEASE_HORIZON_US)
        wanted = max((self._demand + cost) * LEASE_HORIZON_US / window_us, self._waking + cost)
        need = min(max(math.ceil(cost), 1), MAX_AT_MOST)
        return max(min(max(math.ceil(wanted), 1), self.max_lease()), need)

    def _refused(self, now_us: int) -> Refused | None:
        until_us = self._refused_until_us
        if until_us is None or until_us <= now_us:
            return None
        return _refusal(until_us, now_us)

    def _newest(self, sent_us: int) -> bool:
        if sent_us < self._newest_sent_us:
            return False
        self._newest_sent_us = sent_us
        return True

    def _used(self, now_us: int, cost: float) -> None:
        self._demand += cost
        self._last_use_us = now_us


def _refused_until(sent_us: int, retry_after_ms: int) -> int:
    """Until when a refusal of a call sent at `sent_us` holds: for ever when `retry_after_ms` is -1, and where the
    core's 64-bit instant saturates."""
    return FOREVER_US if retry_after_ms < 0 else min(sent_us + retry_after_ms * _MICROS_PER_MS, FOREVER_US)


def _refusal(until_us: int, now_us: int) -> Refused:
    """The refusal at `now_us` of a request refused until `until_us`: its wait in whole ms, rounded up."""
    if until_us == FOREVER_US:
        return Refused(-1)
    return Refused((max(until_us - now_us, 0) + _MICROS_PER_MS - 1) // _MICROS_PER_MS)


def _counted_for_us(reset_after_ms: int) -> int:
    """How long after a call was sent the bucket still counts what it took: less the millisecond of rounding."""
    return min(reset_after_ms * _MICROS_PER_MS, FOREVER_US) - _MICROS_PER_MS
