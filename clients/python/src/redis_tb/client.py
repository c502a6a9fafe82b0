"""The synchronous client, over `redis.Redis` or `redis.cluster.RedisCluster`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from . import _protocol as protocol
from .errors import ModuleNotLoaded
from .replies import (
    Acquired,
    AcquiredAll,
    AcquiredEach,
    Charged,
    PartialGrant,
    Refunded,
    Reservation,
    ThrottleReply,
)

T = TypeVar("T")
Backend = Literal["auto", "module", "function", "script"]
SyncRedis = Redis | RedisCluster
#: The key `detect()` peeks at (cost 0: nothing is written).
DETECT_KEY = "redis-tb:detect"
#: Where backend switches are logged, once each, with their reason.
log = logging.getLogger("redis_tb")
#: How often a client that left the module after a failover tries it again (one call's module command): a
#: failback to a primary with the module then brings the calls back to it.
MODULE_RETRY_S = 60.0


def wall_clock_us() -> int:
    """The caller's clock, integer microseconds since the Unix epoch."""
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Send:
    """One command for the client to send; `key` routes it on a cluster where the Redis client cannot (FCALL and
    FUNCTION LOAD: redis-py would ask a node for FCALL's keys on every call, and send FUNCTION LOAD to every
    primary at once)."""

    args: tuple[str | int, ...]
    key: str
    routed: bool = False


#: A command's run, step by step: yields each command to send, is sent its reply (or thrown its error), and
#: returns the parsed result. The sync and asyncio clients differ only in how they send.
Steps = Generator[Send, Any, T]


class Backends:
    """Which backend runs the commands, and the switches between them. Shared by the sync and asyncio clients;
    holds no connection.

    In auto mode the order is: the module while its commands answer; else the Redis Functions library
    (`FCALL`, loaded with `FUNCTION LOAD` where a server lacks it); else the script (`EVALSHA`) where functions
    are unavailable (Redis 6.2, an ACL user without FCALL or FUNCTION). A switch moves down that order, and the
    call that met it is retried once on the next backend: a failover to a primary without the module costs no
    call. A client that left a module that had answered sends one call a minute to the module again, and goes back
    to it when it answers (a failback). Where TIME is refused inside scripts, the library and the script take the
    caller's clock instead.
    """

    ORDER: tuple[str, ...] = (protocol.MODULE, protocol.FUNCTION, protocol.SCRIPT_BACKEND)

    def __init__(self, backend: Backend, now_us: Callable[[], int]) -> None:
        if backend not in ("auto", *self.ORDER):
            raise ValueError(f"backend must be 'auto', 'module', 'function' or 'script', not {backend!r}")
        self.mode: Backend = backend
        self.in_use: str | None = None if backend == "auto" else backend
        self.answered = False
        self.caller_time = False
        self.now_us = now_us
        #: When (time.monotonic()) the next call tries the module again; None: never (it never answered here).
        self.module_retry_at: float | None = None

    def _switch(self, to: str, reason: str) -> None:
        """Moves to `to` and says why, once: a warning if the backend left had been answering, else a notice."""
        left = self.in_use or protocol.MODULE
        if self.ORDER.index(to) <= self.ORDER.index(left):
            return  # another call switched first
        if self.answered:
            log.warning("redis-tb: %s; calls now go to %s instead of %s", reason, _describe(to), _describe(left))
            if left == protocol.MODULE:
                self.module_retry_at = time.monotonic() + MODULE_RETRY_S
        else:
            log.info("redis-tb: %s; calls go to %s", reason, _describe(to))
        self.in_use = to
        self.answered = False

    def _fall_back(self, backend: str, call: protocol.Call[Any], error: RedisError, kind: str) -> bool:
        """Whether `error` (of the class `kind`) means `backend` cannot run here and the call goes to the next
        backend."""
        if self.mode != "auto":
            if self.mode == protocol.MODULE and kind == "unknown-command":
                message = f"{call.name} is unknown to the server: the redis-tb module is not loaded"
                raise ModuleNotLoaded(message) from error
            return False
        if backend == protocol.MODULE and kind == "unknown-command":
            self._switch(protocol.FUNCTION, f"the server does not know {call.name} ({protocol.summary(error)})")
            return True
        if backend == protocol.FUNCTION and kind in ("unknown-command", "functions-unavailable"):
            what = (
                "the server refused the library"
                if isinstance(error, protocol.LibraryRefused)
                else "Redis Functions are unavailable"
            )
            self._switch(protocol.SCRIPT_BACKEND, f"{what} ({protocol.summary(error)})")
            return True
        return False

    def _module_again(self, call: protocol.Call[T]) -> Generator[Send, Any, tuple[bool, Any]]:
        """Once a minute after a failover left the module: whether the module answers this call again."""
        self.module_retry_at = time.monotonic() + MODULE_RETRY_S
        try:
            reply = yield Send((call.name, *call.module_args), call.keys[0])
        except RedisError as error:
            if protocol.backend_error_class(error) == "unknown-command":
                return False, None
            raise _translated(error) from None
        log.warning(
            "redis-tb: the redis-tb module answers again; calls now go to it instead of %s",
            _describe(self.in_use or ""),
        )
        self.in_use, self.answered, self.module_retry_at = protocol.MODULE, True, None
        return True, reply

    def steps(self, call: protocol.Call[T]) -> Steps[T]:
        if self.module_retry_at is not None and time.monotonic() >= self.module_retry_at:
            answered, reply = yield from self._module_again(call)
            if answered:
                return call.parse(reply)
        caller_time = self.caller_time
        refusal: RedisError | None = None
        while True:
            backend = self.in_use or protocol.MODULE
            caller_us = self.now_us() if caller_time else None
            try:
                if backend == protocol.MODULE:
                    reply = yield Send((call.name, *call.module_args), call.keys[0])
                elif backend == protocol.FUNCTION:
                    reply = yield from _fcall(call, caller_us)
                else:
                    reply = yield from _eval(call, caller_us)
            except RedisError as error:
                kind = protocol.backend_error_class(error)
                if backend != protocol.MODULE and not caller_time and kind == "time-refused":
                    caller_time, refusal = True, error  # retried once with the caller's clock; kept if that answers
                    continue
                if self._fall_back(backend, call, error, kind):
                    continue
                raise _translated(error) from None
            if refusal is not None and not self.caller_time:
                self.caller_time = True
                log.warning(
                    "redis-tb: the server refuses TIME inside scripts (%s); calls now send this process's clock, so "
                    "the bound is burst + rate * (t + skew), skew the largest clock difference between the callers",
                    protocol.summary(refusal),
                )
            if self.in_use is None:
                log.info("redis-tb: calls go to %s", _describe(backend))
                self.in_use = backend
            self.answered = True
            return call.parse(reply)


