"""fixtures/leases.json through the package's lease rule (`redis_tb._lease`): each case's steps at their instants,
each decision as the fixture says, as the Rust workspace's core replays it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from redis_tb._lease import Admit, Call, Lease, Refused

FIXTURE = json.loads((Path(__file__).resolve().parents[3] / "fixtures" / "leases.json").read_text())


def number(value: Any) -> float:
    """A fixture's number: JSON's, or "NaN"/"Infinity"/"-Infinity" written as text."""
    return float(value)


def expected(value: Any) -> Admit | None:
    if value is None or value in ("spent", "wait", "direct"):
        return value  # type: ignore[no-any-return]
    if "call" in value:
        return Call(int(value["call"]))
    if "refused" in value:
        return Refused(int(value["refused"]))
    raise AssertionError(f"an expected decision: {value!r}")


def micros(value: Any) -> int:
    return round(number(value) * 1_000)


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=[case["about"][:60] for case in FIXTURE["cases"]])
def test_leases_follow_the_shared_fixture(case: dict[str, Any]) -> None:
    lease = Lease(number(case["rate"]), number(case["burst"]), 0)
    for index, step in enumerate(case["steps"]):
        now = micros(step["at_ms"])
        at = f"{case['about']}: step {index}"
        if "admit" in step:
            assert lease.admit(now, number(step["admit"])) == expected(step["expect"]), at
        elif "admit_again" in step:
            assert lease.admit_again(now, number(step["admit_again"])) == expected(step["expect"]), at
        elif "answered" in step:
            granted, _remaining, retry_after_ms, reset_after_ms = step["answered"]
            decision = lease.answered(micros(step["sent_ms"]), now, granted, retry_after_ms, reset_after_ms)
            assert decision == expected(step["expect"]), at
        elif "observed" in step:
            allowed, _remaining, retry_after_ms, reset_after_ms = step["observed"]
            lease.observed(micros(step["sent_ms"]), now, allowed == 1, retry_after_ms, reset_after_ms)
        elif "failed" in step:
            lease.failed()
        elif "dropped" in step:
            lease.dropped()
        elif "spendable" in step:
            assert math.isclose(lease.spendable(now), number(step["spendable"]), abs_tol=1e-9), at
        elif "refund_due" in step:
            assert lease.refund_due(now) is step["refund_due"], at
        elif "give_back" in step:
            amount = lease.give_back(now, step["give_back"])
            assert math.isclose(amount, number(step["expect"]), abs_tol=1e-9), at
        else:
            raise AssertionError(f"{at}: an unknown step {step!r}")
