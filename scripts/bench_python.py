#!/usr/bin/env python3
"""`make bench`, Python part: the fallback script's cost next to the module, and the FastAPI middleware under load.

1. Redis level, the module against the Lua fallback (`lua/tb.lua`) on the same server binary: redis-benchmark
   (50 clients, pipeline 16, 3 interleaved rounds, medians) runs `HSET` on a hot key, `TB.ACQUIRE` on a hot key
   (module server) and the script's `TB.ACQUIRE` through `EVALSHA` (a server without the module), and the same
   for `TB.ACQUIREALL` over 3 buckets, beside the simple Lua bucket the main bench compares against (no exact
   text, no expiry window, no argument checks). Every call is allowed (a huge rate), so every call writes. Reported:
   calls/s, the ratio to `HSET` of the same round, and the command's own time (INFO commandstats
   usec_per_call).
2. HTTP level: a FastAPI app (`scripts/bench_app.py`) served by uvicorn (one process), loaded by wrk:
   - added latency: one connection against the app without middleware, with the middleware on the module, and
     with the middleware on the script (three uvicorn processes), every request allowed; 3 interleaved rounds of
     5 s each, medians of wrk's p50 and p99, and their differences to the app without middleware; and the
     middleware's own time per request as the app measured it (entry to the route's app: the Redis round trip
     and the decision), p50 and p99, which wrk's end-to-end figures blur on a busy machine;
   - the bound: 16 connections for 20 s against one key (rate 100/s, burst 200), on the module and on the
     script: requests served (2xx) must be at most burst + rate * t, t being wrk's measured duration. Fails the
     bench otherwise.
3. What metrics and shadow mode cost: the ASGI and WSGI middlewares called in one process under callgrind (no HTTP
   server), on Redis, every request allowed, with `metrics=None`, with metrics (a `CollectorRegistry`), and with
   metrics and `shadow=True` (the limit decided in shadow: one call, as enforced). The middleware's own time is
   counted as the instructions that process runs per request (the decision, the metrics, redis-py writing the call
   and reading the reply): a count that the rest of a shared machine does not move, where wall-clock figures moved by
   more than the 5% to check. Fails the bench when metrics or shadow mode add more than 5%. A request with both
   enforced and shadow limits makes a second call (docs/operating.md): a round trip more, by design.
Redis runs on one core, uvicorn on the other, wrk beside Redis.

    TB_MODULE=target/release/libredis_tb.so REDIS_SERVER=/usr/bin/redis-server .venv/bin/python scripts/bench_python.py
    ... scripts/bench_python.py --cost     # section 3 only (about a minute)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from bench_support import free_port, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "lua" / "tb.lua").read_text()
SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
MODULE = os.environ.get("TB_MODULE", str(ROOT / "target/release/libredis_tb.so"))
BENCHMARK = os.environ.get("REDIS_BENCHMARK", "/usr/bin/redis-benchmark")
WRK = shutil.which("wrk") or "/usr/bin/wrk"
REDIS_CPU, APP_CPU = "1", "0"
ROUNDS = 3
BOUND_RATE, BOUND_BURST, BOUND_SECONDS = 100, 200, 20
LATENCY_SECONDS = 5
LATENCY_ROUNDS = 3


class Process:
    def __init__(self, command: list[str], cpu: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            ["taskset", "-c", cpu, *command],
            env=dict(os.environ, **(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        stop(self.process)


class Server(Process):
    def __init__(self, module: bool) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-tb-bench-py-")
        command = [
            SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
        ]
        if module:
            command += ["--loadmodule", MODULE]
        super().__init__(command, REDIS_CPU)
        self.conn = redis.Redis(port=self.port)
        wait_for(self.conn.ping, f"bench_python: redis-server on {self.port}", (OSError, redis.RedisError))

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_benchmark(port: int, count: int, *command: str) -> float:
    output = subprocess.run(
        [
            "taskset",
            "-c",
            APP_CPU,
            BENCHMARK,
            "-p",
            str(port),
            "-c",
            "50",
            "-P",
            "16",
            "-n",
            str(count),
            "-q",
            *command,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.findall(r"([0-9.]+) requests per second", output)
    if not match:
        raise SystemExit(f"bench_python: no figure from redis-benchmark: {output}")
    return float(match[-1])


def usec_per_call(conn: redis.Redis, command: str) -> float:
    stats = conn.info("commandstats").get(f"cmdstat_{command}", {})
    return float(stats.get("usec_per_call", 0.0))


def redis_level() -> list[tuple[str, float, float, float]]:
    module, plain = Server(module=True), Server(module=False)
    try:
        sha = plain.conn.script_load(SCRIPT)
        simple_sha = plain.conn.script_load((ROOT / "scripts" / "bench_bucket.lua").read_text())
        keys = ["{b}:1", "{b}:2", "{b}:3"]
        all_module = ["TB.ACQUIREALL", "1"] + [part for key in keys for part in (key, "1000000", "1e9")]
        all_script = ["EVALSHA", sha, "3", *keys, "TB.ACQUIREALL", "1"] + ["1000000", "1e9"] * 3
        cases = [
            ("HSET hot key", module, 400_000, ["HSET", "bench:h", "f", "v"], "hset"),
            ("TB.ACQUIRE, module", module, 300_000, ["TB.ACQUIRE", "bench:k", "1000000", "1e9"], "tb.acquire"),
            (
                "TB.ACQUIRE, Lua fallback",
                plain,
                100_000,
                ["EVALSHA", sha, "1", "bench:k", "TB.ACQUIRE", "1000000", "1e9"],
                "evalsha",
            ),
            (
                "a simple Lua token bucket (scripts/bench_bucket.lua), server TIME",
                plain,
                100_000,
                ["EVALSHA", simple_sha, "1", "bench:simple", "1000000", "1e9", "1"],
                "evalsha",
            ),
            ("TB.ACQUIREALL 3 buckets, module", module, 200_000, all_module, "tb.acquireall"),
            ("TB.ACQUIREALL 3 buckets, Lua fallback", plain, 60_000, all_script, "evalsha"),
        ]
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name, *_ in cases}
        for _ in range(ROUNDS):
            hset = 0.0
            for name, server, count, command, stat in cases:
                server.conn.flushall()
                server.conn.config_resetstat()
                rate = redis_benchmark(server.port, count, *command)
                hset = rate if stat == "hset" else hset
                figures[name].append((rate, rate / hset, usec_per_call(server.conn, stat)))
        return [
            (
                name,
                statistics.median(r[0] for r in rows),
                statistics.median(r[1] for r in rows),
                statistics.median(r[2] for r in rows),
            )
            for name, rows in figures.items()
        ]
    finally:
        module.stop()
        plain.stop()


def wrk(port: int, seconds: int, connections: int) -> dict[str, float]:
    output = subprocess.run(
        [
            "taskset",
            "-c",
            REDIS_CPU,
            WRK,
            "-t",
            "1",
            "-c",
            str(connections),
            "-d",
            f"{seconds}s",
            "--latency",
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def ms(label: str) -> float:
        found = re.search(rf"^\s+{label}%\s+([0-9.]+)(us|ms|s)\s*$", output, flags=re.M)
        if not found:
            raise SystemExit(f"bench_python: no {label}% latency in wrk's output:\n{output}")
        value, unit = float(found.group(1)), found.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    total = re.search(r"(\d+) requests in ([0-9.]+)(s|m)", output)
    if not total:
        raise SystemExit(f"bench_python: no request count in wrk's output:\n{output}")
    duration_s = float(total.group(2)) * (60 if total.group(3) == "m" else 1)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    requests = int(total.group(1))
    return {
        "p50": ms("50"),
        "p99": ms("99"),
        "requests": requests,
        "duration_s": duration_s,
        "served": requests - (int(non_2xx.group(1)) if non_2xx else 0),
        "rps": requests / duration_s,
    }


def in_process(port: int) -> dict[str, float]:
    """The app's own timing of the middleware since the last call (scripts/bench_app.py)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /__stats HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    body = response.split(b"\r\n\r\n", 1)[1]
    return {key: float(value) for key, value in json.loads(body).items()}


