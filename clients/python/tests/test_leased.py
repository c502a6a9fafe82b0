"""Leased limits (`Limit(lease=True)`) in both middlewares against spawned servers, on both backends: few Redis
calls per decision, refusals remembered, one refill in flight however many requests wait, the bound kept by three
processes on one limit, the held tokens spent first when Redis fails. The rule itself is test_lease.py's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any, TypeVar

import httpx
import pytest
import redis
from conftest import Server
from fastapi import FastAPI
from flask import Flask
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb import _protocol as protocol

NO_RETRY = Retry(NoBackoff(), 0)
T = TypeVar("T")


class Counting(TokenBucket):
    """Counts the package's calls to Redis (one each, whatever the backend runs inside)."""

    calls = 0

    def _run(self, call: protocol.Call[T]) -> T:
        self.calls += 1
        return super()._run(call)


class AsyncCounting(AsyncTokenBucket):
    calls = 0

    async def _run(self, call: protocol.Call[T]) -> T:
        self.calls += 1
        return await super()._run(call)


def flask_app(conn: redis.Redis, limits: list[Limit], **options: Any) -> tuple[Flask, wsgi.RateLimitMiddleware]:
    app = Flask(__name__)

    @app.get("/hello")
    def hello() -> str:
        return "ok"

    middleware = wsgi.RateLimitMiddleware(app.wsgi_app, limiter=Counting(conn), limits=limits, **options)
    app.wsgi_app = middleware  # type: ignore[method-assign]
    return app, middleware


def calls(middleware: wsgi.RateLimitMiddleware) -> int:
    assert isinstance(middleware.limiter, Counting)
    return middleware.limiter.calls


def global_key(request: Any) -> str:
    return "everyone"


def test_a_leased_limit_decides_most_requests_without_a_call(server: Server, key: str) -> None:
    app, middleware = flask_app(
        server.client(), [Limit("api", rate=100, burst=1_000, lease=True)], prefix=f"{key}:", key=global_key
    )
    http = app.test_client()
    statuses = [http.get("/hello").status_code for _ in range(200)]
    assert statuses == [200] * 200
    # A hot limit (requests far above its rate): the leases grow with the process's use, up to a tenth of the
    # burst, so that the calls are far fewer than the requests (about 20 on an idle machine).
    assert calls(middleware) <= 200 / 4, calls(middleware)
    response = http.get("/hello")
    assert response.headers["RateLimit-Policy"] == '"api";q=1000;w=10'
    remaining = int(response.headers["RateLimit-Remaining"])
    assert 700 <= remaining <= 1_000, remaining


