"""Shared harness: private servers on free loopback ports, stopped by PID.

The server binary is `$REDIS_SERVER` (default Debian's `/usr/bin/redis-server`), the module `$TB_MODULE` (default
`target/release/libredis_tb.so`, which `make test` builds first). Binaries are absolute paths, never looked up on
the PATH. Tests never touch port 6379 or a server they did not start. A controlled clock (`Clock`) comes from
the repository's `tests/clock/` tool.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_tb import SCRIPT

REPO = Path(__file__).resolve().parents[3]
SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
CLI = os.environ.get("REDIS_CLI", "/usr/bin/redis-cli")
MODULE = os.environ.get("TB_MODULE", str(REPO / "target/release/libredis_tb.so"))
STARTUP_DEADLINE_S = 20.0


def server_version(binary: str = SERVER) -> tuple[int, int]:
    """`(major, minor)` of a redis-server or valkey-server binary."""
    text = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)", text)
    assert found, f"no version in {text!r}"
    return int(found.group(1)), int(found.group(2))


#: What serves the calls on a server without the module: the Redis Functions library where the server has
#: functions (Redis 7.0+, Valkey), else the script (Redis 6.2).
WITHOUT_MODULE = "function" if server_version() >= (7, 0) else "script"


#: The ports `free_port` has handed out in this process: the OS may give a released port again.
_HANDED_OUT: set[int] = set()


def free_port(with_bus: bool = False) -> int:
    """A port the OS just gave us, released for a server to take; never one handed out before in this process."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port in _HANDED_OUT:
            continue
        if not with_bus:
            _HANDED_OUT.add(port)
            return port
        bus_port = port + 10000
        if bus_port < 65536 and bus_port not in _HANDED_OUT:
            try:
                with socket.socket() as bus:
                    bus.bind(("127.0.0.1", bus_port))
            except OSError:
                continue
            _HANDED_OUT.update((port, bus_port))
            return port


def answers_as(port: int, pid: int) -> bool:
    """Whether the server on `port` is the process `pid` and ready: it answers PING (not LOADING), and INFO gives
    `pid` as its process_id. A released port can still be taken by another process's server before ours binds it;
    ours then exits, and a check of PING alone would take the other for ours."""
    try:
        with redis.Redis(
            host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        ) as conn:
            return bool(conn.ping()) and conn.info("server").get("process_id") == pid
    except redis.exceptions.RedisError:
        return False


