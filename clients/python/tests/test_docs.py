"""docs/python.md's snippets, run exactly as the page shows them (read from the page), against a server with the
module and one without: each block is executed on its own with `REDIS_URL` pointing at the server, then the app or
function it defines is driven."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from conftest import Server

PAGE = Path(__file__).resolve().parents[3] / "docs/python.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def block_with(marker: str) -> str:
    (found,) = [block for block in blocks() if marker in block]
    return found


def run_block(marker: str, server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("REDIS_URL", server.url())
    namespace: dict[str, Any] = {"__name__": "docs_block"}
    exec(compile(block_with(marker), str(PAGE), "exec"), namespace)
    return namespace


def assert_burst_then_429(statuses: list[int], elapsed_s: float, burst: int = 20, rate: float = 10) -> None:
    """The burst passes, then a 429 comes, and never more passed than `burst + rate * elapsed` (a slow machine
    lets the refill add a token or two during the run)."""
    assert 429 in statuses, statuses
    passed = statuses.index(429)
    assert statuses[:passed] == [200] * passed
    assert burst <= passed <= burst + rate * elapsed_s + 1, (passed, elapsed_s)


def peer(test: int, server: Server) -> str:
    """A peer address of this test and server alone (the default key is the peer's IP address)."""
    return f"10.{test}.{server.port >> 8}.{server.port & 255}"


def test_every_block_is_tested() -> None:
    markers = [
        "def handle",
        "RateLimitMiddleware,\n",
        "app.wsgi_app = RateLimitMiddleware",
        "RATELIMIT_STRATEGY",
        'strategy="token-bucket"',
        "async def call_partner",
        "def build(redis_port",
    ]
    assert sorted(block_with(marker) for marker in markers) == sorted(blocks())


async def test_metrics_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app of examples/metrics.py as the page shows it: the limited path answers, /metrics shows the counts."""
    app = run_block("def build(redis_port", server, monkeypatch)["build"](server.port)
    transport = httpx.ASGITransport(app=app, client=(peer(7, server), 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        first = await http.get("/")
        scrape = await http.get("/metrics")
    assert first.status_code == 200, first
    assert first.json() == {"hello": "world"}
    assert first.headers["ratelimit"] == '"per-client";r=9;t=1'
    assert re.search(r'^redis_tb_requests_total\{outcome="allowed"\} [1-9]', scrape.text, flags=re.M), scrape.text


def test_client_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = run_block("def handle", server, monkeypatch)["handle"]
    begin = time.monotonic()
    statuses = [handle("docs-client") for _ in range(40)]
    assert_burst_then_429(statuses, time.monotonic() - begin)


async def test_fastapi_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_block("RateLimitMiddleware,\n", server, monkeypatch)["app"]
    transport = httpx.ASGITransport(app=app, client=(peer(1, server), 1))
    begin = time.monotonic()
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        responses = [await http.get("/") for _ in range(40)]
    statuses = [r.status_code for r in responses]
    assert_burst_then_429(statuses, time.monotonic() - begin)
    assert responses[0].json() == {"hello": "world"}
    assert responses[0].headers["ratelimit"] == '"per-client";r=19;t=1'
    assert responses[statuses.index(429)].headers["retry-after"] == "1"


def test_flask_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_block("app.wsgi_app = RateLimitMiddleware", server, monkeypatch)["app"]
    http = app.test_client()
    environ = {"REMOTE_ADDR": peer(2, server)}
    begin = time.monotonic()
    searches = [http.get("/search", environ_base=environ).status_code for _ in range(10)]
    assert_burst_then_429(searches, time.monotonic() - begin, burst=5, rate=1)
    home = http.get("/", environ_base=environ)
    assert home.status_code == 200 and home.headers["RateLimit"].startswith('"per-client";r=1')


def test_flask_limiter_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_block("RATELIMIT_STRATEGY", server, monkeypatch)["app"]
    http = app.test_client()
    environ = {"REMOTE_ADDR": peer(3, server)}
    begin = time.monotonic()
    statuses = [http.get("/", environ_base=environ).status_code for _ in range(40)]
    assert_burst_then_429(statuses, time.monotonic() - begin)


async def test_slowapi_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_block('strategy="token-bucket"', server, monkeypatch)["app"]
    transport = httpx.ASGITransport(app=app, client=(peer(4, server), 1))
    begin = time.monotonic()
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        statuses = [(await http.get("/")).status_code for _ in range(40)]
    assert_burst_then_429(statuses, time.monotonic() - begin)


async def test_pacing_block(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_block("async def call_partner", server, monkeypatch)
    await namespace["limiter"].reset("partner:api")

    async def send(request: str) -> str:
        return f"sent {request}"

    loop = asyncio.get_running_loop()
    begin = loop.time()
    results = await asyncio.gather(*(namespace["call_partner"](send, n) for n in range(5)))
    assert sorted(results) == [f"sent {n}" for n in range(5)]
    assert loop.time() - begin >= 0.195  # 20/s, burst 1: the fifth call waits 200 ms
    await namespace["limiter"].redis.aclose()


def test_every_block_sets_timeouts() -> None:
    """Every snippet builds its client with timeouts: without them, a request never returns while Redis stalls."""
    for block in blocks():
        assert "timeout" in block, block


@pytest.fixture
def stalled() -> Iterator[Server]:
    """A server that accepts connections and never answers (stopped with SIGSTOP)."""
    server = Server(module=True)
    server.process.send_signal(signal.SIGSTOP)
    yield server
    server.process.send_signal(signal.SIGCONT)
    server.stop()


def test_client_block_gives_up_on_a_stalled_redis(stalled: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = run_block("def handle", stalled, monkeypatch)["handle"]
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            handle("docs-stalled")
        except redis.exceptions.TimeoutError as error:
            outcome.append(error)

    begin = time.monotonic()
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(5)
    assert not caller.is_alive() and len(outcome) == 1
    assert time.monotonic() - begin < 2


async def test_fastapi_block_answers_while_redis_stalls(stalled: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    app = run_block("RateLimitMiddleware,\n", stalled, monkeypatch)["app"]
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 1))
    begin = time.monotonic()
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        statuses = [(await http.get("/")).status_code for _ in range(30)]
    elapsed = time.monotonic() - begin
    # The first call waits for its deadline (0.5 s); then the fail mode ("local", limits in memory) answers at once.
    assert_burst_then_429(statuses, elapsed)
    assert elapsed < 2