def _describe(backend: str) -> str:
    if backend == protocol.FUNCTION:
        return f"the Redis Functions library {protocol.LIBRARY_NAME} (FCALL)"
    if backend == protocol.SCRIPT_BACKEND:
        return "the Lua script (EVALSHA)"
    return "the redis-tb module"


def _fcall(call: protocol.Call[Any], caller_us: int | None) -> Generator[Send, Any, Any]:
    """FCALL, loading the library first where the server lacks it (first use, FUNCTION FLUSH, a restart or a
    failover): one load and one retry."""
    fcall = Send(call.fcall_args(caller_us), call.keys[0], routed=True)
    try:
        return (yield fcall)
    except ResponseError as error:
        if protocol.backend_error_class(error) != "function-missing":
            raise
    try:
        yield Send(("FUNCTION", "LOAD", protocol.LIBRARY), call.keys[0], routed=True)
    except ResponseError as error:
        if protocol.backend_error_class(error) != "library-loaded":  # else another client loaded it first
            raise protocol.library_refused(error) or error from None
    return (yield fcall)


def _eval(call: protocol.Call[Any], caller_us: int | None) -> Generator[Send, Any, Any]:
    """EVALSHA; on NOSCRIPT (a restart, a failover, SCRIPT FLUSH), EVAL, which runs the script and caches it."""
    args = call.eval_args(caller_us)
    try:
        return (yield Send(("EVALSHA", protocol.SCRIPT_SHA, len(call.keys), *args), call.keys[0]))
    except NoScriptError:
        return (yield Send(("EVAL", protocol.SCRIPT, len(call.keys), *args), call.keys[0]))


