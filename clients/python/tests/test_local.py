"""The local fallback's rule (docs/clients.md, "When Redis fails"): every case of `fixtures/local.json` run through the
package's own in-memory buckets and the middlewares' own charge-back code (the shared decision's charge-back lane, sent
by the ASGI and by the WSGI middleware), on a clock the test sets, with a limiter whose replies the fixture scripts."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis._parsers.base import BaseParser

from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb._local import LocalBuckets
from redis_tb._plan import Plan
from redis_tb._protocol import Call
from redis_tb.client import _translated
from redis_tb.replies import Acquired, AcquiredEach, BucketResult, Charged

FIXTURE: dict[str, Any] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/local.json").read_text())
#: What a charge-back of a step whose Redis fails meets when the fixture names no error: no reply.
NO_REPLY = redis.exceptions.ConnectionError("Connection closed by server.")
#: Long enough for a call begun by a step to reach its first charge-back; a call that does not is a failure.
STEP_DEADLINE_S = 5.0


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


def error_of(text: str) -> BaseException:
    """An error reply as the client raises it: parsed as redis-py parses it, then translated by the client."""
    return _translated(BaseParser.parse_error(text))  # type: ignore[no-untyped-call]


class Charges:
    """What the scripted limiter does with the charge-backs (`TB.LOWER` calls) of one limiter call: records each,
    then answers it, or raises `error`; a call begun by a step waits for its end step (`release`)."""

    def __init__(self, error: BaseException | None, held: bool) -> None:
        self.error = error
        self.sent: list[Call[Any]] = []
        self.first_sent = threading.Event()
        self.released = threading.Event()
        if not held:
            self.released.set()

    def answer(self, call: Call[Any]) -> Charged:
        assert call.name == "TB.LOWER", call
        if self.error is not None:
            raise self.error
        return Charged(0, 0, 0)


class ScriptedLimiter(TokenBucket):
    """A sync limiter that sends nothing: `charges` (set per limiter call) answers the charge-backs."""

    charges: Charges

    def _run(self, call: Call[Any]) -> Any:
        charges = self.charges
        charges.sent.append(call)
        charges.first_sent.set()
        charges.released.wait(STEP_DEADLINE_S)
        return charges.answer(call)


class AsyncScriptedLimiter(AsyncTokenBucket):
    """The same for the ASGI middleware; a held call waits on the event loop."""

    charges: Charges

    async def _run(self, call: Call[Any]) -> Any:
        charges = self.charges
        charges.sent.append(call)
        charges.first_sent.set()
        while not charges.released.is_set():
            await asyncio.sleep(0)
        return charges.answer(call)


async def no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the runner calls the middleware's charge-backs only")


def no_wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
    raise AssertionError("the runner calls the middleware's charge-backs only")


class Runner:
    """One middleware of `kind` over the scripted limiter and the case's in-memory buckets. `start` begins a limiter
    call's charge-backs (the decision's `_charge_back` lane over the buckets' `charge_backs`, sent by the
    middleware's own `_send`) and returns a function that finishes it: None when the charge-backs let the call go
    on to Redis, else the error that fails it."""

    def __init__(self, kind: str, local: LocalBuckets) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        limits = [Limit("unused", rate=1, burst=1)]
        self.middleware: asgi.RateLimitMiddleware | wsgi.RateLimitMiddleware
        # Clients that never connect: the scripted limiters send nothing.
        self.async_limiter = AsyncScriptedLimiter(redis.asyncio.Redis())
        self.limiter = ScriptedLimiter(redis.Redis())
        if kind == "asgi":
            self.middleware = asgi.RateLimitMiddleware(no_app, limiter=self.async_limiter, limits=limits, metrics=None)
        else:
            self.middleware = wsgi.RateLimitMiddleware(no_wsgi_app, limiter=self.limiter, limits=limits, metrics=None)
        self.middleware.local = local

    def start(self, plan: Plan, charges: Charges) -> Callable[[], BaseException | None]:
        outcome: list[BaseException | None] = []
        if isinstance(self.middleware, asgi.RateLimitMiddleware):
            self.async_limiter.charges = charges
            lane = self.middleware._charge_back(self.middleware.local.charge_backs(plan.keys), {})
            task = self.loop.create_task(self.middleware._send(lane))
            self.loop.run_until_complete(asyncio.sleep(0))  # the task runs up to its first charge-back

            def finish_task() -> BaseException | None:
                try:
                    self.loop.run_until_complete(task)
                except Exception as error:
                    return error
                return None

            return finish_task
        self.limiter.charges = charges
        middleware = self.middleware

        def run() -> None:
            try:
                middleware._send(middleware._charge_back(middleware.local.charge_backs(plan.keys), {}))
            except Exception as error:
                outcome.append(error)
            else:
                outcome.append(None)

        thread = threading.Thread(target=run)
        thread.start()
        # Until its first charge-back is out (all of them are computed before it), or it ends without any.
        while not charges.first_sent.wait(0.001) and thread.is_alive():
            pass

        def finish_thread() -> BaseException | None:
            thread.join(STEP_DEADLINE_S)
            assert not thread.is_alive(), "a limiter call's charge-backs did not end"
            return outcome[0]

        return finish_thread

    def close(self) -> None:
        self.loop.run_until_complete(self.async_limiter.redis.aclose())
        self.limiter.redis.close()
        self.loop.close()


def sent_as_fixture(sent: list[Call[Any]]) -> list[dict[str, Any]]:
    """`TB.LOWER key rate burst tokens` as the fixture writes a charge-back, numbers read back from the wire."""
    return [
        {
            "key": call.module_args[0],
            "rate": float(call.module_args[1]),
            "burst": float(call.module_args[2]),
            "tokens": float(call.module_args[3]),
        }
        for call in sent
    ]


def assert_charge_backs(sent: list[Call[Any]], expected: list[dict[str, Any]], where: str) -> None:
    got = sent_as_fixture(sent)
    buckets = [(c["key"], c["rate"], c["burst"]) for c in got]
    assert buckets == [(c["key"], c["rate"], c["burst"]) for c in expected], where
    for found, want in zip(got, expected, strict=True):
        assert found["tokens"] == pytest.approx(want["tokens"], abs=1e-9), where


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda case: case["name"])
def test_local_buckets_follow_the_fixture(case: dict[str, Any], kind: str) -> None:
    clock = Clock()
    local = LocalBuckets(capacity=case.get("capacity", 10_000), clock=clock)
    runner = Runner(kind, local)
    #: Calls begun and not ended yet: id -> (plan, the charge-backs expected, what answers them, its finish).
    begun: dict[str, tuple[Plan, list[dict[str, Any]], Charges, Callable[[], BaseException | None]]] = {}
    try:
        for number, step in enumerate(case["steps"]):
            clock.now_s = 1000.0 + step["at_ms"] / 1000
            where = f"step {number} ({step.get('note', '')})"
            if "end" in step:
                plan, expected, charges, finish = begun.pop(step["end"])
                if step["charge_back_outcome"] == "failed":
                    charges.error = NO_REPLY
                charges.released.set()
                failed = finish()
                assert_charge_backs(charges.sent, expected, where)
            else:
                limits = [
                    Limit(
                        part["limit"],
                        rate=case["limits"][part["limit"]]["rate"],
                        burst=case["limits"][part["limit"]]["burst"],
                        cost=part["cost"],
                    )
                    for part in step["call"]
                ]
                keys = tuple(part["key"] for part in step["call"])
                plan = Plan(tuple(limits), keys, keys)
                if "begin" in step:
                    charges = Charges(None, held=True)
                    begun[step["begin"]] = (plan, step["charge_back"], charges, runner.start(plan, charges))
                    assert_charge_backs(charges.sent, step["charge_back"][: len(charges.sent)], where)
                    continue
                if "charge_back_error" in step:
                    error: BaseException | None = error_of(step["charge_back_error"])
                else:
                    error = NO_REPLY if step["redis"] == "fails" else None
                charges = Charges(error, held=False)
                failed = runner.start(plan, charges)()
            if "charge_back" in step:
                assert_charge_backs(charges.sent, step["charge_back"], where)
            if step["redis"] == "answers":
                assert failed is None, f"{where}: the charge-backs failed the call with {failed!r}"
                runner.middleware.answered(plan, reply_of(step["reply"]), True)
            else:
                # The call failed (its charge-backs, or itself after them): decided in memory.
                reply = local.acquire_each(plan.limits, plan.keys)
                assert decision_of(reply) == step["expect"], where
        assert not begun, f"calls begun and never ended: {sorted(begun)}"
    finally:
        runner.close()


def test_a_refused_charge_back_is_dropped_and_a_failed_one_stays_owed() -> None:
    clock = Clock()
    local = LocalBuckets(clock=clock)
    limits = [Limit("api", rate=1, burst=5)]
    local.acquire_each(limits, ["a"])
    local.acquire_each(limits, ["a"])
    (charge,) = local.charge_backs(["a"])
    (beside,) = local.charge_backs(["a"])  # a second call while the first charge-back is out
    assert (charge.covers, beside.covers) == (2, 0)  # what is owed is covered once
    local.charged(beside)
    local.charge_failed(charge)
    (again,) = local.charge_backs(["a"])
    assert again.covers == 2
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
    assert [c.covers for c in local.charge_backs(["a"])] == [1]


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
