"""What a limit accepts (docs/clients.md, "Limits"), against the fixture the Node suite reads too
(`fixtures/limits.json`): each case's limits built with `Limit` and given to both middlewares, accepted, or refused
at construction with an error naming the field."""

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
from redis_tb.asgi import by_path

FIXTURE: dict[str, Any] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/limits.json").read_text())
NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def number(value: Any) -> Any:
    """The fixture's stand-ins for numbers JSON lacks, as those numbers."""
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    return [b"never called"]


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    """Never called."""


def build(case: dict[str, Any]) -> None:
    limits = [Limit(**{field: number(value) for field, value in entry.items()}) for entry in case["limits"]]
    wsgi.RateLimitMiddleware(wsgi_app, limiter=TokenBucket(Redis()), limits=limits)
    asgi.RateLimitMiddleware(asgi_app, limiter=AsyncTokenBucket(AsyncRedis()), limits=limits)
    by_path({"/": limits})


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda case: case["about"][:60])
def test_limits_are_accepted_or_refused_as_the_fixture_says(case: dict[str, Any]) -> None:
    refused = case["refused"]
    if refused is None:
        build(case)
        return
    with pytest.raises(ValueError) as error:
        build(case)
    if refused["index"] is not None:
        entry = case["limits"][refused["index"]]
        assert refused["field"] in str(error.value)
        if refused["field"] != "name":
            assert repr(entry["name"]) in str(error.value), "the error names the limit"
    else:
        assert "limits" in str(error.value)


def test_a_single_limit_is_one_limit() -> None:
    limit = Limit("per-user", rate=1, burst=1)
    middleware = wsgi.RateLimitMiddleware(wsgi_app, limiter=TokenBucket(Redis()), limits=limit)
    assert middleware.limits == (limit,)


def test_by_path_checks_each_route_and_lets_an_empty_one_through_unlimited() -> None:
    a = Limit("a", rate=1, burst=1)
    with pytest.raises(ValueError, match="used twice"):
        by_path({"/": [a, a]})
    assert by_path({"/health": [], "/": [a]})({"path": "/health"}) == ()
