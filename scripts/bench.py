#!/usr/bin/env python3
"""`make bench`: TB.ACQUIRE against HSET, INCR and a Lua token bucket, on one spawned server, in one run.

What it does, in order:
  1. runs the criterion benches of the pure core (`benches/core.rs`), quick variant: ns per decision and per
     encode/decode;
  2. spawns its own redis-server with the module on a free loopback port, pinned to one core, and pins itself
     (hence redis-benchmark) to another;
  3. runs every case `--rounds` times (interleaved, so drift hits all cases alike) with redis-benchmark, 50
     clients; before each run it flushes the data set and resets INFO commandstats, after it reads the server CPU
     per call; it reports medians, and each ratio is the median of the per-round ratios to HSET at the same
     pipeline depth;
  4. measures bytes per bucket (used_memory delta over 100,000 fresh buckets) for TB.ACQUIRE and the Lua script;
  5. measures the 64-connection over-grant (burst 10, rate 10, 2.9 s of calls on one key: at most 40 grants);
  6. prints one table and whether each goal of issue #5 holds.

Python 3 standard library only. The server is stopped by PID when the script ends, whatever happens. Exits 1 if
a sanity check fails (a case that did not do what it claims, a server error); goals that are missed are reported,
not failed.
"""

import argparse
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LUA_SCRIPT = ROOT / "scripts" / "bench_bucket.lua"
LUA_ALL_SCRIPT = ROOT / "scripts" / "bench_buckets_all.lua"
DEFAULT_MODULE = ROOT / "target" / "release" / "libredis_tb.so"

CLIENTS = 50
PIPELINE = 16
KEYSPACE = 100_000
# Allowed cases: a bucket so deep (burst 1e12) that no run drains it, so every call is allowed and writes, refilled
# so slowly (rate 0.001/s) that it is never full again during the run. A bucket expires when full again, so with a
# huge rate (say 1e12) each key would expire within a millisecond of every write: the 100k-key case would then
# measure key creation on an empty data set, not 100k live buckets.
ALLOW_RATE, ALLOW_BURST = "0.001", "1e12"
# Denied case: a drained bucket with this rate refills one token in 1e9 s.
TINY = "1e-9"
# Bytes per bucket: fractional tokens after one call (10 - 1.3 = 8.7), a TTL of 130 s that outlives the fill.
MEMORY_ARGS = ["0.01", "10", "1.3"]

# Goals of issue #5.
GOAL_US_PER_CALL = 1.0
GOAL_X_HSET = 0.6
GOAL_X_LUA = 5.0
GOAL_KEYS_X_HSET = 0.5
OVERGRANT_CLIENTS = 64
OVERGRANT_RATE = 10
OVERGRANT_BURST = 10
# The bound is for 3 s; clients stop issuing 100 ms early so the last reply lands inside 3 s (as in
# tests/overgrant.rs).
OVERGRANT_RUN_S = 2.9
OVERGRANT_MAX = 40


class RespError(Exception):
    """An error reply from the server."""


