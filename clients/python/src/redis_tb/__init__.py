"""redis-tb for Python: token buckets in Redis, on the redis-tb module or, where it cannot be loaded, on the
same algorithm as a Lua script.

- `TokenBucket` / `AsyncTokenBucket`: one method per command, typed replies (`redis_tb.replies`), exceptions
  naming the problem (`redis_tb.errors`).
- `redis_tb.headers`: RateLimit header fields from a reply.
- `redis_tb.asgi` / `redis_tb.wsgi`: middleware for Starlette/FastAPI and Flask; `ip_identity` and `SKIP`
  for their key functions (`redis_tb.identity`).
- `redis_tb.pacing`: reserve, wait, refund on failure (asyncio and threads).
- `redis_tb.limits`: the "token-bucket" strategy for the `limits` package (Flask-Limiter, slowapi).
"""

from __future__ import annotations

import contextlib

from ._protocol import LIBRARY, LIBRARY_NAME, SCRIPT, SCRIPT_SHA
from .aio import AsyncTokenBucket
from .client import TokenBucket
from .errors import (
    DebtLimitExceeded,
    DuplicateKey,
    InvalidArgument,
    LimiterUnavailable,
    ModuleNotLoaded,
    NotABucket,
    ServerError,
    TokenBucketError,
    TooManyBuckets,
    WrongType,
)
from .identity import SKIP, ip_identity
from .limit import Limit
from .replies import (
    Acquired,
    AcquiredAll,
    AcquiredEach,
    BucketResult,
    Charged,
    PartialGrant,
    Refunded,
    Reservation,
    ThrottleReply,
)

__all__ = [
    "LIBRARY",
    "LIBRARY_NAME",
    "SCRIPT",
    "SCRIPT_SHA",
    "SKIP",
    "Acquired",
    "AcquiredAll",
    "AcquiredEach",
    "AsyncTokenBucket",
    "BucketResult",
    "Charged",
    "DebtLimitExceeded",
    "DuplicateKey",
    "InvalidArgument",
    "Limit",
    "LimiterUnavailable",
    "ModuleNotLoaded",
    "NotABucket",
    "PartialGrant",
    "Refunded",
    "Reservation",
    "ServerError",
    "ThrottleReply",
    "TokenBucket",
    "TokenBucketError",
    "TooManyBuckets",
    "WrongType",
    "ip_identity",
]

# The limits strategy registers itself when `limits` is installed (Flask-Limiter, slowapi).
with contextlib.suppress(ImportError):
    from . import limits as _limits  # noqa: F401
