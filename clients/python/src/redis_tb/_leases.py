"""A middleware's leased limits (`Limit(lease=True)`; docs/clients.md, "How a leased limit decides"): one `Lease` per
bucket key, which takes the limit's tokens from Redis in batches (`TB.ACQUIREATMOST`) and admits requests from them
in memory, keeping the bound exact over every process.

- One refill is in flight per key; the requests that come meanwhile wait for it (`Waiting`), counted toward the
  next lease's size, then are decided again.
- Redis's refusal is remembered until its retry time: refused requests make no call.
- At most `capacity` keys hold a lease; a key that finds no place is decided by its own Redis call, as a limit
  without lease. Idle leases make room.
- Where grants lose their worth within milliseconds (the bucket nearly full), each request is decided by its own
  Redis call until a lease would pay again.

The clock (`time.monotonic_ns`) is read under the table's lock, so that no decision values held tokens at an
earlier instant than the one it is made at. Thread-safe: the WSGI middleware decides in many threads.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from ._lease import LEASE_IDLE_US, Call, Lease, Refused
from .limit import Limit
from .replies import BucketResult, PartialGrant

logger = logging.getLogger("redis_tb")


class Own(Enum):
    """A request of a leased limit decided by a call of its own (`TB.ACQUIRE`), as a limit without lease."""

    #: No place for this key's lease.
    NO_ROOM = "no room"
    #: The bucket is nearly full, where a grant loses its worth within milliseconds.
    DIRECT = "direct"


@dataclass(frozen=True)
class Refill:
    """Send `TB.ACQUIREATMOST key rate burst max` now, then `Leases.answered` or `Leases.ended`."""

    max: int


@dataclass
class _Last:
    """Redis's latest grant reply for a key: what the headers of a leased limit start from."""

    remaining: int
    reset_after_ms: int
    #: When the refill was sent (µs).
    sent_us: int


@dataclass
class _Slot:
    lease: Lease
    #: When the refill in flight was sent (µs).
    sent_us: int
    last: _Last | None = None
    #: Counts the refills ended; whether the latest one failed.
    round: int = 0
    failed: bool = False
    #: Called once the refill in flight ends.
    waiters: list[Callable[[], object]] = field(default_factory=list)

    def result(self, fits: bool, retry_after_ms: int, now_us: int, limit: Limit) -> BucketResult:
        """This lease at `now_us` as a bucket's result: `remaining` is what Redis last said it kept plus what this
        process may still spend of its grants; the reset counts from Redis's last reply."""
        spendable = self.lease.spendable(now_us)
        if self.last is None:
            remaining, reset_after_ms = float(limit.burst), 0
        else:
            elapsed_ms = max(now_us - self.last.sent_us, 0) // 1_000
            remaining = self.last.remaining + spendable
            reset_after_ms = max(self.last.reset_after_ms - elapsed_ms, 0)
        return BucketResult(fits, max(math.floor(min(remaining, limit.burst)), 0), retry_after_ms, reset_after_ms)


class Waiting:
    """A refill in flight that a request waits on, until `deadline` (`time.monotonic`): `register(callback)` has
    the callback called once the refill ends (at once if it already has); then `failed` says whether it failed."""

    def __init__(self, leases: Leases, slot: _Slot, deadline: float) -> None:
        self._leases = leases
        self._slot = slot
        self._round = slot.round
        self.deadline = deadline

    def register(self, callback: Callable[[], object]) -> None:
        with self._leases.lock:
            if self._slot.round == self._round:
                self._slot.waiters.append(callback)
                return
        callback()

    @property
    def ended(self) -> bool:
        """Whether the refill waited on has ended."""
        with self._leases.lock:
            return self._slot.round != self._round

    @property
    def failed(self) -> bool:
        with self._leases.lock:
            return self._slot.failed


#: What a request of a leased limit does next: decided (its bucket's result), send a refill, wait for the one in
#: flight, or make a call of its own.
Step = BucketResult | Refill | Waiting | Own


def _never() -> BucketResult:
    """The result for a cost above the burst: refused, and waiting never helps."""
    return BucketResult(False, 0, -1, 0)


