"""The middleware options every package checks alike (docs/clients.md, "Options"), against the fixture the Node and
Rust suites read too (`fixtures/options.json`): each value given to both middlewares, accepted and kept, or refused
at construction with the error the packages share."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb.asgi import Decision

FIXTURE: dict[str, Any] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/options.json").read_text())
OPTIONS: list[dict[str, Any]] = FIXTURE["options"]
NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
LIMITS = [Limit("api", rate=1, burst=1)]


def value_of(option: dict[str, Any], value: Any) -> Any:
    """The fixture's stand-ins for numbers JSON lacks, as those numbers, for the options that take numbers."""
    return NON_FINITE.get(value, value) if option["numbers"] and isinstance(value, str) else value


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    return [b"never called"]


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    """Never called."""


def wsgi_middleware(**options: Any) -> wsgi.RateLimitMiddleware:
    return wsgi.RateLimitMiddleware(wsgi_app, limiter=TokenBucket(Redis()), limits=LIMITS, **options)


def asgi_middleware(**options: Any) -> asgi.RateLimitMiddleware:
    return asgi.RateLimitMiddleware(asgi_app, limiter=AsyncTokenBucket(AsyncRedis()), limits=LIMITS, **options)


MIDDLEWARES: list[Callable[..., wsgi.RateLimitMiddleware | asgi.RateLimitMiddleware]] = [
    wsgi_middleware,
    asgi_middleware,
]


def build(**options: Any) -> list[wsgi.RateLimitMiddleware | asgi.RateLimitMiddleware]:
    """Both middlewares, built with `options`: no call reaches Redis while they are built."""
    return [make(**options) for make in MIDDLEWARES]


def kept(middleware: wsgi.RateLimitMiddleware | asgi.RateLimitMiddleware, option: str) -> Any:
    """What the middleware holds for `option` (the Python name)."""
    held: dict[str, Any] = {
        "local_capacity": middleware.local.capacity,
        "timeout": middleware.timeout,
        "prefix": middleware.prefix,
        "status_code": middleware.refusals.status,
        "body": middleware.refusals.body,
    }
    return held[option]


def cases(kind: str) -> list[Any]:
    return [
        pytest.param(option, value, id=f"{option['names']['python']}={value!r}")
        for option in OPTIONS
        for value in option[kind]
    ]


def test_the_fixture_covers_every_option_the_middlewares_share() -> None:
    assert [option["names"]["python"] for option in OPTIONS] == [
        "local_capacity",
        "timeout",
        "prefix",
        "status_code",
        "body",
    ]


@pytest.mark.parametrize(("option", "value"), cases("accepted"))
def test_an_accepted_value_is_kept(option: dict[str, Any], value: Any) -> None:
    name = option["names"]["python"]
    for middleware in build(**{name: value_of(option, value)}):
        assert kept(middleware, name) == value_of(option, value)


@pytest.mark.parametrize(("option", "value"), cases("refused"))
def test_a_refused_value_names_the_option_and_the_rule(option: dict[str, Any], value: Any) -> None:
    name = option["names"]["python"]
    for make in MIDDLEWARES:
        with pytest.raises(ValueError) as refused:
            make(**{name: value_of(option, value)})
        assert f"{name} {option['message']}" in str(refused.value)


def test_a_body_function_is_accepted() -> None:
    def body(decision: Decision) -> dict[str, Any]:
        return {"limit": decision.limit.name}

    for middleware in build(body=body):
        assert middleware.refusals.body is body


def test_a_timeout_of_0_is_no_setting_without_a_deadline() -> None:
    """There is no limiter without a deadline: the error says why, rather than taking 0 as "wait forever"."""
    with pytest.raises(ValueError, match="every limiter call has a deadline"):
        build(timeout=0)
