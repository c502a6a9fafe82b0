"""The clients over redis-py's cluster clients, sync and asyncio, on a 3-primary cluster with the module and on
one without (the script): calls route to the key's shard, hash-tagged buckets go in one call, buckets in
different slots are refused before anything is sent."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from conftest import WITHOUT_MODULE, Cluster, Server, owner
from fastapi import FastAPI
from flask import Flask
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

import redis_tb
from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb._plan import Plan


@pytest.fixture(scope="module", params=["module", "script"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    started = Cluster(module=request.param == "module")
    yield started
    started.stop()


def test_sync_cluster_client(cluster: Cluster) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    tb = TokenBucket(client)
    keys = [f"user:{n}" for n in range(12)]  # spread over the three shards
    for key in keys:
        assert tb.acquire(key, 10, 20, 5).remaining == 15
    assert tb.backend_in_use == ("module" if cluster.nodes[0].module else WITHOUT_MODULE)
    for key in keys:
        stored = owner(cluster, key).client().hgetall(key)
        assert stored[b"tokens"] == b"15"
    each = tb.acquire_each([("{acme}:user", 10, 20, 1), ("{acme}:tenant", 100, 200, 10)])
    assert each.allowed and [b.remaining for b in each.buckets] == [19, 190]
    assert tb.acquire_all([("{acme}:user", 10, 20), ("{acme}:tenant", 100, 200)]).allowed
    with pytest.raises((redis.exceptions.RedisClusterException, redis.exceptions.ResponseError)):
        tb.acquire_all([("user:1", 10, 20), ("user:2", 10, 20)])  # different slots: CROSSSLOT
    assert tb.reserve("{acme}:paced", 10, 1, 1, 1000).granted
    assert tb.reset(*keys) == len(keys)
    client.close()


async def test_async_cluster_client(cluster: Cluster) -> None:
    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[1].port)
    tb = AsyncTokenBucket(client)
    try:
        for n in range(6):
            assert (await tb.acquire(f"async:{n}", 1, 2)).remaining == 1
        each = await tb.acquire_each([("{t}:a", 1, 2, 2), ("{t}:b", 1, 2, 3)])
        assert not each.allowed and each.limiting_index == 1 and each.buckets[1].retry_after_ms == -1
        with pytest.raises(redis_tb.InvalidArgument):
            await tb.acquire("async:0", 1, 0)
    finally:
        await client.aclose()


# The middleware on a cluster: every bucket of a request in one slot whatever the identity, and a cluster that
# cannot be reached answered by the fail mode.

AWKWARD = ["}x", "{}", "", "{", "}{", "a b", "x}"]
TWO_LIMITS = [Limit("a", rate=0.01, burst=2), Limit("b", rate=0.01, burst=3)]


def wsgi_app(limiter: TokenBucket, identity: str | None, prefix: str, **options: Any) -> Flask:
    app = Flask(__name__)
    app.get("/")(lambda: "hello")
    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=limiter, limits=TWO_LIMITS, key=lambda request: identity, prefix=prefix, **options
    )
    return app


def fastapi_app(limiter: AsyncTokenBucket, identity: str | None, prefix: str, **options: Any) -> FastAPI:
    app = FastAPI()
    app.get("/")(lambda: "hello")
    key = lambda scope: identity  # noqa: E731
    app.add_middleware(asgi.RateLimitMiddleware, limiter=limiter, limits=TWO_LIMITS, key=key, prefix=prefix, **options)
    return app


def test_wsgi_limits_any_identity_on_a_cluster(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Identities holding `{`, `}`, spaces or nothing are escaped in keys, so no key gets an empty hash tag
    (`ratelimit:{}x}:a`), which would put a request's buckets in two slots: CROSSSLOT, a 500."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    for identity in AWKWARD:
        http = wsgi_app(TokenBucket(client), identity, prefix="wsgi:", fail="closed").test_client()
        assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429], identity
    assert "CROSSSLOT" not in caplog.text and "slot" not in caplog.text
    client.close()


async def test_asgi_limits_any_identity_on_a_cluster(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[1].port)
    for identity in AWKWARD:
        app = fastapi_app(AsyncTokenBucket(client), identity, prefix="asgi:", fail="closed")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            assert [(await http.get("/")).status_code for _ in range(3)] == [200, 200, 429], identity
    assert "CROSSSLOT" not in caplog.text and "slot" not in caplog.text
    await client.aclose()


def lone_node() -> Server:
    """A one-node cluster serving every slot (it reports cluster_state:ok two seconds after it starts)."""
    cluster_args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    node = Server(module=True, args=cluster_args, cluster_bus=True)
    node.client().cluster("addslots", *range(16384))
    deadline = time.monotonic() + 20
    while node.client().cluster("info")["cluster_state"] != "ok":
        assert time.monotonic() < deadline, "the node never reached cluster_state:ok"
        time.sleep(0.02)
    return node


async def test_the_fail_mode_answers_when_the_cluster_is_gone() -> None:
    """A cluster that cannot be connected ("Redis Cluster cannot be connected") is answered by the fail mode, in
    ASGI and WSGI, never a 500."""
    node = lone_node()
    sync_client = RedisCluster(host="127.0.0.1", port=node.port)
    flask = wsgi_app(TokenBucket(sync_client), "user", prefix="gone:", fail="closed", timeout=0.5).test_client()
    async_client = AsyncRedisCluster(host="127.0.0.1", port=node.port)
    app = fastapi_app(AsyncTokenBucket(async_client), "user", prefix="gone:", fail="closed", timeout=0.5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        assert flask.get("/").status_code == 200 and (await http.get("/")).status_code == 200
        node.stop()
        assert flask.get("/").status_code == 503 and (await http.get("/")).status_code == 503
    sync_client.close()
    await async_client.aclose()
    never = AsyncRedisCluster(host="127.0.0.1", port=node.port)  # not reachable even at the first call
    app = fastapi_app(AsyncTokenBucket(never), "user", prefix="gone:", timeout=0.5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        assert [(await http.get("/")).status_code for _ in range(3)] == [200, 200, 429]  # fail="local"
    await never.aclose()


def tenant_limits(prefix: str) -> list[Limit]:
    """A per-user limit next to a per-tenant one: two identities, two slots."""
    return [Limit("user", rate=0.001, burst=5), Limit("tenant", rate=0.001, burst=2, key=lambda request: "acme")]


def assert_tenant_limited(cluster: Cluster, prefix: str, statuses: list[int], caplog: pytest.LogCaptureFixture) -> None:
    assert statuses == [200, 200, 429]
    # The refused request took nothing: what its user bucket gave was given back.
    user_key = f"{prefix}{{u1}}:user"
    assert round(float(owner(cluster, user_key).client().hget(user_key, "tokens") or 0), 2) == 3
    assert "slot" not in caplog.text


def test_wsgi_limits_of_several_identities_on_a_cluster(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """One call cannot reach buckets in two slots: the middleware makes one per identity, refunding on refusal."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    app = Flask(__name__)
    app.get("/")(lambda: "hello")
    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=TokenBucket(client), limits=tenant_limits("w:"), key=lambda r: "u1", prefix="w:"
    )
    http = app.test_client()
    assert_tenant_limited(cluster, "w:", [http.get("/").status_code for _ in range(3)], caplog)
    client.close()