class Conn:
    """A minimal RESP2 client: enough for setup, INFO, fills and the over-grant hammer."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def close(self):
        self.reader.close()
        self.sock.close()

    @staticmethod
    def encode(args):
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return b"".join(parts)

    def read(self):
        line = self.reader.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self.reader.read(size + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self.read() for _ in range(size)]
        raise ConnectionError(f"unexpected reply line {line!r}")

    def call(self, *args):
        self.sock.sendall(self.encode(args))
        reply = self.read()
        if isinstance(reply, RespError):
            raise reply
        return reply

    def pipeline(self, commands):
        self.sock.sendall(b"".join(self.encode(args) for args in commands))
        replies = [self.read() for _ in commands]
        for reply in replies:
            if isinstance(reply, RespError):
                raise reply
        return replies

    def info(self, section):
        text = self.call("INFO", section)
        fields = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                name, value = line.split(":", 1)
                fields[name] = value
        return fields


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A private redis-server with the module loaded; stopped by PID in `stop`."""

    def __init__(self, binary, module, cpu):
        self.dir = Path(tempfile.mkdtemp(prefix="redis-tb-bench-"))
        last_log = ""
        for _ in range(5):
            self.port = free_port()
            self.log = self.dir / f"server-{self.port}.log"
            args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", str(self.dir), "--logfile", str(self.log), "--daemonize", "no",
                    "--loadmodule", str(module)]
            pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, preexec_fn=pin)
            if self.wait_ready():
                return
            self.stop(remove_dir=False)
            last_log = self.log.read_text(errors="replace") if self.log.exists() else ""
        shutil.rmtree(self.dir, ignore_errors=True)
        raise RuntimeError(f"redis-server did not start; last log:\n{last_log}")

    def wait_ready(self, deadline_s=20.0):
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            if self.process.poll() is not None:
                return False
            try:
                conn = Conn(self.port)
                try:
                    if conn.call("PING") == "PONG":
                        return True
                finally:
                    conn.close()
            except (OSError, RespError):
                pass
            time.sleep(0.02)
        return False

    def stop(self, remove_dir=True):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        if remove_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Case:
    """One redis-benchmark run, repeated every round."""

    label: str
    args: list
    pipeline: int
    stat: str  # the INFO commandstats entry whose usec_per_call we report
    requests: int
    random_keys: bool = False
    setup: list = field(default_factory=list)  # commands run after FLUSHALL, before CONFIG RESETSTAT
    check: object = None  # fn(conn, requests) -> None, raises AssertionError if the case did not do what it claims
    runs: list = field(default_factory=list)


def expect_reply(command, allowed):
    def check(conn, _requests):
        reply = conn.call(*command)
        assert reply[0] == allowed, f"{command} replied {reply}, expected allowed={allowed}"
    return check


def expect_many_keys(conn, requests):
    """The run left about as many distinct live keys as `requests` uniform draws from the keyspace give."""
    keys = conn.call("DBSIZE")
    expected = KEYSPACE * (1 - math.exp(-requests / KEYSPACE))
    assert keys > 0.9 * expected, f"only {keys} keys after {requests} calls on {KEYSPACE} keys"


