"""What redis-tb's adapters for the upstream suites share: one redis-server with the module, on a free loopback
port, started by the `Server` of the package's own test harness and stopped by PID when the session ends; with
TB_UPSTREAM_CLOCK=1, on the harness's controlled clock (`CLOCK`), for suites whose tests move time."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import redis

HARNESS = Path(os.environ["TB_PYTHON_TESTS"]) / "conftest.py"


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("redis_tb_harness", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start() -> tuple[Any, Any]:
    """The server, and with TB_UPSTREAM_CLOCK=1 the controlled clock it runs on (tests/clock), else None."""
    harness = _harness()
    if os.environ.get("TB_UPSTREAM_CLOCK") != "1":
        return harness.Server(module=True), None
    preload = harness.clock_preload()
    if preload is None:
        raise RuntimeError("the controlled clock (tests/clock/build.sh: Debian's libfaketime) is not available")
    clock = harness.Clock(harness.CLOCK_2030_US)
    return harness.Server(module=True, env=clock.env(preload)), clock


SERVER, CLOCK = _start()
PORT: int = SERVER.port


def flushed() -> redis.Redis:
    """A client of the server, emptied (what the suites' Redis fixtures return)."""
    client = redis.Redis(port=PORT)
    client.flushall()
    return client


def pytest_sessionfinish() -> None:
    """Stops the server (a hook: each adapter imports it into its conftest)."""
    SERVER.stop()
    if CLOCK is not None:
        CLOCK.remove()
