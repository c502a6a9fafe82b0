"""The failure table (docs/clients.md, "When Redis fails") in both middlewares: the classifier against the shared
fixture, then each row against a real server put in that state, ASGI and WSGI alike. Every row ends in the fail
mode, never in a 500; configuration errors are logged at ERROR level."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from conftest import MODULE, SERVER, Server, free_port
from fastapi import FastAPI
from flask import Flask
from redis._parsers.base import BaseParser
from redis.backoff import NoBackoff
from redis.retry import Retry

import redis_tb
from redis_tb import AsyncTokenBucket, Limit, TokenBucket, asgi, wsgi
from redis_tb._failures import classify
from redis_tb._guard import MAX_IN_FLIGHT, STALL_FRACTION, Guard
from redis_tb._protocol import is_unknown_command

FIXTURE: dict[str, Any] = json.loads((Path(__file__).resolve().parents[3] / "fixtures/failures.json").read_text())
LIMITS = [Limit("per-client", rate=0.01, burst=2)]  # no refill to speak of during a test
KINDS = ["asgi", "wsgi"]


def exception_of(case: dict[str, Any]) -> BaseException:
    """The exception redis-py raises for a case: a server's reply parsed as redis-py parses it, or the named
    exception."""
    if "reply" in case:
        error: BaseException = BaseParser.parse_error(case["reply"])  # type: ignore[no-untyped-call]
        return error
    module, _, name = case["python"].rpartition(".")
    kind: type[BaseException] = getattr(redis.exceptions if module else builtins, name)
    return kind(case["message"]) if case["message"] else kind()


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda case: case["row"])
def test_classifier_follows_the_fixture(case: dict[str, Any]) -> None:
    failure = classify(exception_of(case))
    assert failure.config_error == (case["action"] == "error-fail-mode"), failure
    assert failure.class_ == case["class"], failure
    assert failure.row == case["row"], failure


def test_the_unknown_command_row_is_the_backends_unknown_command() -> None:
    """One check decides both: a reply of fixtures/backends.json is the failure table's "unknown command" row exactly
    when it is what moves calls to the script (a command unknown to a script's `redis.call` is neither)."""
    cases = json.loads((Path(__file__).resolve().parents[3] / "fixtures/backends.json").read_text())["cases"]
    checked = 0
    for case in cases:
        if "reply" not in case:
            continue
        error = BaseParser.parse_error(case["reply"])  # type: ignore[no-untyped-call]
        unknown = classify(error).class_ == "unknown_command"
        assert unknown == is_unknown_command(error) == (case["class"] == "unknown-command"), case
        checked += 1
    assert checked >= 10, checked


@dataclass(frozen=True)
class Answer:
    status: int
    #: The RateLimit-Remaining field: None when no limiter answered (fail open).
    remaining: int | None


class Served:
    """An app of `kind` ("asgi": FastAPI, "wsgi": Flask) with the middleware, over a client built with
    `client_kwargs` (or the option `client`); `get()` sends a request, `pause(s)` lets time pass (and the app's
    background work run)."""

    def __init__(self, kind: str, client_kwargs: dict[str, Any], options: dict[str, Any]) -> None:
        limits = options.pop("limits", LIMITS)
        client = options.pop("client", None)
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        if kind == "wsgi":
            self.conn: Any = client or redis.Redis(**client_kwargs)
            flask = Flask(__name__)
            flask.get("/")(lambda: "hello")
            flask.wsgi_app = wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
                flask.wsgi_app, limiter=TokenBucket(self.conn), limits=limits, **options
            )
            self.flask = flask.test_client()
        else:
            self.conn = client or redis.asyncio.Redis(**client_kwargs)
            app = FastAPI()
            app.get("/")(lambda: "hello")
            app.add_middleware(asgi.RateLimitMiddleware, limiter=AsyncTokenBucket(self.conn), limits=limits, **options)
            self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")

    def get(self) -> Answer:
        if self.kind == "wsgi":
            response = self.flask.get("/")
            status, remaining = response.status_code, response.headers.get("RateLimit-Remaining")
        else:
            answer = self.loop.run_until_complete(self.http.get("/"))
            status, remaining = answer.status_code, answer.headers.get("RateLimit-Remaining")
        return Answer(status, None if remaining is None else int(remaining))

    def pause(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def close(self) -> None:
        if self.kind == "wsgi":
            self.conn.close()
        else:
            self.loop.run_until_complete(self.http.aclose())
            self.loop.run_until_complete(self.conn.aclose())
        self.loop.close()


@contextlib.contextmanager
def served(kind: str, client_kwargs: dict[str, Any], **options: Any) -> Iterator[Served]:
    app = Served(kind, client_kwargs, options)
    try:
        yield app
    finally:
        app.close()


def request(kind: str, client_kwargs: dict[str, Any], n: int = 1, **options: Any) -> list[int]:
    """`n` requests through a fresh app of `kind` over a client built with `client_kwargs`: their statuses."""
    with served(kind, client_kwargs, **options) as app:
        return [app.get().status for _ in range(n)]


@pytest.fixture
def fresh() -> Iterator[Server]:
    """A server of this test's own, which it may put in any state."""
    server = Server(module=True)
    yield server
    server.stop()


def address(server: Server, **extra: Any) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": server.port, **extra}


def assert_fail_modes(kind: str, client_kwargs: dict[str, Any]) -> None:
    """closed answers 503, open lets through, local limits in memory (burst 2: the third is refused)."""
    assert request(kind, client_kwargs, fail="closed") == [503]
    assert request(kind, client_kwargs, fail="open") == [200]
    assert request(kind, client_kwargs, 3) == [200, 200, 429]


@pytest.mark.parametrize("kind", KINDS)
def test_oom_under_noeviction(kind: str, fresh: Server) -> None:
    fresh.client().config_set("maxmemory-policy", "noeviction")
    fresh.client().config_set("maxmemory", "1")
    assert_fail_modes(kind, address(fresh))


@pytest.mark.parametrize("kind", KINDS)
def test_readonly_from_a_demoted_primary(kind: str, fresh: Server) -> None:
    # A failover demotes a primary: it follows the new one (here, one that is gone) and refuses writes.
    gone = Server(module=False)
    gone.stop()
    fresh.client().replicaof("127.0.0.1", gone.port)
    assert_fail_modes(kind, address(fresh))


@pytest.mark.parametrize("kind", KINDS)
def test_masterdown_on_a_replica_that_lost_its_primary(kind: str, fresh: Server) -> None:
    gone = Server(module=False)
    gone.stop()
    fresh.client().config_set("replica-serve-stale-data", "no")
    fresh.client().replicaof("127.0.0.1", gone.port)
    assert request(kind, address(fresh), fail="closed") == [503]


@pytest.mark.parametrize("kind", KINDS)
def test_busy_while_a_script_runs(kind: str, fresh: Server) -> None:
    fresh.client().config_set("lua-time-limit", "10")
    looping = threading.Thread(target=_run_forever_script, args=(fresh,), daemon=True)
    looping.start()
    deadline = time.monotonic() + 10
    while True:  # BUSY once the script has run past lua-time-limit
        try:
            fresh.client(socket_timeout=1).ping()
        except redis.exceptions.ResponseError as error:
            assert str(error).startswith("BUSY")
            break
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert request(kind, address(fresh), fail="closed") == [503]
    finally:
        fresh.client().script_kill()
        looping.join(5)


def _run_forever_script(server: Server) -> None:
    with contextlib.suppress(redis.exceptions.ResponseError):  # SCRIPT KILL ends it
        server.client().eval("while true do end", 0)


@pytest.mark.parametrize("kind", KINDS)
def test_loading_while_the_dataset_loads(kind: str, tmp_path: Path) -> None:
    loader = Server(module=True)
    if not loader.client().config_get("loading-process-events-interval-bytes"):
        loader.stop()  # Redis 6.2 answers clients only every 2 MB it loads
        pytest.skip("this server cannot be made to answer often while it loads")
    loader.client().mset({f"k{n}": os.urandom(64).hex() for n in range(800)})  # random: no compression
    loader.client().save()
    dump = loader.dir / "dump.rdb"
    dump.rename(tmp_path / "dump.rdb")
    port = loader.port
    loader.stop()
    # 800 keys at 5 ms each: the server loads for 4 s, answering LOADING each time it has read 1 KB more.
    command = [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", ""]
    command += ["--loadmodule", MODULE, "--key-load-delay", "5000", "--loading-process-events-interval-bytes", "1024"]
    process = subprocess.Popen(
        [*command, "--logfile", str(tmp_path / "server.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1, retry=Retry(NoBackoff(), 0)).ping()
            except redis.exceptions.BusyLoadingError:
                break
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass
            assert time.monotonic() < deadline, "the server never answered LOADING"
            time.sleep(0.01)
        assert request(kind, {"host": "127.0.0.1", "port": port}, fail="closed") == [503]
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("kind", KINDS)
def test_clusterdown_when_no_node_serves_the_slot(kind: str) -> None:
    lone = Server(
        module=True, args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"), cluster_bus=True
    )
    try:
        assert request(kind, address(lone), fail="closed") == [503]
    finally:
        lone.stop()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("setup", ["NOAUTH", "WRONGPASS", "NOPERM"])
def test_auth_and_acl_errors_are_logged_at_error_level(
    kind: str, setup: str, fresh: Server, caplog: pytest.LogCaptureFixture
) -> None:
    admin = fresh.client()
    admin.acl_setuser("limiter", enabled=True, passwords=["+right"], keys=["*"], commands=["+ping"])
    client = address(fresh)
    if setup == "NOAUTH":
        admin.config_set("requirepass", "secret")
    elif setup == "WRONGPASS":
        client.update(username="limiter", password="wrong")
    else:
        client.update(username="limiter", password="right")
    with caplog.at_level(logging.ERROR, logger="redis_tb"):
        assert request(kind, client, fail="closed") == [503]
        assert request(kind, client, fail="open") == [200]
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert errors, "a configuration error must be logged at ERROR level"
    assert "secret" not in caplog.text


@pytest.mark.parametrize("kind", KINDS)
def test_connection_refused(kind: str) -> None:
    gone = Server(module=False)
    gone.stop()
    assert_fail_modes(kind, {"host": "127.0.0.1", "port": gone.port})


def test_fail_defaults_to_local() -> None:
    gone = Server(module=False)
    gone.stop()
    for kind in KINDS:
        assert request(kind, {"host": "127.0.0.1", "port": gone.port}, 4) == [200, 200, 429, 429]


def test_fail_mode_and_timeout_are_checked() -> None:
    conn = redis.Redis()
    for options in (
        {"fail": "maybe"},
        {"timeout": 0},
        {"timeout": float("inf")},
        {"ipv6_subnet": 65},
        {"local_capacity": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(options))):
            wsgi.RateLimitMiddleware(lambda e, s: [], limiter=TokenBucket(conn), limits=LIMITS, **options)
    assert redis_tb.SKIP is not None


@contextlib.contextmanager
def sentinel_for(primary: Server) -> Iterator[int]:
    """A Sentinel watching `primary` as "mymaster": its port."""
    port = free_port()
    config = primary.dir / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {primary.dir}\nlogfile {primary.dir / 'sentinel.log'}\n"
        f"sentinel monitor mymaster 127.0.0.1 {primary.port} 1\n"
    )
    process = subprocess.Popen(
        [SERVER, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis(port=port, socket_timeout=1).sentinel_get_master_addr_by_name("mymaster"):
                    break
            except redis.exceptions.ConnectionError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the sentinel did not start"
            time.sleep(0.02)
        yield port
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("kind", KINDS)
def test_the_middleware_limits_through_a_sentinel_client(kind: str, fresh: Server) -> None:
    """The deadline settings on a client from Sentinel (its pool asks Sentinel for the primary on each new
    connection): timeouts capped (the connect timeout only, for the ASGI middleware), and the calls still limit,
    in Redis."""
    with sentinel_for(fresh) as port:
        client: Any
        if kind == "wsgi":
            sentinel = redis.sentinel.Sentinel([("127.0.0.1", port)], socket_timeout=1)  # type: ignore[no-untyped-call]
            client = sentinel.master_for("mymaster")  # type: ignore[no-untyped-call]
        else:
            async_sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
                [("127.0.0.1", port)], socket_timeout=1
            )
            client = async_sentinel.master_for("mymaster")
        with served(kind, {}, client=client, fail="closed", timeout=0.5) as app:
            assert [app.get().status for _ in range(3)] == [200, 200, 429]
            kwargs = client.connection_pool.connection_kwargs
            assert kwargs["socket_connect_timeout"] == 0.5
            # The ASGI middleware cancels each call at its deadline itself: the read timeout stays the client's.
            assert kwargs["socket_timeout"] == (0.5 if kind == "wsgi" else 1)
    assert fresh.client().exists("ratelimit:{127.0.0.1}:per-client")


@pytest.mark.parametrize("kind", KINDS)
def test_calls_during_a_stall_are_not_charged_when_redis_resumes(kind: str, fresh: Server) -> None:
    """A stalled Redis (SIGSTOP) runs, when it resumes, what was written to it meanwhile: a client that retried each
    timed-out call, or sent every request's call, would have each charged later. Only the call in flight when the
    stall began may be; the others get the fail mode at once and send nothing."""
    key = f"stall:{kind}"
    # A client with socket timeouts and redis-py's default retries: the middleware takes its retries away.
    client = address(fresh, socket_timeout=0.3, socket_connect_timeout=0.3)
    limits = [Limit("stall", rate=0.001, burst=100)]  # no refill to speak of during the test
    with served(kind, client, limits=limits, prefix=key, fail="open", timeout=0.3) as app:
        assert app.get().status == 200
        fresh.process.send_signal(signal.SIGSTOP)
        durations = []
        try:
            during = []
            for _ in range(20):
                begin = time.monotonic()
                during.append(app.get())
                durations.append(time.monotonic() - begin)
        finally:
            fresh.process.send_signal(signal.SIGCONT)
        assert [response.status for response in during] == [200] * 20
        assert not any(response.remaining is not None for response in during)
        # One deadline (0.3 s), then the fail mode answers at once, without waiting a deadline for each. The
        # median, not the total, so that a busy machine starving a few answers does not count.
        assert sorted(durations)[len(durations) // 2] < 0.3, durations
        deadline = time.monotonic() + 10
        while (answered := app.get()).remaining is None:  # until the gate reopens and Redis answers
            assert time.monotonic() < deadline, "the middleware never sent a call again"
            app.pause(0.02)
    tokens = float(fresh.client().hget(f"{key}{{127.0.0.1}}:stall", "tokens") or 0)
    late = round(100 - 2 - tokens)
    assert 0 <= late <= 1, late
    assert answered.remaining == 100 - 2 - late


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_gate_probes_a_few_times_a_second_and_warns_once_per_fault(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    guard = Guard("local", clock)
    refused = redis.exceptions.ConnectionError("Connection refused.")
    with caplog.at_level(logging.INFO, logger="redis_tb"):
        guard.failed(refused)
        assert not guard.admits and not guard.probe_due()
        clock.now += 0.25
        assert guard.probe_due() and not guard.probe_due()  # one probe at a time
        guard.probed(refused)
        clock.now += 0.25
        assert not guard.probe_due()  # the interval grows while probes fail
        clock.now += 0.25
        assert guard.probe_due()
        guard.probed(None)
        assert guard.admits
        guard.failed(redis.exceptions.TimeoutError("Timeout reading from socket"))  # the same fault goes on
        clock.now += 1
        assert guard.probe_due()
        guard.probed(None)
        guard.answered()
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].message
    assert "answers again after 1.8 s" in caplog.text


def test_gate_follows_the_deadlines_fixture() -> None:
    """fixtures/deadlines.json (read by Node's and Rust's suites too): probes after 250 ms, 500 ms, then every
    second while they fail; once one answers, a new failure is probed after the first delay again."""
    fixture = json.loads((Path(__file__).resolve().parents[3] / "fixtures/deadlines.json").read_text())
    assert fixture["max_in_flight"] == MAX_IN_FLIGHT
    assert fixture["stall_fraction"] == STALL_FRACTION
    delays = fixture["probe_delays_ms"]
    clock = FakeClock()
    guard = Guard("local", clock)
    refused = redis.exceptions.ConnectionError("Connection refused.")

    def next_probe_after_ms() -> int:
        waited = 0
        while not guard.probe_due():
            clock.now += 0.001
            waited += 1
        return waited

    guard.failed(refused)
    seen = []
    for _ in range(len(delays) + 2):
        seen.append(next_probe_after_ms())
        guard.probed(refused)
    assert seen == delays + [delays[-1]] * 2
    assert next_probe_after_ms() == delays[-1]
    guard.probed(None)
    guard.failed(redis.exceptions.TimeoutError("Timeout reading from socket"))
    assert next_probe_after_ms() == delays[0]


def test_an_error_reply_fails_its_own_call_only(caplog: pytest.LogCaptureFixture) -> None:
    """OOM, READONLY, LOADING, CLUSTERDOWN...: the server answered, so the next call goes to it (another key may
    live on a healthy shard); a warning at most once a minute per error."""
    clock = FakeClock()
    guard = Guard("local", clock)
    with caplog.at_level(logging.WARNING, logger="redis_tb"):
        for error in (
            redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
            redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
            redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
            redis.exceptions.ClusterDownError("The cluster is down"),
            redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        ):
            guard.failed(error)
            assert guard.admits, error
            clock.now += 1
    assert len(caplog.records) == 4  # the second OOM within a minute is not logged
    lost: tuple[BaseException, ...] = (
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.ConnectionError("Connection refused."),
        asyncio.TimeoutError(),
        ConnectionResetError(),
    )
    for lost_error in lost:
        closing = Guard("local", clock)
        closing.failed(lost_error)
        assert not closing.admits, lost_error


def test_configuration_errors_are_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    guard = Guard("open", clock)
    with caplog.at_level(logging.ERROR, logger="redis_tb"):
        for _ in range(3):
            guard.failed(redis.exceptions.NoPermissionError("User has no permissions"))
            clock.now += 20
        guard.failed(ValueError("a bug"))
    assert len(caplog.records) == 2  # NOPERM once in 60 s, then the other error
    assert caplog.records[1].exc_info is not None  # not a Redis error: the traceback helps
    clock.now += 1
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="redis_tb"):
        guard.failed(redis.exceptions.NoPermissionError("User has no permissions"))
    assert len(caplog.records) == 1


async def test_calls_in_flight_during_a_stall_are_at_most_max_in_flight(fresh: Server) -> None:
    """Many concurrent requests when Redis stalls: each one whose call went out before the deadline may be charged
    when Redis resumes. At most MAX_IN_FLIGHT calls are out at once, whatever the request rate, where sending
    them all would charge 150 here (one per pooled connection). The tokens are read before the stall, once a call
    has answered: under load some warm-up calls miss their deadline (the gate closes and later ones are answered by
    the fail mode, never charged), so the warm-up's charge is not 150."""
    conn = redis.asyncio.Redis(**address(fresh, socket_timeout=0.3, socket_connect_timeout=0.3))
    app = FastAPI()
    app.get("/")(lambda: "hello")
    limits = [Limit("stall", rate=0.001, burst=1000)]
    app.add_middleware(
        asgi.RateLimitMiddleware, limiter=AsyncTokenBucket(conn), limits=limits, fail="open", timeout=0.3
    )
    observer = fresh.client()

    def tokens() -> float:
        return float(observer.hget("ratelimit:{127.0.0.1}:stall", "tokens") or 0)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:

        async def burst(n: int) -> list[httpx.Response]:
            return list(await asyncio.gather(*(http.get("/") for _ in range(n))))

        async def until_a_call_answers() -> None:
            deadline = time.monotonic() + 10
            while "ratelimit" not in (await http.get("/")).headers:
                assert time.monotonic() < deadline, "the middleware never sent a call again"
                await asyncio.sleep(0.02)

        warm = await burst(150)  # the pool now holds connections for the calls of the next burst
        assert {response.status_code for response in warm} == {200}
        await until_a_call_answers()  # the gate is open: the next burst's calls go out
        before = tokens()
        fresh.process.send_signal(signal.SIGSTOP)
        try:
            during = await burst(150)
        finally:
            fresh.process.send_signal(signal.SIGCONT)
        assert {response.status_code for response in during} == {200}
        # A new connection's PING is read after every command already waiting in a socket when Redis resumed.
        with fresh.client() as barrier:
            assert barrier.ping()
        late = round(before - tokens())
        await until_a_call_answers()
    await conn.aclose()
    observer.close()
    assert 1 <= late <= MAX_IN_FLIGHT, late


@pytest.mark.parametrize("kind", KINDS)
def test_calls_made_once_a_call_has_waited_a_quarter_of_the_deadline_are_not_written(kind: str, fresh: Server) -> None:
    """Redis stalls (SIGSTOP) with one call out; 10 concurrent requests made half a deadline later wait unwritten
    behind it and are answered by the fail mode once it misses its deadline: when Redis resumes, only that first
    call is run (as in Node's lane), where writing them on the pool's connections would charge 11."""
    limits = [Limit("quarter", rate=0.001, burst=1000)]
    observer = fresh.client()
    key = "ratelimit:{127.0.0.1}:quarter"
    kwargs = address(fresh, socket_timeout=0.4, socket_connect_timeout=0.4)

    def concurrently(app: Served, n: int, first_alone: bool = False) -> list[Answer]:
        """`n` requests at once (after one made half a deadline earlier, with `first_alone`)."""
        if kind == "wsgi":
            with ThreadPoolExecutor(n + 1) as pool:
                first = pool.submit(app.get) if first_alone else None
                if first_alone:
                    time.sleep(0.2)
                answers = [future.result() for future in [pool.submit(app.get) for _ in range(n)]]
                if first is not None:
                    first.result()
                return answers

        async def requests() -> list[Answer]:
            first = asyncio.ensure_future(app.http.get("/")) if first_alone else None
            if first is not None:
                await asyncio.sleep(0.2)
            answers = await asyncio.gather(*(app.http.get("/") for _ in range(n)))
            if first is not None:
                await first
            return [Answer(answer.status_code, None) for answer in answers]

        return app.loop.run_until_complete(requests())

    with served(kind, kwargs, limits=limits, fail="open", timeout=0.4) as app:
        deadline = time.monotonic() + 10
        while True:  # the pool holds a connection for each of the stall's calls, and the last call answered
            concurrently(app, 11)
            if app.get().remaining is not None:
                break
            assert time.monotonic() < deadline, "the middleware never sent a call again"
        before = float(observer.hget(key, "tokens") or 0)
        fresh.process.send_signal(signal.SIGSTOP)
        try:
            later = concurrently(app, 10, first_alone=True)
        finally:
            fresh.process.send_signal(signal.SIGCONT)
        assert {answer.status for answer in later} == {200}
        with fresh.client() as barrier:  # read after every command already in a socket when Redis resumed
            assert barrier.ping()
        charged = before - float(observer.hget(key, "tokens") or 0)
    observer.close()
    assert charged <= 1 + 1e-6, f"{charged} tokens taken during the stall: calls made behind a stalled one were written"