class TokenBucket:
    """Token buckets in Redis, one method per command.

    `backend="auto"` (the default) sends the module's command; where the server does not know it, the calls go to
    the Redis Functions library (`FCALL`, loaded by the client where missing), and where functions are
    unavailable (Redis 6.2, an ACL user without them) to the Lua script (`EVALSHA`). Each switch is logged once
    (logger "redis_tb") with its reason, and the call that met it is retried on the next backend: no extra round
    trip in the steady state. `backend="module"`, `"function"` or `"script"` forces one. `backend_in_use` says
    which one runs ("module", "function" or "script"; None before the first call in auto mode).

    `now_us` is the caller's clock (integer Unix microseconds), sent only where the server refuses TIME inside
    scripts: then the bound over any window `t` becomes `burst + rate * (t + skew)`, skew being the largest
    difference between the callers' clocks.
    """

    def __init__(
        self, redis: SyncRedis, *, backend: Backend = "auto", now_us: Callable[[], int] = wall_clock_us
    ) -> None:
        self.redis = redis
        self._backends = Backends(backend, now_us)

    @property
    def backend_in_use(self) -> str | None:
        return self._backends.in_use

    def detect(self) -> str:
        """Finds the backend now rather than on the first call (loading the library if need be), and returns it.
        The question is a peek (`TB.ACQUIRE` with cost 0 on the key `redis-tb:detect`), which writes nothing."""
        self._run(protocol.acquire(DETECT_KEY, 1, 1, 0))
        return self._backends.in_use or protocol.MODULE

    def _send(self, send: Send) -> Any:
        if send.routed and isinstance(self.redis, RedisCluster):
            node = self.redis.get_node_from_key(send.key)  # type: ignore[no-untyped-call]
            return self.redis.execute_command(*send.args, target_nodes=node)  # type: ignore[no-untyped-call]
        return self.redis.execute_command(*send.args)  # type: ignore[no-untyped-call]

    def _run(self, call: protocol.Call[T]) -> T:
        steps = self._backends.steps(call)
        try:
            send = next(steps)
            while True:
                try:
                    reply = self._send(send)
                except RedisError as error:  # a cluster client's own command table raises a plain RedisError
                    send = steps.throw(error)
                else:
                    send = steps.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def acquire(self, key: str, rate: float, burst: float, cost: float = 1) -> Acquired:
        """`TB.ACQUIRE`: takes `cost` tokens if the bucket holds them."""
        return self._run(protocol.acquire(key, rate, burst, cost))

    def acquire_all(self, buckets: Sequence[protocol.Bucket], cost: float = 1) -> AcquiredAll:
        """`TB.ACQUIREALL`: takes `cost` from every `(key, rate, burst)` bucket, or from none."""
        return self._run(protocol.acquire_all(buckets, cost))

    def acquire_each(self, buckets: Sequence[protocol.BucketWithCost]) -> AcquiredEach:
        """`TB.ACQUIREEACH`: takes each `(key, rate, burst, cost)` bucket's own cost, from all or none."""
        return self._run(protocol.acquire_each(buckets))

    def acquire_at_most(self, key: str, rate: float, burst: float, max_tokens: int) -> PartialGrant:
        """`TB.ACQUIREATMOST`: takes up to `max_tokens` whole tokens, as many as are there."""
        return self._run(protocol.acquire_at_most(key, rate, burst, max_tokens))

    def reserve(self, key: str, rate: float, burst: float, cost: float, max_wait_ms: int) -> Reservation:
        """`TB.RESERVE`: takes `cost` now for the caller to act after `wait_ms` (at most `max_wait_ms`)."""
        return self._run(protocol.reserve(key, rate, burst, cost, max_wait_ms))

    def refund(self, key: str, rate: float, burst: float, amount: float) -> Refunded:
        """`TB.REFUND`: gives `amount` tokens back (nothing while the bucket is in debt)."""
        return self._run(protocol.refund(key, rate, burst, amount))

    def charge(self, key: str, rate: float, burst: float, cost: float) -> Charged:
        """`TB.CHARGE`: takes `cost` whether or not it is there (into debt, up to 24 hours of refill)."""
        return self._run(protocol.charge(key, rate, burst, cost))

    def lower(self, key: str, rate: float, burst: float, tokens: float) -> Charged:
        """`TB.LOWER`: brings the bucket down to `tokens` where it holds more (never raises it; `tokens` may be
        negative, down to a day of refill in debt)."""
        return self._run(protocol.lower(key, rate, burst, tokens))

    def block(self, key: str, rate: float, burst: float, ms: int) -> Charged:
        """`TB.BLOCK`: denies every cost above 0 for `ms`, then refills from empty."""
        return self._run(protocol.block(key, rate, burst, ms))

    def throttle(
        self, key: str, max_burst: int, count_per_period: int, period: int, quantity: int = 1
    ) -> ThrottleReply:
        """`CL.THROTTLE`: redis-cell's GCRA limit, `count_per_period` per `period` seconds and `max_burst + 1` at
        once, on a key of its own (a string; not a token bucket)."""
        return self._run(protocol.throttle(key, max_burst, count_per_period, period, quantity))

    def reset(self, *keys: str) -> int:
        """Deletes buckets (a missing bucket is a full one); returns how many existed."""
        deleted = 0
        for key in keys:  # one DEL per key: cluster keys may live on different shards
            deleted += int(self.redis.delete(key))
        return deleted


def _translated(error: Exception) -> Exception:
    if isinstance(error, ResponseError):
        return protocol.translate(error)
    return error
