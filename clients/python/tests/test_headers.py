"""The header mapping of docs/headers.md against the fixture the Node suite and tb-rls read too
(`fixtures/headers.json`): exact fields for decisions and limits, numbers kept within RFC 8941, names the
sf-string cannot hold refused when the limit is built."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb.headers import MAX_INTEGER, STANDARDS, BucketStatus, headers_for, rate_limit_headers
from redis_tb.replies import Acquired, AcquiredEach, BucketResult

REPOSITORY = Path(__file__).resolve().parents[3]
FIXTURE: dict[str, Any] = json.loads((REPOSITORY / "fixtures/headers.json").read_text())
PER_USER = Limit("per-user", rate=10, burst=20)
PER_TENANT = Limit("tenant", rate=100, burst=1000)


def limit_of(bucket: dict[str, Any]) -> Limit:
    """The bucket's limit. A rate or burst of "NaN", "Infinity" or "-Infinity" (JSON has no such numbers) is set past
    `Limit`'s check, which refuses it: the mapping answers for any number all the same."""
    rate, burst = float(bucket["rate"]), float(bucket["burst"])
    if math.isfinite(rate) and math.isfinite(burst):
        return Limit(bucket["name"], rate=rate, burst=burst)
    limit = Limit(bucket["name"], rate=1, burst=1)
    object.__setattr__(limit, "rate", rate)
    object.__setattr__(limit, "burst", burst)
    return limit


def limits_of(case: dict[str, Any]) -> list[Limit]:
    return [limit_of(b) for b in case["buckets"]]


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda case: case["about"][:60])
def test_headers_of_each_decision_match_the_fixture(case: dict[str, Any]) -> None:
    results = tuple(
        BucketResult(b["fits"], b["remaining"], b["retry_after_ms"], b["reset_after_ms"]) for b in case["buckets"]
    )
    reply = AcquiredEach(case["allowed"], case["limiting_index"], results)
    expected = [tuple(pair) for pair in case["headers"]]
    assert headers_for(limits_of(case), reply, standard=case["standard"]) == expected
    if len(results) == 1:  # TB.ACQUIRE's reply gives the same fields
        (only,) = results
        single = Acquired(case["allowed"], only.remaining, only.retry_after_ms, only.reset_after_ms)
        assert headers_for(limits_of(case), single, standard=case["standard"]) == expected


def test_the_bound_of_numbers_is_the_largest_sf_integer() -> None:
    assert FIXTURE["max_integer"] == MAX_INTEGER == 10**15 - 1


def test_the_standards_are_the_fixture_s() -> None:
    assert sorted(STANDARDS) == sorted(FIXTURE["standards"]["accepted"])


@pytest.mark.parametrize("standard", FIXTURE["standards"]["refused"], ids=repr)
def test_unknown_standard_is_refused_by_the_function_and_when_the_middleware_is_built(standard: Any) -> None:
    with pytest.raises(ValueError, match="standard"):
        rate_limit_headers([BucketStatus(PER_USER, 1, 1)], standard=standard)
    for middleware in (asgi.RateLimitMiddleware, wsgi.RateLimitMiddleware):
        limiter = AsyncTokenBucket(AsyncRedis()) if middleware is asgi.RateLimitMiddleware else TokenBucket(Redis())
        with pytest.raises(ValueError, match="standard"):
            middleware(None, limiter=limiter, limits=[PER_USER], standard=standard)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", FIXTURE["names"]["accepted"])
def test_names_the_sf_string_holds_are_accepted_and_quoted(name: str) -> None:
    (policy, _) = rate_limit_headers([BucketStatus(Limit(name, rate=1, burst=1), 1, 0)], standard="draft")
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    assert policy == ("RateLimit-Policy", f'"{escaped}";q=1;w=1')


@pytest.mark.parametrize("name", FIXTURE["names"]["refused"] + FIXTURE["names"]["refused_types"], ids=repr)
def test_names_the_sf_string_cannot_hold_are_refused_at_construction(name: Any) -> None:
    with pytest.raises(ValueError, match="name must be a non-empty string of the characters 0x20 to 0x7E"):
        Limit(name, rate=1, burst=1)


def test_the_examples_of_docs_headers_md() -> None:
    """docs/headers.md's two examples, as that page shows them."""
    allowed = rate_limit_headers([BucketStatus(PER_USER, 19, 100), BucketStatus(PER_TENANT, 999, 10)])
    refused = rate_limit_headers(
        [BucketStatus(PER_USER, 0, 2000), BucketStatus(PER_TENANT, 980, 200)],
        limiting_index=0,
        allowed=False,
        retry_after_ms=100,
    )
    page = (REPOSITORY / "docs/headers.md").read_text()
    for headers in (allowed, refused):
        block = "\n".join(f"{name}: {value}" for name, value in headers)
        assert f"```\n{block}\n```" in page, block
