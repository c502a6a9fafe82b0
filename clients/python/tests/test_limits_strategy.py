"""The "token-bucket" strategy: `limits`' own contract (hit, test, get_window_stats, clear), then Flask-Limiter
and slowapi selecting it by configuration alone, on both backends."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import flask_limiter
import httpx
import pytest
import redis
from conftest import Server, free_port
from fastapi import FastAPI, Request
from flask import Flask
from flask.testing import FlaskClient
from flask_limiter.util import get_remote_address
from limits import parse
from limits.aio.strategies import STRATEGIES as AIO_STRATEGIES
from limits.errors import ConfigurationError, StorageError
from limits.storage import MemcachedStorage, MemoryStorage, storage_from_string
from limits.strategies import STRATEGIES
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address as starlette_remote_address

import redis_tb.limits  # importing the package registers the strategy
from redis_tb import Limit
from redis_tb._local import LocalBuckets
from redis_tb.limits import AsyncTokenBucketRateLimiter, MemoryBuckets


def memcached_storage() -> MemcachedStorage:
    """A memcached storage (never connected: only its type matters here)."""
    return MemcachedStorage.__new__(MemcachedStorage)


class Blocking:
    """A `limits.aio` strategy driven from synchronous code (one event loop per instance), so that one test body
    checks both interfaces."""

    def __init__(self, limiter: Any) -> None:
        self.limiter = limiter
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.limiter, name)
        return lambda *args, **kwargs: self.loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        self.loop.close()


@pytest.fixture(params=["module", "script", "memory"])
def storage_uri(request: pytest.FixtureRequest, module_server: Server, plain_server: Server) -> str:
    """The strategy's storages: Redis with the module, Redis without it (the Lua script), and in memory."""
    if request.param == "memory":
        return "memory://"
    return (module_server if request.param == "module" else plain_server).url()


Build = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def build(request: pytest.FixtureRequest) -> Iterator[Build]:
    """Builds the token-bucket strategy of `limits` (sync) or of `limits.aio` (async) over the storage of a URI
    (`memory://` or `redis://...`), with the storage's options."""
    assert AIO_STRATEGIES["token-bucket"] is AsyncTokenBucketRateLimiter
    built: list[Blocking] = []

    def strategy(uri: str, **options: Any) -> Any:
        if request.param == "sync":
            return STRATEGIES["token-bucket"](storage_from_string(uri, **options))
        if uri.startswith("redis"):
            options.setdefault("implementation", "redispy")
        built.append(Blocking(AsyncTokenBucketRateLimiter(storage_from_string(f"async+{uri}", **options))))
        return built[-1]

    yield strategy
    for blocking in built:
        blocking.close()


@pytest.fixture
def limiter(build: Build, storage_uri: str) -> Any:
    """The token-bucket strategy of `limits` and of `limits.aio`, on each storage."""
    return build(storage_uri)


def test_hit_takes_until_the_burst_is_spent(limiter: Any, key: str) -> None:
    item = parse("3 per 3 seconds")  # burst 3, one token per second
    assert [limiter.hit(item, key) for _ in range(4)] == [True, True, True, False]
    assert limiter.hit(item, key, "other") is True  # identifiers make separate buckets
    assert not limiter.hit(parse("3 per 3 seconds"), key, "more", cost=4)  # more than the burst: never


def test_test_peeks_without_taking(limiter: Any, key: str) -> None:
    item = parse("2/second")
    assert limiter.test(item, key) and limiter.test(item, key, cost=2)
    assert not limiter.test(item, key, cost=3)
    assert limiter.hit(item, key, cost=2)
    assert not limiter.test(item, key)


def test_window_stats(limiter: Any, key: str) -> None:
    """`reset_time` is now for a full bucket; else when it is full again, or, with no token left, when the next
    one arrives, the wait rounded up to whole seconds."""
    item = parse("10/minute")  # burst 10, one token per 6 s
    before = time.time()
    full = limiter.get_window_stats(item, key)
    assert full.remaining == 10 and before <= full.reset_time <= time.time()
    limiter.hit(item, key, cost=9)
    asked = time.time()
    partial = limiter.get_window_stats(item, key)
    assert partial.remaining == 1 and asked + 53.9 <= partial.reset_time <= time.time() + 54.001  # full in 54 s
    limiter.hit(item, key)
    asked = time.time()
    empty = limiter.get_window_stats(item, key)
    assert empty.remaining == 0 and asked + 5.9 <= empty.reset_time <= time.time() + 6.001  # the next token in 6 s