def make_cases(scale, lua_sha, lua_all_sha, client_now_ms):
    def n(count):
        return max(1_000, int(count * scale))

    tb_hot = ["TB.ACQUIRE", "bench:tb", ALLOW_RATE, ALLOW_BURST]
    tb_deny = ["TB.ACQUIRE", "bench:deny", TINY, "1", "1"]
    tb_keys = ["TB.ACQUIRE", "bench:tb:__rand_int__", ALLOW_RATE, ALLOW_BURST]
    lua_client = ["EVALSHA", lua_sha, "1", "bench:lua", ALLOW_RATE, ALLOW_BURST, "1", str(client_now_ms)]
    lua_server = ["EVALSHA", lua_sha, "1", "bench:lua", ALLOW_RATE, ALLOW_BURST, "1"]
    hset = ["HSET", "bench:h", "f", "v"]
    # Three limits at once (user, tenant, global), all or nothing: the module command and its Lua peer.
    buckets = [("bench:all:user", ALLOW_RATE, ALLOW_BURST), ("bench:all:tenant", ALLOW_RATE, ALLOW_BURST),
               ("bench:all:global", ALLOW_RATE, ALLOW_BURST)]
    tb_all = ["TB.ACQUIREALL", "1"] + [arg for bucket in buckets for arg in bucket]
    lua_all = (["EVALSHA", lua_all_sha, str(len(buckets))] + [key for key, _, _ in buckets] + ["1"]
               + [arg for _, rate, burst in buckets for arg in (rate, burst)])
    return [
        Case("HSET hot key", hset, PIPELINE, "hset", n(1_000_000)),
        Case("INCR hot key", ["INCR", "bench:n"], PIPELINE, "incr", n(1_000_000)),
        Case("HSET 100k keys", ["HSET", "bench:h:__rand_int__", "f", "v"], PIPELINE, "hset", n(800_000),
             random_keys=True, check=expect_many_keys),
        Case("TB.ACQUIRE hot, allowed", tb_hot, PIPELINE, "tb.acquire", n(500_000),
             check=expect_reply(tb_hot, 1)),
        Case("TB.ACQUIRE hot, denied", tb_deny, PIPELINE, "tb.acquire", n(600_000),
             setup=[tb_deny], check=expect_reply(tb_deny, 0)),
        Case("TB.ACQUIRE 100k keys", tb_keys, PIPELINE, "tb.acquire", n(400_000), random_keys=True,
             check=expect_many_keys),
        Case("Lua bucket, client ts", lua_client, PIPELINE, "evalsha", n(150_000),
             check=expect_reply(lua_client, 1)),
        Case("Lua bucket, server TIME", lua_server, PIPELINE, "evalsha", n(150_000),
             check=expect_reply(lua_server, 1)),
        Case("TB.ACQUIREALL 3 buckets", tb_all, PIPELINE, "tb.acquireall", n(300_000),
             check=expect_reply(tb_all, 1)),
        Case("Lua 3 buckets, all/none", lua_all, PIPELINE, "evalsha", n(100_000),
             check=expect_reply(lua_all, 1)),
        Case("HSET hot key", hset, 1, "hset", n(200_000)),
        Case("TB.ACQUIRE hot, allowed", tb_hot, 1, "tb.acquire", n(200_000), check=expect_reply(tb_hot, 1)),
        Case("TB.ACQUIRE 100k keys", tb_keys, 1, "tb.acquire", n(200_000), random_keys=True,
             check=expect_many_keys),
        Case("Lua bucket, server TIME", lua_server, 1, "evalsha", n(100_000),
             check=expect_reply(lua_server, 1)),
    ]


def run_case(case, server, conn, benchmark):
    conn.call("FLUSHALL", "SYNC")
    for command in case.setup:
        conn.call(*command)
    conn.call("CONFIG", "RESETSTAT")
    cpu_before = main_thread_cpu_s(conn)
    args = [benchmark, "-h", "127.0.0.1", "-p", str(server.port), "-c", str(CLIENTS), "-P", str(case.pipeline),
            "-n", str(case.requests), "--csv"]
    if case.random_keys:
        args += ["-r", str(KEYSPACE)]
    output = subprocess.run(args + case.args, check=True, capture_output=True, text=True).stdout
    rows = [line for line in output.splitlines() if line.startswith('"') and not line.startswith('"test"')]
    if len(rows) != 1:
        raise RuntimeError(f"unexpected redis-benchmark output for {case.label}:\n{output}")
    cells = [cell.strip('"') for cell in rows[0].split('","')]
    rps, p50_ms, p99_ms = float(cells[1]), float(cells[4]), float(cells[6])

    cpu_s = main_thread_cpu_s(conn) - cpu_before
    stats = conn.info("commandstats").get(f"cmdstat_{case.stat}")
    if stats is None:
        raise RuntimeError(f"no commandstats for {case.stat} after {case.label}")
    numbers = dict(item.split("=") for item in stats.split(","))
    calls, usec = int(numbers["calls"]), int(numbers["usec"])
    if calls < case.requests or int(numbers["failed_calls"]) or int(numbers["rejected_calls"]):
        raise RuntimeError(f"{case.label}: expected {case.requests} clean calls, got {stats}")
    if case.check is not None:
        case.check(conn, case.requests)
    case.runs.append({"rps": rps, "us": usec / calls, "cpu_us": cpu_s * 1e6 / calls, "p50": p50_ms, "p99": p99_ms})