class Leases:
    """The leases of one middleware, one per key of a leased limit, for at most `capacity` keys."""

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._capacity = capacity
        #: When idle leases were last swept from a full table (µs).
        self._swept_us: int | None = None

    @staticmethod
    def now_us() -> int:
        return time.monotonic_ns() // 1_000

    def held(self, key: str, limit: Limit) -> BucketResult | None:
        """The decision for one request on `key` when the lease makes it without a call: from the tokens it holds,
        or by Redis's remembered refusal. None (nothing changed): it must wait or refill, or `key` has no lease."""
        if limit.cost > limit.burst:
            return _never()
        with self.lock:
            now_us = self.now_us()
            slot = self._slots.get(key)
            if slot is None:
                return None
            decided = slot.lease.admit_held(now_us, limit.cost)
            return self._decided(slot, decided, now_us, limit)

    def admit(self, key: str, limit: Limit, waited: bool, deadline: float) -> Step:
        """Decides one request on `key`'s lease: spend leased tokens, refuse from a remembered refusal, send a
        refill, wait (until `deadline`) for the one in flight, or call Redis directly. `waited`: it waited on a
        refill before, and was counted toward the next lease's size then."""
        if limit.cost > limit.burst:
            return _never()
        with self.lock:
            now_us = self.now_us()
            slot = self._slot(key, limit, now_us)
            if slot is None:
                return Own.NO_ROOM
            admit = slot.lease.admit_again(now_us, limit.cost) if waited else slot.lease.admit(now_us, limit.cost)
            if isinstance(admit, Call):
                slot.sent_us = now_us
                return Refill(max(admit.max, 1))
            if admit == "wait":
                return Waiting(self, slot, deadline)
            if admit == "direct":
                return Own.DIRECT
            decided = self._decided(slot, admit, now_us, limit)
            assert decided is not None
            return decided

    def answered(self, key: str, limit: Limit, grant: PartialGrant) -> BucketResult:
        """The refill of `key` was answered with `grant`: the decision of the request that sent it (its tokens
        count as taken when Redis granted them). The requests waiting on it are told."""
        refused = BucketResult(False, grant.remaining, grant.retry_after_ms, grant.reset_after_ms)
        with self.lock:
            now_us = self.now_us()
            slot = self._slots.get(key)
            if slot is None:
                return refused
            decision = slot.lease.answered(
                slot.sent_us, now_us, grant.granted, grant.retry_after_ms, grant.reset_after_ms
            )
            slot.last = _Last(grant.remaining, grant.reset_after_ms, slot.sent_us)
            waiters = self._end(slot, failed=False)
            result = self._decided(slot, decision, now_us, limit) or refused
        _call(waiters)
        return result

    def ended(self, key: str, *, failed: bool) -> None:
        """The refill of `key` ended without a grant: nothing is known to be granted. `failed`: Redis failed it, and
        the requests waiting on it take the leased tokens, then a call of their own; else it was dropped (its
        request went away), and they are decided again, one of them sending the next refill."""
        with self.lock:
            slot = self._slots.get(key)
            if slot is None or not slot.lease.in_flight:
                return
            if failed:
                slot.lease.failed()
            else:
                slot.lease.dropped()
            waiters = self._end(slot, failed=failed)
        _call(waiters)

    def observed(self, key: str, sent_us: int, result: BucketResult) -> None:
        """Redis answered a call of `key`'s own, sent at `sent_us`: its refusal is remembered, and whether leasing
        pays again."""
        with self.lock:
            slot = self._slots.get(key)
            if slot is not None:
                slot.lease.observed(sent_us, self.now_us(), result.fits, result.retry_after_ms, result.reset_after_ms)

    def spend_held(self, key: str, limit: Limit) -> BucketResult | None:
        """After a failed refill: the request's cost from the leased tokens, if they hold it."""
        with self.lock:
            now_us = self.now_us()
            slot = self._slots.get(key)
            if slot is None or not slot.lease.spend(now_us, limit.cost):
                return None
            return slot.result(True, 0, now_us, limit)

    def spendable(self, key: str) -> float:
        """The tokens this process may spend now of `key`'s lease (0 without one)."""
        with self.lock:
            slot = self._slots.get(key)
            return 0.0 if slot is None else slot.lease.spendable(self.now_us())

    def peek(self, key: str, limit: Limit) -> BucketResult:
        """`key`'s lease as a result, taking nothing: for a leased limit of a request another limit refused."""
        with self.lock:
            now_us = self.now_us()
            slot = self._slots.get(key)
            if slot is None:
                return BucketResult(True, math.floor(limit.burst), 0, 0)
            return slot.result(slot.lease.spendable(now_us) >= limit.cost, 0, now_us, limit)

    def _decided(self, slot: _Slot, decided: object, now_us: int, limit: Limit) -> BucketResult | None:
        if decided == "spent":
            return slot.result(True, 0, now_us, limit)
        if isinstance(decided, Refused):
            return slot.result(False, decided.retry_after_ms, now_us, limit)
        return None

    @staticmethod
    def _end(slot: _Slot, *, failed: bool) -> list[Callable[[], object]]:
        slot.round += 1
        slot.failed = failed
        waiters, slot.waiters = slot.waiters, []
        return waiters

    def _slot(self, key: str, limit: Limit, now_us: int) -> _Slot | None:
        """`key`'s slot, a new one if there is room (idle leases are swept from a full table at most once per
        `LEASE_IDLE_US`, so a flood of new keys costs no sweep each)."""
        slot = self._slots.get(key)
        if slot is not None:
            return slot
        if len(self._slots) >= self._capacity:
            if self._swept_us is not None and now_us - self._swept_us < LEASE_IDLE_US:
                return None
            self._swept_us = now_us
            self._slots = {
                key: kept for key, kept in self._slots.items() if kept.lease.in_flight or not kept.lease.idle(now_us)
            }
            if len(self._slots) >= self._capacity:
                return None
        slot = _Slot(Lease(float(limit.rate), float(limit.burst), now_us), now_us)
        self._slots[key] = slot
        return slot


def _call(waiters: list[Callable[[], object]]) -> None:
    """Tells each waiter, whatever another's callback raises (a closed event loop): none is left to its deadline."""
    for waiter in waiters:
        try:
            waiter()
        except Exception:
            logger.exception("redis-tb: waking a request that waited on a refill failed")
