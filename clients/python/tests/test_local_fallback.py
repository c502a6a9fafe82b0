"""`fail="local"` keeps the limit's bound on real servers, in ASGI and WSGI alike (docs/clients.md, "When Redis
fails"): one process admits at most `burst + rate * t` per key over any interval `t`, whether one shard fails while
another answers, Redis flaps, or a flood of identities meets a Redis that is down."""

from __future__ import annotations

import asyncio
import itertools
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
from conftest import WITHOUT_MODULE, Cluster, Server, owner
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


class Bare:
    """The middleware of `kind` alone over `client` (no framework), for tests that look into its in-memory buckets:
    `get(identity)` answers a status, `get_at_once(identity, n)` sends n requests at once (one task or thread each)."""

    def __init__(self, kind: str, client: Any, limits: list[Limit], **options: Any) -> None:
        self.kind = kind
        self.client = client
        self.loop = asyncio.new_event_loop()
        self.middleware: asgi.RateLimitMiddleware | wsgi.RateLimitMiddleware
        if kind == "asgi":
            self.middleware = asgi.RateLimitMiddleware(
                ok_asgi, limiter=AsyncTokenBucket(client), limits=limits, key=who, **options
            )
            self.call = asgi_caller(self.middleware)
        else:
            self.middleware = wsgi.RateLimitMiddleware(
                ok_wsgi, limiter=TokenBucket(client), limits=limits, key=who, **options
            )

    def get(self, identity: str) -> int:
        if isinstance(self.middleware, asgi.RateLimitMiddleware):
            return int(self.loop.run_until_complete(self.call(identity)))
        answered: list[str] = []

        def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
            answered.append(status)

        self.middleware({"PATH_INFO": f"/{identity}"}, start_response)
        return int(answered[0].split()[0])

    def get_at_once(self, identity: str, count: int) -> list[int]:
        if self.kind == "asgi":

            async def together() -> list[int]:
                return list(await asyncio.gather(*(self.call(identity) for _ in range(count))))

            return self.loop.run_until_complete(together())
        statuses: list[int] = []
        ready = threading.Barrier(count)

        def one() -> None:
            ready.wait()
            statuses.append(self.get(identity))

        threads = [threading.Thread(target=one) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return statuses

    def in_memory(self, key: str) -> float:
        """The tokens the key's in-memory bucket holds now: what this process's own history allows."""
        local = self.middleware.local
        bucket = local._buckets[key]
        return bucket.held(local.clock())

    def close(self) -> None:
        if self.kind == "asgi":
            self.loop.run_until_complete(self.client.aclose())
        else:
            self.client.close()
        self.loop.close()


def redis_tokens(server: Server, key: str, rate: float, burst: float) -> float:
    """The tokens Redis's bucket holds now (within a millisecond of refill), from a peek that writes nothing."""
    with server.client() as admin:
        peek = TokenBucket(admin).acquire(key, rate, burst, 0)
    return burst - rate * peek.reset_after_ms / 1000


def lower_stats(server: Server) -> dict[str, int]:
    """TB.LOWER's counts in INFO commandstats: `calls` answered, `rejected_calls` refused, before running (ACL) or
    by the command itself (OOM: it answers a call that writes nothing, so it runs; Redis counts `failed_calls`)."""
    with server.client() as admin:
        stats = admin.info("commandstats").get("cmdstat_tb.lower", {})
    calls, rejected, failed = (int(stats.get(name, 0)) for name in ("calls", "rejected_calls", "failed_calls"))
    return {"calls": calls - failed, "rejected_calls": rejected + failed}


#: The paced client: rate 2/s, burst 5, its burst used at once and then one request at each token's refill, through
#: an OOM fault from FAULT_S[0] to FAULT_S[1] after its burst and on to PACED_S.
PACED_RATE, PACED_BURST = 2.0, 5
FAULT_S = (1.0, 11.0)
PACED_S = 16.0
#: Each paced request is sent this long after its token refilled (by the test's clock): never before it.
PACE_MARGIN_S = 0.05


def test_a_client_paced_at_the_limit_meets_no_refusal_through_a_fault_and_after_it(
    fresh: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that uses its burst, then exactly the limit's rate, is within `burst + rate * t` all along: it is
    never refused, not during a 10 s OOM fault (decided in memory) nor after it, when Redis, full again, is brought
    down to the in-memory bucket instead of being charged the whole fault's admissions on top of its refill. ASGI
    and WSGI run side by side, each against a bucket of its own."""
    fresh.client().config_set("maxmemory-policy", "noeviction")
    limits = [Limit("api", rate=PACED_RATE, burst=PACED_BURST)]
    apps = {
        "asgi": App("asgi", fresh.async_client(), limits, prefix="paced-asgi:", timeout=5),
        "wsgi": App("wsgi", fresh.client(), limits, prefix="paced-wsgi:", timeout=5),
    }
    statuses: dict[str, list[tuple[float, int]]] = {kind: [] for kind in KINDS}
    began = time.monotonic()

    def paced(kind: str) -> None:
        app = apps[kind]
        burst = [app.get("alice") for _ in range(PACED_BURST)]
        statuses[kind] += [(0.0, status) for status in burst]
        drained = time.monotonic()  # Redis took the last token before this
        for token in itertools.count(1):
            slot = drained + token / PACED_RATE + PACE_MARGIN_S
            if slot - began > PACED_S:
                return
            time.sleep(max(0.0, slot - time.monotonic()))
            statuses[kind].append((time.monotonic() - began, app.get("alice")))

    clients = [threading.Thread(target=paced, args=(kind,)) for kind in KINDS]
    try:
        with caplog.at_level(logging.WARNING, logger="redis_tb"), fresh.client() as admin:
            for thread in clients:
                thread.start()
            time.sleep(max(0.0, began + FAULT_S[0] - time.monotonic()))
            admin.config_set("maxmemory", "1")
            time.sleep(max(0.0, began + FAULT_S[1] - time.monotonic()))
            admin.config_set("maxmemory", "0")
            for thread in clients:
                thread.join(PACED_S + 30)
    finally:
        fresh.client().config_set("maxmemory", "0")
        for app in apps.values():
            app.close()
    for kind in KINDS:
        during = [status for at, status in statuses[kind] if FAULT_S[0] + 0.1 < at < FAULT_S[1]]
        after = [status for at, status in statuses[kind] if at > FAULT_S[1] + 0.1]
        assert len(during) >= 18 and len(after) >= 8, (kind, statuses[kind])  # 2 a second: the pace was kept
        refused = [(round(at, 2), status) for at, status in statuses[kind] if status != 200]
        assert refused == [], (kind, refused)
        # Redis was brought down to the in-memory bucket (a token or so); left alone, it would be full.
        assert redis_tokens(fresh, f"paced-{kind}:{{alice}}:api", PACED_RATE, PACED_BURST) < 2, kind
    failed = [record.getMessage() for record in caplog.records if "maxmemory" in record.getMessage()]
    assert len(failed) >= 2, caplog.text  # each middleware met the fault


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_calls_at_recovery_bring_redis_down_once(kind: str, fresh: Server) -> None:
    """Redis drained, then 2 s of OOM (rate 5/s, burst 5: Redis refills to its burst meanwhile) in which 6 requests
    are admitted in memory, then 8 requests at once as Redis answers again: each sends its own floor, and Redis ends
    where this process's history puts it, less what the 8 took, not the admissions charged once per request or on
    top of Redis's capped refill."""
    rate, burst = 5.0, 5
    prefix = f"at-once-{kind}:"
    key = f"{prefix}{{alice}}:api"
    admin = fresh.client()
    admin.config_set("maxmemory-policy", "noeviction")
    client: Any = fresh.client() if kind == "wsgi" else fresh.async_client()
    bare = Bare(kind, client, [Limit("api", rate=rate, burst=burst)], prefix=prefix, timeout=5)
    try:
        assert [bare.get("alice") for _ in range(burst + 1)] == [200] * burst + [429]
        admin.config_set("maxmemory", "1")
        fault_began = time.monotonic()
        during = []
        for step in range(1, 7):  # one every 0.3 s: the in-memory bucket gains 0.5 a step
            time.sleep(max(0.0, fault_began + 0.3 * step - time.monotonic()))
            during.append(bare.get("alice"))
        time.sleep(max(0.0, fault_began + 2 - time.monotonic()))
        admin.config_set("maxmemory", "0")
        allowed = bare.in_memory(key)
        read_at = time.monotonic()
        together = bare.get_at_once("alice", 8)
        after = redis_tokens(fresh, key, rate, burst)
        elapsed = time.monotonic() - read_at
    finally:
        admin.config_set("maxmemory", "0")
        bare.close()
    assert during == [200] * 6
    assert 3 <= allowed <= 4.5, allowed
    taken = together.count(200)
    assert taken >= 3, together  # the in-memory bucket's tokens, from Redis
    # Not below what the history allows (what the 8 took aside), and not above it (what refilled since aside).
    assert allowed - taken - 0.01 <= after <= allowed - taken + rate * elapsed + 0.01, (allowed, taken, after)


@pytest.mark.parametrize("backend", ["module", WITHOUT_MODULE])
@pytest.mark.parametrize("kind", KINDS)
def test_a_charge_back_that_meets_oom_stays_owed_and_the_call_is_decided_in_memory(kind: str, backend: str) -> None:
    """While Redis answers OOM, each call for the diverged key sends its charge-back first; OOM fails it like a
    fault, so what it covered stays owed and the call is decided in memory. When Redis answers again, one floor
    brings it down to the in-memory bucket, not below: Redis's refill capped at the burst meanwhile is not taken a
    second time. With the module, and without it (the calls and charge-backs run in the library, or the script)."""
    rate, burst = 2.0, 5
    prefix = f"oom-{kind}:"
    key = f"{prefix}{{alice}}:api"
    fresh = Server(module=backend == "module")
    admin = fresh.client()
    admin.config_set("maxmemory-policy", "noeviction")
    client: Any = fresh.client() if kind == "wsgi" else fresh.async_client()
    bare = Bare(kind, client, [Limit("api", rate=rate, burst=burst)], prefix=prefix, timeout=5)
    try:
        assert bare.get("alice") == 200  # Redis: 4 left
        assert bare.middleware.limiter.backend_in_use == backend
        admin.config_set("maxmemory", "1")
        before = lower_stats(fresh)
        fault_began = time.monotonic()
        during = []
        while time.monotonic() - fault_began < 2:  # Redis would refill 4 meanwhile: capped at 5
            during.append(bare.get("alice"))
            time.sleep(0.1)
        rejected = lower_stats(fresh)["rejected_calls"] - before["rejected_calls"]
        admin.config_set("maxmemory", "0")
        allowed = bare.in_memory(key)
        read_at = time.monotonic()
        taken = int(bare.get("alice") == 200)
        after = redis_tokens(fresh, key, rate, burst)
        elapsed = time.monotonic() - read_at
    finally:
        admin.config_set("maxmemory", "0")
        bare.close()
        calls = lower_stats(fresh)["calls"] - before["calls"]
        fresh.stop()
    # Decided in memory: the 4 tokens Redis last reported, then about 2 a second.
    assert during[:4] == [200] * 4 and 6 <= during.count(200) <= 10, during
    if backend == "module":  # the library's and the script's calls are all FCALL or EVALSHA in the statistics
        assert rejected == len(during) - 1, (rejected, during)  # every call but the first sent one, refused by OOM
        assert calls == 1  # then one floor, once Redis answers
    assert allowed - taken - 0.01 <= after <= allowed - taken + rate * elapsed + 0.01, (allowed, taken, after)


@pytest.mark.parametrize("kind", KINDS)
def test_a_charge_back_refused_by_an_acl_is_dropped_and_logged_and_the_call_answered_by_redis(
    kind: str, fresh: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The limiter's Redis user may not run TB.LOWER: a configuration error, not a fault. Each charge-back is
    refused (NOPERM), what it covered dropped and logged as an error, and the call goes on to Redis: after an OOM
    fault in which the in-memory bucket spent its refill, Redis, which kept its own, answers the next request."""
    rate, burst = 1.0, 5
    prefix = f"noperm-{kind}:"
    key = f"{prefix}{{alice}}:api"
    admin = fresh.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.acl_setuser("limiter", enabled=True, nopass=True, keys=["*"], categories=["+@all"], commands=["-tb.lower"])
    options = {"username": "limiter", "password": "unused"}
    client: Any = fresh.client(**options) if kind == "wsgi" else fresh.async_client(**options)
    classes: list[str] = []
    bare = Bare(
        kind,
        client,
        [Limit("api", rate=rate, burst=burst)],
        prefix=prefix,
        timeout=5,
        on_error=lambda error, request, failure: classes.append(failure.class_),
    )
    try:
        assert [bare.get("alice") for _ in range(burst)] == [200] * burst
        with caplog.at_level(logging.WARNING, logger="redis_tb"):
            admin.config_set("maxmemory", "1")
            fault_began = time.monotonic()
            during = []
            while time.monotonic() - fault_began < 2.2:
                during.append(bare.get("alice"))
                time.sleep(0.1)
            admin.config_set("maxmemory", "0")
            assert bare.in_memory(key) < 1  # the in-memory bucket would refuse
            assert bare.get("alice") == 200  # Redis, which took nothing during the fault, allows it
    finally:
        admin.config_set("maxmemory", "0")
        bare.close()
    assert 1 <= during.count(200) <= 3, during  # decided in memory: the tokens that refilled, about 2
    assert 0 <= redis_tokens(fresh, key, rate, burst) < 3  # about 2.2 refilled in Redis, one taken
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "refused to take back" in r.getMessage()]
    assert len(errors) == 1, caplog.text  # at most once a minute
    assert "no permissions" in errors[0].getMessage(), errors[0].getMessage()
    assert "noperm" in classes and "oom" in classes, classes  # each refused charge-back, each call OOM failed
