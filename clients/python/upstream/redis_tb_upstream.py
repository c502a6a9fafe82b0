"""What redis-tb's adapters for the upstream suites share: one redis-server with the module, on a free loopback
port, started by the `Server` of the package's own test harness and stopped by PID when the session ends."""

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


SERVER = _harness().Server(module=True)
PORT: int = SERVER.port


def flushed() -> redis.Redis:
    """A client of the server, emptied (what the suites' Redis fixtures return)."""
    client = redis.Redis(port=PORT)
    client.flushall()
    return client


def pytest_sessionfinish() -> None:
    """Stops the server (a hook: each adapter imports it into its conftest)."""
    SERVER.stop()
