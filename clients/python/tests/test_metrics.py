"""The middleware's metrics, shadow mode and refusal options (docs/operating.md, "Watching the middleware"), in ASGI
and WSGI alike, on real servers: after a known sequence of requests the scraped values are exact."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import prometheus_client
import pytest
import redis
import redis.asyncio
from conftest import WITHOUT_MODULE, Server, free_port
from fastapi import FastAPI
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from redis_tb import SKIP, AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb._failures import Failure

KINDS = ["asgi", "wsgi"]


def who(request: Any) -> Any:
    """The identity is the path (`/alice` counts against alice); `/skip` is not limited."""
    name = str(request.get("path", request.get("PATH_INFO", ""))).strip("/")
    return SKIP if name == "skip" else name


class App:
    """A FastAPI (asgi) or Flask (wsgi) app behind the middleware, over a client of `server`."""

    def __init__(self, kind: str, server: Server | int, limits: list[Limit], **options: Any) -> None:
        port = server if isinstance(server, int) else server.port
        backend = options.pop("backend", "auto")
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        if kind == "wsgi":
            flask = Flask(__name__)
            flask.get("/<name>")(lambda name: "hello")
            self.middleware: Any = wsgi.RateLimitMiddleware(
                flask.wsgi_app,
                limiter=TokenBucket(redis.Redis(host="127.0.0.1", port=port), backend=backend),
                limits=limits,
                key=who,
                **options,
            )
            flask.wsgi_app = self.middleware  # type: ignore[method-assign]
            self.flask = flask.test_client()
        else:
            fastapi = FastAPI()
            fastapi.get("/{name}")(lambda name: "hello")
            self.middleware = asgi.RateLimitMiddleware(
                fastapi,
                limiter=AsyncTokenBucket(redis.asyncio.Redis(host="127.0.0.1", port=port), backend=backend),
                limits=limits,
                key=who,
                **options,
            )
            self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.middleware), base_url="http://test")

    def get(self, identity: str) -> tuple[int, dict[str, str], bytes]:
        if self.kind == "wsgi":
            response: Any = self.flask.get(f"/{identity}")
            return int(response.status_code), {k.lower(): v for k, v in response.headers.items()}, bytes(response.data)
        answer = self.loop.run_until_complete(self.http.get(f"/{identity}"))
        return answer.status_code, {k.lower(): v for k, v in answer.headers.items()}, answer.content

    def probe(self) -> None:
        """What the middleware runs in the background while Redis is down: once it answers, calls go to Redis. A
        probe the middleware started before (on a slow machine) ends first, so that it cannot close the gate after."""
        if self.kind == "wsgi":
            deadline = time.monotonic() + 10
            while self.middleware.guard._probing and time.monotonic() < deadline:
                time.sleep(0.01)
            self.middleware._probe()
        else:
            if self.middleware._probe_task is not None:
                self.loop.run_until_complete(self.middleware._probe_task)
            self.loop.run_until_complete(self.middleware._probe())
        assert self.middleware.guard.admits

    def close(self) -> None:
        if self.kind == "asgi":
            self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


def scraped(registry: prometheus_client.CollectorRegistry) -> dict[str, float]:
    """Every counter sample and each histogram's count, as the text a scrape gets: `name{label="value"}` -> value."""
    text = prometheus_client.generate_latest(registry).decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_total", "_count")):
                labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def restart(server: Server) -> None:
    """Starts the stopped `server` again, on its port, empty (nothing is persisted)."""
    server.process = subprocess.Popen(
        server.process.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert server._wait_ready()


@pytest.fixture
def fresh() -> Iterator[Server]:
    server = Server(module=True)
    yield server
    server.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_a_known_sequence_scrapes_exact_values(kind: str, fresh: Server) -> None:
    """alice: 3 of 4 requests fit `api` (burst 3), the shadow limit `trial` (burst 1) refuses the 2nd and 3rd, and
    the 4th is refused by `api` before `trial` is asked. /skip is skipped. Redis killed: bob's first call fails
    (connection), the gate closes and the local fallback decides the enforced and shadow calls. Redis back (empty):
    bob's in-memory admissions are charged back, `api` allows and `trial` refuses."""
    registry = prometheus_client.CollectorRegistry()
    errors: list[tuple[str, str]] = []
    limits = [Limit("api", rate=0.001, burst=3), Limit("trial", rate=0.001, burst=1, shadow=True)]

    def on_error(error: BaseException, request: Any, failure: Failure) -> None:
        errors.append((who(request), failure.class_))

    app = App(kind, fresh, limits, metrics=registry, on_error=on_error)
    try:
        alice = [app.get("alice") for _ in range(4)]
        assert [status for status, _, _ in alice] == [200, 200, 200, 429]
        for _, headers, _ in alice:  # a client sees nothing of the shadow limit
            assert headers["ratelimit-policy"] == '"api";q=3;w=3000', headers
            assert "trial" not in headers["ratelimit"], headers
        assert app.get("skip")[0] == 200
        fresh._kill()
        assert [app.get("bob")[0] for _ in range(2)] == [200, 200]
        restart(fresh)
        app.probe()
        assert app.get("bob")[0] == 200
        assert float(fresh.client().hget("ratelimit:{bob}:trial", "tokens") or "1") < 0.5  # charged back
    finally:
        app.close()
    assert errors == [("bob", "connection")]
    assert scraped(registry) == {
        'redis_tb_requests_total{outcome="allowed"}': 2,
        'redis_tb_requests_total{outcome="refused"}': 1,
        'redis_tb_requests_total{outcome="shadow_refused"}': 4,
        'redis_tb_requests_total{outcome="skipped"}': 1,
        'redis_tb_refusals_total{limit="api"}': 1,
        'redis_tb_refusals_total{limit="trial"}': 4,
        'redis_tb_decisions_total{source="module"}': 9,
        'redis_tb_decisions_total{source="function"}': 0,
        'redis_tb_decisions_total{source="script"}': 0,
        'redis_tb_decisions_total{source="lease"}': 0,
        'redis_tb_decisions_total{source="local"}': 4,
        'redis_tb_decisions_total{source="open"}': 0,
        'redis_tb_decisions_total{source="closed"}': 0,
        'redis_tb_redis_failures_total{class="connection"}': 1,
        "redis_tb_call_duration_seconds_count{}": 13,
    }


# Redis 6.2 has no Functions: only the script runs without the module there.
@pytest.mark.parametrize("backend", ["function", "script"] if WITHOUT_MODULE == "function" else ["script"])
@pytest.mark.parametrize("kind", KINDS)
def test_decisions_name_the_backend_that_answered(kind: str, backend: str, plain_server: Server) -> None:
    registry = prometheus_client.CollectorRegistry()
    app = App(kind, plain_server, [Limit(f"api-{kind}-{backend}", rate=1, burst=5)], backend=backend, metrics=registry)
    try:
        assert [app.get("carol")[0] for _ in range(2)] == [200, 200]
    finally:
        app.close()
    assert scraped(registry)[f'redis_tb_decisions_total{{source="{backend}"}}'] == 2
    assert scraped(registry)['redis_tb_decisions_total{source="module"}'] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_fail_open_and_closed_are_counted_as_the_source(kind: str) -> None:
    """Nothing listens on the port: each call fails (connection), then the fail mode answers without a call."""
    registry = prometheus_client.CollectorRegistry()
    port = free_port()
    opened = App(kind, port, [Limit("api", rate=1, burst=5)], fail="open", metrics=registry)
    closed = App(kind, port, [Limit("api", rate=1, burst=5)], fail="closed", metrics=registry)
    try:
        assert opened.get("dan")[0] == 200
        status, _, body = closed.get("dan")
        assert status == 503 and b"unavailable" in body
    finally:
        opened.close()
        closed.close()
    values = scraped(registry)
    assert values['redis_tb_decisions_total{source="open"}'] == 1
    assert values['redis_tb_decisions_total{source="closed"}'] == 1
    assert values['redis_tb_redis_failures_total{class="connection"}'] == 2
    assert values['redis_tb_requests_total{outcome="allowed"}'] == 1
    assert values['redis_tb_requests_total{outcome="refused"}'] == 1
    assert not any(name.startswith("redis_tb_refusals_total") for name in values)  # no bucket refused


@pytest.mark.parametrize("kind", KINDS)
def test_two_middlewares_share_the_series_of_one_registry(kind: str, module_server: Server) -> None:
    registry = prometheus_client.CollectorRegistry()
    first = App(kind, module_server, [Limit("shared", rate=1, burst=5)], metrics=registry, prefix=f"one-{kind}:")
    second = App(kind, module_server, [Limit("shared", rate=1, burst=5)], metrics=registry, prefix=f"two-{kind}:")
    try:
        assert first.get("erin")[0] == second.get("erin")[0] == 200
    finally:
        first.close()
        second.close()
    assert scraped(registry)['redis_tb_requests_total{outcome="allowed"}'] == 2


def test_the_default_registry_unless_none(module_server: Server) -> None:
    counted = App("wsgi", module_server, [Limit("default-registry", rate=1, burst=5)])
    silent = App("wsgi", module_server, [Limit("no-metrics", rate=1, burst=5)], metrics=None)
    try:
        before = prometheus_client.REGISTRY.get_sample_value("redis_tb_requests_total", {"outcome": "skipped"})
        assert before is not None
        counted.get("skip")
        silent.get("skip")
        after = prometheus_client.REGISTRY.get_sample_value("redis_tb_requests_total", {"outcome": "skipped"})
        assert after == before + 1
        assert silent.middleware.metrics is None
    finally:
        counted.close()
        silent.close()
    with pytest.raises(ValueError, match="metrics must be a prometheus_client CollectorRegistry"):
        App("wsgi", module_server, [Limit("api", rate=1, burst=5)], metrics="default")


@pytest.mark.parametrize("kind", KINDS)
def test_middleware_shadow_serves_every_request_and_sends_no_headers(
    kind: str, module_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """`shadow=True`: every limit is tried; the bucket is charged as when enforced; the refusal is logged once
    within a second however many requests it refuses."""
    registry = prometheus_client.CollectorRegistry()
    name = f"tried-{kind}"
    app = App(kind, module_server, [Limit(name, rate=0.001, burst=2)], shadow=True, metrics=registry)
    try:
        with caplog.at_level(logging.WARNING, logger="redis_tb"):
            began = time.monotonic()
            answers = [app.get("frank") for _ in range(5)]
            elapsed = time.monotonic() - began
    finally:
        app.close()
    assert [status for status, _, _ in answers] == [200] * 5
    assert not any(header.lower().startswith("ratelimit") for _, headers, _ in answers for header in headers)
    assert float(module_server.client().hget(f"ratelimit:{{frank}}:{name}", "tokens") or "2") < 0.5
    logged = [record for record in caplog.records if name in record.getMessage()]
    assert "would have refused" in logged[0].getMessage()
    assert len(logged) == 1 or elapsed >= 1.0, (len(logged), elapsed)  # a second line only a second later
    values = scraped(registry)
    assert values['redis_tb_requests_total{outcome="allowed"}'] == 2
    assert values['redis_tb_requests_total{outcome="shadow_refused"}'] == 3
    assert values[f'redis_tb_refusals_total{{limit="{name}"}}'] == 3


@pytest.mark.parametrize("kind", KINDS)
def test_refusal_status_and_body_options(kind: str, module_server: Server) -> None:
    limit = Limit(f"strict-{kind}", rate=0.001, burst=1)
    with_dict = App(kind, module_server, [limit], status_code=403, body={"error": "slow down"}, metrics=None)
    with_function = App(
        kind,
        module_server,
        [limit],
        prefix="fn:",
        body=lambda decision: {"limit": decision.limit.name, "wait": decision.retry_after_ms > 0},
        metrics=None,
    )
    try:
        assert with_dict.get("gina")[0] == 200
        status, headers, body = with_dict.get("gina")
        assert (status, body) == (403, b'{"error": "slow down"}')
        assert "retry-after" in headers
        assert with_function.get("gina")[0] == 200
        assert with_function.get("gina")[:3:2] == (429, f'{{"limit": "{limit.name}", "wait": true}}'.encode())
    finally:
        with_dict.close()
        with_function.close()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("status_code", 200, "status_code must be an HTTP error status"),
        ("status_code", True, "status_code must be an HTTP error status"),
        ("body", ["a"], "body must be a JSON object"),
        ("body", {"a": object()}, "body must be a JSON object"),
        ("on_error", "log", "on_error must be a function"),
        ("shadow", 1, "shadow must be True or False"),
    ],
)
def test_bad_options_are_refused_by_name(option: str, value: Any, message: str, module_server: Server) -> None:
    with pytest.raises(ValueError, match=message):
        App("wsgi", module_server, [Limit("api", rate=1, burst=1)], **{option: value})


