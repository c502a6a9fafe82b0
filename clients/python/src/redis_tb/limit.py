"""A named limit: what the middleware checks and what the headers describe."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .identity import _Skip

#: Who a request counts against, from the request itself (the ASGI scope or the WSGI environ): an identity, None
#: (no identity: the shared anonymous bucket) or `redis_tb.SKIP` (not limited).
KeyFunction = Callable[[Mapping[str, Any]], str | Literal[_Skip.SKIP] | None]


@dataclass(frozen=True)
class Limit:
    """`rate` tokens per second into a bucket of `burst`, each request taking `cost`.

    `name` appears in the bucket's key and in the `RateLimit-Policy` header. `key`, when given, overrides the
    middleware's key function for this limit (a per-tenant limit next to a per-user one); `redis_tb.SKIP` from
    a key function skips the limit for that request.
    """

    name: str
    rate: float
    burst: float
    cost: float = 1
    key: KeyFunction | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a limit needs a name (it appears in headers and keys)")
        if not (self.rate > 0 and self.burst > 0 and self.cost >= 0):
            raise ValueError(f"limit {self.name!r}: rate and burst must be > 0 and cost >= 0")