def test_window_stats_round_the_wait_up(limiter: Any, key: str) -> None:
    """A wait of a fraction of a second is reported as a whole one."""
    item = parse("2/second")  # burst 2, the next token 0.5 s after both are taken
    assert limiter.hit(item, key, cost=2)
    asked = time.time()
    stats = limiter.get_window_stats(item, key)
    assert stats.remaining == 0 and asked + 0.999 <= stats.reset_time <= time.time() + 1.001


def test_a_limit_of_zero_admits_nothing(limiter: Any, key: str) -> None:
    """`0/minute` refuses every hit, as the library's strategies do, and says to come back a window later."""
    item = parse("0/minute")
    assert not limiter.hit(item, key) and not limiter.test(item, key)
    stats = limiter.get_window_stats(item, key)
    assert stats.remaining == 0 and time.time() + 59 <= stats.reset_time <= time.time() + 60.001


def test_memory_buckets_sweep_the_expired(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full buckets (expired entries) leave the in-memory storage even when its own timer does not run."""
    monkeypatch.setattr(redis_tb.limits, "SWEEP_EVERY", 2)
    storage = MemoryStorage()
    storage.timer.cancel()  # the storage's own expiry, which runs only after its own writes
    limiter = STRATEGIES["token-bucket"](storage)
    assert limiter.hit(parse("1000/second"), "soon-full")  # full again 1 ms later
    (expiry,) = storage.expirations.values()
    while time.time() <= expiry:
        time.sleep(0.001)
    assert limiter.hit(parse("1/hour"), "a")  # the second write sweeps
    assert list(storage.storage) == ["tb/LIMITER/a/1/1/hour"]


def test_clear_refills(limiter: Any, key: str) -> None:
    item = parse("1/hour")
    assert limiter.hit(item, key) and not limiter.hit(item, key)
    limiter.clear(item, key)
    assert limiter.hit(item, key)


def test_memory_buckets_expire_when_full_and_go_with_reset() -> None:
    """In memory, a bucket is an entry of the storage that expires when the bucket is full again, and the
    storage's `reset` (Flask-Limiter's `limiter.reset()`) refills every bucket."""
    storage = MemoryStorage()
    limiter = STRATEGIES["token-bucket"](storage)
    item = parse("2/second")
    assert limiter.hit(item, "a", cost=2) and not limiter.hit(item, "a")
    (entry,) = storage.expirations.items()
    assert entry[0].startswith("tb/") and time.time() < entry[1] <= time.time() + 1.0
    storage.reset()
    assert limiter.hit(item, "a", cost=2)


def test_key_prefix_and_wrap_exceptions(build: Build, server: Server, key: str) -> None:
    """The storage's options keep their meaning: `key_prefix` prefixes the bucket's key, `wrap_exceptions`
    turns the storage's errors into `limits.errors.StorageError`."""
    assert build(server.url(), key_prefix=key).hit(parse("1/hour"), "a")
    assert server.client().exists(f"{key}:tb/LIMITER/a/1/1/hour") == 1
    dead = f"redis://127.0.0.1:{free_port()}"
    with pytest.raises(StorageError):
        build(dead, wrap_exceptions=True).hit(parse("1/hour"), "a")
    with pytest.raises(redis.exceptions.ConnectionError):
        build(dead).hit(parse("1/hour"), "a")


def test_refuses_other_storages() -> None:
    """Storages the strategy cannot run on are refused when it is built, naming what it needs."""
    with pytest.raises(ConfigurationError, match=r"Redis storage .* not memcached"):
        STRATEGIES["token-bucket"](memcached_storage())
    with pytest.raises(ConfigurationError, match=r"not a valkey\.client\.Valkey client \(for a Valkey server, use"):
        STRATEGIES["token-bucket"](storage_from_string("valkey://127.0.0.1:1"))
    valkey = storage_from_string("async+valkey://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match=r'implementation="redispy".* not a valkey\.asyncio'):
        AsyncTokenBucketRateLimiter(valkey)


def flask_client(storage_uri: str, key: str, limit: str, **config: Any) -> FlaskClient:
    """A Flask-Limiter app on the token-bucket strategy, configured only, limiting `/` to `limit`."""
    app = Flask(__name__)
    app.config.update(
        RATELIMIT_STORAGE_URI=storage_uri,
        RATELIMIT_STRATEGY="token-bucket",
        RATELIMIT_DEFAULT=limit,
        RATELIMIT_HEADERS_ENABLED=True,
        RATELIMIT_KEY_PREFIX=key,
        **config,
    )
    flask_limiter.Limiter(get_remote_address, app=app)
    app.get("/")(lambda: "hello")
    return app.test_client()


def test_flask_limiter_by_configuration(server: Server, key: str) -> None:
    # A token every 10 s: a busy machine cannot refill one between the requests.
    http = flask_client(server.url(), key, "2 per 20 seconds")
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]
    refused = http.get("/")
    assert refused.status_code == 429
    assert 9 <= int(refused.headers["Retry-After"]) <= 11, refused.headers  # the next token, not the window
    assert refused.headers["X-RateLimit-Remaining"] == "0"


