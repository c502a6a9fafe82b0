"""`make bench-lease`: one hot shared limit (a global key) served by PROCESSES copies of the axum app
clients/rust/examples/hot_limit.rs on one redis-server with the module, each copy under its own wrk (a closed loop of
CONNECTIONS connections), in ROUNDS interleaved rounds of SECONDS. The variants:

    none       the app without a layer
    governor   tower_governor's in-memory layer (each process its own, nothing shared)
    redis-tb   the redis-tb layer: one Redis call per request
    lease      the redis-tb layer with the limit leased (`Limit::lease`)

    lease-full the same on a bucket that stays nearly full (a limit far from its rate)

Two loads. "open": every request allowed, the limit's bucket emptied first and far below its burst, as a hot
limit's bucket is (rate 1,000,000 a second, above the load; burst 10^12): decisions per second (all processes),
Redis calls per decision (every TB.* call in INFO commandstats), the app's CPU per request (utime + stime of the
copies over the measured window, from /proc) and Redis's (INFO cpu). A layer's own CPU per request is its
variant's less the app alone of the same round. `lease-full` runs on a bucket that stays full (rate and burst
10^9): its grants lose their worth within a millisecond (docs/clients.md, "What held tokens are worth").
"binding": the limit below the load, on a fresh bucket and fresh processes: what all processes admitted against
`burst + rate * t`, `t` the whole time the load ran.

    REDIS_SERVER=/usr/bin/redis-server TB_MODULE=$PWD/target/release/libredis_tb.so python3 scripts/bench_lease.py
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from bench_support import free_port, stop, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.environ.get("REDIS_SERVER", "redis-server")
MODULE = os.environ.get("TB_MODULE", os.path.join(ROOT, "target/release/libredis_tb.so"))
WRK = os.environ.get("WRK", "/usr/bin/wrk")
APP = os.path.join(ROOT, "target/release/examples/hot_limit")
PROCESSES = int(os.environ.get("BENCH_PROCESSES", "4"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "4"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
VARIANTS = ["none", "governor", "redis-tb", "lease", "lease-full"]
OPEN_RATE, OPEN_BURST = 1e6, 1e12
FULL_RATE, FULL_BURST = 1e9, 1e9
BINDING_RATE, BINDING_BURST = 2_000.0, 200.0
KEY = "ratelimit:{global}:hot"
TICKS = os.sysconf("SC_CLK_TCK")


class Redis:
    """A redis-server with the module, spoken to through redis-cli."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-tb-bench-lease-")
        command = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += ["--dir", self.dir, "--loadmodule", MODULE]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(
                lambda: self.cli("PING") == "PONG",
                f"bench_lease: redis-server on {self.port}",
                (OSError, subprocess.CalledProcessError),
            )
        except BaseException:
            self.stop()
            raise

    def cli(self, *args: str) -> str:
        cli = os.environ.get("REDIS_CLI", os.path.join(os.path.dirname(SERVER), "redis-cli"))
        return subprocess.run([cli, "-p", str(self.port), *args], capture_output=True, text=True, check=True).stdout.strip()

    def calls(self) -> int:
        """Every TB.* call since the last CONFIG RESETSTAT."""
        stats = self.cli("INFO", "commandstats")
        return sum(int(n) for n in re.findall(r"^cmdstat_tb\.[a-z]+:calls=(\d+)", stats, flags=re.M))

    def cpu_s(self) -> float:
        info = self.cli("INFO", "cpu")
        return sum(float(v) for v in re.findall(r"^used_cpu_(?:sys|user):([0-9.]+)", info, flags=re.M))

    def stop(self) -> None:
        stop(self.process)


