"""HTTP header fields from a decision: one mapping, shared with the Node package (docs/headers.md).

- `standard="draft"`: the IETF draft's `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers,
  revision 11), one list member per bucket:
  `RateLimit-Policy: "<name>";q=<burst>;w=<ceil(burst / rate)>` and
  `RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>`.
- `standard="legacy"`: the older drafts' `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`, all three
  from the limiting bucket (the one that refused, or the one with the fewest tokens left).
- `standard="both"` (the default): both sets.
- `standard="none"`: neither set.
- `Retry-After` (RFC 9110): on a refusal, `ceil(retry_after_ms / 1000)` whole seconds, whatever the standard; left
  out when the cost exceeds the burst (`retry_after_ms` -1: waiting never helps).

Every number is an integer from 0 to `MAX_INTEGER`, the largest RFC 8941 sf-integer: a larger one (a burst of
1e21, a fill time that overflows to infinity, the module's saturated remaining) goes out as `MAX_INTEGER`, so no
limit and no reply can make a field a client cannot parse, or make this module raise. Names need no check here:
`Limit` refuses at construction any name the sf-string cannot hold (`fixtures/headers.json` holds the cases).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from .limit import Limit
from .replies import Acquired, AcquiredAll, AcquiredEach

Standard = Literal["draft", "legacy", "both", "none"]
STANDARDS: tuple[Standard, ...] = ("draft", "legacy", "both", "none")
#: The largest RFC 8941 sf-integer (15 digits): every number in a field is clamped to 0..MAX_INTEGER.
MAX_INTEGER = 999_999_999_999_999


@dataclass(frozen=True)
class BucketStatus:
    """One bucket as a reply left it."""

    limit: Limit
    remaining: int
    reset_after_ms: int


def _integer(value: float, rounding: Callable[[float], int]) -> int:
    """`value` rounded by `rounding`, within 0..MAX_INTEGER (infinity as MAX_INTEGER, NaN as 0): never raises."""
    if not value > 0:
        return 0
    if value >= MAX_INTEGER:
        return MAX_INTEGER
    return min(MAX_INTEGER, rounding(value))


def _seconds_up(ms: float) -> int:
    return _integer(ms / 1000, math.ceil)


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string: quoted, with `\\` and `"` escaped (`Limit` admits only 0x20-0x7E in names)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quota(limit: Limit) -> int:
    """Whole requests the burst allows (the draft's `q` is an integer)."""
    return _integer(limit.burst, math.floor)


def _window(limit: Limit) -> int:
    """Seconds the bucket takes to fill from empty, at least 1 (burst / rate may round to 0 or overflow)."""
    return max(1, _integer(limit.burst / limit.rate, math.ceil))


def _count(tokens: int) -> int:
    return _integer(tokens, int)


@lru_cache(maxsize=1024)
def _name_item(limit: Limit) -> str:
    """The limit's name as an sf-string, made once per limit."""
    return _sf_string(limit.name)


@lru_cache(maxsize=1024)
def _policy_item(limit: Limit) -> str:
    """The limit's `RateLimit-Policy` item, made once per limit."""
    return f"{_name_item(limit)};q={_quota(limit)};w={_window(limit)}"


@lru_cache(maxsize=1024)
def _quota_text(limit: Limit) -> str:
    return str(_quota(limit))


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
        if len(buckets) == 1:
            b = buckets[0]
            policies = _policy_item(b.limit)
            current = f"{_name_item(b.limit)};r={_count(b.remaining)};t={_seconds_up(b.reset_after_ms)}"
        else:
            policies = ", ".join([_policy_item(b.limit) for b in buckets])
            current = ", ".join(
                [f"{_name_item(b.limit)};r={_count(b.remaining)};t={_seconds_up(b.reset_after_ms)}" for b in buckets]
            )
        headers += [("RateLimit-Policy", policies), ("RateLimit", current)]
    if buckets and standard in ("legacy", "both"):
        limiting = buckets[limiting_index if 0 <= limiting_index < len(buckets) else 0]
        headers += [
            ("RateLimit-Limit", _quota_text(limiting.limit)),
            ("RateLimit-Remaining", str(_count(limiting.remaining))),
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
