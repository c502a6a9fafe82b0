"""The middleware's side of a failing Redis: the failure table's logging, the gate that keeps limiter calls off
a Redis that stopped answering, and the deadline of a call.

A fault is a fault of the calls that failed. An error reply (`OOM`, `READONLY`, `CLUSTERDOWN`, ...) fails its own
call only: the next call goes to Redis as usual (another key may live on a healthy shard). A timeout or a lost
connection closes the gate: while it is closed no limiter call is sent, the fail mode answers at once, and only a
probe (`PING`, run by the middleware in the background) is sent, a few a second at most (`PROBE_INTERVALS_S`,
growing while it fails). A probe that answers reopens the gate, and the next call that answers ends the fault. So
a stalled Redis never gets a queue of limiter calls to run (and charge) when it resumes, and a dead one never gets
a connection attempt per request. `Guard` does no I/O: the middleware sends the calls and probes and tells it how
they went.

The deadline: `configure` caps the client's socket timeouts at the middleware's `timeout` and turns its retries
off, because a retried limiter call is sent, and charged, twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as redis_asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from ._failures import Failure, classify
from .errors import TokenBucketError

logger = logging.getLogger("redis_tb")

#: Seconds from a failure to the next probe: the first probe comes soon, then they space out, the last repeating;
#: the count starts again once a probe answers. Node's lane and the Rust client use the same delays
#: (fixtures/deadlines.json).
PROBE_INTERVALS_S = (0.25, 0.5, 1.0)
#: A configuration error (at ERROR level) or an error reply (a warning) is logged at most once per row in this
#: many seconds.
ERROR_LOG_INTERVAL_S = 60.0
#: Limiter calls one middleware has out at once, at most; the others wait for one to end, within their deadline.
#: A stalled Redis runs the calls written to it before their deadline when it resumes: this bounds how many, per
#: process, whatever the request rate (calls still waiting at their deadline were never written).
MAX_IN_FLIGHT = 64
#: While a limiter call has been out longer than this part of the deadline, no new call is written (Node's lane and
#: the Rust client hold them the same way): when Redis stalls, only the calls written before that are run when it
#: resumes.
STALL_FRACTION = 0.25


class NotSent(Exception):
    """A limiter call that waited, unwritten, behind a stalled one, and found the gate closed: the fail mode
    answers it, as any call made while the gate is closed."""


class Guard:
    """The gate and the logging of one middleware; thread-safe (WSGI servers call from several threads)."""

    def __init__(self, fail: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.fail = fail
        self.clock = clock
        #: The clock reading of the failure that closed the gate; None while it is open.
        self.down_since: float | None = None
        #: When the fault began (the first failure since a call last answered): its warning is logged once.
        self._fault_began: float | None = None
        self._failures = 0
        self._next_probe_at = 0.0
        self._probing = False
        self._error_logged_at: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def admits(self) -> bool:
        """Whether limiter calls may be sent."""
        return self.down_since is None

    def probe_due(self) -> bool:
        """Whether the caller should start a probe now; if so, the caller owns it until `probed`."""
        with self._lock:
            if self.down_since is None or self._probing or self.clock() < self._next_probe_at:
                return False
            self._probing = True
            return True

    def probed(self, error: BaseException | None) -> None:
        """A probe ended: it answered (error None: the next call goes to Redis), or failed with `error`."""
        with self._lock:
            self._probing = False
            if error is None:
                self.down_since = None
                self._failures = 0
                return
        self._closed(classify(error), error)

    def answered(self) -> None:
        """A limiter call answered: that ends a fault of the connection, if one went on."""
        with self._lock:
            self.down_since = None
            self._failures = 0
            began, self._fault_began = self._fault_began, None
        if began is not None:
            logger.info("redis-tb: Redis answers again after %.1f s; limiter calls go to it", self.clock() - began)

    def failed(self, error: BaseException) -> Failure:
        """A limiter call failed: log it as the failure table says; a timeout or a lost connection closes the
        gate, any other failure fails this call only."""
        failure = classify(error)
        if failure.config_error and self._due(failure.row):
            # Not a Redis error: a bug somewhere, so the traceback is worth its lines.
            trace = None if _from_redis(error) else error
            logger.error(
                "redis-tb: limiter call refused (%s): %s; this does not pass by itself (the Redis user's "
                "password or permissions, a key of another type, or a bug); meanwhile fail=%r answers",
                failure.row,
                error,
                self.fail,
                exc_info=trace,
            )
        if failure.lost_connection:
            self._closed(failure, error)
        elif not failure.config_error and self._due(failure.row):
            logger.warning(
                "redis-tb: a limiter call failed (%s: %s); fail=%r answered it, other calls still go to Redis "
                "(logged at most once a minute)",
                failure.row,
                error,
                self.fail,
            )
        return failure

    def refund_failed(self, key: str, error: BaseException) -> None:
        """A refund of a request refused in part failed (an error reply, a lost connection, its deadline): the
        request stays refused, and `key`'s bucket keeps what it took. A warning at most once a minute per row; a
        timeout or a lost connection closes the gate, as for any call."""
        failure = classify(error)
        if self._due(f"refund {failure.row}"):
            logger.warning(
                "redis-tb: could not give back what a refused request took from %r (%s: %s); the request stays "
                "refused and the bucket keeps those tokens (logged at most once a minute)",
                key,
                failure.row,
                error,
            )
        if failure.lost_connection:
            self._closed(failure, error)

    def charge_back_refused(self, key: str, failure: Failure, error: BaseException) -> None:
        """Redis refused a charge-back with a configuration error: what it covered is dropped and the call goes on
        to Redis. At ERROR level, at most once a minute per row, as any configuration error."""
        if self._due(f"charge-back {failure.row}"):
            logger.error(
                "redis-tb: Redis refused to take back what this process admitted in memory for %r (%s: %s); it is "
                "dropped and the call goes on to Redis. This does not pass by itself: the Redis user needs TB.LOWER "
                "(or FCALL or EVALSHA where the library or the script runs the calls), like the other limiter commands",
                key,
                failure.row,
                error,
            )

    def _due(self, row: str) -> bool:
        """Whether a failure of `row` is logged now: at most once per row in `ERROR_LOG_INTERVAL_S`."""
        now = self.clock()
        with self._lock:
            last = self._error_logged_at.get(row)
            due = last is None or now - last >= ERROR_LOG_INTERVAL_S
            if due:
                self._error_logged_at[row] = now
        return due

    def _closed(self, failure: Failure, error: BaseException) -> None:
        with self._lock:
            now = self.clock()
            starts = self._fault_began is None
            if starts:
                self._fault_began = now
            if self.down_since is None:
                self.down_since = now
            self._failures += 1
            step = PROBE_INTERVALS_S[min(self._failures, len(PROBE_INTERVALS_S)) - 1]
            self._next_probe_at = now + step
        if starts and not failure.config_error:
            logger.warning(
                "redis-tb: Redis unavailable (%s: %s); fail=%r answers until it answers again",
                failure.row,
                error,
                self.fail,
            )


def _from_redis(error: BaseException) -> bool:
    return isinstance(error, (RedisError, RedisClusterException, TokenBucketError, OSError, TimeoutError))


def configure(redis: Any, timeout: float) -> None:
    """Caps the socket timeouts of a redis-py client (standalone, sentinel or cluster, sync or asyncio) at `timeout`
    seconds and turns its retries off, on the client and on the cluster nodes it already knows. An asyncio client
    keeps its read and write timeout (`socket_timeout`): the ASGI middleware cancels each call at its deadline
    itself, and redis-py's own timeout would wrap every write in `asyncio.wait_for` (a task per call before Python
    3.12) for nothing.

    Only through what each client keeps for itself: its `set_retry`, the timeouts in the keyword arguments it makes
    connections with, and a `retry` already among them (replaced, never added: redis-py 6 and later make a cluster
    node's client with a `retry` of their own, no retries, and a second one fails with TypeError)."""
    asynchronous = isinstance(redis, (redis_asyncio.Redis, redis_asyncio.RedisCluster))
    no_retry: Any = AsyncRetry(NoBackoff(), 0) if asynchronous else Retry(NoBackoff(), 0)
    capped = ("socket_connect_timeout",) if asynchronous else ("socket_timeout", "socket_connect_timeout")
    clients = [redis]
    get_nodes = getattr(redis, "get_nodes", None)
    if get_nodes is not None:
        clients += [node.redis_connection for node in get_nodes() if getattr(node, "redis_connection", None)]
        for node in get_nodes():  # asyncio cluster nodes keep their own connection settings
            node_kwargs = getattr(node, "connection_kwargs", None)
            if isinstance(node_kwargs, dict):
                _cap(node_kwargs, timeout, capped)
                _replace_retry(node_kwargs, no_retry)
    for client in clients:
        kwargs = client.get_connection_kwargs()
        _cap(kwargs, timeout, capped)
        _replace_retry(kwargs, no_retry)
        if client is not redis or get_nodes is None:
            client.set_retry(no_retry)  # a Redis client: its pool's connections, now and to come
        pool = getattr(client, "connection_pool", None)
        if pool is not None and not asynchronous:
            # Connections made before keep their settings: close them, so the next call opens one with these.
            pool.disconnect()
            pool.reset()
    if get_nodes is not None:
        # The cluster's own retries (of a call, after a refresh of the topology), set where each version keeps them.
        redis.retry = no_retry
        if hasattr(redis, "cluster_error_retry_attempts"):
            redis.cluster_error_retry_attempts = 0


def _replace_retry(kwargs: dict[str, Any], retry: Any) -> None:
    if "retry" in kwargs:
        kwargs["retry"] = retry


def _cap(kwargs: dict[str, Any], timeout: float, names: tuple[str, ...]) -> None:
    for name in names:
        current = kwargs.get(name)
        if current is None or current > timeout:
            kwargs[name] = timeout