def serve(mode: str, redis_port: int, rate: float, burst: float, key: str) -> tuple[Process, int]:
    port = free_port()
    env = {
        "TB_BENCH_MODE": mode,
        "TB_BENCH_REDIS_PORT": str(redis_port),
        "TB_BENCH_RATE": str(rate),
        "TB_BENCH_BURST": str(burst),
        "TB_BENCH_KEY": key,
        "PYTHONPATH": str(ROOT / "scripts"),
    }
    app = Process(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench_app:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        APP_CPU,
        env,
    )
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None, f"bench_python: uvicorn on {port}")
    return app, port


def http_level() -> tuple[list[tuple[str, dict[str, float]]], list[tuple[str, dict[str, float], float]]]:
    module, plain = Server(module=True), Server(module=False)
    apps: list[Process] = []
    try:
        cases = [
            ("no middleware", "none", module),
            ("middleware, module", "module", module),
            ("middleware, Lua fallback", "script", plain),
        ]
        ports = []
        for _, mode, server in cases:
            app, port = serve(mode, server.port, 1e9, 1e12, f"latency:{mode}")
            apps.append(app)
            ports.append(port)
            wrk(port, 2, 1)  # warm-up: imports, connection pools, the script cache
        # Interleaved rounds, so that whatever else the machine does hits every case alike; medians per case.
        runs: list[list[dict[str, float]]] = [[] for _ in cases]
        for _ in range(LATENCY_ROUNDS):
            for index, port in enumerate(ports):
                in_process(port)  # drop the samples of earlier runs
                result = wrk(port, LATENCY_SECONDS, 1)
                inside = in_process(port)
                result["mw_p50"], result["mw_p99"] = inside["p50"], inside["p99"]
                runs[index].append(result)
        latency = [
            (label, {field: statistics.median(run[field] for run in runs[index]) for field in runs[index][0]})
            for index, (label, _, _) in enumerate(cases)
        ]
        for app in apps:
            app.stop()
        apps = []
        bound = []
        for label, mode, server in [("module", "module", module), ("Lua fallback", "script", plain)]:
            app, port = serve(mode, server.port, BOUND_RATE, BOUND_BURST, f"bound:{mode}")
            apps.append(app)
            result = wrk(port, BOUND_SECONDS, 16)
            limit = BOUND_BURST + BOUND_RATE * result["duration_s"]
            bound.append((label, result, limit))
        return latency, bound
    finally:
        for app in apps:
            app.stop()
        module.stop()
        plain.stop()


