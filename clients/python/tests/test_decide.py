"""The decision flow both middlewares run (`Middleware.decide`), driven by hand with no I/O: the lanes of calls it
yields, and what it does with the replies and errors that each middleware sends back in."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from typing import Any

import pytest
import redis

from redis_tb import Limit, TokenBucket, wsgi
from redis_tb._decide import Calls, Probe
from redis_tb._failures import Failure
from redis_tb.replies import Acquired

#: What a lost connection raises; it closes the gate.
LOST = redis.exceptions.ConnectionError("Connection closed by server.")


def no_app(environ: Any, start_response: Any) -> list[bytes]:
    raise AssertionError("the flow is driven by hand")


def middleware(on_error: list[str] | None = None) -> wsgi.RateLimitMiddleware:
    def report(error: BaseException, request: Mapping[str, Any], failure: Failure) -> None:
        if on_error is not None:
            on_error.append(failure.class_)

    # A client that never connects: nothing is sent.
    return wsgi.RateLimitMiddleware(
        no_app,
        limiter=TokenBucket(redis.Redis()),
        limits=[Limit("per-client", rate=1, burst=2)],
        key=lambda request: "client",
        metrics=None,
        on_error=report,
    )


def lane_of(flow: Generator[Any, Any, Any]) -> Calls[Any]:
    action = next(flow)
    assert not isinstance(action, Probe)
    lane: Calls[Any] = action
    return lane


def returned(step: Any) -> Any:
    """What a generator returns on the step (`send` or `throw`) that ends it."""
    with pytest.raises(StopIteration) as done:
        step()
    return done.value.value


def test_an_allowed_request_is_one_lane_of_one_call() -> None:
    flow = middleware().decide({})
    lane = lane_of(flow)
    call = next(lane)
    assert call.name == "TB.ACQUIRE"
    reply = Acquired(True, 1, 0, 1000)
    found = returned(lambda: lane.send(reply))
    assert found == (reply, [])
    verdict = returned(lambda: flow.send(found))
    assert verdict.allowed
    assert ("RateLimit-Policy", '"per-client";q=2;w=2') in verdict.headers


def test_charge_backs_go_first_in_the_lane_and_each_outcome_is_kept() -> None:
    errors: list[str] = []
    limiter = middleware(errors)
    # A lost connection: the request is decided in memory, and the gate closes.
    flow = limiter.decide({})
    lane = lane_of(flow)
    next(lane)
    with pytest.raises(redis.exceptions.ConnectionError):
        lane.throw(LOST)
    verdict = returned(lambda: flow.throw(LOST))
    assert verdict.allowed
    assert not limiter.guard.admits
    limiter.guard.probed(None)  # a probe answered: calls go to Redis again

    # The key admitted one request in memory: its lane starts with TB.LOWER. Cancelled at the deadline: what it
    # covered stays owed, and the next lane sends it again.
    lane = lane_of(limiter.decide({}))
    assert next(lane).name == "TB.LOWER"
    with pytest.raises(asyncio.CancelledError):
        lane.throw(asyncio.CancelledError())
    # Refused by the ACL: dropped, given to on_error, and the call goes on to Redis in the same lane.
    flow = limiter.decide({})
    lane = lane_of(flow)
    lower = next(lane)
    assert lower.name == "TB.LOWER"
    refused = redis.exceptions.NoPermissionError("User has no permissions to run the 'tb.lower' command")
    assert lane.throw(refused).name == "TB.ACQUIRE"
    assert errors[-1] == "noperm"
    reply = Acquired(True, 0, 0, 2000)
    verdict = returned(lambda: flow.send(returned(lambda: lane.send(reply))))
    assert verdict.allowed
    # Nothing is owed any more: the next lane is the call alone.
    assert next(lane_of(limiter.decide({}))).name == "TB.ACQUIRE"