def test_a_refusal_is_remembered_until_its_retry_time(server: Server, key: str) -> None:
    app, middleware = flask_app(
        server.client(), [Limit("api", rate=0.01, burst=3, lease=True)], prefix=f"{key}:", key=global_key
    )
    http = app.test_client()
    statuses = [http.get("/hello").status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    refused = http.get("/hello")
    assert refused.status_code == 429 and 99 <= int(refused.headers["Retry-After"]) <= 100
    before = calls(middleware)
    again = [http.get("/hello") for _ in range(20)]
    assert calls(middleware) == before
    assert {response.status_code for response in again} == {429}
    assert all(99 <= int(response.headers["Retry-After"]) <= 100 for response in again)


def test_the_other_limits_are_asked_first_and_give_back_when_the_leased_one_refuses(server: Server, key: str) -> None:
    limits = [Limit("per-client", rate=0.01, burst=10), Limit("api", rate=0.01, burst=2, lease=True)]
    app, _ = flask_app(server.client(), limits, prefix=f"{key}:")
    http = app.test_client()
    assert [http.get("/hello").status_code for _ in range(3)] == [200, 200, 429]
    refused = http.get("/hello")
    assert refused.status_code == 429 and json.loads(refused.data)["limit"] == "api"
    # Two requests allowed: the per-client bucket gave back what the refused ones took.
    peeked = TokenBucket(server.client()).acquire(f"{key}:{{127.0.0.1}}:per-client", 0.01, 10, 0)
    assert peeked.remaining == 8, peeked


def test_a_limit_list_takes_one_leased_limit() -> None:
    with pytest.raises(ValueError, match="at most one limit of a request may be leased"):
        wsgi.RateLimitMiddleware(
            Flask(__name__).wsgi_app,
            limiter=TokenBucket(redis.Redis()),
            limits=[Limit("a", rate=1, burst=1, lease=True), Limit("b", rate=1, burst=1, lease=True)],
        )
    with pytest.raises(ValueError, match="burst of at least 1"):
        Limit("a", rate=1, burst=0.5, lease=True)
    with pytest.raises(ValueError, match="lease must be True or False"):
        Limit("a", rate=1, burst=1, lease="yes")  # type: ignore[arg-type]


async def test_one_refill_in_flight_however_many_requests_wait(server: Server, key: str) -> None:
    app = FastAPI()
    limiter = AsyncCounting(server.async_client())

    @app.get("/hello")
    async def hello() -> str:
        return "ok"

    app.add_middleware(
        asgi.RateLimitMiddleware,
        limiter=limiter,
        limits=[Limit("api", rate=10, burst=10_000, lease=True)],
        prefix=f"{key}:",
        key=global_key,
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        responses = await asyncio.gather(*(http.get("/hello") for _ in range(100)))
    assert {response.status_code for response in responses} == {200}
    # Sent together, the requests wait on one refill after another, each sized by those that waited.
    assert limiter.calls <= 10, limiter.calls


async def test_a_request_cancelled_during_its_refill_ends_the_refill(key: str) -> None:
    """The client goes away while the refill it sent waits on a stopped server: the refill ends with it, and the
    next request sends one of its own instead of waiting for the first."""
    server = Server()
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> str:
        return "ok"

    middleware = asgi.RateLimitMiddleware(
        app,
        limiter=AsyncTokenBucket(server.async_client()),
        limits=[Limit("api", rate=10, burst=1_000, lease=True)],
        prefix=f"{key}:",
        key=global_key,
        timeout=30,
    )
    try:
        await _cancel_during_refill(middleware, server, f"{key}:{{everyone}}:api")
    finally:
        server.stop()


async def _cancel_during_refill(middleware: asgi.RateLimitMiddleware, server: Server, lease_key: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://test") as http:
        assert (await http.get("/hello")).status_code == 200  # the backend known, a lease taken
        leases = middleware.leases
        while leases.spendable(lease_key) >= 1:
            assert (await http.get("/hello")).status_code == 200
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            request = asyncio.ensure_future(http.get("/hello"))
            slot = leases._slots[lease_key]
            while not slot.lease.in_flight:
                await asyncio.sleep(0.005)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            assert not slot.lease.in_flight
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert (await http.get("/hello")).status_code == 200


def test_held_tokens_are_spent_first_when_redis_fails(key: str) -> None:
    stopped = Server()
    conn = redis.Redis(port=stopped.port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=NO_RETRY)
    app, middleware = flask_app(
        conn, [Limit("api", rate=10, burst=1_000, lease=True)], prefix=f"{key}:", key=global_key, fail="closed"
    )
    http = app.test_client()
    # The bucket stays low (rate 10), so a grant keeps its worth for seconds: the lease grows to 100 tokens.
    lease_key = f"{key}:{{everyone}}:api"
    for _ in range(400):
        assert http.get("/hello").status_code == 200
    # Until the process holds more than a token (the last grant may have just been spent).
    for _ in range(50):
        if middleware.leases.spendable(lease_key) >= 2:
            break
        assert http.get("/hello").status_code == 200
    held = middleware.leases.spendable(lease_key)
    assert held >= 2
    stopped.stop()
    statuses = [http.get("/hello").status_code for _ in range(200)]
    admitted = statuses.count(200)
    assert admitted >= 1 and statuses[:admitted] == [200] * admitted
    assert set(statuses[admitted:]) == {503}
    assert admitted <= held <= 101, (admitted, held)


PROCESS = textwrap.dedent(
    """
    import json, sys, time
    import redis
    from flask import Flask
    from redis_tb import Limit, TokenBucket
    from redis_tb.wsgi import RateLimitMiddleware

    port, prefix = int(sys.argv[1]), sys.argv[2]
    app = Flask(__name__)
    app.get("/hello")(lambda: "ok")
    app.wsgi_app = RateLimitMiddleware(
        app.wsgi_app, limiter=TokenBucket(redis.Redis(port=port)), prefix=prefix,
        limits=[Limit("api", rate=200, burst=50, lease=True)], key=lambda request: "everyone",
    )
    http = app.test_client()
    print("ready", flush=True)
    start, until_a, quiet_until, until_b = map(float, sys.stdin.readline().split())
    admitted, refused = [], 0

    def sleep_until(instant):
        while time.monotonic() < instant:
            time.sleep(0.002)

    def run(until):
        global refused
        while time.monotonic() < until:
            if http.get("/hello").status_code == 200:
                admitted.append(time.monotonic())
            else:
                refused += 1

    sleep_until(start)
    run(until_a)
    sleep_until(quiet_until)
    run(until_b)
    print(json.dumps({"admitted": admitted, "refused": refused}))
    """
)


def test_three_processes_keep_the_bound_through_a_quiet_time(server: Server, key: str) -> None:
    """Three processes, each in a closed loop on one leased limit (rate 200, burst 50), then quiet long enough for
    the bucket to fill, then together again: no more than `burst + rate * t` admitted over the whole run and over
    the second phase, and each phase admits in every process."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, str(server.port), f"{key}:"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    start = time.monotonic() + 0.1  # the processes start their loops together, none before
    until_a, quiet_until, until_b = start + 0.8, start + 1.2, start + 2.0
    reports = []
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(f"{start} {until_a} {quiet_until} {until_b}\n")
        process.stdin.flush()
    for process in processes:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        reports.append(json.loads(out))
    admitted: list[list[float]] = [report["admitted"] for report in reports]
    total = sum(len(times) for times in admitted)
    # Every grant was taken after `start`, and every admission was answered by the last one's instant: the
    # bucket, full at the first grant, granted at most burst + rate * (last - start) in between.
    # The 5 ms allow for the server's reading of its clock, which may lag the instant a call arrives.
    last = max(times[-1] for times in admitted if times)
    bound = 50 + 200 * (last - start + 0.005)
    assert total <= bound, (total, bound)
    # The quiet time is longer than the bucket takes to fill (0.25 s), so every token held from the first phase has
    # lost its worth by the second: there the processes admit at most burst + rate * t again, counted from its start.
    # A process spending tokens of the first phase would exceed it by up to its lease (5 tokens).
    second = sum(1 for times in admitted for at in times if at > quiet_until)
    second_bound = 50 + 200 * (last - quiet_until + 0.005)
    assert second <= second_bound, (second, second_bound)
    # The limit was reached, and every process admitted in both phases.
    assert sum(report["refused"] for report in reports) > 0
    for times in admitted:
        assert any(at < until_a for at in times) and any(at > quiet_until for at in times), times
