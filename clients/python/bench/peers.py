#!/usr/bin/env python3
"""`make bench-middleware-python`: redis-tb's ASGI middleware beside slowapi, one FastAPI app per variant, each
under uvicorn (one worker) in its own process, all against one spawned redis-server with the module:
  bare, redis-tb (RateLimitMiddleware, module backend), slowapi's SlowAPIASGIMiddleware on its Redis storage
  (`limits`) with each strategy it offers: moving window, fixed window, sliding window counter (slowapi has no
  token bucket).
Every limit is far above the load (every request allowed). Two keyings: the peer address (one identity) and an
x-user header cycling 1,000 identities (wrk with a Lua script). BENCH_ROUNDS interleaved rounds; in each round every
variant gets BENCH_SECONDS of wrk (BENCH_CONNECTIONS connections, 1 thread), after a short warm-up. Per variant and
round: requests/s, its ratio to the bare app of the same round, the app's own CPU µs per request (utime + stime of
the uvicorn process from /proc/<pid>/stat over the measured window / requests wrk completed) and Redis's CPU µs per
request (INFO cpu, used_cpu_user + used_cpu_sys, over the same window). The table shows the median of the rounds
and the min-max spread; the last lines say where redis-tb stands against each peer.

    REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so .venv/bin/python \
        clients/python/bench/peers.py
"""

from __future__ import annotations

import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
MODULE = os.environ.get("TB_MODULE", str(ROOT / "target/release/libredis_tb.so"))
WRK = os.environ.get("WRK", "/usr/bin/wrk")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "10"))
VARIANTS = os.environ.get("BENCH_VARIANTS", "bare,redis-tb,slowapi-moving,slowapi-fixed,slowapi-sliding").split(",")
KEYINGS = os.environ.get("BENCH_KEYINGS", "peer,header").split(",")
PEERS = [v for v in VARIANTS if v.startswith("slowapi")]
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")

# wrk's script: an x-user header cycling 1,000 identities.
SCRIPT = """local i = 0
request = function()
  i = (i + 1) % 1000
  return wrk.format("GET", "/", { ["x-user"] = "user-" .. i })
end
"""
UVICORN = [
    sys.executable,
    "-m",
    "uvicorn",
    "peer_app:app",
    "--workers",
    "1",
    "--no-access-log",
    "--log-level",
    "warning",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"peers: {what} did not come up")


