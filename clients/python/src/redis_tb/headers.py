"""HTTP header fields from a decision: one mapping, shared with the Node package (docs/headers.md).

- `standard="draft"`: the IETF draft's `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers,
  revision 11), one list member per bucket:
  `RateLimit-Policy: "<name>";q=<burst>;w=<ceil(burst / rate)>` and
  `RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>`.
- `standard="legacy"`: the older drafts' `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`, all three
  from the limiting bucket (the one that refused, or the one with the fewest tokens left).
- `standard="both"` (the default): both sets.
- `Retry-After` (RFC 9110): on a refusal, `ceil(retry_after_ms / 1000)` whole seconds; left out when the cost
  exceeds the burst (`retry_after_ms` -1: waiting never helps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .limit import Limit
from .replies import Acquired, AcquiredAll, AcquiredEach

Standard = Literal["draft", "legacy", "both"]
STANDARDS: tuple[Standard, ...] = ("draft", "legacy", "both")


@dataclass(frozen=True)
class BucketStatus:
    """One bucket as a reply left it."""

    limit: Limit
    remaining: int
    reset_after_ms: int


def _seconds_up(ms: int) -> int:
    return max(0, math.ceil(ms / 1000))


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string: quoted, with `\\` and `"` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quota(limit: Limit) -> int:
    """Whole requests the burst allows (the draft's `q` is an integer)."""
    return math.floor(limit.burst)


def rate_limit_headers(
    buckets: Sequence[BucketStatus],
    *,
    limiting_index: int = 0,
    allowed: bool = True,
    retry_after_ms: int | None = None,
    standard: Standard = "both",
) -> list[tuple[str, str]]:
    """The header fields for a decision over `buckets` (one for `TB.ACQUIRE`, one per bucket for
    `TB.ACQUIREEACH`). `retry_after_ms` is used only when `allowed` is false."""
    if standard not in STANDARDS:
        raise ValueError(f"standard must be one of {STANDARDS}, not {standard!r}")
    headers: list[tuple[str, str]] = []
    if buckets and standard in ("draft", "both"):
        policies = ", ".join(
            f"{_sf_string(b.limit.name)};q={_quota(b.limit)};w={max(1, math.ceil(b.limit.burst / b.limit.rate))}"
            for b in buckets
        )
        current = ", ".join(
            f"{_sf_string(b.limit.name)};r={b.remaining};t={_seconds_up(b.reset_after_ms)}" for b in buckets
        )
        headers += [("RateLimit-Policy", policies), ("RateLimit", current)]
    if buckets and standard in ("legacy", "both"):
        limiting = buckets[limiting_index if 0 <= limiting_index < len(buckets) else 0]
        headers += [
            ("RateLimit-Limit", str(_quota(limiting.limit))),
            ("RateLimit-Remaining", str(limiting.remaining)),
            ("RateLimit-Reset", str(_seconds_up(limiting.reset_after_ms))),
        ]
    if not allowed and retry_after_ms is not None and retry_after_ms >= 0:
        headers.append(("Retry-After", str(_seconds_up(retry_after_ms))))
    return headers


def headers_for(
    limits: Sequence[Limit],
    reply: Acquired | AcquiredAll | AcquiredEach,
    *,
    standard: Standard = "both",
) -> list[tuple[str, str]]:
    """The header fields for a reply: `TB.ACQUIRE`'s with its one limit, `TB.ACQUIREEACH`'s with one limit per
    bucket in call order, or `TB.ACQUIREALL`'s (which reports only the limiting bucket, so only that bucket's
    limit appears)."""
    if isinstance(reply, AcquiredEach):
        statuses = [
            BucketStatus(limit, b.remaining, b.reset_after_ms) for limit, b in zip(limits, reply.buckets, strict=True)
        ]
        return rate_limit_headers(
            statuses,
            limiting_index=reply.limiting_index,
            allowed=reply.allowed,
            retry_after_ms=reply.retry_after_ms,
            standard=standard,
        )
    index = reply.limiting_index if isinstance(reply, AcquiredAll) else 0
    status = BucketStatus(limits[index], reply.remaining, reply.reset_after_ms)
    return rate_limit_headers([status], allowed=reply.allowed, retry_after_ms=reply.retry_after_ms, standard=standard)
