"""Unplanned and planned failovers of a 3 primaries + 3 replicas cluster under load, through ASGI and WSGI at once
(docs/clients.md, "When Redis fails"): one primary is killed, or stopped and started again (after its replica took
over, or before), or hands its shard to a replica without the module. Every identity must stay within
`burst + rate * t` plus the calls in flight when the fault begins, however long the shard is gone; before the
in-memory buckets continued from Redis's last answer and charged back what they admitted, such a fault handed every
identity 3-4 fresh bursts.

Each test starts its own cluster (`cluster-node-timeout` 1000 ms: a replica takes over within a few seconds), so the
scenarios are independent; ASGI and WSGI share it and its fault, each with its own prefix (its own buckets)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import Cluster, Server
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from test_local_fallback import asgi_caller, ok_asgi, ok_wsgi

from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi

RATE, BURST = 5.0, 10
IDENTITIES = 20  # per middleware
PER_IDENTITY_RPS = 10.0  # twice the rate: 200 requests/s per middleware
WORKERS = IDENTITIES  # per middleware, one per identity: one call of it in flight, a stalled call stalls no other
# One call per identity in flight when the fault begins (Redis may have taken it while the middleware, given no
# reply, admits it in memory), and one answered by the primary but lost with it before it reached the replica.
IN_FLIGHT = 2
NODE_TIMEOUT = ("--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0")
DEADLINE_S = 30.0


def who(request: Any) -> str:
    return str(request.get("path", request.get("PATH_INFO", ""))).strip("/")


class Record:
    """What one identity was answered, and when its first call began and its last one ended."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.first = float("inf")
        self.last = 0.0
        self.refused = float("-inf")  # when its last refused call began

    def add(self, began: float, status: int) -> None:
        self.statuses.append(status)
        self.first = min(self.first, began)
        self.last = time.monotonic()
        if status == 429:
            self.refused = began


