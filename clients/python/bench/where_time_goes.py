#!/usr/bin/env python3
"""Where each variant of `bench/peer_app.py` spends a request's time inside the process, outside the HTTP server:
the FastAPI app called in-process (no socket but Redis's), one request at a time, N requests after a warm-up, keyed
by the x-user header over 1,000 identities, against a spawned redis-server with the module. Prints, per variant, the
wall time per request without a profiler, then cProfile's own time per request grouped by package (redis_tb, redis,
slowapi + limits, starlette + fastapi, asyncio, the rest) and the heaviest functions of the limiter's own package.

    TB_MODULE=$PWD/target/release/libredis_tb.so .venv/bin/python clients/python/bench/where_time_goes.py [variant ...]
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
N = int(os.environ.get("BENCH_REQUESTS", "5000"))
GROUPS = [
    ("redis_tb", "/redis_tb/"),
    ("redis-py", "/redis/"),
    ("slowapi + limits", "/slowapi/"),
    ("slowapi + limits", "/limits/"),
    ("starlette + fastapi", "/starlette/"),
    ("starlette + fastapi", "/fastapi/"),
    ("prometheus_client", "/prometheus_client/"),
    ("asyncio", "/asyncio/"),
]


def group_of(filename: str) -> str:
    for name, part in GROUPS:
        if part in filename:
            return name
    return "other (builtins, sockets)"


async def requests(app: Any, n: int, offset: int) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise SystemExit(f"profile: status {message['status']}")

    for i in range(n):
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/",
            "raw_path": b"/",
            "root_path": "",
            "query_string": b"",
            "headers": [(b"host", b"127.0.0.1"), (b"x-user", f"user-{(i + offset) % 1000}".encode())],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
        }
        await app(scope, receive, send)


async def one_variant() -> None:
    sys.path.insert(0, str(HERE))
    import peer_app

    app = peer_app.app
    await requests(app, 1000, 0)  # warm-up
    started = time.perf_counter()
    await requests(app, N, 0)
    wall_us = (time.perf_counter() - started) * 1e6 / N
    profile = cProfile.Profile()
    profile.enable()
    await requests(app, N, 0)
    profile.disable()
    stats = pstats.Stats(profile)
    by_group: dict[str, float] = defaultdict(float)
    ours: list[tuple[float, str]] = []
    for (filename, line, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_group[group_of(filename)] += tottime
        if "/redis_tb/" in filename:
            ours.append((tottime, f"{Path(filename).name}:{line} {function}"))
    total = sum(by_group.values())
    print(f"{os.environ['VARIANT']}: {wall_us:.0f} µs/request without the profiler; under cProfile (own time):")
    for name, seconds in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"  {name:28} {seconds * 1e6 / N:7.1f} µs/request  {seconds / total:5.1%}")
    for seconds, where in sorted(ours, reverse=True)[:12]:
        print(f"    {seconds * 1e6 / N:6.1f} µs  {where}")


def main() -> None:
    if os.environ.get("VARIANT"):
        asyncio.run(one_variant())
        return
    variants = sys.argv[1:] or ["bare", "redis-tb", "slowapi-moving", "slowapi-fixed", "slowapi-sliding"]
    server = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
    module = os.environ.get("TB_MODULE", str(HERE.parents[2] / "target/release/libredis_tb.so"))
    sys.path.insert(0, str(HERE))
    from peers import free_port, redis_command, wait_for

    port = free_port()
    redis = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--loadmodule", module],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: redis_command(port, "PING").startswith("+PONG"), "redis-server")
        for variant in variants:
            env = {**os.environ, "VARIANT": variant, "KEYING": "header", "REDIS_PORT": str(port)}
            subprocess.run([sys.executable, __file__], env=env, check=True)
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    main()