def test_a_limit_refuses_a_shadow_that_is_no_bool() -> None:
    with pytest.raises(ValueError, match="limit 'api': shadow must be True or False"):
        Limit("api", rate=1, burst=1, shadow="yes")  # type: ignore[arg-type]


def test_the_shadow_log_waits_a_second_per_limit(module_server: Server, caplog: pytest.LogCaptureFixture) -> None:
    name = "tried-again"
    app = App("wsgi", module_server, [Limit(name, rate=0.001, burst=1, shadow=True)], metrics=None)
    try:
        with caplog.at_level(logging.WARNING, logger="redis_tb"):
            app.get("hank")
            app.get("hank")
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # within the second: no second line
                app.get("hank")
            app.get("hank")
    finally:
        app.close()
    logged = [record for record in caplog.records if name in record.getMessage()]
    assert len(logged) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_hook_or_body_function_is_no_500(
    kind: str, module_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """on_error raising: logged, and the fail mode answers; a body function raising: logged, the default body."""

    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("a bug in the app's hook")

    limit = Limit(f"hooked-{kind}", rate=0.001, burst=1)
    down = App(kind, free_port(), [limit], fail="closed", on_error=broken, metrics=None)
    refusing = App(kind, module_server, [limit], body=broken, metrics=None)
    try:
        with caplog.at_level(logging.ERROR, logger="redis_tb"):
            assert down.get("ivy")[0] == 503
            assert refusing.get("ivy")[0] == 200
            status, _, body = refusing.get("ivy")
    finally:
        down.close()
        refusing.close()
    assert status == 429 and json.loads(body)["limit"] == limit.name
    messages = [record.getMessage() for record in caplog.records]
    assert any("on_error raised" in message for message in messages), messages
    assert any("body function failed" in message for message in messages), messages
