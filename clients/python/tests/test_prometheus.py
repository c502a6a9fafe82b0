"""Prometheus itself scrapes the example app (examples/metrics.py) on loopback and answers an instant query on
`redis_tb_requests_total` through its HTTP API: the metrics are what a real server reads, not only what
prometheus_client writes. Prometheus runs with its own configuration, port and storage, and is stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, free_port

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = os.environ.get("TB_PROMETHEUS", "/usr/bin/prometheus")
DEADLINE_S = 60.0


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return int(response.status), bytes(response.read())


def until(check: Callable[[], Any], what: str, process: subprocess.Popen[bytes], log: Path) -> Any:
    """Polls `check` until it returns something true, within the deadline; fails with `process`'s log."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{what}: the process exited:\n{log.read_text()}"
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} within {DEADLINE_S} s; log:\n{log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="redis-tb-prometheus-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_prometheus_scrapes_the_example_and_answers_a_query(workdir: Path) -> None:
    server = Server(module=True)
    app_port = prometheus_port = free_port()
    while prometheus_port == app_port:  # the OS may hand out a released port again
        prometheus_port = free_port()
    app_log = workdir / "app.log"
    port_args = ["--port", str(app_port)]
    with app_log.open("wb") as out:
        app = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/metrics.py"), "--redis-port", str(server.port), *port_args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        base = f"http://127.0.0.1:{app_port}"
        until(lambda: get(f"{base}/metrics")[0] == 200, "the example serves /metrics", app, app_log)
        statuses: list[int] = []
        # per-client: burst 10, refilled 5 a second, so requests until the first refusal (however slow they are).
        while 429 not in statuses and len(statuses) < 200:
            try:
                statuses.append(get(f"{base}/")[0])
            except urllib.error.HTTPError as error:
                statuses.append(error.code)
        assert statuses.count(200) >= 10 and 429 in statuses, statuses
        allowed, refused = statuses.count(200), statuses.count(429)

        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: example\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{app_port}']\n"
        )
        prometheus_log = workdir / "prometheus.log"
        with prometheus_log.open("wb") as out:
            prometheus = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        query = urllib.parse.urlencode({"query": "redis_tb_requests_total"})

        def answered() -> dict[str, float] | None:
            status, body = get(f"http://127.0.0.1:{prometheus_port}/api/v1/query?{query}")
            reply = json.loads(body)
            if status != 200 or reply["status"] != "success" or not reply["data"]["result"]:
                return None
            return {row["metric"]["outcome"]: float(row["value"][1]) for row in reply["data"]["result"]}

        values = until(answered, "Prometheus answers the query", prometheus, prometheus_log)
        assert set(values) == {"allowed", "refused", "shadow_refused", "skipped"}, values
        # The shadow limit (burst 3, 1/s) refused most of those served: they count as shadow_refused.
        assert values["allowed"] >= 3 and values["allowed"] + values["shadow_refused"] == allowed, values
        assert (values["refused"], values["skipped"]) == (refused, 0), values
    finally:
        if prometheus is not None:
            stop(prometheus)
        stop(app)
        server.stop()
