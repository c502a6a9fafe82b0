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
from typing import TYPE_CHECKING, Any, TypeVar

from . import _decide
from ._decide import Decision, Options, client_address
from ._guard import MAX_IN_FLIGHT, STALL_FRACTION, NotSent
from ._leases import Waiting
from ._plan import LimitsSpec, by_path
from .aio import AsyncTokenBucket

if TYPE_CHECKING:
    from typing import Unpack

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
    - `prefix`: the start of every bucket key, without `{` or `}` (the hash tag of every key is its identity's).
    - `fail`: what answers while Redis fails (docs/clients.md, "When Redis fails"): `"local"` (default)
      limits with in-memory buckets per process, `"open"` lets requests through, `"closed"` answers 503.
    - `timeout`: the deadline of a limiter call in seconds (default 1), a positive finite number. The middleware
      cancels each call at it, caps its Redis client's connect timeout at it and turns the client's retries off:
      give it a client of its own.
    - `standard`: which header fields to send: `"draft"`, `"legacy"` or `"both"` (docs/headers.md).
    - `local_capacity`: the keys `fail="local"` keeps in memory per process (a positive integer, default 10,000);
      beyond them, keys share one overflow bucket per limit.
    - `shadow`: try every limit without enforcing it (`Limit(shadow=True)` for one): buckets are charged, refusals
      are counted and logged, requests are served. Enforced limits are decided first; when they allow, the shadow
      limits in a second call. Headers describe the enforced limits only.
    - `status_code` (default 429, 400 to 599) and `body` (a JSON object, or a function of the `Decision` returning
      one) of a refusal. docs/clients.md ("Options") says what each option accepts.
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
        verdict = await self._run(self.decide(scope))
        if verdict is not None and not verdict.allowed:
            await _respond(send, verdict)
            return
        if verdict is None or not verdict.headers:
            await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, _with_headers(send, verdict.headers))

    async def _run(self, flow: _decide.Flow[T]) -> T:
        """Runs a decision (`_decide.Flow`): each lane of calls within its deadline, a probe as a task of its own."""
        try:
            action = next(flow)
            while True:
                if isinstance(action, _decide.Probe):
                    self._probe_task = asyncio.ensure_future(self._probe())
                    action = next(flow)
                    continue
                if isinstance(action, Waiting):
                    action = flow.send(await _waited(action))
                    continue
                try:
                    result = await self._within_deadline(partial(self._send, action))
                except Exception as error:
                    action = flow.throw(error)
                else:
                    action = flow.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            # Cancelled (the client went away, the server stops): the flow ends now, not when it is collected, so
            # that a leased limit's refill it sent is ended for the requests waiting on it.
            flow.close()

    async def _within_deadline(self, send: Callable[[], Awaitable[T]]) -> T:
        """Runs `send()`, a lane, once one of the `MAX_IN_FLIGHT` slots is free and no call out has waited more than
        `STALL_FRACTION` of the deadline, cancelled at the deadline (redis-py then closes the connection: nothing
        more is written to it; a lane still waiting for a slot was never written)."""
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

    async def _send(self, calls: _decide.Calls[T]) -> T:
        """Sends a lane's calls one after the other, each reply sent back in, each error (the cancellation at the
        deadline too) thrown in."""
        run = self.limiter._run
        try:
            call = next(calls)
            while True:
                try:
                    reply = await run(call)
                except BaseException as error:
                    call = calls.throw(error)
                else:
                    call = calls.send(reply)
        except StopIteration as done:
            value: T = done.value
            return value

    async def _probe(self) -> None:
        try:
            await asyncio.wait_for(self.limiter.redis.ping(), self.timeout)
        except Exception as error:
            self.guard.probed(error)
        else:
            self.guard.probed(None)


async def _waited(waiting: Waiting) -> bool:
    """Waits for a leased limit's refill in flight to end, until the wait's deadline: whether it ended."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def end() -> None:
        if not ended.done():
            ended.set_result(None)

    waiting.register(lambda: loop.call_soon_threadsafe(end))
    try:
        await asyncio.wait_for(ended, max(waiting.deadline - time.monotonic(), 0.0))
    except asyncio.TimeoutError:
        return waiting.ended  # at the deadline, its wake-up may still be on its way
    return True


# The names the middleware sends, lower-cased and encoded once.
_NAMES = {
    name: name.lower().encode("latin-1")
    for name in (
        "RateLimit-Policy",
        "RateLimit",
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "Retry-After",
        "Content-Type",
    )
}


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    names = _NAMES
    return [(names.get(name) or name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]


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
    limiter: AsyncTokenBucket, limits: LimitsSpec, **options: Unpack[Options]
) -> Callable[[ASGIApp], RateLimitMiddleware]:
    """The middleware as a wrapper: `app = limited(limiter, limits)(app)`; the options and their defaults are
    `RateLimitMiddleware`'s."""

    def wrap(app: ASGIApp) -> RateLimitMiddleware:
        return RateLimitMiddleware(app, limiter=limiter, limits=limits, **options)

    return wrap