class Apps:
    """PROCESSES copies of the app for one variant."""

    def __init__(self, variant: str, redis: Redis, rate: float, burst: float) -> None:
        self.ports = [free_port() for _ in range(PROCESSES)]
        env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{redis.port}", RATE=str(rate), BURST=str(burst))
        env["LAYER"] = {"none": "none", "governor": "governor"}.get(variant, "redis-tb")
        env["LEASE"] = "1" if variant.startswith("lease") else "0"
        self.processes = [
            subprocess.Popen([APP], env=dict(env, BIND=f"127.0.0.1:{port}"), stdout=subprocess.DEVNULL)
            for port in self.ports
        ]
        try:
            for port in self.ports:
                wait_for(lambda port=port: self._answers(port), f"bench_lease: the app on {port}")
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _answers(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True

    def cpu_s(self) -> float:
        total = 0
        for process in self.processes:
            with open(f"/proc/{process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / TICKS

    def stop(self) -> None:
        for process in self.processes:
            stop(process)


def load(ports: list[int], seconds: int) -> tuple[int, int, float]:
    """One wrk per port at once: (requests, allowed, wall seconds from the first start to the last end)."""
    started = time.monotonic()
    runs = [
        subprocess.Popen(
            [WRK, "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", f"http://127.0.0.1:{port}/"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for port in ports
    ]
    outputs = [run.communicate()[0] for run in runs]
    elapsed = time.monotonic() - started
    requests = allowed = 0
    for output in outputs:
        total = re.search(r"(\d+) requests in", output)
        if not total:
            raise SystemExit(f"bench_lease: no request count in wrk's output:\n{output}")
        refused = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
        requests += int(total.group(1))
        allowed += int(total.group(1)) - (int(refused.group(1)) if refused else 0)
    return requests, allowed, elapsed


def open_round(variant: str, redis: Redis) -> dict[str, float]:
    rate, burst = (FULL_RATE, FULL_BURST) if variant == "lease-full" else (OPEN_RATE, OPEN_BURST)
    redis.cli("DEL", KEY)
    if variant != "lease-full":
        redis.cli("TB.ACQUIRE", KEY, str(rate), str(burst), str(burst))
    apps = Apps(variant, redis, rate, burst)
    try:
        load(apps.ports, 1)  # warm-up: connections, the first leases
        redis.cli("CONFIG", "RESETSTAT")
        app_cpu, redis_cpu = apps.cpu_s(), redis.cpu_s()
        requests, allowed, elapsed = load(apps.ports, SECONDS)
        app_cpu, redis_cpu = apps.cpu_s() - app_cpu, redis.cpu_s() - redis_cpu
        calls = redis.calls()
    finally:
        apps.stop()
    if allowed != requests:
        raise SystemExit(f"bench_lease: {variant}: {requests - allowed} of {requests} refused under a limit far above the load")
    return {
        "rps": requests / elapsed,
        "calls": calls / requests,
        "app_us": app_cpu * 1e6 / requests,
        "redis_us": redis_cpu * 1e6 / requests,
    }


def binding_round(variant: str, redis: Redis) -> tuple[int, int, float]:
    redis.cli("DEL", KEY)
    redis.cli("CONFIG", "RESETSTAT")
    apps = Apps(variant, redis, BINDING_RATE, BINDING_BURST)
    try:
        requests, allowed, elapsed = load(apps.ports, SECONDS)
    finally:
        apps.stop()
    return requests, allowed, elapsed


def main() -> None:
    for path, what in ((APP, "make bench-lease builds it"), (WRK, "apt-get install wrk"), (MODULE, "make build")):
        if not os.path.exists(path):
            raise SystemExit(f"bench_lease: {path} is missing ({what})")
    redis = Redis()
    try:
        print(
            f"bench_lease: {PROCESSES} processes of the app, each under wrk -t1 -c{CONNECTIONS} for {SECONDS} s, "
            f"{ROUNDS} interleaved rounds, one redis-server with the module; {os.cpu_count()} CPUs"
        )
        results: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
        for _ in range(ROUNDS):
            for variant in VARIANTS:
                results[variant].append(open_round(variant, redis))
        own = {
            variant: [r["app_us"] - base["app_us"] for r, base in zip(results[variant], results["none"])]
            for variant in VARIANTS
        }
        print("\nEvery request allowed, the bucket far below its burst (lease-full: a full bucket), medians of the rounds:\n")
        print("| variant | decisions/s | Redis calls per decision | app CPU µs per request | own CPU µs per request | Redis CPU µs per decision |")
        print("|---|--:|--:|--:|--:|--:|")
        for variant in VARIANTS:
            rows = results[variant]
            median = {field: statistics.median(row[field] for row in rows) for field in rows[0]}
            own_us = "—" if variant == "none" else f"{statistics.median(own[variant]):.1f}"
            print(
                f"| {variant} | {median['rps']:,.0f} | {median['calls']:.4f} | {median['app_us']:.1f} | {own_us} | "
                f"{median['redis_us']:.2f} |"
            )
        leased_calls = statistics.median(row["calls"] for row in results["lease"])
        print(f"\nlease: {leased_calls:.4f} Redis calls per decision (goal at most 0.05)")
        print(
            "own CPU per request: "
            + ", ".join(f"{variant} {statistics.median(own[variant]):.1f} µs" for variant in VARIANTS[1:])
            + " (a difference of two app figures, each tens of µs, on a shared machine; instructions per request, "
            "which do not move with the machine's load: scripts/layer_instructions.sh)"
        )
        print(f"\nA limit below the load (rate {BINDING_RATE:,.0f}/s, burst {BINDING_BURST:,.0f}), one round each:\n")
        print("| variant | requests | admitted | seconds | bound burst + rate * t | within |")
        print("|---|--:|--:|--:|--:|---|")
        failed = False
        for variant in ("redis-tb", "lease"):
            requests, allowed, elapsed = binding_round(variant, redis)
            bound = BINDING_BURST + BINDING_RATE * elapsed
            failed |= allowed > bound
            print(f"| {variant} | {requests:,} | {allowed:,} | {elapsed:.2f} | {bound:,.0f} | {'yes' if allowed <= bound else 'NO'} |")
        if failed:
            sys.exit("bench_lease: admitted more than the bound")
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
