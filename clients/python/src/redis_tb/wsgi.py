"""WSGI middleware (Flask, Django, any WSGI app): the same behaviour as `redis_tb.asgi`, with the sync client.

app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=TokenBucket(redis.Redis()),
                                   limits=[Limit("per-client", rate=10, burst=20)])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import _decide
from ._decide import FailMode, LimitsSpec, by_path, client_address
from .asgi import UNREACHABLE
from .client import TokenBucket
from .headers import Standard
from .limit import KeyFunction

logger = logging.getLogger("redis_tb")

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

__all__ = ["RateLimitMiddleware", "by_path", "client_address"]

_REASONS = {429: "429 Too Many Requests", 503: "503 Service Unavailable"}


class RateLimitMiddleware:
    """Rate limits requests of a WSGI app; the options are those of `redis_tb.asgi.RateLimitMiddleware`."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        limiter: TokenBucket,
        limits: LimitsSpec,
        key: KeyFunction = client_address,
        prefix: str = "ratelimit:",
        fail: FailMode = "open",
        standard: Standard = "both",
    ) -> None:
        if fail not in ("open", "closed"):
            raise ValueError(f"fail must be 'open' or 'closed', not {fail!r}")
        self.app = app
        self.limiter = limiter
        self.limits = limits
        self.key = key
        self.prefix = prefix
        self.fail = fail
        self.standard = standard

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request: Mapping[str, Any] = environ
        plan = _decide.plan(request, self.limits, self.key, self.prefix)
        if plan is None:
            return self.app(environ, start_response)
        try:
            reply = self.limiter._run(plan.call())
        except UNREACHABLE as error:
            if self.fail == "open":
                logger.warning("redis-tb: Redis unreachable, letting the request through: %s", error)
                return self.app(environ, start_response)
            return _respond(start_response, _decide.unavailable())
        verdict = _decide.verdict(plan, reply, self.standard)
        if not verdict.allowed:
            return _respond(start_response, verdict)

        def start_with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any | None = None) -> Any:
            return start_response(status, [*headers, *verdict.headers], exc_info)

        return self.app(environ, start_with_headers)


def _respond(start_response: StartResponse, verdict: _decide.Verdict) -> Iterable[bytes]:
    headers = [*verdict.headers, ("Content-Length", str(len(verdict.body)))]
    start_response(_REASONS.get(verdict.status, str(verdict.status)), headers)
    return [verdict.body]
