"""A named limit: what the middleware checks and what the headers describe.

What a limit accepts is one rule shared with the Node package (docs/clients.md, "Limits";
`fixtures/limits.json` and the names of `fixtures/headers.json` hold the cases): refused at construction with an
error naming the limit and the argument, so that no request ever meets a limit the headers or the server cannot
take.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .identity import _Skip

#: Who a request counts against, from the request itself (the ASGI scope or the WSGI environ): an identity, None
#: (no identity: the shared anonymous bucket) or `redis_tb.SKIP` (not limited).
KeyFunction = Callable[[Mapping[str, Any]], str | Literal[_Skip.SKIP] | None]
#: What an RFC 8941 sf-string holds: the characters 0x20 to 0x7E (a name goes into RateLimit-Policy as one).
_NAME = re.compile("[\x20-\x7e]+")


@dataclass(frozen=True)
class Limit:
    """`rate` tokens per second into a bucket of `burst`, each request taking `cost`.

    `name` appears in the bucket's key and in the `RateLimit-Policy` header: a non-empty string of the
    characters 0x20 to 0x7E (printable ASCII and space). `rate` and `burst` are finite numbers > 0, `cost` a
    finite number >= 0 (0 peeks). `key`, when given, overrides the middleware's key function for this limit (a
    per-tenant limit next to a per-user one); `redis_tb.SKIP` from a key function skips the limit for that request.
    `shadow=True` tries the limit without enforcing it: its bucket is charged, but a request it refuses is served
    (counted and logged; docs/operating.md, "Shadow mode"). `lease=True` takes the limit's tokens from Redis in
    batches and admits requests from them in memory, with the same bound (docs/clients.md, "How a leased limit
    decides"): for a hot shared limit, with a burst of at least 1. Anything else raises ValueError.
    """

    name: str
    rate: float
    burst: float
    cost: float = 1
    key: KeyFunction | None = None
    shadow: bool = False
    lease: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"a limit's name must be a non-empty string of the characters 0x20 to 0x7E (it goes into the "
                f"RateLimit-Policy header), not {self.name!r}"
            )
        _check_number(self.name, "rate", self.rate, minimum_excluded=True)
        _check_number(self.name, "burst", self.burst, minimum_excluded=True)
        _check_number(self.name, "cost", self.cost, minimum_excluded=False)
        if self.key is not None and not callable(self.key):
            raise ValueError(f"limit {self.name!r}: key must be a function of the request, not {self.key!r}")
        if not isinstance(self.shadow, bool):
            raise ValueError(f"limit {self.name!r}: shadow must be True or False, not {self.shadow!r}")
        if not isinstance(self.lease, bool):
            raise ValueError(f"limit {self.name!r}: lease must be True or False, not {self.lease!r}")
        if self.lease and self.burst < 1:
            raise ValueError(
                f"limit {self.name!r}: a leased limit needs a burst of at least 1 (grants are whole tokens)"
            )


def _check_number(name: str, field: str, value: object, *, minimum_excluded: bool) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int beyond any float
            finite = False
        if finite and (value > 0 if minimum_excluded else value >= 0):
            return
    bound = "> 0" if minimum_excluded else ">= 0"
    raise ValueError(f"limit {name!r}: {field} must be a finite number {bound}, not {value!r}")


def check_limits(limits: Limit | Sequence[Limit], *, allow_empty: bool = False) -> tuple[Limit, ...]:
    """The limits of one request as a tuple: a `Limit` or a sequence of them, names unique (each names a bucket of
    the identity and a header item). Empty only where `allow_empty` (a route that is explicitly not limited)."""
    if isinstance(limits, Limit):
        return (limits,)
    if isinstance(limits, (str, bytes)) or not isinstance(limits, Sequence):
        raise ValueError(f"limits must be a Limit or a sequence of them, not {limits!r}")
    chosen = tuple(limits)
    if not chosen and not allow_empty:
        raise ValueError("limits must not be empty: give at least one Limit (SKIP from a key function skips one)")
    names: set[str] = set()
    leased = 0
    for index, limit in enumerate(chosen):
        if not isinstance(limit, Limit):
            raise ValueError(f"limits[{index}] must be a Limit, not {limit!r}")
        if limit.name in names:
            raise ValueError(f"limits[{index}]: the name {limit.name!r} is used twice (it names the bucket)")
        names.add(limit.name)
        leased += limit.lease
        if leased > 1:
            raise ValueError(f"limits[{index}]: at most one limit of a request may be leased (the shared, hot one)")
    return chosen