def connects(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def redis_command(port: int, *args: str) -> str:
    """One command in RESP over a fresh connection; the reply's text."""
    request = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        data = sock.recv(65536)
        if data.startswith(b"$"):
            size = int(data[1 : data.index(b"\r\n")])
            while len(data) < data.index(b"\r\n") + 2 + size:
                data += sock.recv(65536)
        return data.decode()


def redis_cpu_us(port: int) -> float:
    info = redis_command(port, "INFO", "cpu")

    def field(name: str) -> float:
        found = re.search(rf"^{name}:([\d.]+)", info, re.M)
        return float(found.group(1)) if found else 0.0

    return (field("used_cpu_user") + field("used_cpu_sys")) * 1e6


def app_cpu_us(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_US  # utime, stime (fields 14 and 15)


def wrk(url: str, seconds: int, keying: str, script: str) -> tuple[int, int]:
    args = [WRK, "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency"]
    if keying == "header":
        args += ["-s", script]
    out = subprocess.run([*args, url], check=True, capture_output=True, text=True).stdout
    requests = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return (int(requests.group(1)) if requests else 0, int(non2xx.group(1)) if non2xx else 0)


def one_round(variant: str, keying: str, redis_port: int, script: str) -> dict[str, float]:
    port = free_port()
    env = {**os.environ, "VARIANT": variant, "KEYING": keying, "REDIS_PORT": str(redis_port)}
    uvicorn = subprocess.Popen(
        [*UVICORN, "--app-dir", str(HERE), "--host", "127.0.0.1", "--port", str(port)],
        env=env,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: connects(port), f"uvicorn ({variant}) on {port}")
        wrk(url, 2, keying, script)  # warm-up: connections, imports, the script cache
        app_before, redis_before = app_cpu_us(uvicorn.pid), redis_cpu_us(redis_port)
        started = time.monotonic()
        served, non2xx = wrk(url, SECONDS, keying, script)
        elapsed = time.monotonic() - started
        app_after, redis_after = app_cpu_us(uvicorn.pid), redis_cpu_us(redis_port)
        if non2xx:
            raise SystemExit(f"peers: {variant}/{keying}: {non2xx} responses were not 2xx")
        return {
            "rps": served / elapsed,
            "app_us": (app_after - app_before) / served,
            "redis_us": 0.0 if variant == "bare" else (redis_after - redis_before) / served,
        }
    finally:
        uvicorn.terminate()
        try:
            uvicorn.wait(10)
        except subprocess.TimeoutExpired:
            uvicorn.kill()
            uvicorn.wait()


def spread(xs: list[float], digits: int) -> str:
    return f"{min(xs):.{digits}f}-{max(xs):.{digits}f}"


def table(keying: str, results: dict[str, list[dict[str, float]]]) -> list[str]:
    label = "key = x-user header, 1,000 identities" if keying == "header" else "key = peer address"
    lines = [
        "",
        f"| {label} | requests/s | x bare (spread) | app CPU µs/request (spread) | Redis CPU µs/request (spread) |",
        "|---|--:|--:|--:|--:|",
    ]
    summary: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        rows = results[variant]
        pick: dict[str, list[float]] = {f: [r[f] for r in rows] for f in ("rps", "ratio", "app_us", "redis_us")}
        s = summary[variant] = {f: statistics.median(xs) for f, xs in pick.items()}
        redis_cell = "— |" if variant == "bare" else f"{s['redis_us']:.1f} ({spread(pick['redis_us'], 1)}) |"
        lines.append(
            f"| {variant} | {s['rps']:.0f} | {s['ratio']:.2f} ({spread(pick['ratio'], 2)}) | "
            f"{s['app_us']:.0f} ({spread(pick['app_us'], 0)}) | {redis_cell}"
        )
    lines.append("")
    ours = summary.get("redis-tb")
    for peer in PEERS if ours else []:
        p = summary[peer]
        assert ours is not None
        through = ours["ratio"] / p["ratio"] - 1
        cpu = ours["app_us"] / p["app_us"] - 1
        redis_cpu = ours["redis_us"] / p["redis_us"] - 1
        lines.append(
            f"- against {peer} ({label}): throughput {'ahead' if through >= 0 else 'behind'} by "
            f"{abs(through) * 100:.1f}%, app CPU per request {'lower' if cpu <= 0 else 'higher'} by "
            f"{abs(cpu) * 100:.1f}%, Redis CPU per request {'lower' if redis_cpu <= 0 else 'higher'} by "
            f"{abs(redis_cpu) * 100:.1f}%"
        )
    return lines


def main() -> None:
    redis_port = free_port()
    redis = subprocess.Popen(
        [SERVER, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script_file:
        script_file.write(SCRIPT)
        script_file.flush()
        try:
            wait_for(lambda: redis_command(redis_port, "PING").startswith("+PONG"), "redis-server")
            version = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout.split()[:3]
            import fastapi
            import uvicorn

            lines = [
                f"Python {platform.python_version()}, FastAPI {fastapi.__version__}, uvicorn {uvicorn.__version__}, "
                f"slowapi {_dist('slowapi')}, "
                f"limits {_dist('limits')}, {' '.join(version)}, {os.cpu_count()} vCPU",
                f"wrk -t1 -c{CONNECTIONS}, {SECONDS} s per variant, {ROUNDS} interleaved rounds, every request "
                f"allowed; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
            ]
            for keying in KEYINGS:
                results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
                for r in range(ROUNDS):
                    # A different order each round, so that no variant always runs first or last.
                    order = [VARIANTS[(i + r) % len(VARIANTS)] for i in range(len(VARIANTS))]
                    got = {v: one_round(v, keying, redis_port, script_file.name) for v in order}
                    for v in VARIANTS:
                        results[v].append({**got[v], "ratio": got[v]["rps"] / got["bare"]["rps"]})
                    print(f"{keying} round {r + 1}/{ROUNDS} done", file=sys.stderr)
                lines += table(keying, results)
        finally:
            redis.terminate()
            redis.wait()
    print("\n".join(lines))


def _dist(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