COST_REQUESTS = 400
COST_LIMIT = 0.05
COST_CASES = ("metrics=None", "metrics", "metrics, shadow=True")


def cost_child(redis_port: int) -> None:
    """Run under callgrind by `middleware_cost`: builds each interface's middleware per case on the Redis at
    `redis_port`, then per case says `ready`, waits for `go` (polling stdin, so that callgrind_control is served),
    sends COST_REQUESTS requests through it and says `done`."""
    import asyncio
    import gc
    import select

    import prometheus_client

    from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi

    limit = Limit("cost", rate=1e9, burst=1e12)
    options = {
        "metrics=None": {"metrics": None},
        "metrics": {"metrics": prometheus_client.CollectorRegistry()},
        "metrics, shadow=True": {"metrics": prometheus_client.CollectorRegistry(), "shadow": True},
    }

    async def asgi_app(scope: object, receive: object, send: object) -> None:
        return None

    def wsgi_app(environ: object, start_response: object) -> list[bytes]:
        return []

    async def receive() -> dict[str, object]:
        return {"type": "http.request"}

    async def send(message: object) -> None:
        return None

    scope = {"type": "http", "path": "/", "headers": [], "client": ("127.0.0.1", 1)}
    environ = {"PATH_INFO": "/", "REMOTE_ADDR": "127.0.0.1"}
    loop = asyncio.new_event_loop()

    async def run_asgi(middleware: Any, count: int) -> None:
        for _ in range(count):
            await middleware(scope, receive, send)

    def run(interface: str, middleware: Any, count: int) -> None:
        if interface == "ASGI":
            loop.run_until_complete(run_asgi(middleware, count))
        else:
            for _ in range(count):
                middleware(environ, lambda *args: None)

    def wait_for_go() -> None:
        while not select.select([sys.stdin], [], [], 0.05)[0]:
            pass
        sys.stdin.readline()

    built = []
    for interface in ("ASGI", "WSGI"):
        for case in COST_CASES:
            common: dict[str, Any] = {"limits": [limit], "key": lambda request: "one-key", **options[case]}
            if interface == "ASGI":
                limiter: Any = AsyncTokenBucket(redis.asyncio.Redis(port=redis_port), backend="module")
                middleware: Any = asgi.RateLimitMiddleware(asgi_app, limiter=limiter, **common)
            else:
                limiter = TokenBucket(redis.Redis(port=redis_port), backend="module")
                middleware = wsgi.RateLimitMiddleware(wsgi_app, limiter=limiter, **common)
            run(interface, middleware, 20)  # warm-up: the connection, first registrations, caches
            built.append((interface, case, middleware))
    gc.disable()  # a collection lands in whichever case crosses its threshold: counted in none
    for interface, case, middleware in built:
        gc.collect()
        print(f"ready {interface} {case}", flush=True)
        wait_for_go()
        run(interface, middleware, COST_REQUESTS)
        print("done", flush=True)
        wait_for_go()


