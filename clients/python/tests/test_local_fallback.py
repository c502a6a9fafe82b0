"""`fail="local"` keeps the limit's bound on real servers, in ASGI and WSGI alike (docs/clients.md, "When Redis
fails"): one process admits at most `burst + rate * t` per key over any interval `t`, whether one shard fails while
another answers, Redis flaps, or a flood of identities meets a Redis that is down."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from conftest import Cluster, Server, owner
from fastapi import FastAPI
from flask import Flask
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi

KINDS = ["asgi", "wsgi"]


def who(request: Any) -> str:
    """The identity is the path: `/alice` counts against alice."""
    return str(request.get("path", request.get("PATH_INFO", ""))).strip("/")


class App:
    """A FastAPI (asgi) or Flask (wsgi) app with the middleware over `client`; `get(identity)` answers a status."""

    def __init__(self, kind: str, client: Any, limits: list[Limit], **options: Any) -> None:
        self.kind = kind
        self.client = client
        self.loop = asyncio.new_event_loop()
        if kind == "wsgi":
            flask = Flask(__name__)
            flask.get("/<name>")(lambda name: "hello")
            flask.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
                flask.wsgi_app, limiter=TokenBucket(client), limits=limits, key=who, **options
            )
            self.flask = flask.test_client()
        else:
            app = FastAPI()
            app.get("/{name}")(lambda name: "hello")
            app.add_middleware(
                asgi.RateLimitMiddleware, limiter=AsyncTokenBucket(client), limits=limits, key=who, **options
            )
            self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")

    def get(self, identity: str) -> int:
        if self.kind == "wsgi":
            return int(self.flask.get(f"/{identity}").status_code)
        return int(self.loop.run_until_complete(self.http.get(f"/{identity}")).status_code)

    def close(self) -> None:
        if self.kind == "asgi":
            self.loop.run_until_complete(self.http.aclose())
            self.loop.run_until_complete(self.client.aclose())
        else:
            self.client.close()
        self.loop.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = Cluster(module=True)
    yield started
    started.stop()


def on_another_shard(cluster: Cluster, prefix: str, identity: str) -> str:
    """An identity whose bucket lives on another shard than `identity`'s."""
    taken = owner(cluster, f"{prefix}{{{identity}}}:api")
    return next(
        name for name in (f"bob{n}" for n in range(100)) if owner(cluster, f"{prefix}{{{name}}}:api") is not taken
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_shard_keeps_its_keys_bound_while_another_answers(kind: str, cluster: Cluster) -> None:
    """alice's shard answers OOM, bob's answers: requests alternate. Each answer for bob used to clear the in-memory
    buckets (and close the gate until a probe), so alice took a fresh burst after each of bob's requests."""
    prefix = f"shard-{kind}:"
    bob = on_another_shard(cluster, prefix, "alice")
    failing = owner(cluster, f"{prefix}{{alice}}:api")
    failing.client().config_set("maxmemory-policy", "noeviction")
    failing.client().config_set("maxmemory", "1")
    rate, burst = 0.5, 3
    client: Any = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    if kind == "asgi":
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    # A deadline no loaded machine misses: a call that timed out may still take its cost (in flight).
    app = App(kind, client, [Limit("api", rate=rate, burst=burst)], prefix=prefix, timeout=10)
    try:
        began = time.monotonic()
        alice = []
        for _ in range(30):  # over 3 s: long enough for a gate closed by alice's failure to reopen
            assert app.get(bob) in (200, 429)
            alice.append(app.get("alice"))
            time.sleep(0.1)
        elapsed = time.monotonic() - began
    finally:
        failing.client().config_set("maxmemory", "0")
        app.close()
    admitted = alice.count(200)
    assert 1 <= admitted <= burst + rate * elapsed, (admitted, elapsed, alice)
    assert set(alice) <= {200, 429}
    bob_key = f"{prefix}{{{bob}}}:api"
    assert owner(cluster, bob_key).client().hget(bob_key, "tokens") is not None  # bob's calls reached Redis


@pytest.fixture
def fresh() -> Iterator[Server]:
    server = Server(module=True)
    yield server
    server.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_a_flapping_redis_hands_out_no_fresh_burst(kind: str, fresh: Server) -> None:
    """OOM on and off every 0.5 s for 6 s, a request every 10-20 ms: what the in-memory buckets admit is charged
    back when Redis answers again, and they continue from what Redis last said, so the flaps add nothing. Before,
    each fault started from a full in-memory bucket."""
    rate, burst = 2.0, 5
    fresh.client().config_set("maxmemory-policy", "noeviction")
    stop = threading.Event()

    def flap() -> None:
        with fresh.client() as admin:
            oom = False
            while not stop.wait(0.5):
                oom = not oom
                admin.config_set("maxmemory", "1" if oom else "0")
            admin.config_set("maxmemory", "0")

    client: Any = fresh.client() if kind == "wsgi" else fresh.async_client()
    app = App(kind, client, [Limit("api", rate=rate, burst=burst)], prefix=f"flap-{kind}:", timeout=10)
    flapping = threading.Thread(target=flap, daemon=True)
    statuses = []
    try:
        began = time.monotonic()
        flapping.start()
        while time.monotonic() - began < 6:
            statuses.append(app.get("alice"))
            time.sleep(random.uniform(0.01, 0.02))
        elapsed = time.monotonic() - began
    finally:
        stop.set()
        flapping.join(5)
        app.close()
    admitted = statuses.count(200)
    # One request at a time, none missing its deadline: no call is in flight when a fault begins, and an OOM reply
    # takes nothing.
    assert burst <= admitted <= burst + rate * elapsed, (admitted, elapsed, len(statuses))
    assert set(statuses) == {200, 429}


def asgi_caller(middleware: asgi.RateLimitMiddleware) -> Any:
    async def call(identity: str) -> int:
        sent: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])

        await middleware({"type": "http", "path": f"/{identity}", "headers": [], "client": None}, receive, send)
        return sent[0]

    return call