def test_a_client_waiting_retry_after_is_admitted(storage_uri: str, key: str) -> None:
    """Told to wait N seconds, a client is admitted after N. The token is taken at x.5 s and the refusal asked for
    just after the next whole second, 0.4 to 0.65 s before the next token: a reset reported to the millisecond
    made Flask-Limiter, which truncates, answer `Retry-After: 0`."""
    http = flask_client(storage_uri, key, "1 per 1 second")
    while not 0.5 <= time.time() % 1 < 0.6:
        time.sleep(0.005)
    assert http.get("/").status_code == 200  # the only token; the next one comes 1 s later
    while time.time() % 1 >= 0.5:  # until just past the next whole second
        time.sleep(0.005)
    refused = http.get("/")
    assert refused.status_code == 429
    wait = int(refused.headers["Retry-After"])
    assert wait >= 1
    time.sleep(wait)
    assert http.get("/").status_code == 200


def test_flask_limiter_in_memory_fallback(key: str) -> None:
    """`RATELIMIT_IN_MEMORY_FALLBACK_ENABLED`: the app starts, and while Redis is unreachable the same limits
    hold in each process's memory, on the same strategy."""
    dead = f"redis://127.0.0.1:{free_port()}?socket_connect_timeout=0.5"
    http = flask_client(dead, key, "2 per 2 seconds", RATELIMIT_IN_MEMORY_FALLBACK_ENABLED=True)
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]


async def test_slowapi_by_configuration(server: Server, key: str) -> None:
    limiter = Limiter(
        key_func=starlette_remote_address, storage_uri=server.url(), strategy="token-bucket", key_prefix=key
    )
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

    @app.get("/")
    @limiter.limit("2 per 2 seconds")
    async def home(request: Request) -> dict[str, str]:
        return {"hello": "world"}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        assert [(await http.get("/")).status_code for _ in range(3)] == [200, 200, 429]


def test_installed_package_registers_without_an_import(server: Server, key: str) -> None:
    """`pip install redis-tb` is enough: a Flask-Limiter app that never imports redis_tb selects the strategy by
    configuration (redis-tb.pth registers it when `limits` loads), and so does `limits.aio`."""
    program = f"""
import sys
import limits.aio.strategies
from flask import Flask
from flask.testing import FlaskClient
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

app = Flask(__name__)
app.config.update(RATELIMIT_STORAGE_URI={server.url()!r}, RATELIMIT_STRATEGY="token-bucket",
                  RATELIMIT_DEFAULT="1 per 10 seconds", RATELIMIT_KEY_PREFIX={key!r})
Limiter(get_remote_address, app=app)
app.get("/")(lambda: "hello")
http = app.test_client()
print([http.get("/").status_code for _ in range(2)], "redis_tb" in sys.modules,
      "token-bucket" in limits.aio.strategies.STRATEGIES)
"""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[200, 429] True True"


def test_memory_buckets_decide_as_the_local_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strategy's in-memory buckets and the middleware's (whose arithmetic fixtures/local.json checks, as
    Node's) answer a sequence of calls alike, field for field: one bucket, one arithmetic."""
    now = [1_000_000.0]
    monkeypatch.setattr(redis_tb.limits, "time", SimpleNamespace(time=lambda: now[0]))
    rng = random.Random(7)
    for rate, burst in itertools.product((3, 1 / 3, 0.25, 7, 1000), (1, 2, 2.5, 100)):
        memory = MemoryBuckets(MemoryStorage())
        local = LocalBuckets(clock=lambda: now[0])
        for step in range(40):
            now[0] += rng.choice((0.0, 0.001, 0.01, 0.1, 1 / 3, 1.0))
            cost = rng.choice((1, 1, 2, 0.5, 0))
            got = memory.acquire("k", rate, burst, cost)
            (bucket,) = local.acquire_each([Limit("k", rate=rate, burst=burst, cost=cost)], ["k"]).buckets
            expected = (bucket.fits, bucket.remaining, bucket.retry_after_ms, bucket.reset_after_ms)
            assert (got.allowed, got.remaining, got.retry_after_ms, got.reset_after_ms) == expected, (rate, burst, step)
