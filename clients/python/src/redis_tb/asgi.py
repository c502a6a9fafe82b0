"""ASGI middleware (Starlette, FastAPI): every request that a limit applies to takes its cost from Redis
first; a refusal answers `429` with `Retry-After` and a small JSON body; every response carries the RateLimit
header fields (docs/headers.md).

    app.add_middleware(RateLimitMiddleware, limiter=AsyncTokenBucket(redis.asyncio.Redis()),
                       limits=[Limit("per-client", rate=10, burst=20)])
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any, TypeVar

from . import _decide, _plan
from ._decide import Body, Decision, ErrorHook, FailMode, client_address, default_body
from ._guard import MAX_IN_FLIGHT, STALL_FRACTION, NotSent
from ._local import CAPACITY
from ._metrics import DEFAULT_REGISTRY
from ._plan import LimitsSpec, by_path
from ._protocol import Call
from .aio import AsyncTokenBucket
from .headers import Standard
from .identity import DEFAULT_IPV6_SUBNET
from .limit import KeyFunction
from .replies import Acquired, AcquiredEach

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
T = TypeVar("T")

__all__ = ["Decision", "RateLimitMiddleware", "by_path", "client_address"]


class RateLimitMiddleware(_decide.Middleware[ASGIApp, AsyncTokenBucket]):
    """Rate limits HTTP requests of an ASGI app.

    - `limits`: the limits of every request, or a function of the scope choosing them (`by_path`); several
      limits go in one atomic `TB.ACQUIREEACH` call, with one header item each.
    - `key`: who a request counts against (default: the peer address, `redis_tb.ip_identity`). None or ""
      (no identity) limits the request under the shared anonymous identity, with a warning once;
      `redis_tb.SKIP` lets it through unlimited.
    - `ipv6_subnet`: the prefix length IPv6 peers are grouped by (1 to 64, default 56).
    - `prefix`: the start of every bucket key.
    - `fail`: what answers while Redis fails (docs/clients.md, "When Redis fails"): `"local"` (default)
      limits with in-memory buckets per process, `"open"` lets requests through, `"closed"` answers 503.
    - `timeout`: the deadline of a limiter call in seconds (default 1). The middleware caps its Redis client's
      socket timeouts at it and turns the client's retries off: give it a client of its own.
    - `standard`: which header fields to send: `"draft"`, `"legacy"` or `"both"` (docs/headers.md).
    - `local_capacity`: the keys `fail="local"` keeps in memory per process (default 10,000); beyond them, keys
      share one overflow bucket per limit.
    - `shadow`: try every limit without enforcing it (`Limit(shadow=True)` for one): buckets are charged, refusals
      are counted and logged, requests are served. Enforced limits are decided first; when they allow, the shadow
      limits in a second call. Headers describe the enforced limits only.
    - `status_code` (default 429) and `body` (a JSON object, or a function of the `Decision` returning one) of a
      refusal.
    - `on_error(error, request, failure)`: called for every limiter call that failed, with the failure table's
      row (`failure.class_`), before the fail mode answers.
    - `metrics`: the `prometheus_client` registry to count into (default: its default registry when installed);
      None for no metrics. docs/operating.md lists the metrics.
    """

    _probe_task: asyncio.Task[None] | None = None
    _slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        plans = self.plans(scope)
        if plans is None:
            await self.app(scope, receive, send)
            return
        enforced, shadow = plans
        verdict = None if enforced is None else await self._decision(enforced, scope, True)
        if verdict is not None and not verdict.allowed:
            self.refused(verdict)
            await _respond(send, verdict)
            return
        self.served(shadow, None if shadow is None else await self._decision(shadow, scope, False))
        if verdict is None or not verdict.headers:
            await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, _with_headers(send, verdict.headers))

    async def _decision(self, plan: _plan.Plan, scope: Scope, enforced: bool) -> _decide.Verdict | None:
        """One limiter call for `plan`: Redis's answer, or the fail mode's when Redis fails or the gate is closed."""
        started = time.perf_counter()
        verdict: _decide.Verdict | None
        answered = False
        if not self.guard.admits:
            if self.guard.probe_due():
                self._probe_task = asyncio.ensure_future(self._probe())
            verdict = self.fallback(plan, enforced)
        else:
            try:
                reply, refunds = await self._within_deadline(partial(self._ask, plan, scope))
            except NotSent:
                verdict = self.fallback(plan, enforced)
            except Exception as error:  # every failure is a row of the failure table, none a 500
                verdict = self.failed(plan, error, scope, enforced)
            else:
                verdict = self.answered(plan, reply, enforced)
                answered = True
                await self._give_back(refunds)
        self.called(started, answered)
        return verdict

    async def _within_deadline(self, send: Callable[[], Awaitable[T]]) -> T:
        """Runs `send()`, a limiter call, once one of the `MAX_IN_FLIGHT` slots is free and no call out has waited
        more than `STALL_FRACTION` of the deadline, cancelled at the deadline (redis-py then closes the connection:
        nothing more is written to it; a call still waiting for a slot was never written)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        if sys.version_info >= (3, 11):  # no task per call, unlike wait_for before 3.12
            async with asyncio.timeout(self.timeout):
                return await self._in_slot(send, self._slots)
        return await asyncio.wait_for(self._in_slot(send, self._slots), self.timeout)

    async def _in_slot(self, send: Callable[[], Awaitable[T]], slots: asyncio.Semaphore) -> T:
        async with slots:
            while self.stalled() and self.guard.admits:  # the deadline cancels the wait
                await asyncio.sleep(self.timeout * STALL_FRACTION / 4)
            if not self.guard.admits:  # a call it waited behind missed its deadline
                raise NotSent
            with self.written():
                return await send()

    async def _ask(self, plan: _plan.Plan, scope: Scope) -> tuple[Acquired | AcquiredEach, list[Call[Any]]]:
        """The plan's reply, and the refunds to send when a part of it (one call per cluster slot) refused."""
        await self._charge_back(plan, scope)
        parts = self.parts(plan)
        if len(parts) == 1:
            return await self.limiter._run(plan.call()), []
        replies = [await self.limiter._run(part.call()) for part in parts]
        return plan.combined(parts, replies), plan.refunds(parts, replies)

    async def _give_back(self, refunds: list[Call[Any]]) -> None:
        """Each refund in a call of its own, within its own deadline; one that fails leaves the request refused
        (`refund_failed`), and the others are still sent."""
        for refund in refunds:
            try:
                await self._within_deadline(partial(self.limiter._run, refund))
            except Exception as error:
                self.refund_failed(refund, error)

    async def _charge_back(self, plan: _plan.Plan, scope: Scope) -> None:
        """Brings Redis down to the in-memory buckets of the plan's diverged keys, before the plan's call. A
        charge-back that meets a fault (or is cancelled at the deadline) fails the call, and what it and the ones
        after it covered stays owed; one refused for good is dropped, and the call goes on."""
        charges = self.charge_backs(plan)
        settled = 0
        try:
            for charge in charges:
                try:
                    await self.limiter._run(_decide.charge_back_call(charge))
                except Exception as error:
                    if not self.charge_refused(charge, error, scope):
                        raise
                else:
                    self.charge_accepted(charge)
                settled += 1
        finally:
            self.charges_unsent(charges[settled:])

    async def _probe(self) -> None:
        try:
            await asyncio.wait_for(self.limiter.redis.ping(), self.timeout)
        except Exception as error:
            self.guard.probed(error)
        else:
            self.guard.probed(None)


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def _with_headers(send: Send, headers: list[tuple[str, str]]) -> Send:
    extra = _encoded(headers)

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return send_with_headers


async def _respond(send: Send, verdict: _decide.Verdict) -> None:
    headers = [*_encoded(verdict.headers), (b"content-length", str(len(verdict.body)).encode())]
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": verdict.body})


def limited(
    limiter: AsyncTokenBucket,
    limits: LimitsSpec,
    *,
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
) -> Callable[[ASGIApp], RateLimitMiddleware]:
    """The middleware as a wrapper: `app = limited(limiter, limits)(app)`."""

    def wrap(app: ASGIApp) -> RateLimitMiddleware:
        return RateLimitMiddleware(
            app,
            limiter=limiter,
            limits=limits,
            key=key,
            prefix=prefix,
            fail=fail,
            standard=standard,
            ipv6_subnet=ipv6_subnet,
            timeout=timeout,
            local_capacity=local_capacity,
            shadow=shadow,
            status_code=status_code,
            body=body,
            on_error=on_error,
            metrics=metrics,
        )

    return wrap
