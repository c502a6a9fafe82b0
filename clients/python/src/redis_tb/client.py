"""The synchronous client, over `redis.Redis` or `redis.cluster.RedisCluster`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from . import _protocol as protocol
from .errors import ModuleNotLoaded
from .replies import Acquired, AcquiredAll, AcquiredEach, Charged, PartialGrant, Refunded, Reservation

T = TypeVar("T")
Backend = Literal["auto", "module", "script"]
SyncRedis = Redis | RedisCluster
#: The key `detect()` peeks at (cost 0: nothing is written).
DETECT_KEY = "redis-tb:detect"


class Backends:
    """Which backend runs each command: the module where the server has it, else the Lua script. Shared by the
    sync and asyncio clients; holds no connection."""

    def __init__(self, backend: Backend) -> None:
        if backend not in ("auto", "module", "script"):
            raise ValueError(f"backend must be 'auto', 'module' or 'script', not {backend!r}")
        self.mode: Backend = backend
        self.in_use: str | None = None if backend == "auto" else backend
        # Commands an older module lacks: those run on the script while the rest stay on the module.
        self.missing: set[str] = set()

    def uses_module(self, name: str) -> bool:
        return self.mode == "module" or (self.in_use != protocol.SCRIPT_BACKEND and name not in self.missing)

    def module_answered(self) -> None:
        if self.in_use is None:
            self.in_use = protocol.MODULE

    def module_missing(self, name: str, error: Exception) -> None:
        """The server did not know `name`: fall back to the script (auto), or say the module is missing."""
        if self.mode == "module":
            raise ModuleNotLoaded(f"{name} is unknown to the server: the redis-tb module is not loaded") from error
        if self.in_use == protocol.MODULE:
            self.missing.add(name)
        else:
            self.in_use = protocol.SCRIPT_BACKEND


class TokenBucket:
    """Token buckets in Redis, one method per command.

    `backend="auto"` (the default) sends the module's command and, if the server answers that it does not know
    it, switches to the Lua script for good (`EVALSHA`, loading the script on `NOSCRIPT`): no extra round trip in
    the steady state either way. `backend="module"` never falls back; `backend="script"` never tries the module.
    `backend_in_use` says which one runs ("module" or "script"; None before the first call in auto mode).
    """

    def __init__(self, redis: SyncRedis, *, backend: Backend = "auto") -> None:
        self.redis = redis
        self._backends = Backends(backend)

    @property
    def backend_in_use(self) -> str | None:
        return self._backends.in_use

    def detect(self) -> str:
        """Asks the server once which backend applies, and keeps the answer. The question is a peek
        (`TB.ACQUIRE` with cost 0 on the key `redis-tb:detect`), which writes nothing."""
        if self._backends.mode == "auto":
            try:
                self.redis.execute_command("TB.ACQUIRE", DETECT_KEY, "1", "1", "0")  # type: ignore[no-untyped-call]
            except RedisError as error:  # a cluster client's own command table raises a plain RedisError
                if not protocol.is_unknown_command(error):
                    raise _translated(error) from None
                self._backends.in_use = protocol.SCRIPT_BACKEND
            else:
                self._backends.in_use = protocol.MODULE
        return self._backends.in_use or protocol.MODULE

    def _run(self, call: protocol.Call[T]) -> T:
        if self._backends.uses_module(call.name):
            try:
                reply = self.redis.execute_command(call.name, *call.module_args)  # type: ignore[no-untyped-call]
            except RedisError as error:  # a cluster client's own command table raises a plain RedisError
                if not protocol.is_unknown_command(error):
                    raise _translated(error) from None
                self._backends.module_missing(call.name, error)
            else:
                self._backends.module_answered()
                return call.parse(reply)
        return call.parse(self._eval(call))

    def _eval(self, call: protocol.Call[T]) -> Any:
        args = call.eval_args()
        try:
            try:
                return self.redis.evalsha(protocol.SCRIPT_SHA, len(call.keys), *args)
            except NoScriptError:
                return self.redis.eval(protocol.SCRIPT, len(call.keys), *args)
        except ResponseError as error:
            raise _translated(error) from None

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

    def block(self, key: str, rate: float, burst: float, ms: int) -> Charged:
        """`TB.BLOCK`: denies every cost above 0 for `ms`, then refills from empty."""
        return self._run(protocol.block(key, rate, burst, ms))

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
