"""WSGI middleware (Flask, Django, any WSGI app): the same behaviour as `redis_tb.asgi`, with the sync client.

app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=TokenBucket(redis.Redis()),
                                   limits=[Limit("per-client", rate=10, burst=20)])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import _decide
from ._decide import UNREACHABLE, by_path, client_address
from .client import TokenBucket

logger = logging.getLogger("redis_tb")

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

__all__ = ["RateLimitMiddleware", "by_path", "client_address"]

_REASONS = {429: "429 Too Many Requests", 503: "503 Service Unavailable"}


class RateLimitMiddleware(_decide.Middleware[WSGIApp, TokenBucket]):
    """Rate limits requests of a WSGI app; the options are those of `redis_tb.asgi.RateLimitMiddleware`."""

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