class Load:
    """Requests of `IDENTITIES` identities at `PER_IDENTITY_RPS` each through the WSGI and the ASGI middleware,
    from `WORKERS` threads and `WORKERS` tasks, until `stop()`."""

    def __init__(self, cluster: Cluster) -> None:
        limits = [Limit("api", rate=RATE, burst=BURST)]
        port = cluster.nodes[0].port
        self.sync_client = RedisCluster(host="127.0.0.1", port=port)
        self.async_client = AsyncRedisCluster(host="127.0.0.1", port=port)
        self.sync_limiter = TokenBucket(self.sync_client)
        self.async_limiter = AsyncTokenBucket(self.async_client)
        self.wsgi = wsgi.RateLimitMiddleware(ok_wsgi, limiter=self.sync_limiter, limits=limits, key=who, prefix="w:")
        self.asgi = asgi.RateLimitMiddleware(ok_asgi, limiter=self.async_limiter, limits=limits, key=who, prefix="a:")
        self.records = {kind: {f"u{n}": Record() for n in range(IDENTITIES)} for kind in ("wsgi", "asgi")}
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._wsgi_worker, args=(w,), daemon=True) for w in range(WORKERS)]
        self.threads.append(threading.Thread(target=lambda: asyncio.run(self._asgi_workers()), daemon=True))
        for thread in self.threads:
            thread.start()

    def _share(self, worker: int) -> list[str]:
        return [f"u{n}" for n in range(worker, IDENTITIES, WORKERS)]

    def _paced(self, worker: int) -> Iterator[tuple[str, float]]:
        """(identity, seconds to wait) for the worker's next call: its identities in turn at the target rate."""
        share = self._share(worker)
        interval = 1 / (PER_IDENTITY_RPS * len(share))
        due = time.monotonic() + random.uniform(0, interval)
        while not self.stopping.is_set():
            for identity in share:
                now = time.monotonic()
                due = max(due + interval, now - 0.5)  # a stalled worker catches up for at most half a second
                yield identity, max(0.0, due - now)

    def _wsgi_worker(self, worker: int) -> None:
        answered: list[str] = []

        def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
            answered.append(status)

        for identity, wait in self._paced(worker):
            time.sleep(wait)
            began = time.monotonic()
            self.wsgi({"PATH_INFO": f"/{identity}", "REQUEST_METHOD": "GET"}, start_response)
            self.records["wsgi"][identity].add(began, int(answered.pop().split()[0]))

    async def _asgi_workers(self) -> None:
        call = asgi_caller(self.asgi)

        async def worker(index: int) -> None:
            for identity, wait in self._paced(index):
                await asyncio.sleep(wait)
                began = time.monotonic()
                status = await call(identity)
                self.records["asgi"][identity].add(began, status)

        await asyncio.gather(*(worker(index) for index in range(WORKERS)))
        await self.async_client.aclose()

    def requests(self) -> int:
        return sum(len(record.statuses) for records in self.records.values() for record in records.values())

    def run_for(self, seconds: float) -> None:
        """Lets the load run `seconds` more (and fails if a worker died)."""
        time.sleep(seconds)
        assert all(thread.is_alive() for thread in self.threads), "a load worker stopped"

    def run_until_limited(self) -> None:
        """Runs the load at least 2 s more, until most identities of each middleware were refused (429) in calls
        begun from now: their tokens were all spent after the fault, so a fresh burst would have been admitted."""
        since = time.monotonic()
        self.run_for(2)

        def limited() -> bool:
            return all(
                sum(record.refused >= since for record in records.values()) >= IDENTITIES / 2
                for records in self.records.values()
            )

        wait_for(limited, "most identities meet their limit after the fault")

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(DEADLINE_S)
        self.sync_client.close()

    def assert_bound_kept(self, faulted: Server) -> None:
        """Every identity, in both middlewares, admitted at most `burst + rate * t + IN_FLIGHT` and was answered
        nothing but 200 or 429; identities on the faulted shard were among them."""
        over: list[str] = []
        for kind, records in self.records.items():
            on_faulted = [name for name in records if serves(faulted, f"{kind[0]}:{{{name}}}:api")]
            assert on_faulted, f"{kind}: no identity on the faulted shard"
            for name, record in records.items():
                admitted = record.statuses.count(200)
                seconds = record.last - record.first
                bound = BURST + RATE * seconds + IN_FLIGHT
                shown = f"{kind} {name}: {admitted} admitted of {len(record.statuses)} in {seconds:.1f} s"
                if admitted > bound:
                    over.append(f"{shown}, bound {bound:.1f}")
                assert set(record.statuses) <= {200, 429}, f"{shown}: {sorted(set(record.statuses))}"
        assert not over, "\n".join(over)


def serves(node: Server, key: str) -> bool:
    try:
        node.client().hgetall(key)
        return True
    except redis.exceptions.ResponseError:  # MOVED
        return False


def replica_of(cluster: Cluster, primary: Server) -> Server:
    (replica,) = [
        node
        for node in cluster.nodes
        if node is not primary and node.client().info("replication").get("master_port") == primary.port
    ]
    return replica


def replicates(node: Server, primary: Server) -> bool:
    info = node.client().info("replication")
    return bool(info.get("master_port") == primary.port and info.get("master_link_status") == "up")


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            if condition():
                return
        except redis.exceptions.RedisError:
            pass
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def limiter_calls(node: Server) -> int:
    """The limiter calls `node` has served: TB.* commands, FCALL, EVAL and EVALSHA (INFO commandstats)."""
    stats = node.client().info("commandstats")
    names = [name for name in stats if name.startswith("cmdstat_tb.")]
    names += ["cmdstat_fcall", "cmdstat_eval", "cmdstat_evalsha"]
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in names)


def reached(primary: Server) -> None:
    """Waits until the middlewares' calls reach `primary`, the shard's new primary (which, as a replica, served
    none): the clients found it."""
    wait_for(lambda: limiter_calls(primary) > 0, "the middlewares' calls reach the new primary")


def takes_over(node: Server) -> Callable[[], bool]:
    """Whether `node` is a primary and finds the cluster serving every slot."""

    def check() -> bool:
        client = node.client(socket_timeout=1)
        try:
            role = client.info("replication")["role"]
            return bool(role == "master" and client.cluster("info")["cluster_state"] == "ok")
        finally:
            client.close()

    return check


