"""What both middlewares share: their options, the response to give from Redis's reply or from the fail mode, and
what they count. Which limits apply and the calls that decide them are `_plan`'s; each middleware (`asgi`, `wsgi`)
sends the calls."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from . import _protocol as protocol
from ._failures import Failure, classify
from ._guard import MAX_IN_FLIGHT, STALL_FRACTION, Guard, configure
from ._local import CAPACITY, ChargeBack, LocalBuckets
from ._metrics import DEFAULT_REGISTRY, metrics_for
from ._plan import LimitsSpec, Plan, plan
from .aio import AsyncTokenBucket
from .client import TokenBucket
from .headers import STANDARDS, Standard, headers_for
from .identity import (
    DEFAULT_IPV6_SUBNET,
    check_ipv6_subnet,
    check_prefix,
    ip_identity,
)
from .limit import KeyFunction, Limit, check_limits
from .replies import Acquired, AcquiredEach

FailMode = Literal["local", "open", "closed"]
#: The `on_error` option: called with the error, the request (ASGI scope or WSGI environ) and the failure table's
#: row (`Failure`: its `class_` is the row's class) for every limiter call that failed.
ErrorHook = Callable[[BaseException, Mapping[str, Any], Failure], object]
#: A shadow limit's refusals are logged at most once per limit in this many seconds.
SHADOW_LOG_INTERVAL_S = 1.0
logger = logging.getLogger("redis_tb")


@dataclass(frozen=True)
class Verdict:
    """What to answer: go on (with headers) or refuse with a status, headers and a JSON body."""

    allowed: bool
    headers: list[tuple[str, str]]
    status: int = 200
    body: bytes = b""
    #: The names of the limits whose bucket did not fit (none for a fail mode's refusal).
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """A refusal, as the `body` function is given it: the limit that refuses (the one with the longest wait), its
    wait in ms (-1: its cost exceeds its burst, waiting never helps), every enforced limit of the request and Redis's
    reply (or the local fallback's, alike)."""

    limit: Limit
    retry_after_ms: int
    limits: tuple[Limit, ...]
    reply: Acquired | AcquiredEach


#: The `body` option: a JSON object, or a function of the refusal returning one.
Body = Mapping[str, Any] | Callable[[Decision], Mapping[str, Any]]


def default_body(decision: Decision) -> dict[str, Any]:
    """`{"error": "rate limit exceeded", "limit": <name>, "retry_after_ms": <ms>}`, the wait left out when
    waiting never helps."""
    body: dict[str, Any] = {"error": "rate limit exceeded", "limit": decision.limit.name}
    if decision.retry_after_ms >= 0:
        body["retry_after_ms"] = decision.retry_after_ms
    return body


@dataclass(frozen=True)
class Refusals:
    """How a refusal answers: the status code and the body (docs/operating.md, "Refusals")."""

    status: int = 429
    body: Body = default_body

    def encoded(self, decision: Decision) -> bytes:
        body = self.body
        if callable(body):
            try:
                body = body(decision)
                return json.dumps(body).encode()
            except Exception:  # a refusal is never a 500: the default body instead, and the bug logged
                logger.exception("redis-tb: the body function failed for limit %r", decision.limit.name)
                return json.dumps(default_body(decision)).encode()
        return json.dumps(body).encode()


def verdict(
    plan: Plan, reply: Acquired | AcquiredEach, standard: Standard, refusals: Refusals | None = None
) -> Verdict:
    """The answer to `reply`; without `refusals` (a shadow plan) only whether it allows and which limits refused."""
    if refusals is None:
        return Verdict(reply.allowed, [], refused=refused_limits(plan, reply))
    headers = headers_for(plan.limits, reply, standard=standard)
    if reply.allowed:
        return Verdict(True, headers)
    limiting = reply.limiting_index if isinstance(reply, AcquiredEach) else 0
    decision = Decision(plan.limits[limiting], reply.retry_after_ms, plan.limits, reply)
    headers.append(("Content-Type", "application/json"))
    return Verdict(False, headers, refusals.status, refusals.encoded(decision), refused_limits(plan, reply))


def refused_limits(plan: Plan, reply: Acquired | AcquiredEach) -> tuple[str, ...]:
    """The names of the limits whose bucket did not fit: none when the reply allows."""
    if reply.allowed:
        return ()
    if isinstance(reply, AcquiredEach):
        return tuple(limit.name for limit, bucket in zip(plan.limits, reply.buckets, strict=True) if not bucket.fits)
    return (plan.limits[0].name,)


def unavailable() -> Verdict:
    """Fail closed: Redis could not be asked, so the request is refused."""
    body = json.dumps({"error": "rate limiter unavailable"}).encode()
    return Verdict(False, [("Content-Type", "application/json"), ("Retry-After", "1")], 503, body)


def peer_address(request: Mapping[str, Any]) -> str | None:
    """The peer address as the server gives it (ASGI `client`, WSGI `REMOTE_ADDR`); None where there is none
    (a Unix socket)."""
    client = request.get("client")
    if client:
        return str(client[0])
    address = request.get("REMOTE_ADDR")
    return str(address) if address else None


def client_address(request: Mapping[str, Any]) -> str | None:
    """The default identity: the peer address through `ip_identity` (IPv6 by /56). Behind a proxy, pass a key
    function that reads the header your proxy sets (docs/clients.md says what such a key trusts)."""
    return ip_identity(peer_address(request))


App = TypeVar("App")
Limiter = TypeVar("Limiter", bound=AsyncTokenBucket | TokenBucket)


class Middleware(Generic[App, Limiter]):
    """The options both middlewares take, checked and kept once, and what they do with a call's outcome: the
    wrapped app (ASGI or WSGI), the limiter (async or sync) and the rest, described on
    `redis_tb.asgi.RateLimitMiddleware`."""

    def __init__(
        self,
        app: App,
        *,
        limiter: Limiter,
        limits: LimitsSpec,
        key: KeyFunction | None = None,
        prefix: str = "ratelimit:",
        fail: FailMode = "local",
        standard: Standard = "both",
        ipv6_subnet: int = DEFAULT_IPV6_SUBNET,
        timeout: float = 1.0,
        local_capacity: int = CAPACITY,
        shadow: bool = False,
        status_code: int = 429,
        body: Body = default_body,
        on_error: ErrorHook | None = None,
        metrics: Any = DEFAULT_REGISTRY,
    ) -> None:
        if fail not in ("local", "open", "closed"):
            raise ValueError(f"fail must be 'local', 'open' or 'closed', not {fail!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if standard not in STANDARDS:
            raise ValueError(f"standard must be one of {', '.join(STANDARDS)}, not {standard!r}")
        if not isinstance(shadow, bool):
            raise ValueError(f"shadow must be True or False, not {shadow!r}")
        if isinstance(status_code, bool) or not isinstance(status_code, int) or not 400 <= status_code <= 599:
            raise ValueError(f"status_code must be an HTTP error status (400 to 599), not {status_code!r}")
        if not callable(body):
            try:
                json.dumps(body)
            except (TypeError, ValueError) as error:
                raise ValueError(f"body must be a JSON object or a function returning one, not {body!r}") from error
            if not isinstance(body, Mapping):
                raise ValueError(f"body must be a JSON object or a function returning one, not {body!r}")
        if on_error is not None and not callable(on_error):
            raise ValueError(f"on_error must be a function (error, request, failure), not {on_error!r}")
        self.app = app
        self.limiter = limiter
        self.limits: LimitsSpec = limits if callable(limits) else check_limits(limits)
        self.ipv6_subnet = check_ipv6_subnet(ipv6_subnet)
        self.key: KeyFunction = key if key is not None else self.peer_identity
        self.prefix = check_prefix(prefix)
        self.fail = fail
        self.standard = standard
        self.timeout = float(timeout)
        self.guard = Guard(fail)
        self.local = LocalBuckets(local_capacity)
        self.shadow = shadow
        self.refusals = Refusals(status_code, body)
        self.on_error = on_error
        self.metrics = metrics_for(metrics)
        self._shadow_logged_at: dict[str, float] = {}
        configure(limiter.redis, self.timeout)
        #: The WSGI middleware's `MAX_IN_FLIGHT` (the ASGI one keeps an asyncio semaphore of its own).
        self.thread_slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        #: When each limiter call out now was written (`time.monotonic`), oldest first.
        self._written: dict[object, float] = {}
        self._written_lock = threading.Lock()
        # A cluster client cannot send one call for buckets in several slots: such plans go in parts.
        self.in_parts = isinstance(limiter.redis, (RedisCluster, AsyncRedisCluster))

    def stalled(self) -> bool:
        """Whether a limiter call out now has waited more than a quarter of the deadline. Then Redis may have
        stalled, and a call written now would be run, and charged, when it resumes: new calls wait unwritten
        (within their own deadline) until it ends (`STALL_FRACTION` of docs/clients.md's Deadlines)."""
        with self._written_lock:
            oldest = next(iter(self._written.values()), None)
        return oldest is not None and time.monotonic() - oldest > self.timeout * STALL_FRACTION

    @contextmanager
    def written(self) -> Iterator[None]:
        """Counts a limiter call as out while the block runs."""
        token = object()
        with self._written_lock:
            self._written[token] = time.monotonic()
        try:
            yield
        finally:
            with self._written_lock:
                self._written.pop(token, None)

    def peer_identity(self, request: Mapping[str, Any]) -> str | None:
        """The default key function: the peer address, IPv6 grouped by the `ipv6_subnet` prefix."""
        return ip_identity(peer_address(request), self.ipv6_subnet)

    def plans(self, request: Mapping[str, Any]) -> tuple[Plan | None, Plan | None] | None:
        """The enforced plan and the shadow plan of `request`; None (counted as skipped) when no limit applies."""
        found = plan(request, self.limits, self.key, self.prefix)
        if found is None:
            if self.metrics is not None:
                self.metrics.request("skipped")
            return None
        return found.split(self.shadow)

    def refused(self, verdict: Verdict) -> None:
        """An enforced plan refused the request."""
        if self.metrics is not None:
            self.metrics.request("refused", verdict.refused)

    def served(self, shadow: Plan | None, verdict: Verdict | None) -> None:
        """The request is served: allowed, or refused by shadow limits only (`verdict`, that of the shadow plan)."""
        if verdict is None or verdict.allowed:
            if self.metrics is not None:
                self.metrics.request("allowed")
            return
        if self.metrics is not None:
            self.metrics.request("shadow_refused", verdict.refused)
        # A fail mode's refusal (closed) names no bucket: every shadow limit of the call would have refused.
        names = verdict.refused
        if not names and shadow is not None:
            names = tuple(limit.name for limit in shadow.limits)
        now = time.monotonic()
        for name in names:
            last = self._shadow_logged_at.get(name)
            if last is None or now - last >= SHADOW_LOG_INTERVAL_S:
                self._shadow_logged_at[name] = now
                logger.warning(
                    "redis-tb: shadow limit %r would have refused a request; it was served (logged at most once a "
                    "second per limit)",
                    name,
                )

    def called(self, started: float, answered: bool) -> None:
        """A limiter call ended, begun at `started` (`time.perf_counter()`): Redis `answered` it (through the backend
        the client uses), or the fail mode did."""
        if self.metrics is not None:
            source = (self.limiter.backend_in_use or protocol.MODULE) if answered else self.fail
            self.metrics.decided(source, time.perf_counter() - started)

    def parts(self, plan: Plan) -> tuple[Plan, ...]:
        return plan.parts() if self.in_parts else (plan,)

    def charge_backs(self, plan: Plan) -> list[ChargeBack]:
        """The charge-backs to send before the plan's call, in order (`charge_back_call`), one per key whose
        in-memory bucket diverged from Redis: each then reported to `charge_accepted` or `charge_refused`, and the
        ones that met a fault or were not sent to `charges_unsent`."""
        return self.local.charge_backs(plan.keys) if self.fail == "local" else []

    def charge_accepted(self, charge: ChargeBack) -> None:
        """Redis took a charge-back: what it covered is in its bucket."""
        self.local.charged(charge)

    def charge_refused(self, charge: ChargeBack, error: BaseException, request: Mapping[str, Any]) -> bool:
        """A charge-back failed with `error`: whether the plan's call goes on to Redis. A configuration error (a
        missing ACL permission, a script error: the failure table's rows logged as errors) drops what it covered,
        logged as an error, counted and given to `on_error`, and the call goes on: a limiter that can never charge
        back must not stay in memory for good; so does a command the server still lacks after the client's own
        retry (a module older than TB.LOWER). A fault (`Failure.fault`) answers False: the caller re-raises it (the
        call is decided in memory) and reports the charge-back unsent."""
        failure = classify(error)
        if failure.fault:
            return False
        self.local.charge_refused(charge)
        self.guard.charge_back_refused(charge.key, failure, error)
        self._report(error, request, failure)
        return True

    def charges_unsent(self, charges: Sequence[ChargeBack]) -> None:
        """Charge-backs that met a fault or were never sent: what they covered is owed again, for the next call
        that reaches Redis."""
        for charge in charges:
            self.local.charge_failed(charge)

    def refund_failed(self, refund: protocol.Call[Any], error: BaseException) -> None:
        """A refund of a request refused in part (`Plan.refunds`) failed. The request stays refused, with the reply
        of the part that refused it: the fail mode never answers it, since Redis did. Logged (`Guard.refund_failed`);
        the caller still sends the refunds after it."""
        self.guard.refund_failed(refund.keys[0], error)

    def answered(self, plan: Plan, reply: Acquired | AcquiredEach, enforced: bool) -> Verdict:
        """Redis answered: the in-memory buckets of the plan's keys continue from its report. `enforced`: the answer
        is the response's (headers, body); else only whether it allows."""
        self.guard.answered()
        if self.fail == "local":
            self.local.observe(plan.limits, plan.keys, reply)
        return verdict(plan, reply, self.standard, self.refusals if enforced else None)

    def failed(self, plan: Plan, error: BaseException, request: Mapping[str, Any], enforced: bool) -> Verdict | None:
        """A limiter call failed: counted, logged, given to `on_error`, and the fail mode answers."""
        self._report(error, request, self.guard.failed(error))
        return self.fallback(plan, enforced)

    def _report(self, error: BaseException, request: Mapping[str, Any], failure: Failure) -> None:
        """A limiter call failed: counted, and given to `on_error`."""
        if self.metrics is not None:
            self.metrics.failed(failure.class_)
        if self.on_error is not None:
            try:
                self.on_error(error, request, failure)
            except Exception:  # the hook's own failure is no 500 either
                logger.exception("redis-tb: on_error raised")

    def fallback(self, plan: Plan, enforced: bool) -> Verdict | None:
        """The fail mode's answer: None lets the request through (open), else a verdict (local or closed)."""
        if self.fail == "open":
            return None
        if self.fail == "closed":
            return unavailable()
        reply = self.local.acquire_each(plan.limits, plan.keys)
        return verdict(plan, reply, self.standard, self.refusals if enforced else None)


def charge_back_call(charge: ChargeBack) -> protocol.Call[Any]:
    """`TB.LOWER`: Redis's bucket brought down to the key's in-memory bucket (module, function or script alike)."""
    return protocol.lower(charge.key, charge.rate, charge.burst, charge.tokens)