async def test_asgi_limits_of_several_identities_on_a_cluster(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[2].port)
    app = FastAPI()
    app.get("/")(lambda: "hello")
    limits = tenant_limits("a:")
    app.add_middleware(
        asgi.RateLimitMiddleware, limiter=AsyncTokenBucket(client), limits=limits, key=lambda s: "u1", prefix="a:"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        statuses = [(await http.get("/")).status_code for _ in range(3)]
        refused = await http.get("/")
    assert_tenant_limited(cluster, "a:", statuses, caplog)
    assert refused.json()["limit"] == "tenant"
    assert refused.headers["ratelimit-policy"] == '"user";q=5;w=5000, "tenant";q=2;w=2000'
    await client.aclose()


def taker(cluster: Cluster) -> dict[str, Any]:
    """Credentials of an ACL user that may take tokens but never give them back: TB.REFUND is denied, and so is DEL
    (the script's refund deletes a bucket it fills: the one of the tests below, burst 5, after a request of 1)."""
    commands = ["+@all", "-del", *(["-tb.refund"] if cluster.nodes[0].module else [])]
    for node in cluster.nodes:
        node.client().acl_setuser("taker", enabled=True, passwords=["+pw"], keys=["*"], commands=commands)
    return {"host": "127.0.0.1", "port": cluster.nodes[0].port, "username": "taker", "password": "pw"}


def drain_tenant(cluster: Cluster, prefix: str) -> None:
    """Empties the tenant bucket from outside the middleware: its in-memory fallback has never seen it, so the fail
    mode (fail="local") would admit the next request."""
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    assert TokenBucket(client).acquire(f"{prefix}{{acme}}:tenant", 0.001, 2, 2).allowed
    client.close()


def assert_refused_without_refund(
    cluster: Cluster, prefix: str, status: int, body: Any, caplog: pytest.LogCaptureFixture
) -> None:
    assert status == 429, status
    assert body["limit"] == "tenant"
    assert "could not give back what a refused request took" in caplog.text
    # The refund failed: the user bucket keeps the token the refused request took.
    user_key = f"{prefix}{{u1}}:user"
    assert round(float(owner(cluster, user_key).client().hget(user_key, "tokens") or 0), 2) == 4


def test_wsgi_refusal_stands_when_its_refund_fails(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """A part refused, then the refund of the allowed part fails (NOPERM): the request is refused with the
    part's reply and the failure logged, never handed to the fail mode (which would admit it)."""
    drain_tenant(cluster, "wr:")
    client = RedisCluster(**taker(cluster))
    app = Flask(__name__)
    app.get("/")(lambda: "hello")
    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=TokenBucket(client), limits=tenant_limits("wr:"), key=lambda r: "u1", prefix="wr:"
    )
    with caplog.at_level(logging.WARNING, logger="redis_tb"):
        response = app.test_client().get("/")
        assert_refused_without_refund(cluster, "wr:", response.status_code, response.get_json(), caplog)
    client.close()


async def test_asgi_refusal_stands_when_its_refund_fails(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    drain_tenant(cluster, "ar:")
    client = AsyncRedisCluster(**taker(cluster))
    app = FastAPI()
    app.get("/")(lambda: "hello")
    limits = tenant_limits("ar:")
    app.add_middleware(
        asgi.RateLimitMiddleware, limiter=AsyncTokenBucket(client), limits=limits, key=lambda s: "u1", prefix="ar:"
    )
    with caplog.at_level(logging.WARNING, logger="redis_tb"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            response = await http.get("/")
    assert_refused_without_refund(cluster, "ar:", response.status_code, response.json(), caplog)
    await client.aclose()


def test_moved_and_crossslot_from_a_cluster_node_answer_with_the_fail_mode(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that does not follow the cluster (a plain one on a node) meets MOVED, and CROSSSLOT for buckets
    of two identities in one call: the fail mode, CROSSSLOT logged as an error."""
    key = "ratelimit:{u1}:user"
    stranger = next(node for node in cluster.nodes if node is not owner(cluster, key))
    moved = wsgi_app(TokenBucket(stranger.client()), "u1", prefix="ratelimit:", fail="closed").test_client()
    assert moved.get("/").status_code == 503
    limits = tenant_limits("x:")
    node = stranger.client()
    app = Flask(__name__)
    app.get("/")(lambda: "hello")
    app.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=TokenBucket(node), limits=limits, key=lambda r: "u1", prefix="x:", fail="closed"
    )
    with caplog.at_level(logging.ERROR, logger="redis_tb"):
        statuses = {app.test_client().get("/").status_code for _ in range(3)}
    assert statuses == {503}
    (error,) = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert "CROSSSLOT" in error.message


def test_wsgi_limits_again_after_a_planned_failover() -> None:
    """A replica takes over the shard of the limited key (CLUSTER FAILOVER): redis-py 6 and later connect to it with
    a node client of their own making, which the middleware's settings must not break (a `retry` written into the
    cluster's connection arguments made each new node connection fail with TypeError: the fail mode for good)."""
    cluster = Cluster(module=True, replicas=1)
    try:
        key = "f:{u1}:a"
        primary = owner(cluster, key)
        primary_id = primary.client().cluster("myid")
        (replica,) = [
            node for node in cluster.nodes if node.client().info("replication").get("master_port") == primary.port
        ]
        client = RedisCluster(host="127.0.0.1", port=primary.port)
        http = wsgi_app(TokenBucket(client), "u1", prefix="f:", fail="closed").test_client()
        assert http.get("/").status_code == 200
        replica.client().cluster("failover")
        deadline = time.monotonic() + 30
        while replica.client().info("replication")["role"] != "master":
            assert time.monotonic() < deadline, "the replica never took over"
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        statuses: list[int] = []
        while (status := http.get("/").status_code) == 503 or not statuses:
            statuses.append(status)
            assert time.monotonic() < deadline, f"the middleware never limited again: {statuses}"
            time.sleep(0.05)
        assert status in (200, 429) and owner(cluster, key) is replica
        assert primary.client().cluster("myid") == primary_id
        client.close()
    finally:
        cluster.stop()


def test_a_plan_goes_in_one_call_per_cluster_slot() -> None:
    """Limits of several identities go in one call per slot, as Node's middleware sends them: `u787` and `u1020`
    hash to one slot (13453), so their buckets go in one atomic call; `u1` is in another slot, a call of its own."""
    user, tenant = Limit("user", rate=1, burst=1), Limit("tenant", rate=1, burst=1)
    keys = ("ratelimit:{u787}:user", "ratelimit:{u1020}:tenant")
    assert key_slot(keys[0].encode()) == key_slot(keys[1].encode())
    shared = Plan((user, tenant), keys, ("u787", "u1020"))
    assert shared.parts() == (shared,)
    apart = Plan((user, tenant, user), (keys[0], "ratelimit:{u1}:tenant", keys[1]), ("u787", "u1", "u1020"))
    assert [part.keys for part in apart.parts()] == [(keys[0], keys[1]), ("ratelimit:{u1}:tenant",)]
