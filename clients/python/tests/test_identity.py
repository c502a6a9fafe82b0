"""The identity rule and the key layout, against the fixture the Node suite reads too (`fixtures/keys.json`):
Python and Node derive the same key for the same client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import redis_tb
from redis_tb.identity import ANONYMOUS_TAG, bucket_key, escape, ip_identity

FIXTURE: dict[str, Any] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/keys.json").read_text())


@pytest.mark.parametrize("row", FIXTURE["keys"], ids=lambda row: repr(row["identity"])[:20])
def test_key_of_each_identity_matches_the_fixture(row: dict[str, Any]) -> None:
    assert bucket_key(row["prefix"], row["identity"], row["limit"]) == row["key"]


@pytest.mark.parametrize("row", FIXTURE["ip_identity"], ids=lambda row: f"{row['address']}/{row['ipv6_subnet']}")
def test_identity_of_each_address_matches_the_fixture(row: dict[str, Any]) -> None:
    assert redis_tb.ip_identity(row["address"], row["ipv6_subnet"]) == row["identity"]


@pytest.mark.parametrize("subnet", FIXTURE["ipv6_subnet_refused"])
def test_ipv6_subnet_outside_1_to_64_is_refused(subnet: Any) -> None:
    with pytest.raises(ValueError, match="ipv6_subnet"):
        ip_identity("::1", subnet)


def test_express_and_fastify_addresses_of_one_client_are_one_identity() -> None:
    """Express's `::ffff:127.0.0.1` and Fastify's `127.0.0.1` are one client: one identity, one bucket."""
    assert ip_identity("::ffff:127.0.0.1") == ip_identity("127.0.0.1") == "127.0.0.1"


def test_ipv6_addresses_of_one_slash_56_share_a_bucket() -> None:
    """IPv6 addresses of one /56 are one identity: a client holding a /64 cannot pick a fresh bucket per request."""
    identities = {ip_identity(f"2001:db8:1:2{n:02x}::{n}:1") for n in range(256)}
    assert identities == {"2001:db8:1:200::/56"}
    assert ip_identity("2001:db8:1:300::1") != ip_identity("2001:db8:1:2ff::1")


def test_escaping_is_injective_and_never_yields_a_brace_or_the_anonymous_tag() -> None:
    samples = ["", "%", "%2", "%25", "{", "}", "{}", "%anonymous", "a b", "a%20b", "é", "\x00", "\udc80"]
    tags = [escape(sample) for sample in samples]
    assert len(set(tags)) == len(tags)
    assert not any("{" in tag or "}" in tag for tag in tags)
    assert ANONYMOUS_TAG not in tags


def test_a_surrogate_pair_held_as_two_code_points_is_the_character_it_encodes() -> None:
    """JSON and JavaScript cannot tell them apart, so the key does not either; lone surrogates stay apart."""
    two_code_points = b"\xed\xa0\xbd\xed\xb8\x80".decode("utf-8", "surrogatepass")
    assert len(two_code_points) == 2
    assert escape(two_code_points) == escape("\U0001f600") == "%F0%9F%98%80"
    assert len({escape("\ud800"), escape("\udfff"), escape("\ufffd"), escape("\udc00\ud800")}) == 4
