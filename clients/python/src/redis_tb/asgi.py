"""ASGI middleware (Starlette, FastAPI): every request that a limit applies to takes its cost from Redis
first; a refusal answers `429` with `Retry-After` and a small JSON body; every response carries the RateLimit
header fields (docs/headers.md).

    app.add_middleware(RateLimitMiddleware, limiter=AsyncTokenBucket(redis.asyncio.Redis()),
                       limits=[Limit("per-client", rate=10, burst=20)])
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from . import _decide
from ._decide import UNREACHABLE, FailMode, LimitsSpec, by_path, client_address
from .aio import AsyncTokenBucket
from .headers import Standard
from .limit import KeyFunction

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("redis_tb")

__all__ = ["RateLimitMiddleware", "by_path", "client_address"]


class RateLimitMiddleware(_decide.Middleware[ASGIApp, AsyncTokenBucket]):
    """Rate limits HTTP requests of an ASGI app.

    - `limits`: the limits of every request, or a function of the scope choosing them (`by_path`); several
      limits go in one atomic `TB.ACQUIREEACH` call, with one header item each.
    - `key`: who a request counts against (default: the client address); None skips the limits.
    - `prefix`: the start of every bucket key.
    - `fail`: `"open"` lets requests through when Redis is unreachable (logged), `"closed"` answers 503.
    - `standard`: which header fields to send: `"draft"`, `"legacy"` or `"both"` (docs/headers.md).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        plan = _decide.plan(scope, self.limits, self.key, self.prefix)
        if plan is None:
            await self.app(scope, receive, send)
            return
        try:
            reply = await self.limiter._run(plan.call())
        except UNREACHABLE as error:
            if self.fail == "open":
                logger.warning("redis-tb: Redis unreachable, letting the request through: %s", error)
                await self.app(scope, receive, send)
            else:
                await _respond(send, _decide.unavailable())
            return
        verdict = _decide.verdict(plan, reply, self.standard)
        if not verdict.allowed:
            await _respond(send, verdict)
            return
        await self.app(scope, receive, _with_headers(send, verdict.headers))


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def _with_headers(send: Send, headers: list[tuple[str, str]]) -> Send:
    extra = _encoded(headers)

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return send_with_headers


async def _respond(send: Send, verdict: _decide.Verdict) -> None:
    headers = [*_encoded(verdict.headers), (b"content-length", str(len(verdict.body)).encode())]
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": verdict.body})


def limited(
    limiter: AsyncTokenBucket,
    limits: LimitsSpec,
    *,
    key: KeyFunction = client_address,
    prefix: str = "ratelimit:",
    fail: FailMode = "open",
    standard: Standard = "both",
) -> Callable[[ASGIApp], RateLimitMiddleware]:
    """The middleware as a wrapper: `app = limited(limiter, limits)(app)`."""

    def wrap(app: ASGIApp) -> RateLimitMiddleware:
        return RateLimitMiddleware(
            app, limiter=limiter, limits=limits, key=key, prefix=prefix, fail=fail, standard=standard
        )

    return wrap
