"""The local fallback's rule (docs/clients.md, "When Redis fails"): every case of `fixtures/local.json` run through
the package's own in-memory buckets, on a clock the test sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from redis_tb import Limit
from redis_tb._local import ChargeBack, LocalBuckets
from redis_tb.replies import Acquired, AcquiredEach, BucketResult

FIXTURE: dict[str, Any] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/local.json").read_text())


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def reply_of(answer: dict[str, Any]) -> Acquired | AcquiredEach:
    """Redis's answer as the client parses it: `TB.ACQUIRE`'s for one bucket, `TB.ACQUIREEACH`'s for several."""
    buckets = answer["buckets"]
    if len(buckets) == 1:
        (only,) = buckets
        return Acquired(answer["allowed"], only["remaining"], only["retry_after_ms"], only["reset_after_ms"])
    results = tuple(
        BucketResult(b["retry_after_ms"] == 0, b["remaining"], b["retry_after_ms"], b["reset_after_ms"])
        for b in buckets
    )
    return AcquiredEach(answer["allowed"], 0, results)


def decision_of(reply: AcquiredEach) -> dict[str, Any]:
    return {
        "allowed": reply.allowed,
        "buckets": [
            {"remaining": b.remaining, "retry_after_ms": b.retry_after_ms, "reset_after_ms": b.reset_after_ms}
            for b in reply.buckets
        ],
    }


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda case: case["name"])
def test_local_buckets_follow_the_fixture(case: dict[str, Any]) -> None:
    clock = Clock()
    local = LocalBuckets(capacity=case.get("capacity", 10_000), clock=clock)
    for number, step in enumerate(case["steps"]):
        clock.now_s = 1000.0 + step["at_ms"] / 1000
        limits = [
            Limit(
                part["limit"],
                rate=case["limits"][part["limit"]]["rate"],
                burst=case["limits"][part["limit"]]["burst"],
                cost=part["cost"],
            )
            for part in step["call"]
        ]
        keys = [part["key"] for part in step["call"]]
        where = f"step {number} ({step.get('note', '')})"
        charges = local.charge_backs(keys)
        if step["redis"] == "answers":
            expected = [ChargeBack(c["key"], c["rate"], c["burst"], c["cost"]) for c in step["charge_back"]]
            assert charges == expected, where
            for charge in charges:
                local.charged(charge)
            local.observe(limits, keys, reply_of(step["reply"]))
        else:
            for charge in charges:  # the charge-back fails with the call: still owed
                local.charge_failed(charge)
            assert decision_of(local.acquire_each(limits, keys)) == step["expect"], where


def test_a_refused_charge_back_is_dropped_and_a_failed_one_stays_owed() -> None:
    clock = Clock()
    local = LocalBuckets(clock=clock)
    limits = [Limit("api", rate=1, burst=5)]
    local.acquire_each(limits, ["a"])
    local.acquire_each(limits, ["a"])
    (charge,) = local.charge_backs(["a"])
    assert charge.cost == 2 and local.charge_backs(["a"]) == []  # in flight: not handed out twice
    local.charge_failed(charge)
    (again,) = local.charge_backs(["a"])
    assert again.cost == 2
    local.charge_refused(again)
    assert local.charge_backs(["a"]) == []


def test_a_key_with_a_charge_back_in_flight_keeps_its_place() -> None:
    clock = Clock()
    local = LocalBuckets(capacity=1, clock=clock)
    limits = [Limit("api", rate=1, burst=1)]
    local.acquire_each(limits, ["a"])
    (charge,) = local.charge_backs(["a"])
    clock.now_s += 10  # "a" is full again, but its charge-back's outcome is not known
    assert local.acquire_each(limits, ["b"]).allowed  # the overflow bucket
    assert local.acquire_each(limits, ["a"]).allowed  # "a"'s own bucket, still in the table
    local.charged(charge)
    assert [c.cost for c in local.charge_backs(["a"])] == [1]


def test_an_answer_does_not_count_what_redis_has_not_seen_yet() -> None:
    """An answer that left Redis before this process admitted a cost in memory does not give that cost back."""
    clock = Clock()
    local = LocalBuckets(clock=clock)
    limits = [Limit("api", rate=0.001, burst=2)]
    assert local.acquire_each(limits, ["a"]).allowed  # owed 1
    local.observe(limits, ["a"], Acquired(True, 1, 0, 1000))  # Redis: 1 left, before the charge-back
    assert not local.acquire_each(limits, ["a"]).allowed


def test_local_capacity_is_checked() -> None:
    for capacity in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="local_capacity"):
            LocalBuckets(capacity=capacity)  # type: ignore[arg-type]
