"""The clients over redis-py's cluster clients, sync and asyncio, on a 3-primary cluster with the module and on
one without (the script): calls route to the key's shard, hash-tagged buckets go in one call, buckets in
different slots are refused before anything is sent."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from conftest import CLI, Server
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

import redis_tb
from redis_tb import AsyncTokenBucket, TokenBucket


class Cluster:
    def __init__(self, module: bool) -> None:
        args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        self.nodes = [Server(module=module, args=args, cluster_bus=True) for _ in range(3)]
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [CLI, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + 20
        for node in self.nodes:
            while node.client().cluster("info")["cluster_state"] != "ok":
                assert time.monotonic() < deadline, f"node {node.port} never reached cluster_state:ok"
                time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="module", params=["module", "script"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    started = Cluster(module=request.param == "module")
    yield started
    started.stop()


def owner(cluster: Cluster, key: str) -> Server:
    """The node that serves `key`: the others answer MOVED."""
    for node in cluster.nodes:
        try:
            node.client().hgetall(key)
            return node
        except redis.exceptions.ResponseError:
            continue
    raise AssertionError(f"no node serves {key}")


def test_sync_cluster_client(cluster: Cluster) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    tb = TokenBucket(client)
    keys = [f"user:{n}" for n in range(12)]  # spread over the three shards
    for key in keys:
        assert tb.acquire(key, 10, 20, 5).remaining == 15
    assert tb.backend_in_use == ("module" if cluster.nodes[0].module else "script")
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