class Server:
    """One redis-server process with its own directory; `stop()` kills it by PID and removes the directory."""

    def __init__(
        self,
        *,
        module: bool = True,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        cluster_bus: bool = False,
        binary: str = SERVER,
    ) -> None:
        self.module = module
        self.dir = Path(tempfile.mkdtemp(prefix="redis-tb-py-"))
        last_log = ""
        for _ in range(5):
            self.port = free_port(cluster_bus)
            command = [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.dir / "server.log"),
            ]
            if module:
                command += ["--loadmodule", MODULE]
            command += list(args)
            self.command = command
            self.env = dict(os.environ, **(env or {}))
            self._spawn()
            if self._wait_ready():
                return
            self._kill()
            log = self.dir / "server.log"
            last_log = log.read_text() if log.exists() else ""
        raise RuntimeError(f"{binary} did not start; last log:\n{last_log}")

    def _spawn(self) -> None:
        self.process = subprocess.Popen(
            self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def restart(self) -> None:
        """Starts the stopped server again with its port and directory (a cluster node keeps its nodes.conf)."""
        assert self.process.poll() is not None, "the server still runs"
        self._spawn()
        if not self._wait_ready():
            raise RuntimeError(f"{self.command[0]} did not start again")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if answers_as(self.port, self.process.pid):
                return True
            time.sleep(0.02)
        return False

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        return redis.asyncio.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three primaries, each with `replicas` replicas (in sync when the constructor returns): `nodes[:3]` are the
    primaries. `args` go to every node; `replica_module`, where given, says whether the replicas load the module."""

    def __init__(
        self, module: bool, replicas: int = 0, *, args: tuple[str, ...] = (), replica_module: bool | None = None
    ) -> None:
        args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *args)
        modules = [module] * 3 + [module if replica_module is None else replica_module] * (3 * replicas)
        self.nodes = [Server(module=loaded, args=args, cluster_bus=True) for loaded in modules]
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [CLI, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + 30
        for node in self.nodes:
            while not (
                node.client().cluster("info")["cluster_state"] == "ok"
                and synced(node)
                and known_replicas(node) == 3 * replicas
            ):
                assert time.monotonic() < deadline, f"node {node.port} never reached cluster_state:ok"
                time.sleep(0.05)
        roles = [node.client().info("replication")["role"] for node in self.nodes]
        assert roles == ["master"] * 3 + ["slave"] * (3 * replicas), roles

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def synced(node: Server) -> bool:
    """A primary, or a replica whose link to its primary is up."""
    info = node.client().info("replication")
    return info["role"] == "master" or info.get("master_link_status") == "up"


def known_replicas(node: Server) -> int:
    """How many replicas `node` knows as replicas. A primary ignores CLUSTER FAILOVER's request from a replica it
    does not know yet (Redis 6.2 learns it by gossip, seconds after the replica started syncing): the manual failover
    then times out."""
    nodes: dict[str, dict[str, Any]] = node.client().cluster("nodes")
    return sum("slave" in entry["flags"].split(",") for entry in nodes.values())


def owner(cluster: Cluster, key: str) -> Server:
    """The node that serves `key`: the others answer MOVED."""
    for node in cluster.nodes:
        try:
            node.client().hgetall(key)
            return node
        except redis.exceptions.ResponseError:  # MOVED; a replica answers MOVED to its primary too
            continue
    raise AssertionError(f"no node serves {key}")


@pytest.fixture(scope="session")
def module_server() -> Iterator[Server]:
    server = Server(module=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def plain_server() -> Iterator[Server]:
    server = Server(module=False)
    yield server
    server.stop()


@pytest.fixture(params=["module", "script"])
def server(request: pytest.FixtureRequest, module_server: Server, plain_server: Server) -> Server:
    """Each test that takes `server` runs twice: on a server with the module and on one without."""
    return module_server if request.param == "module" else plain_server


_key_counter = 0


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A key no other test uses."""
    global _key_counter
    _key_counter += 1
    return f"test:{request.node.name}:{_key_counter}"


# ---------------------------------------------------------------------------------------------------------------
# A controlled server clock: libfaketime behind the repository's preload shim (tests/clock/README.md). The server's
# wall clock (TIME, expiry, the module's clock) stands at the written microsecond until the test moves it.
# ---------------------------------------------------------------------------------------------------------------

CLOCK_2030_US = 1_893_456_000_000_000


def clock_preload() -> str | None:
    """LD_PRELOAD for a controlled clock, or None where the clock tool is not available."""
    build = Path(os.environ.get("TB_CLOCK_BUILD", str(REPO / "tests/clock/build.sh")))
    if not build.exists():
        return None
    result = subprocess.run(["bash", str(build)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return None
    return result.stdout.strip()


def faketime_text(unix_us: int) -> str:
    seconds, micros = divmod(unix_us, 1_000_000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}"


class Clock:
    """A timestamp file servers read on every clock read; `set_us` moves it atomically."""

    def __init__(self, unix_us: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="redis-tb-clock-"))
        self.path = self.dir / "faketime"
        self.set_us(unix_us)

    def set_us(self, unix_us: int) -> None:
        # libfaketime reads the fraction through a double and truncates: a tenth of a nanosecond past the microsecond
        # makes both µs readers (TIME) and ns readers (the module's CL.THROTTLE) read back that microsecond exactly.
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(faketime_text(unix_us) + "0001\n")
        tmp.rename(self.path)

    def env(self, preload: str) -> dict[str, str]:
        return {
            "LD_PRELOAD": preload,
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "TZ": "UTC",
        }

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# The function library in tests: any name will do (the packages name it after their version), generated from the
# one script by the rule in lua/tb.lua's header.
LIBRARY = "tb_test"


def library_source(name: str = LIBRARY) -> str:
    return f"#!lua name={name}\nlocal TB_LIBRARY = '{name}'\n" + SCRIPT


def function_name(command: str) -> str:
    """The library's function for a command: TB.ACQUIRE -> tb_test_acquire, CL.THROTTLE -> tb_test_cl_throttle."""
    return f"{LIBRARY}_{command.lower().removeprefix('tb.').replace('.', '_')}"