async def ok_asgi(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def ok_wsgi(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b"ok"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_flood_of_identities_shares_the_overflow_bucket_while_redis_is_down(kind: str) -> None:
    """10,001 identities, three rounds each, burst 1, Redis down: the table keeps 10,000 keys (none full again, all
    owing), the one left over takes the overflow bucket's token. Before, the least recently used key went to make
    room, so each identity came back to a full bucket: 30,003 admitted."""
    gone = Server(module=False)
    gone.stop()
    limits = [Limit("api", rate=0.0001, burst=1)]
    identities = [f"u{n}" for n in range(10_001)]
    statuses: list[int] = []
    if kind == "wsgi":
        middleware = wsgi.RateLimitMiddleware(
            ok_wsgi, limiter=TokenBucket(redis.Redis(port=gone.port)), limits=limits, key=who, timeout=0.5
        )
        answered: list[str] = []

        def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
            answered.append(status)

        for identity in identities * 3:
            middleware({"PATH_INFO": f"/{identity}"}, start_response)
        statuses = [int(status.split()[0]) for status in answered]
    else:
        client = redis.asyncio.Redis(port=gone.port)
        middleware_asgi = asgi.RateLimitMiddleware(
            ok_asgi, limiter=AsyncTokenBucket(client), limits=limits, key=who, timeout=0.5
        )
        call = asgi_caller(middleware_asgi)

        async def flood() -> None:
            for identity in identities * 3:
                statuses.append(await call(identity))

        asyncio.run(flood())
    assert statuses.count(200) == 10_000 + 1
    assert set(statuses) == {200, 429}


@pytest.mark.parametrize("kind", KINDS)
def test_a_charge_back_redis_refuses_is_dropped_and_logged(
    kind: str, fresh: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process left alice's bucket near a day of debt; this one admitted 5 in memory while Redis answered
    OOM. Charging them back would pass the debt bound: Redis refuses, the 5 are dropped (logged), and the request
    goes on to Redis, which refuses it."""
    rate, burst = 0.0001, 5  # a day of refill: 8.64 tokens of debt at most
    prefix = f"refused-{kind}:"
    key = f"{prefix}{{alice}}:api"
    admin = fresh.client()
    TokenBucket(admin).charge(key, rate, burst, 13)  # 5 - 13: 8 tokens of debt
    admin.config_set("maxmemory-policy", "noeviction")
    client: Any = fresh.client() if kind == "wsgi" else fresh.async_client()
    app = App(kind, client, [Limit("api", rate=rate, burst=burst)], prefix=prefix, timeout=10)
    try:
        admin.config_set("maxmemory", "1")
        assert [app.get("alice") for _ in range(6)] == [200] * 5 + [429]  # decided in memory
        admin.config_set("maxmemory", "0")
        with caplog.at_level(logging.WARNING, logger="redis_tb"):
            assert app.get("alice") == 429  # answered by Redis, after the refused charge-back
            assert app.get("alice") == 429
    finally:
        admin.config_set("maxmemory", "0")
        app.close()
    refused = [record for record in caplog.records if "refused to take back" in record.getMessage()]
    assert len(refused) == 1, caplog.text  # dropped: not sent again
    assert round(float(admin.hget(key, "tokens") or 0)) == -8
