"""Which backend serves the calls, and the switches between them, on real servers: the module while it answers,
else the Redis Functions library (loaded by the client, reloaded after a FUNCTION FLUSH, a failover or a
restart), else the script where functions are unavailable (Redis 6.2, an ACL user without them); the caller's
clock where the server refuses TIME inside scripts. Each switch is logged once with its reason."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from conftest import REPO, WITHOUT_MODULE, Cluster, Server

import redis_tb
from redis_tb import AsyncTokenBucket, TokenBucket
from redis_tb import _protocol as protocol

needs_functions = pytest.mark.skipif(WITHOUT_MODULE != "function", reason="the server has no Redis Functions")


@pytest.fixture
def fresh_plain() -> Iterator[Server]:
    """An empty server without the module: no library, no cached script."""
    server = Server(module=False)
    yield server
    server.stop()


def switches(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage()) for record in caplog.records if record.name == "redis_tb"]


def libraries(conn: redis.Redis) -> list[str]:
    return [dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"].decode() for entry in conn.function_list()]


def calls(conn: redis.Redis, command: str) -> int:
    return int(conn.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_first_call_on_an_empty_server_loads_the_library(
    fresh_plain: Server, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="redis_tb")
    conn = fresh_plain.client()
    tb = TokenBucket(conn)
    assert tb.acquire(key, 0.01, 20).remaining == 19
    assert tb.acquire(key, 0.01, 20, 0).remaining == 19
    assert tb.backend_in_use == WITHOUT_MODULE
    if WITHOUT_MODULE == "function":
        assert libraries(conn) == [protocol.LIBRARY_NAME]
        assert calls(conn, "function|load") == 1
    logged = switches(caplog)
    assert logged[0][0] == logging.INFO and "does not know TB.ACQUIRE" in logged[0][1]
    assert len(logged) == (1 if WITHOUT_MODULE == "function" else 2)  # 6.2: no FCALL either
    assert all(level == logging.INFO for level, _ in logged)  # a first detection, not a failover


@needs_functions
def test_function_flush_mid_run_costs_one_reload(fresh_plain: Server, key: str) -> None:
    conn = fresh_plain.client()
    tb = TokenBucket(conn)
    tb.acquire(key, 0.01, 5, 2)
    conn.function_flush()
    assert tb.acquire(key, 0.01, 5, 2).remaining == 1  # the bucket is kept: only the code was lost
    assert calls(conn, "function|load") == 2
    assert tb.backend_in_use == "function"


@needs_functions
async def test_async_client_reloads_the_library_too(fresh_plain: Server, key: str) -> None:
    conn = fresh_plain.async_client()
    try:
        tb = AsyncTokenBucket(conn)
        assert (await tb.acquire(key, 0.01, 5, 2)).remaining == 3
        await conn.function_flush()
        assert (await tb.acquire(key, 0.01, 5, 2)).remaining == 1
        assert tb.backend_in_use == "function"
    finally:
        await conn.aclose()


@needs_functions
def test_two_versions_share_a_server_each_with_its_library(fresh_plain: Server, key: str) -> None:
    conn = fresh_plain.client()
    conn.function_load(protocol.LIBRARY.replace(protocol.LIBRARY_NAME, "tb_0_0_1"))
    TokenBucket(conn).acquire(key, 1, 5)
    assert sorted(libraries(conn)) == sorted(["tb_0_0_1", protocol.LIBRARY_NAME])


#: A primary that starts a replica's sync at once (7.0+ waits 5 s for more replicas by default).
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def replica_of(primary: Server) -> Server:
    replica = Server(module=False, args=("--replicaof", "127.0.0.1", str(primary.port)))
    deadline = time.monotonic() + 20
    while replica.client().info("replication")["master_link_status"] != "up":
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.02)
    return replica


class Failover:
    """A primary, with or without the module, its replica without it, and a client of the primary."""

    def __init__(self, module: bool) -> None:
        self.primary = Server(module=module, args=FAST_SYNC)
        self.replica = replica_of(self.primary)
        self.conn = self.primary.client()

    def run(self) -> None:
        """Once the replica has everything the primary wrote (WAIT on another connection would not wait for the
        client's writes), it becomes the primary and the client's address moves to it (what Sentinel or a DNS name
        does)."""
        written = self.primary.client().info("replication")["master_repl_offset"]
        deadline = time.monotonic() + 5
        while self.replica.client().info("replication")["master_repl_offset"] < written:
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.01)
        self.replica.client().replicaof("NO", "ONE")
        self.primary.stop()
        self.conn.connection_pool.disconnect()
        self.conn.connection_pool = redis.ConnectionPool(host="127.0.0.1", port=self.replica.port)

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def failover() -> Iterator[Callable[[bool], Failover]]:
    started: list[Failover] = []

    def start(module: bool) -> Failover:
        started.append(Failover(module))
        return started[-1]

    yield start
    for pair in started:
        pair.stop()


def test_failover_to_a_primary_without_the_module_switches_and_retries(
    failover: Callable[[bool], Failover], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After the module has answered, `unknown command` from a new primary moves the client to the library (or
    the script) and the call is retried there, on the replicated bucket, without an error."""
    caplog.set_level(logging.INFO, logger="redis_tb")
    pair = failover(True)
    tb = TokenBucket(pair.conn)
    assert tb.acquire(key, 0.01, 10, 4).remaining == 6
    assert tb.backend_in_use == "module"
    pair.run()
    assert tb.acquire(key, 0.01, 10, 4).remaining == 2  # no error, and the bucket went on
    assert tb.backend_in_use == WITHOUT_MODULE
    assert not tb.acquire(key, 0.01, 10, 4).allowed
    logged = switches(caplog)
    assert logged[1][0] == logging.WARNING and "does not know TB.ACQUIRE" in logged[1][1]
    assert re.search(r"\(unknown command .TB\.ACQUIRE.\).*instead of the redis-tb module", logged[1][1])
    assert key not in logged[1][1]  # no arguments, so no identities, in the log
    assert len([entry for entry in logged if entry[0] == logging.WARNING]) == 1


def test_a_failback_to_a_primary_with_the_module_brings_the_calls_back(
    failover: Callable[[bool], Failover], key: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failover left the module, one call a minute (here: every call) tries the module again; when a
    failback puts a primary with the module behind the address, the calls go back to it, logged once."""
    monkeypatch.setattr(redis_tb.client, "MODULE_RETRY_S", 0.0)
    caplog.set_level(logging.INFO, logger="redis_tb")
    pair = failover(True)
    tb = TokenBucket(pair.conn)
    tb.acquire(key, 0.01, 10, 4)
    pair.run()
    assert tb.acquire(key, 0.01, 10, 4).remaining == 2
    assert tb.acquire(key, 0.01, 10, 1).remaining == 1  # tried the module, stayed on the library
    assert tb.backend_in_use == WITHOUT_MODULE
    back = Server(module=True)
    try:
        pair.conn.connection_pool.disconnect()
        pair.conn.connection_pool = redis.ConnectionPool(host="127.0.0.1", port=back.port)
        assert tb.acquire(key, 0.01, 10, 4).remaining == 6  # a new primary: its own (empty) bucket
        assert tb.backend_in_use == "module"
        back_lines = [(level, line) for level, line in switches(caplog) if "answers again" in line]
        assert back_lines == [(logging.WARNING, back_lines[0][1])]
    finally:
        back.stop()


async def test_async_client_switches_after_a_failover_too(failover: Callable[[bool], Failover], key: str) -> None:
    pair = failover(True)
    conn = pair.primary.async_client()
    try:
        tb = AsyncTokenBucket(conn)
        assert (await tb.acquire(key, 0.01, 10, 4)).remaining == 6
        pair.run()
        await conn.connection_pool.disconnect()
        conn.connection_pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=pair.replica.port)
        assert (await tb.acquire(key, 0.01, 10, 4)).remaining == 2
        assert tb.backend_in_use == WITHOUT_MODULE
    finally:
        await conn.aclose()


def test_a_promoted_replica_serves_without_the_module(failover: Callable[[bool], Failover], key: str) -> None:
    """Library or script, a promoted replica serves the next call: functions replicate with FUNCTION LOAD, and a
    script the new primary never cached costs one EVAL."""
    pair = failover(False)
    tb = TokenBucket(pair.conn)
    assert tb.acquire(key, 0.01, 10, 4).remaining == 6
    pair.run()
    assert tb.acquire(key, 0.01, 10, 4).remaining == 2
    assert tb.backend_in_use == WITHOUT_MODULE


def test_backend_module_does_not_switch_after_a_failover(failover: Callable[[bool], Failover], key: str) -> None:
    pair = failover(True)
    tb = TokenBucket(pair.conn, backend="module")
    tb.acquire(key, 1, 10)
    pair.run()
    with pytest.raises(redis_tb.ModuleNotLoaded):
        tb.acquire(key, 1, 10)


@needs_functions
@pytest.mark.parametrize("refused", ["-function", "-fcall"])
def test_acl_user_without_functions_falls_back_to_the_script(
    fresh_plain: Server, key: str, refused: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="redis_tb")
    fresh_plain.client().acl_setuser("tb", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", refused])
    tb = TokenBucket(fresh_plain.client(username="tb", password="pw"))
    assert tb.acquire(key, 0.01, 20).remaining == 19
    assert tb.acquire(key, 0.01, 20).remaining == 18
    assert tb.backend_in_use == "script"
    assert "Redis Functions are unavailable" in switches(caplog)[-1][1]
    assert "no permissions to run the" in switches(caplog)[-1][1]


@needs_functions
def test_acl_user_without_function_load_uses_a_library_already_there(fresh_plain: Server, key: str) -> None:
    assert fresh_plain.client().function_load(redis_tb.LIBRARY) == redis_tb.LIBRARY_NAME.encode()  # an administrator
    fresh_plain.client().acl_setuser("tb", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-function"])
    tb = TokenBucket(fresh_plain.client(username="tb", password="pw"))
    assert tb.acquire(key, 10, 20).remaining == 19
    assert tb.backend_in_use == "function"


@needs_functions
def test_a_library_the_server_refuses_falls_back_to_the_script(
    fresh_plain: Server, key: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that does not load there (here: one that does not compile) is no outage: the calls go to the
    script, and the log says why."""
    caplog.set_level(logging.INFO, logger="redis_tb")
    monkeypatch.setattr(protocol, "LIBRARY", f"#!lua name={protocol.LIBRARY_NAME}\nthis is not Lua")
    tb = TokenBucket(fresh_plain.client())
    assert tb.acquire(key, 10, 20).remaining == 19
    assert tb.backend_in_use == "script"
    assert "the server refused the library (Error compiling function" in switches(caplog)[-1][1]


@pytest.mark.parametrize("backend", ["function", "script"])
def test_forced_backend_never_falls_back(fresh_plain: Server, key: str, backend: str) -> None:
    tb = TokenBucket(fresh_plain.client(), backend=backend)  # type: ignore[arg-type]
    if backend == "function" and WITHOUT_MODULE == "script":
        with pytest.raises(redis.exceptions.ResponseError, match="unknown command"):
            tb.acquire(key, 1, 5)
        return
    assert tb.acquire(key, 1, 5).remaining == 4
    assert tb.backend_in_use == backend


def test_cluster_loads_the_library_on_each_primary_and_routes_fcall_itself(key: str) -> None:
    """Three primaries without the module: each gets the library at its first call, a FUNCTION FLUSH on one of
    them costs one reload there, and FCALL goes straight to the key's node (no COMMAND GETKEYS per call)."""
    cluster = Cluster(module=False)
    try:
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        tb = TokenBucket(client)
        keys: list[str] = []
        per_node: dict[str, int] = {}
        for n in range(1000):  # four buckets on each primary
            bucket = f"{{{key}:{n}}}:api"
            node = client.get_node_from_key(bucket).name  # type: ignore[no-untyped-call]
            if per_node.get(node, 0) < 4:
                per_node[node] = per_node.get(node, 0) + 1
                keys.append(bucket)
        assert len(keys) == 12
        for bucket in keys:
            assert tb.acquire(bucket, 0.01, 20, 5).remaining == 15
        assert tb.backend_in_use == WITHOUT_MODULE
        if WITHOUT_MODULE == "function":
            for node in cluster.nodes:
                assert libraries(node.client()) == [protocol.LIBRARY_NAME]
                assert calls(node.client(), "function|load") == 1
            before = sum(calls(node.client(), "command|getkeys") for node in cluster.nodes)
            cluster.nodes[1].client().function_flush()
            for bucket in keys:
                assert tb.acquire(bucket, 0.01, 20, 5).remaining == 10
            assert sum(calls(node.client(), "command|getkeys") for node in cluster.nodes) == before
            assert calls(cluster.nodes[1].client(), "function|load") == 2
        client.close()
    finally:
        cluster.stop()


# -------------------------------------------------------------------------------------------------------------
# TIME refused inside scripts: the caller's clock, and the bound burst + rate * (t + skew).
# -------------------------------------------------------------------------------------------------------------

RENAMED_TIME = ("--rename-command", "TIME", "TB_TEST_TIME")


def refusing_time(how: str) -> tuple[Server, redis.Redis]:
    """A server that refuses TIME to scripts, and a connection that meets the refusal."""
    if how == "renamed":
        server = Server(module=False, args=RENAMED_TIME)
        return server, server.client()
    server = Server(module=False)
    server.client().acl_setuser("tb", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-time"])
    return server, server.client(username="tb", password="pw")


@pytest.mark.parametrize("how", ["acl", "renamed"])
def test_each_server_refuses_time_in_a_way_the_client_maps(how: str) -> None:
    server, conn = refusing_time(how)
    try:
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            conn.eval("return redis.call('TIME')", 0)
        assert protocol.is_time_refused(refused.value), str(refused.value)
        assert not protocol.is_unknown_command(refused.value)
    finally:
        server.stop()


class Clock:
    """A caller's clock the test moves: `offset_us` ahead of (or behind) the shared virtual time."""

    def __init__(self, virtual: list[int], offset_us: int) -> None:
        self.virtual = virtual
        self.offset_us = offset_us

    def __call__(self) -> int:
        return self.virtual[0] + self.offset_us


@pytest.mark.parametrize(("how", "backend"), [("acl", "auto"), ("renamed", "auto"), ("renamed", "script")])
def test_caller_time_keeps_the_bound_with_skewed_clocks(
    how: str, backend: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two callers whose clocks differ by 1 s take from one bucket over 2 s of their time: at most
    burst + rate * (t + skew) calls are allowed, and the stored time is the later clock's."""
    caplog.set_level(logging.INFO, logger="redis_tb")
    rate, burst, skew_us, step_us, steps = 10, 20, 1_000_000, 50_000, 40
    virtual = [time.time_ns() // 1000]  # near the server's clock, so the bucket's expiry is a real one
    server, conn = refusing_time(how)
    try:
        early = TokenBucket(conn, backend=backend, now_us=Clock(virtual, 0))  # type: ignore[arg-type]
        late = TokenBucket(conn, backend=backend, now_us=Clock(virtual, skew_us))  # type: ignore[arg-type]
        allowed = 0
        start_us = virtual[0]
        for _ in range(steps + 1):
            for caller in (early, late):
                while caller.acquire(key, rate, burst).allowed:
                    allowed += 1
            virtual[0] += step_us
        t_s = (virtual[0] - step_us - start_us) / 1e6
        bound = burst + rate * (t_s + skew_us / 1e6)
        assert allowed <= bound
        assert allowed >= burst + rate * t_s  # the callers' clocks drove the refill, not the server's
        assert int(conn.hget(key, "ts") or 0) == virtual[0] - step_us + skew_us
        time_lines = [line for _, line in switches(caplog) if "refuses TIME" in line]
        assert len(time_lines) == 2  # once per client
        assert all(protocol.is_time_refused(redis.exceptions.ResponseError(line)) for line in time_lines)  # why
    finally:
        server.stop()


def test_caller_time_is_not_taken_for_another_refused_command(key: str) -> None:
    """An ACL that refuses a command the script writes with is a configuration error: it is raised, and the
    client does not switch to its own clock."""
    server = Server(module=False)
    try:
        server.client().acl_setuser("tb", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-hset"])
        tb = TokenBucket(server.client(username="tb", password="pw"), backend="script")
        with pytest.raises(redis.exceptions.ResponseError):
            tb.acquire(key, 1, 5)
        assert not tb._backends.caller_time
    finally:
        server.stop()


def test_classifiers_agree_with_the_shared_fixture() -> None:
    cases = json.loads((REPO / "fixtures" / "backends.json").read_text())["cases"]
    for case in cases:
        reply = case["reply"]
        stripped = reply.split(" ", 1)[1] if reply.startswith(("ERR ", "NOPERM ")) else reply  # as redis-py has it
        for text in (reply, stripped):
            error = redis.exceptions.ResponseError(text)
            assert protocol.backend_error_class(error) == case["class"], case
            if case["class"] == "unknown-command":
                assert protocol.is_functions_unavailable(error), case  # a server without the command has no FCALL