def main_thread_cpu_s(conn):
    """CPU seconds (user + system) the server's main thread has used: commands, parsing, replies, socket I/O."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def bytes_per_bucket(conn, make_command, count=KEYSPACE, batch=1_000):
    """used_memory delta per bucket over `count` fresh buckets, and the stored hash of one of them."""
    conn.call("FLUSHALL", "SYNC")
    before = int(conn.info("memory")["used_memory"])
    for start in range(0, count, batch):
        replies = conn.pipeline([make_command(i) for i in range(start, min(count, start + batch))])
        if any(reply[0] != 1 for reply in replies):
            raise RuntimeError("a fill call was not allowed")
    after = settled_used_memory(conn)
    keys = conn.call("DBSIZE")
    if keys != count:
        raise RuntimeError(f"expected {count} buckets, found {keys}")
    first = make_command(0)
    sample = conn.call("HGETALL", first[3] if first[0] == "EVALSHA" else first[1])
    conn.call("FLUSHALL", "SYNC")
    return (after - before) / count, sample


def settled_used_memory(conn, deadline_s=5.0):
    """used_memory once it stops moving. Growing to 100k keys leaves the key and expiry dicts rehashing into bigger
    tables, which the server finishes in its cron; until then both tables count, about 5 B per key."""
    start = time.monotonic()
    last, steady = None, 0
    while time.monotonic() - start < deadline_s:
        used = int(conn.info("memory")["used_memory"])
        steady = steady + 1 if used == last else 0
        if steady >= 3:
            break
        last = used
        time.sleep(0.1)
    return last


def overgrant(port):
    """64 connections call TB.ACQUIRE on one key (burst 10, rate 10) for 2.9 s; returns grants, calls, seconds."""
    conns = [Conn(port) for _ in range(OVERGRANT_CLIENTS)]
    conns[0].call("DEL", "bench:overgrant")
    barrier = threading.Barrier(OVERGRANT_CLIENTS + 1)
    granted = [0] * OVERGRANT_CLIENTS
    calls = [0] * OVERGRANT_CLIENTS
    command = Conn.encode(["TB.ACQUIRE", "bench:overgrant", OVERGRANT_RATE, OVERGRANT_BURST])

    def hammer(index):
        conn = conns[index]
        barrier.wait()
        start = time.monotonic()
        while time.monotonic() - start < OVERGRANT_RUN_S:
            conn.sock.sendall(command)
            reply = conn.read()
            if isinstance(reply, RespError):
                raise reply
            calls[index] += 1
            granted[index] += reply[0] == 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(OVERGRANT_CLIENTS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.monotonic()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    for conn in conns:
        conn.close()
    return sum(granted), sum(calls), elapsed


def criterion(cargo):
    """Runs the quick variant of benches/core.rs; returns [(name, ns per iteration)]."""
    args = [cargo, "bench", "--bench", "core", "--", "--warm-up-time", "0.5", "--measurement-time", "1",
            "--output-format", "bencher"]
    print("$ " + " ".join(args), flush=True)
    output = subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [(name, int(ns.replace(",", "")))
            for name, ns in re.findall(r"^test (\S+) \.\.\. bench:\s+([\d,]+) ns/iter", output, re.M)]


def machine():
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return model, os.cpu_count(), os.getloadavg()


def median(values):
    return statistics.median(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=os.environ.get("TB_MODULE", str(DEFAULT_MODULE)))
    parser.add_argument("--server", default=os.environ.get("REDIS_SERVER", "/usr/bin/redis-server"))
    parser.add_argument("--benchmark", default=os.environ.get("REDIS_BENCHMARK", "/usr/bin/redis-benchmark"))
    parser.add_argument("--rounds", type=int, default=3, help="runs of every case; medians are reported")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every case's request count")
    parser.add_argument("--no-criterion", action="store_true", help="skip the criterion benches")
    options = parser.parse_args()

    model, cpus, load = machine()
    print(f"machine: {model}, {cpus} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"date:    {time.strftime('%Y-%m-%d %H:%M %Z')}")
    version = subprocess.run([options.server, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"server:  {version}")

    core = [] if options.no_criterion else criterion(os.environ.get("CARGO", "cargo"))

    usable = sorted(os.sched_getaffinity(0))
    server_cpu, load_cpu = (usable[0], usable[1]) if len(usable) >= 2 else (None, None)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
        print(f"pinning: server on CPU {server_cpu}; this script, redis-benchmark and the over-grant clients "
              f"on CPU {load_cpu}")
    else:
        print("pinning: only one CPU usable, nothing pinned (figures will be noisier)")

    server = Server(options.server, Path(options.module).resolve(), server_cpu)
    try:
        conn = Conn(server.port)
        lua_sha = conn.call("SCRIPT", "LOAD", LUA_SCRIPT.read_text())
        lua_all_sha = conn.call("SCRIPT", "LOAD", LUA_ALL_SCRIPT.read_text())
        cases = make_cases(options.scale, lua_sha, lua_all_sha, int(time.time() * 1000))
        started = time.monotonic()
        live = sys.stdout.isatty()
        for round_index in range(options.rounds):
            for case in cases:
                if live:
                    print(f"\rround {round_index + 1}/{options.rounds}: {case.label}, pipeline {case.pipeline}"
                          .ljust(70), end="", flush=True)
                run_case(case, server, conn, options.benchmark)
            if not live:
                print(f"round {round_index + 1}/{options.rounds} done", flush=True)
        print(f"\r{len(cases)} cases x {options.rounds} rounds in {time.monotonic() - started:.0f} s".ljust(70))

        tb_bytes, tb_sample = bytes_per_bucket(
            conn, lambda i: ["TB.ACQUIRE", f"mem:{i:06d}", *MEMORY_ARGS])
        lua_bytes, lua_sample = bytes_per_bucket(
            conn, lambda i: ["EVALSHA", lua_sha, "1", f"mem:{i:06d}", *MEMORY_ARGS])
        granted, og_calls, og_elapsed = overgrant(server.port)
        conn.close()
    finally:
        server.stop()

    report(cases, core, (tb_bytes, tb_sample, lua_bytes, lua_sample), (granted, og_calls, og_elapsed))
    return 0


def report(cases, core, memory, grants):
    rounds = len(cases[0].runs)
    baseline = {case.pipeline: case for case in cases if case.label == "HSET hot key"}

    def ratio(case, other):
        return median([a["rps"] / b["rps"] for a, b in zip(case.runs, other.runs)])

    def find(label, pipeline=PIPELINE):
        return next(case for case in cases if case.label == label and case.pipeline == pipeline)

    print()
    print(f"redis-benchmark, {CLIENTS} clients, medians of {rounds} rounds. x HSET: median per-round ratio to HSET "
          f"hot key at the same pipeline depth.")
    print("µs/call: the command's own time per call (INFO commandstats usec/calls; wall-clock, so a busy machine "
          "inflates it).")
    print("cpu µs/call: the server main thread's CPU time (user + sys, INFO cpu) over the run / calls: the command "
          "plus parsing, replies and socket I/O.")
    header = (f"{'case':<26} {'pipeline':>8} {'calls/s':>10} {'x HSET':>7} {'µs/call':>8} {'cpu µs/call':>11} "
              f"{'p50 ms':>7} {'p99 ms':>7}")
    print(header)
    print("-" * len(header))
    for case in cases:
        print(f"{case.label:<26} {case.pipeline:>8} {median([r['rps'] for r in case.runs]):>10,.0f} "
              f"{ratio(case, baseline[case.pipeline]):>7.2f} {median([r['us'] for r in case.runs]):>8.2f} "
              f"{median([r['cpu_us'] for r in case.runs]):>11.2f} "
              f"{median([r['p50'] for r in case.runs]):>7.3f} {median([r['p99'] for r in case.runs]):>7.3f}")

    tb_bytes, tb_sample, lua_bytes, lua_sample = memory
    print()
    print(f"bytes per bucket (used_memory delta over {KEYSPACE:,} buckets, rate {MEMORY_ARGS[0]} burst {MEMORY_ARGS[1]} "
          f"cost {MEMORY_ARGS[2]}):")
    print(f"  TB.ACQUIRE  {tb_bytes:6.1f} B   e.g. {tb_sample}")
    print(f"  Lua script  {lua_bytes:6.1f} B   e.g. {lua_sample}")

    granted, og_calls, og_elapsed = grants
    bound = int(OVERGRANT_BURST + OVERGRANT_RATE * og_elapsed)
    print()
    print(f"over-grant: {granted} grants of {og_calls} calls in {og_elapsed:.3f} s from {OVERGRANT_CLIENTS} "
          f"connections on one key (burst {OVERGRANT_BURST}, rate {OVERGRANT_RATE}/s; bound {bound}, "
          f"at most {OVERGRANT_MAX})")

    if core:
        print()
        print("criterion, benches/core.rs (quick variant), ns per call:")
        for name, ns in core:
            print(f"  {name:<26} {ns:>5} ns")

    allowed, denied = find("TB.ACQUIRE hot, allowed"), find("TB.ACQUIRE hot, denied")
    keys = find("TB.ACQUIRE 100k keys")
    lua_server, lua_client = find("Lua bucket, server TIME"), find("Lua bucket, client ts")
    allowed_us, denied_us = median([r["us"] for r in allowed.runs]), median([r["us"] for r in denied.runs])
    x_hset, x_keys = ratio(allowed, baseline[PIPELINE]), ratio(keys, baseline[PIPELINE])
    x_keys_vs_keys = ratio(keys, find("HSET 100k keys"))
    x_lua, x_lua_client = ratio(allowed, lua_server), ratio(allowed, lua_client)
    multi, lua_multi = find("TB.ACQUIREALL 3 buckets"), find("Lua 3 buckets, all/none")
    print()
    print(f"multi-bucket (issue #8), 3 buckets all or nothing: TB.ACQUIREALL "
          f"{median([r['us'] for r in multi.runs]):.2f} µs/call vs the Lua script "
          f"{median([r['us'] for r in lua_multi.runs]):.2f} µs/call; throughput {ratio(multi, lua_multi):.2f}x the script")
    goals = [
        (allowed_us <= GOAL_US_PER_CALL, f"server CPU per TB.ACQUIRE <= {GOAL_US_PER_CALL} µs",
         f"{allowed_us:.2f} µs"),
        (x_hset >= GOAL_X_HSET, f"throughput >= {GOAL_X_HSET}x HSET", f"{x_hset:.2f}x"),
        (x_lua >= GOAL_X_LUA, f"throughput >= {GOAL_X_LUA:.0f}x the Lua bucket (server TIME)",
         f"{x_lua:.2f}x (vs client ts: {x_lua_client:.2f}x)"),
        (denied_us < allowed_us, "a denied call cheaper than an allowed one", f"{denied_us:.2f} < {allowed_us:.2f} µs"),
        (x_keys >= GOAL_KEYS_X_HSET, f"{KEYSPACE:,} keys >= {GOAL_KEYS_X_HSET}x HSET hot key",
         f"{x_keys:.2f}x (vs HSET on 100k keys: {x_keys_vs_keys:.2f}x)"),
        (tb_bytes <= lua_bytes, "bytes per bucket <= the Lua hash", f"{tb_bytes:.0f} B vs {lua_bytes:.0f} B"),
        (granted <= min(bound, OVERGRANT_MAX), f"over-grant <= {OVERGRANT_MAX} (and <= burst + rate * t)",
         f"{granted} grants"),
    ]
    print()
    print(f"goals (issue #5; hot key, pipeline {PIPELINE}, this run):")
    for holds, goal, figure in goals:
        print(f"  {'holds ' if holds else 'MISSED'}  {goal:<48} {figure}")
    print("  (every test still passing is `make test`'s job)")


if __name__ == "__main__":
    sys.exit(main())
