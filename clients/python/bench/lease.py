"""`make bench-lease-python`: one hot shared limit (a global key) decided by PROCESSES Python processes, each a closed
loop of the WSGI middleware around a Flask app (Flask's test client: no HTTP server, so the figures are the
middleware's and Redis's), in ROUNDS interleaved rounds of SECONDS, with and without `lease=True`, on one redis-server
with the module. The limit allows every request, its bucket emptied first and far below its burst, as a hot limit's
is (rate 1,000,000 a second, burst 10^12). Reported per variant, median over the rounds: decisions per second (all
processes) and Redis calls per decision (every TB.* call in INFO commandstats).

    REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so .venv/bin/python \\
        clients/python/bench/lease.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SERVER = os.environ.get("REDIS_SERVER", "redis-server")
MODULE = os.environ.get("TB_MODULE", os.path.join(ROOT, "target/release/libredis_tb.so"))
PROCESSES = int(os.environ.get("BENCH_PROCESSES", "4"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
RATE, BURST = 1e6, 1e12
KEY = "ratelimit:{everyone}:hot"
VARIANTS = ("redis-tb", "lease")

PROCESS = """
import json, sys, time
import redis
from flask import Flask
from redis_tb import Limit, TokenBucket
from redis_tb.wsgi import RateLimitMiddleware

port, lease, rate, burst = int(sys.argv[1]), sys.argv[2] == "lease", float(sys.argv[3]), float(sys.argv[4])
app = Flask(__name__)
app.get("/hello")(lambda: "ok")
app.wsgi_app = RateLimitMiddleware(
    app.wsgi_app, limiter=TokenBucket(redis.Redis(port=port)), metrics=None,
    limits=[Limit("hot", rate=rate, burst=burst, lease=lease)], key=lambda request: "everyone",
)
http = app.test_client()
for _ in range(200):  # warm: the backend found, the lease grown
    http.get("/hello")
print("ready", flush=True)
start, until = map(float, sys.stdin.readline().split())
while time.monotonic() < start:
    time.sleep(0.001)
decided = allowed = 0
while time.monotonic() < until:
    decided += 1
    allowed += http.get("/hello").status_code == 200
print(json.dumps({"decided": decided, "allowed": allowed}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tb_calls(conn: redis.Redis) -> int:
    stats: dict[str, Any] = conn.info("commandstats")
    return sum(int(value["calls"]) for name, value in stats.items() if name.startswith("cmdstat_tb."))


def run(port: int, variant: str) -> tuple[float, float]:
    """One round of one variant: decisions per second over all processes, Redis calls per decision."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, str(port), variant, str(RATE), str(BURST)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n", "a process did not start"
    conn = redis.Redis(port=port)
    before = tb_calls(conn)
    start = time.monotonic() + 0.2
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(f"{start} {start + SECONDS}\n")
        process.stdin.flush()
    reports = [json.loads(process.communicate(timeout=SECONDS + 60)[0]) for process in processes]
    calls = tb_calls(conn) - before
    decided = sum(report["decided"] for report in reports)
    assert all(report["allowed"] == report["decided"] for report in reports), "the open load was refused"
    return decided / SECONDS, calls / decided


def main() -> None:
    directory = tempfile.mkdtemp(prefix="redis-tb-bench-lease-python-")
    port = free_port()
    server = subprocess.Popen(
        [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory, "--loadmodule", MODULE],
        stdout=subprocess.DEVNULL,
    )
    try:
        conn = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                if conn.info("server")["process_id"] == server.pid:
                    break
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "redis-server did not start"
            time.sleep(0.02)
        # The bucket far below its burst, as a hot limit's is: a grant keeps its worth for its whole reset time.
        conn.execute_command("TB.ACQUIRE", KEY, RATE, BURST, BURST / 2)  # type: ignore[no-untyped-call]
        figures: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
        for round_ in range(ROUNDS):
            for variant in VARIANTS:
                figures[variant].append(run(port, variant))
                print(f"round {round_ + 1} {variant}: {figures[variant][-1][0]:,.0f} decisions/s", file=sys.stderr)
        print(f"{PROCESSES} processes, one hot limit, {ROUNDS} rounds of {SECONDS:g} s, medians:")
        for variant in VARIANTS:
            rate = statistics.median(figure[0] for figure in figures[variant])
            calls = statistics.median(figure[1] for figure in figures[variant])
            print(f"  {variant:9} {rate:9,.0f} decisions/s  {calls:.3f} Redis calls per decision")
        base = statistics.median(figure[0] for figure in figures["redis-tb"])
        leased = statistics.median(figure[0] for figure in figures["lease"])
        print(f"  lease / redis-tb: {leased / base:.2f}x the decisions per second")
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