@pytest.fixture
def started() -> Iterator[list[Cluster]]:
    """The test's cluster, stopped at the end whatever happened."""
    clusters: list[Cluster] = []
    yield clusters
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def load() -> Iterator[list[Load]]:
    loads: list[Load] = []
    yield loads
    for running in loads:
        running.stop()


def test_a_killed_primary_and_its_replica_taking_over(started: list[Cluster], load: list[Load]) -> None:
    cluster = Cluster(module=True, replicas=1, args=NODE_TIMEOUT)
    started.append(cluster)
    primary = cluster.nodes[0]
    replica = replica_of(cluster, primary)
    running = Load(cluster)
    load.append(running)
    running.run_for(2)  # Redis's buckets run low before the fault begins
    primary.process.send_signal(signal.SIGKILL)
    wait_for(takes_over(replica), "the replica takes over")
    reached(replica)
    running.run_until_limited()
    running.stop()
    running.assert_bound_kept(replica)


def test_a_primary_shut_down_and_started_again(started: list[Cluster], load: list[Load]) -> None:
    """SHUTDOWN NOSAVE: the primary waits for its replica to catch up and exits; the replica takes the shard, and
    the primary comes back empty as its replica."""
    cluster = Cluster(module=True, replicas=1, args=NODE_TIMEOUT)
    started.append(cluster)
    primary = cluster.nodes[0]
    replica = replica_of(cluster, primary)
    running = Load(cluster)
    load.append(running)
    running.run_for(2)
    with contextlib.suppress(redis.exceptions.ConnectionError):  # the server closes the connection as it exits
        primary.client().shutdown(nosave=True)
    primary.process.wait(DEADLINE_S)
    wait_for(takes_over(replica), "the replica takes over")
    primary.restart()
    wait_for(lambda: replicates(primary, replica), "the restarted primary replicates the new one")
    reached(replica)
    running.run_until_limited()
    running.stop()
    running.assert_bound_kept(replica)


def test_a_primary_shut_down_and_started_again_before_a_replica_takes_over(
    started: list[Cluster], load: list[Load]
) -> None:
    """SHUTDOWN NOSAVE with the AOF on, and replicas that may not take over (cluster-replica-no-failover): the
    primary comes back on its port with its buckets and keeps its shard, whose calls fail while it is gone."""
    cluster = Cluster(
        module=True,
        replicas=1,
        args=(*NODE_TIMEOUT, "--appendonly", "yes", "--cluster-replica-no-failover", "yes"),
    )
    started.append(cluster)
    primary = cluster.nodes[0]
    running = Load(cluster)
    load.append(running)
    running.run_for(2)
    with contextlib.suppress(redis.exceptions.ConnectionError):  # the server closes the connection as it exits
        primary.client().shutdown(nosave=True)
    primary.process.wait(DEADLINE_S)
    running.run_for(0.5)  # the shard's calls fail meanwhile
    primary.restart()
    wait_for(takes_over(primary), "the restarted primary serves its shard")
    reached(primary)  # a new process: its command counts start at 0
    running.run_until_limited()
    running.stop()
    running.assert_bound_kept(primary)


def test_a_failover_to_a_replica_without_the_module(started: list[Cluster], load: list[Load]) -> None:
    """The replicas lack the module: the new primary answers `unknown command`, the clients switch to the function
    library, which finds the buckets the module left (its effects replicate as HSET and PEXPIREAT)."""
    cluster = Cluster(module=True, replicas=1, args=NODE_TIMEOUT, replica_module=False)
    started.append(cluster)
    primary = cluster.nodes[0]
    replica = replica_of(cluster, primary)
    assert not replica.module
    running = Load(cluster)
    load.append(running)
    running.run_for(2)
    assert running.sync_limiter.backend_in_use == running.async_limiter.backend_in_use == "module"
    replica.client().cluster("failover")
    wait_for(takes_over(replica), "the replica takes over")
    wait_for(
        lambda: running.sync_limiter.backend_in_use != "module" and running.async_limiter.backend_in_use != "module",
        "both clients leave the module",
    )
    reached(replica)
    running.run_until_limited()
    running.stop()
    running.assert_bound_kept(replica)
    assert running.sync_limiter.backend_in_use in ("function", "script")
