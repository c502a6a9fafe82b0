"""Typed replies, one per command. Field names and meanings are the module's (see the README's command
reference); every integer is exactly what the server sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Acquired:
    """`TB.ACQUIRE`: whether `cost` tokens were taken."""

    allowed: bool
    #: Whole tokens left after the call (rounded down; 0 for a bucket in debt).
    remaining: int
    #: 0 when allowed; -1 when the cost exceeds the burst (never succeeds); else ms until the cost is there.
    retry_after_ms: int
    #: Milliseconds until the bucket is full again (rounded up); 0 when full.
    reset_after_ms: int


@dataclass(frozen=True)
class AcquiredAll:
    """`TB.ACQUIREALL`: one cost from every bucket, all or none."""

    allowed: bool
    #: The smallest `remaining` over the buckets.
    remaining: int
    #: 0 when allowed; -1 if the cost exceeds some bucket's burst; else the longest wait.
    retry_after_ms: int
    #: The longest time until a bucket is full again.
    reset_after_ms: int
    #: 0-based index of the bucket that decided (the one refused, or the one with the fewest tokens left).
    limiting_index: int


@dataclass(frozen=True)
class BucketResult:
    """One bucket of a `TB.ACQUIREEACH` reply."""

    #: Whether this bucket alone holds its cost now.
    fits: bool
    remaining: int
    #: 0 when it fits; -1 when its cost exceeds its burst; else ms until it fits.
    retry_after_ms: int
    reset_after_ms: int


@dataclass(frozen=True)
class AcquiredEach:
    """`TB.ACQUIREEACH`: a cost per bucket, all or none, with a result per bucket in argument order."""

    allowed: bool
    limiting_index: int
    buckets: tuple[BucketResult, ...]

    @property
    def limiting(self) -> BucketResult:
        """The bucket that decided the reply."""
        return self.buckets[self.limiting_index]

    @property
    def retry_after_ms(self) -> int:
        """0 when allowed, else the limiting bucket's wait (-1: never)."""
        return 0 if self.allowed else self.limiting.retry_after_ms


@dataclass(frozen=True)
class PartialGrant:
    """`TB.ACQUIREATMOST`: up to `max` whole tokens, as many as the bucket holds."""

    #: Whole tokens taken (0 when less than one token is there).
    granted: int
    remaining: int
    #: 0 when something was granted; -1 when the burst is below one token; else ms until one token is there.
    retry_after_ms: int
    reset_after_ms: int


@dataclass(frozen=True)
class Reservation:
    """`TB.RESERVE`: tokens taken now for the caller to act after `wait_ms`."""

    granted: bool
    #: Granted: ms to wait before acting (0: now). Refused: the wait a grant needed (-1: cost > burst).
    wait_ms: int
    remaining: int
    reset_after_ms: int


@dataclass(frozen=True)
class Refunded:
    """`TB.REFUND`: whether tokens went back into the bucket."""

    refunded: bool
    remaining: int
    reset_after_ms: int


class ThrottleReply(NamedTuple):
    """`CL.THROTTLE`: redis-cell's reply, field for field (a tuple, as redis-cell's clients unpack it)."""

    #: True when the call was refused (the opposite sense of `Acquired.allowed`).
    limited: bool
    #: `max_burst + 1`.
    limit: int
    #: Requests of quantity 1 the key admits now, after this call.
    remaining: int
    #: Seconds until this call would be allowed (rounded up past a whole ms); -1 when allowed, and when the
    #: quantity exceeds the limit (never).
    retry_after: int
    #: Seconds until the key is empty again (the same rounding).
    reset_after: int


@dataclass(frozen=True)
class Charged:
    """`TB.CHARGE` and `TB.BLOCK`: the bucket after a charge that always lands, or a block."""

    remaining: int
    #: Milliseconds until one whole token is there (0: now; -1: the burst is below one token).
    retry_after_ms: int
    reset_after_ms: int
