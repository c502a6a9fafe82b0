"""What both middlewares share: their options, and the decision on a request (`Middleware.decide`) as plain code
that sends nothing: it yields the Redis calls it needs, in lanes, and takes their replies or errors (`Flow`); the
ASGI middleware performs them with `await`, the WSGI one in its thread. The response to give from Redis's reply or
from the fail mode, and what is counted, are decided here too. Which limits apply and the calls that decide them
are `_plan`'s."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypedDict, TypeVar

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from . import _protocol as protocol
from ._failures import Failure, answered_by_server, classify
from ._guard import MAX_IN_FLIGHT, STALL_FRACTION, Guard, NotSent, configure
from ._leases import Leases, Own, Refill, Waiting
from ._local import CAPACITY, ChargeBack, LocalBuckets, limiting_index
from ._metrics import DEFAULT_REGISTRY, metrics_for
from ._plan import LimitsSpec, Plan, bucket_result, plan
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
from .replies import Acquired, AcquiredEach, BucketResult, PartialGrant

FailMode = Literal["local", "open", "closed"]
#: The `on_error` option: called with the error, the request (ASGI scope or WSGI environ) and the failure table's
#: row (`Failure`: its `class_` is the row's class) for every limiter call that failed.
ErrorHook = Callable[[BaseException, Mapping[str, Any], Failure], object]
#: A shadow limit's refusals are logged at most once per limit in this many seconds.
SHADOW_LOG_INTERVAL_S = 1.0
logger = logging.getLogger("redis_tb")
T = TypeVar("T")

#: A lane: Redis calls sent one after the other within one deadline (`MAX_IN_FLIGHT`, `STALL_FRACTION`; see each
#: middleware's `_within_deadline`). Each call's reply is sent back in, or its error thrown in; a lane cancelled at
#: its deadline has the cancellation thrown in. It returns what the calls found.
Calls = Generator[protocol.Call[Any], Any, T]


class Probe:
    """Asks the middleware to ping Redis in the background (the closed gate's probe, `Guard.probe_due`); the flow
    goes on at once, and the probe reports to `Guard.probed`."""


PROBE = Probe()
#: A decision as its middleware runs it: it yields `PROBE`, a lane (`Calls`), to which the middleware sends the
#: lane's result, or throws its error (`NotSent` when the gate closed while the lane waited unwritten), or a
#: `Waiting` (a leased limit's refill in flight), to which it sends whether the refill ended before the wait's
#: deadline; it returns the decision.
Flow = Generator["Calls[Any] | Probe | Waiting", Any, T]
#: A refund of a plan refused in part (`Plan.refunds`).
Refund = protocol.Call[Any]


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


class Options(TypedDict, total=False):
    """The middleware's options after `limiter` and `limits`, as `redis_tb.asgi.limited` passes them on: their
    defaults are `Middleware`'s."""

    key: KeyFunction | None
    prefix: str
    fail: FailMode
    standard: Standard
    ipv6_subnet: int
    timeout: float
    local_capacity: int
    shadow: bool
    status_code: int
    body: Body
    on_error: ErrorHook | None
    metrics: Any


class Middleware(Generic[App, Limiter]):
    """The options both middlewares take, with their defaults, checked and kept once, and the decision on a request
    (`decide`) that both run: the wrapped app (ASGI or WSGI), the limiter (async or sync) and the rest, described on
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
            raise ValueError(
                f"timeout must be a positive finite number of seconds, not {timeout!r}: every limiter call has a "
                "deadline (without one, a stalled Redis would stall the requests)"
            )
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
        self.leases = Leases(local_capacity)
        #: Whether a request may have a leased limit: not for a fixed list without one, whose requests then skip the
        #: look for one.
        self.leasing = callable(self.limits) or any(limit.lease for limit in self.limits)
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

    def decide(self, request: Mapping[str, Any]) -> Flow[Verdict | None]:
        """The decision on `request`, as a flow its middleware runs (`Flow`): the refusal to answer, the verdict
        whose headers go on the response, or None (no limit applies, or the fail mode lets it through)."""
        found = plan(request, self.limits, self.key, self.prefix)
        if found is None:
            if self.metrics is not None:
                self.metrics.request("skipped")
            return None
        enforced, shadow = found.split(self.shadow)
        verdict = None if enforced is None else (yield from self._decision(enforced, request, True))
        if verdict is not None and not verdict.allowed:
            if self.metrics is not None:
                self.metrics.request("refused", verdict.refused)
            return verdict
        self._served(shadow, None if shadow is None else (yield from self._decision(shadow, request, False)))
        return verdict

    def _decision(self, plan: Plan, request: Mapping[str, Any], enforced: bool) -> Flow[Verdict | None]:
        """One limiter call for `plan`: Redis's answer, or the fail mode's when Redis fails or the gate is closed.
        `enforced`: the answer is the response's (headers, body); else only whether it allows."""
        if self.leasing and any(limit.lease for limit in plan.limits):
            return (yield from self._leased_decision(plan, request, enforced))
        started = time.perf_counter()
        verdict: Verdict | None
        answered = False
        if not self.guard.admits:
            if self.guard.probe_due():
                yield PROBE
            verdict = self.fallback(plan, enforced)
        else:
            try:
                reply, refunds = yield self._ask(plan, request)
            except NotSent:
                verdict = self.fallback(plan, enforced)
            except Exception as error:  # every failure is a row of the failure table, none a 500
                self._report(error, request, self.guard.failed(error))
                verdict = self.fallback(plan, enforced)
            else:
                verdict = self.answered(plan, reply, enforced)
                answered = True
                # Each refund in a lane of its own, within its own deadline; one that fails leaves the request
                # refused, with the reply of the part that refused it (the fail mode never answers it, since Redis
                # did): logged, and the others are still sent.
                for refund in refunds:
                    yield from self._refund(refund)
        if self.metrics is not None:
            source = (self.limiter.backend_in_use or protocol.MODULE) if answered else self.fail
            self.metrics.decided(source, time.perf_counter() - started)
        return verdict

    def _leased_decision(self, plan: Plan, request: Mapping[str, Any], enforced: bool) -> Flow[Verdict | None]:
        """`_decision` for a plan with a leased limit: from the tokens held when it is the only limit and needs no
        call; else its other limits by one call, then the leased one (`_leased`). A call that fails takes the
        whole plan to the fail mode. Counted as the backend's when a call decided, else as the lease's."""
        started = time.perf_counter()
        source = "lease"
        answer: Verdict | None
        if not self.guard.admits and self.guard.probe_due():
            yield PROBE
        try:
            reply, called = yield from self._ask_leased(plan, request)
        except NotSent:
            answer, source = self.fallback(plan, enforced), self.fail
        except Exception as error:  # every failure is a row of the failure table, none a 500
            self._report(error, request, self.guard.failed(error))
            answer, source = self.fallback(plan, enforced), self.fail
        else:
            if called:
                source = self.limiter.backend_in_use or protocol.MODULE
            answer = verdict(plan, reply, self.standard, self.refusals if enforced else None)
        if self.metrics is not None:
            self.metrics.decided(source, time.perf_counter() - started)
        return answer

    def _ask_leased(self, plan: Plan, request: Mapping[str, Any]) -> Flow[tuple[AcquiredEach, bool]]:
        """The plan's reply, and whether a Redis call made it. The limits without lease are asked first, in one
        call; when they allow, the leased limit takes from its lease, and when it refuses, what the others took goes
        back (`TB.REFUND`), so a refused request takes nothing. Only the first leased limit of a plan is leased
        (the middleware refuses a second in a fixed list; a `limits` function may return one): the others are asked
        as without lease."""
        index = next(index for index, limit in enumerate(plan.limits) if limit.lease)
        limit, key = plan.limits[index], plan.keys[index]
        if len(plan.limits) == 1:
            held = self.leases.held(key, limit)
            if held is not None:
                return AcquiredEach(held.fits, 0, (held,)), False
            result, called = yield from self._leased(plan, request)
            return AcquiredEach(result.fits, 0, (result,)), called
        others = plan.without(index)
        asked, refunds = yield self._ask(others, request)
        self._remember(others, asked)
        for refund in refunds:
            yield from self._refund(refund)
        results = list(asked.buckets if isinstance(asked, AcquiredEach) else (bucket_result(asked),))
        allowed = asked.allowed
        if allowed:
            try:
                result, _ = yield from self._leased(plan.only(index), request)
            except Exception:
                yield from self._give_back(others)
                raise
            if not result.fits:
                yield from self._give_back(others)
                allowed = False
        else:
            result = self.leases.peek(key, limit)
        results.insert(index, result)
        buckets = tuple(results)
        return AcquiredEach(allowed, limiting_index(buckets, allowed), buckets), True

    def _leased(self, plan: Plan, request: Mapping[str, Any]) -> Flow[tuple[BucketResult, bool]]:
        """One request on a leased limit's bucket (`plan` holds that limit alone): from the lease; after waiting for
        the refill in flight, if there is one; or by the refill this request sends. A request whose wait reached the
        deadline, whose refill failed without held tokens to cover it, or whose lease does not pay (the bucket nearly
        full), is decided by a call of its own, as a key without lease. With the result: whether a call made it."""
        limit, key = plan.limits[0], plan.keys[0]
        deadline = time.monotonic() + self.timeout
        waited = False
        while True:
            step = self.leases.admit(key, limit, waited, deadline)
            if isinstance(step, BucketResult):
                return step, False
            if isinstance(step, Own):
                return (yield from self._own_call(plan, request))
            if isinstance(step, Waiting):
                waited = True
                if not (yield step):
                    return (yield from self._own_call(plan, request))
                if step.failed:
                    held = self.leases.spend_held(key, limit)
                    if held is not None:
                        return held, False
                    return (yield from self._own_call(plan, request))
                continue
            return (yield from self._refill(plan, step, request))

    def _refill(self, plan: Plan, refill: Refill, request: Mapping[str, Any]) -> Flow[tuple[BucketResult, bool]]:
        """The lease's refill, whose reply decides the request that sent it. However it ends without a reply (an
        error, the deadline, the gate closed, the request abandoned), the requests waiting on it are told; tokens
        Redis may have granted then are never spent, which can only admit fewer. When it fails, the request takes
        the leased tokens, then the fail mode (the error is reported once, here or by the fail mode)."""
        limit, key = plan.limits[0], plan.keys[0]
        try:
            grant = yield self._refill_lane(plan, refill, request)
        except BaseException as error:
            # Anything else than an error (the request cancelled, the flow closed) only dropped the refill.
            self.leases.ended(key, failed=isinstance(error, Exception))
            if not isinstance(error, Exception):
                raise
            held = self.leases.spend_held(key, limit)
            if held is None:
                raise
            if not isinstance(error, NotSent):  # a call never sent is no failure of its own
                self._report(error, request, self.guard.failed(error))
            return held, False
        # The lease first: whatever follows raises, the refill has ended and the requests waiting on it are told.
        result = self.leases.answered(key, limit, grant)
        # Redis's bucket after the grant, which the fail mode continues from: the tokens the process holds are not
        # in it, and are spent first when Redis fails.
        self._remember(plan, Acquired(True, grant.remaining, grant.retry_after_ms, grant.reset_after_ms))
        return result, True

    def _refill_lane(self, plan: Plan, refill: Refill, request: Mapping[str, Any]) -> Calls[PartialGrant]:
        """The refill's lane: the key's charge-backs (fail mode `local`), then `TB.ACQUIREATMOST`."""
        limit, key = plan.limits[0], plan.keys[0]
        if self.fail == "local":
            charges = self.local.charge_backs(plan.keys)
            if charges:
                yield from self._charge_back(charges, request)
        grant: PartialGrant = yield protocol.acquire_at_most(key, limit.rate, limit.burst, refill.max)
        return grant

    def _own_call(self, plan: Plan, request: Mapping[str, Any]) -> Flow[tuple[BucketResult, bool]]:
        """A leased limit's bucket decided by a call of its own (`TB.ACQUIRE` after its charge-backs), as a key
        without lease: Redis decides, from its bucket, which counts every lease's grants. Its refusal, and how far
        from full the bucket is, go to the lease."""
        sent_us = self.leases.now_us()
        reply, _ = yield self._ask(plan, request)
        self._remember(plan, reply)
        result = reply.buckets[0] if isinstance(reply, AcquiredEach) else bucket_result(reply)
        self.leases.observed(plan.keys[0], sent_us, result)
        return result, True

    def _remember(self, plan: Plan, reply: Acquired | AcquiredEach) -> None:
        """Redis answered for `plan`: the gate hears of it, and the fail mode's buckets continue from it."""
        self.guard.answered()
        if self.fail == "local":
            self.local.observe(plan.limits, plan.keys, reply)

    def _give_back(self, plan: Plan) -> Flow[None]:
        """What `plan`'s limits took goes back (`TB.REFUND`): a leased limit refused the request they allowed."""
        for key, limit in zip(plan.keys, plan.limits, strict=True):
            yield from self._refund(protocol.refund(key, limit.rate, limit.burst, limit.cost))

    def _refund(self, refund: Refund) -> Flow[None]:
        """One refund in a lane of its own, within its own deadline; one that fails is logged, and the request
        keeps its decision."""
        try:
            yield _single(refund)
        except Exception as error:
            self.guard.refund_failed(refund.keys[0], error)

    def _ask(self, plan: Plan, request: Mapping[str, Any]) -> Calls[tuple[Acquired | AcquiredEach, list[Refund]]]:
        """The plan's lane: its charge-backs, then its call (in a cluster, one per slot); returns the reply and the
        refunds to send when a part of it refused."""
        if self.fail == "local":
            charges = self.local.charge_backs(plan.keys)
            if charges:
                yield from self._charge_back(charges, request)
        parts = plan.parts() if self.in_parts else (plan,)
        if len(parts) == 1:
            reply: Acquired | AcquiredEach = yield plan.call()
            return reply, []
        replies = []
        for part in parts:
            replies.append((yield part.call()))
        return plan.combined(parts, replies), plan.refunds(parts, replies)

    def _charge_back(self, charges: list[ChargeBack], request: Mapping[str, Any]) -> Calls[None]:
        """Brings Redis down to the in-memory buckets of the plan's diverged keys (`LocalBuckets.charge_backs`, taken
        when its lane starts), before the plan's call, one `TB.LOWER` each, in order. Accepted: what it covered is in
        Redis's bucket. A fault (`Failure.fault`, an error that is not the server's reply, or the lane cancelled at its
        deadline) fails the call (decided in memory), and what it and the ones after it covered is owed again, for the
        next call that reaches Redis. Refused
        by a configuration error (a missing ACL permission, a script error: the failure table's rows logged as errors),
        or by a server that still lacks the command after the client's own retry (a module older than TB.LOWER): what it
        covered is dropped, logged as an error, counted and given to `on_error`, and the call goes on; a limiter that
        can never charge back must not stay in memory for good."""
        settled = 0
        try:
            for charge in charges:
                try:
                    yield charge_back_call(charge)
                except Exception as error:
                    failure = classify(error)
                    # Only the server's own refusal drops a charge-back; after anything else, Redis may or may not
                    # have taken it, and bringing it down again later is harmless (TB.LOWER is a minimum).
                    if failure.fault or not answered_by_server(error):
                        raise
                    self.local.charge_refused(charge)
                    self.guard.charge_back_refused(charge.key, failure, error)
                    self._report(error, request, failure)
                else:
                    self.local.charged(charge)
                settled += 1
        finally:
            for charge in charges[settled:]:
                self.local.charge_failed(charge)

    def _served(self, shadow: Plan | None, verdict: Verdict | None) -> None:
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

    def answered(self, plan: Plan, reply: Acquired | AcquiredEach, enforced: bool) -> Verdict:
        """Redis answered: the in-memory buckets of the plan's keys continue from its report. `enforced`: the answer
        is the response's (headers, body); else only whether it allows."""
        self._remember(plan, reply)
        return verdict(plan, reply, self.standard, self.refusals if enforced else None)

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


def _single(call: protocol.Call[Any]) -> Calls[Any]:
    """A lane of one call."""
    reply = yield call
    return reply


def charge_back_call(charge: ChargeBack) -> protocol.Call[Any]:
    """`TB.LOWER`: Redis's bucket brought down to the key's in-memory bucket (module, function or script alike)."""
    return protocol.lower(charge.key, charge.rate, charge.burst, charge.tokens)
