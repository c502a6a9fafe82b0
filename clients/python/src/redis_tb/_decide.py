"""What both middlewares share, without I/O: which limits apply to a request, their keys, the call to make,
and the response to give."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _protocol as protocol
from .headers import Standard, headers_for
from .limit import KeyFunction, Limit
from .replies import Acquired, AcquiredEach

FailMode = Literal["open", "closed"]
#: What counts as "Redis is unreachable": the connection failed or timed out (also OSError underneath).
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
#: The limits of a request: the same for every request, or chosen from the request (by path, say).
LimitsSpec = Sequence[Limit] | Callable[[Mapping[str, Any]], Sequence[Limit]]


def by_path(routes: Mapping[str, Sequence[Limit]]) -> Callable[[Mapping[str, Any]], Sequence[Limit]]:
    """Limits by path prefix, longest prefix first: `by_path({"/search": [...], "/": [...]})`. A path no prefix
    matches is not limited. Works on an ASGI scope (`path`) and a WSGI environ (`PATH_INFO`)."""
    ordered = sorted(routes.items(), key=lambda item: len(item[0]), reverse=True)

    def limits_for(request: Mapping[str, Any]) -> Sequence[Limit]:
        path = str(request.get("path", request.get("PATH_INFO", "")))
        for prefix, limits in ordered:
            if path.startswith(prefix):
                return limits
        return ()

    return limits_for


@dataclass(frozen=True)
class Plan:
    """The limits that apply to one request, each with its bucket key."""

    limits: tuple[Limit, ...]
    keys: tuple[str, ...]

    def call(self) -> protocol.Call[Acquired | AcquiredEach]:
        """`TB.ACQUIRE` for one limit; `TB.ACQUIREEACH` for several (one result per limit, for the headers)."""
        if len(self.limits) == 1:
            limit = self.limits[0]
            return protocol.acquire(self.keys[0], limit.rate, limit.burst, limit.cost)
        return protocol.acquire_each(
            [(key, limit.rate, limit.burst, limit.cost) for key, limit in zip(self.keys, self.limits, strict=True)]
        )


def plan(request: Mapping[str, Any], limits: LimitsSpec, key: KeyFunction, prefix: str) -> Plan | None:
    """The limits for `request` and their keys; None when nothing applies. Keys are
    `<prefix>{<identity>}:<limit name>`: the hash tag keeps one identity's buckets in one cluster slot, so that
    several limits go in one atomic call."""
    chosen = limits(request) if callable(limits) else limits
    applied: list[Limit] = []
    keys: list[str] = []
    for limit in chosen:
        identity = (limit.key or key)(request)
        if identity is None:
            continue
        applied.append(limit)
        keys.append(f"{prefix}{{{identity}}}:{limit.name}")
    if not applied:
        return None
    return Plan(tuple(applied), tuple(keys))


@dataclass(frozen=True)
class Verdict:
    """What to answer: go on (with headers) or refuse with a status, headers and a JSON body."""

    allowed: bool
    headers: list[tuple[str, str]]
    status: int = 200
    body: bytes = b""


def verdict(plan: Plan, reply: Acquired | AcquiredEach, standard: Standard) -> Verdict:
    headers = headers_for(plan.limits, reply, standard=standard)
    limiting = reply.limiting_index if isinstance(reply, AcquiredEach) else 0
    retry_after_ms = reply.retry_after_ms
    if reply.allowed:
        return Verdict(True, headers)
    body: dict[str, Any] = {"error": "rate limit exceeded", "limit": plan.limits[limiting].name}
    if retry_after_ms >= 0:
        body["retry_after_ms"] = retry_after_ms
    headers.append(("Content-Type", "application/json"))
    return Verdict(False, headers, 429, json.dumps(body).encode())


def unavailable() -> Verdict:
    """Fail closed: Redis could not be asked, so the request is refused."""
    body = json.dumps({"error": "rate limiter unavailable"}).encode()
    return Verdict(False, [("Content-Type", "application/json")], 503, body)


def client_address(request: Mapping[str, Any]) -> str | None:
    """The default key: the client's address (ASGI `client`, WSGI `REMOTE_ADDR`). Behind a proxy, pass a key
    function that reads the header your proxy sets."""
    client = request.get("client")
    if client:
        return str(client[0])
    address = request.get("REMOTE_ADDR")
    return str(address) if address else None


App = TypeVar("App")
Limiter = TypeVar("Limiter")


class Middleware(Generic[App, Limiter]):
    """The options both middlewares take, checked and kept once: the wrapped app (ASGI or WSGI), the limiter
    (async or sync) and the rest, described on `redis_tb.asgi.RateLimitMiddleware`."""

    def __init__(
        self,
        app: App,
        *,
        limiter: Limiter,
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
