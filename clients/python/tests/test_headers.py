"""The header mapping of docs/headers.md, field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from redis_tb import Limit
from redis_tb.headers import BucketStatus, rate_limit_headers

PER_USER = Limit("per-user", rate=10, burst=20)
PER_TENANT = Limit("tenant", rate=100, burst=1000)


def test_one_bucket_both_standards() -> None:
    headers = rate_limit_headers([BucketStatus(PER_USER, 19, 100)])
    assert headers == [
        ("RateLimit-Policy", '"per-user";q=20;w=2'),
        ("RateLimit", '"per-user";r=19;t=1'),
        ("RateLimit-Limit", "20"),
        ("RateLimit-Remaining", "19"),
        ("RateLimit-Reset", "1"),
    ]


def test_refusal_adds_retry_after_rounded_up() -> None:
    headers = rate_limit_headers(
        [BucketStatus(PER_USER, 0, 2001)], allowed=False, retry_after_ms=1001, standard="legacy"
    )
    assert headers == [
        ("RateLimit-Limit", "20"),
        ("RateLimit-Remaining", "0"),
        ("RateLimit-Reset", "3"),
        ("Retry-After", "2"),
    ]


def test_no_retry_after_when_waiting_never_helps() -> None:
    headers = rate_limit_headers([BucketStatus(PER_USER, 0, 0)], allowed=False, retry_after_ms=-1, standard="draft")
    assert [name for name, _ in headers] == ["RateLimit-Policy", "RateLimit"]


def test_several_buckets_one_item_each_legacy_from_the_limiting_one() -> None:
    statuses = [BucketStatus(PER_USER, 5, 1500), BucketStatus(PER_TENANT, 0, 10_000)]
    headers = dict(rate_limit_headers(statuses, limiting_index=1, allowed=False, retry_after_ms=10))
    assert headers["RateLimit-Policy"] == '"per-user";q=20;w=2, "tenant";q=1000;w=10'
    assert headers["RateLimit"] == '"per-user";r=5;t=2, "tenant";r=0;t=10'
    assert (headers["RateLimit-Limit"], headers["RateLimit-Remaining"], headers["RateLimit-Reset"]) == (
        "1000",
        "0",
        "10",
    )
    assert headers["Retry-After"] == "1"


def test_names_are_quoted_strings_and_fractions_round() -> None:
    odd = Limit('a "quoted" \\ name', rate=0.3, burst=2.5)
    headers = dict(rate_limit_headers([BucketStatus(odd, 2, 1)], standard="draft"))
    assert headers["RateLimit-Policy"] == '"a \\"quoted\\" \\\\ name";q=2;w=9'
    assert headers["RateLimit"] == '"a \\"quoted\\" \\\\ name";r=2;t=1'


def test_unknown_standard_is_refused() -> None:
    with pytest.raises(ValueError, match="standard"):
        rate_limit_headers([BucketStatus(PER_USER, 1, 1)], standard="rfc")  # type: ignore[arg-type]


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        Limit("x", rate=0, burst=1)
    with pytest.raises(ValueError):
        Limit("", rate=1, burst=1)


def test_the_examples_of_docs_headers_md() -> None:
    """docs/headers.md's two examples, as that page shows them."""
    allowed = rate_limit_headers([BucketStatus(PER_USER, 19, 100), BucketStatus(PER_TENANT, 999, 10)])
    refused = rate_limit_headers(
        [BucketStatus(PER_USER, 0, 2000), BucketStatus(PER_TENANT, 980, 200)],
        limiting_index=0,
        allowed=False,
        retry_after_ms=100,
    )
    page = (Path(__file__).resolve().parents[3] / "docs/headers.md").read_text()
    for headers in (allowed, refused):
        block = "\n".join(f"{name}: {value}" for name, value in headers)
        assert f"```\n{block}\n```" in page, block