def middleware_cost() -> list[tuple[str, str, float]]:
    """(interface, case, instructions per request) of the middleware on Redis; see the module doc, 3."""
    server = Server(module=True)
    out_dir = tempfile.mkdtemp(prefix="redis-tb-bench-cost-")
    child = subprocess.Popen(
        [
            "taskset",
            "-c",
            APP_CPU,
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_dir}/callgrind.out",
            sys.executable,
            __file__,
            "--cost-child",
            str(server.port),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    rows = []
    try:
        for _ in range(2 * len(COST_CASES)):
            line = child.stdout.readline().strip().split(maxsplit=2)
            if not line or line[0] != "ready":
                raise SystemExit(f"bench_python: the cost child said {line!r}")
            subprocess.run(["callgrind_control", "-z", str(child.pid)], capture_output=True, check=True)
            child.stdin.write("go\n")
            child.stdin.flush()
            if child.stdout.readline().strip() != "done":
                raise SystemExit("bench_python: the cost child did not finish a case")
            before = set(Path(out_dir).glob("callgrind.out*"))
            subprocess.run(["callgrind_control", "-d", str(child.pid)], capture_output=True, check=True)
            dumps = sorted(set(Path(out_dir).glob("callgrind.out*")) - before, key=os.path.getmtime)
            found = re.search(r"^(?:summary|totals): (\d+)", dumps[-1].read_text(), re.M)
            if not found:
                raise SystemExit(f"bench_python: no total in {dumps[-1]}")
            rows.append((line[1], line[2], int(found.group(1)) / COST_REQUESTS))
            child.stdin.write("go\n")
            child.stdin.flush()
        child.wait(timeout=60)
        return rows
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(out_dir, ignore_errors=True)
        server.stop()


def main() -> None:
    if "--cost-child" in sys.argv:
        cost_child(int(sys.argv[sys.argv.index("--cost-child") + 1]))
        return
    version = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"== bench_python: {version}; wrk: {WRK}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if "--cost" in sys.argv:
        cost_section()
        return
    rows = redis_level()
    print("\nRedis level: redis-benchmark, 50 clients, pipeline 16, medians of 3 interleaved rounds")
    print("\n| case | calls/s | x HSET | command µs/call |\n|---|--:|--:|--:|")
    for name, rate, ratio, usec in rows:
        print(f"| {name} | {rate:,.0f} | {ratio:.2f} | {usec:.2f} |")
    latency, bound = http_level()
    base = latency[0][1]
    print(
        f"\nHTTP level: FastAPI on uvicorn (1 process), wrk, 1 connection, {LATENCY_ROUNDS} interleaved rounds of"
        f" {LATENCY_SECONDS} s per app, medians; every request allowed; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "\n| app | requests/s | wrk p50 ms | wrk p99 ms | added p50 ms (wrk) | added p99 ms (wrk) |"
        " middleware p50 ms (in process) | middleware p99 ms (in process) |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for label, r in latency:
        print(
            f"| {label} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['p50'] - base['p50']:.2f} |"
            f" {r['p99'] - base['p99']:.2f} | {r['mw_p50']:.3f} | {r['mw_p99']:.3f} |"
        )
    print(f"\nBound: one key, rate {BOUND_RATE}/s, burst {BOUND_BURST}, wrk 16 connections for {BOUND_SECONDS} s")
    print("\n| backend | requests | served (2xx) | t (s) | bound burst + rate * t | within |")
    print("|---|--:|--:|--:|--:|---|")
    failed = False
    for label, r, limit in bound:
        within = r["served"] <= limit
        failed |= not within
        print(
            f"| {label} | {r['requests']:,.0f} | {r['served']:,.0f} | {r['duration_s']:.2f} | {limit:,.0f} |"
            f" {'yes' if within else 'NO'} |"
        )
    if failed:
        raise SystemExit("bench_python: a run served more than burst + rate * t")
    cost_section()


def cost_section() -> None:
    rows = middleware_cost()
    print(
        f"\nMetrics and shadow mode: the middleware's own instructions per request on Redis (callgrind, this process"
        f" only: redis-py's writing and reading included, the wait for Redis not), {COST_REQUESTS} requests per case,"
        " every one allowed"
    )
    print("\n| middleware | case | instructions per request | vs metrics=None |\n|---|---|--:|--:|")
    base = {interface: count for interface, case, count in rows if case == "metrics=None"}
    over = []
    for interface, case, count in rows:
        ratio = count / base[interface] - 1
        print(f"| {interface} | {case} | {count:,.0f} | {ratio:+.1%} |")
        if ratio > COST_LIMIT:
            over.append(f"{interface} {case}: {ratio:+.1%}")
    if over:
        raise SystemExit(f"bench_python: metrics or shadow mode add more than {COST_LIMIT:.0%}: {', '.join(over)}")


if __name__ == "__main__":
    main()
