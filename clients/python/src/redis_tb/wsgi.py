"""WSGI middleware (Flask, Django, any WSGI app): the same behaviour as `redis_tb.asgi`, with the sync client.

app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=TokenBucket(redis.Redis()),
                                   limits=[Limit("per-client", rate=10, burst=20)])
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from http import HTTPStatus
from typing import Any, TypeVar

from . import _decide, _plan
from ._decide import Decision, client_address
from ._guard import MAX_IN_FLIGHT, STALL_FRACTION, NotSent
from ._plan import by_path
from ._protocol import Call
from .client import TokenBucket
from .replies import Acquired, AcquiredEach

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
T = TypeVar("T")

__all__ = ["Decision", "RateLimitMiddleware", "by_path", "client_address"]


class RateLimitMiddleware(_decide.Middleware[WSGIApp, TokenBucket]):
    """Rate limits requests of a WSGI app; the options are those of `redis_tb.asgi.RateLimitMiddleware`."""

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request: Mapping[str, Any] = environ
        plans = self.plans(request)
        if plans is None:
            return self.app(environ, start_response)
        enforced, shadow = plans
        verdict = None if enforced is None else self._decision(enforced, request, True)
        if verdict is not None and not verdict.allowed:
            self.refused(verdict)
            return _respond(start_response, verdict)
        self.served(shadow, None if shadow is None else self._decision(shadow, request, False))
        if verdict is None or not verdict.headers:
            return self.app(environ, start_response)
        headers = verdict.headers

        def start_with_headers(status: str, own: list[tuple[str, str]], exc_info: Any | None = None) -> Any:
            return start_response(status, [*own, *headers], exc_info)

        return self.app(environ, start_with_headers)

    def _decision(self, plan: _plan.Plan, request: Mapping[str, Any], enforced: bool) -> _decide.Verdict | None:
        """One limiter call for `plan`: Redis's answer, or the fail mode's when Redis fails or the gate is closed."""
        started = time.perf_counter()
        verdict: _decide.Verdict | None
        answered = False
        if not self.guard.admits:
            if self.guard.probe_due():
                threading.Thread(target=self._probe, name="redis-tb probe", daemon=True).start()
            verdict = self.fallback(plan, enforced)
        else:
            try:
                reply, refunds = self._within_deadline(partial(self._ask, plan, request))
            except NotSent:
                verdict = self.fallback(plan, enforced)
            except Exception as error:  # every failure is a row of the failure table, none a 500
                verdict = self.failed(plan, error, request, enforced)
            else:
                verdict = self.answered(plan, reply, enforced)
                answered = True
                self._give_back(refunds)
        self.called(started, answered)
        return verdict

    def _within_deadline(self, send: Callable[[], T]) -> T:
        """Runs `send()`, a limiter call, once one of the `MAX_IN_FLIGHT` slots is free and no call out has waited
        more than `STALL_FRACTION` of the deadline (waiting up to the deadline); the fail mode's if the gate closes
        meanwhile."""
        deadline = time.monotonic() + self.timeout
        if not self.thread_slots.acquire(timeout=self.timeout):
            raise TimeoutError(f"{MAX_IN_FLIGHT} limiter calls are out: none ended within the deadline")
        try:
            while self.stalled() and self.guard.admits:
                if time.monotonic() >= deadline:
                    raise TimeoutError("a limiter call has waited a quarter of the deadline: none ended within it")
                time.sleep(self.timeout * STALL_FRACTION / 4)
            if not self.guard.admits:  # a call it waited behind missed its deadline
                raise NotSent
            with self.written():
                return send()
        finally:
            self.thread_slots.release()

    def _ask(self, plan: _plan.Plan, request: Mapping[str, Any]) -> tuple[Acquired | AcquiredEach, list[Call[Any]]]:
        """The plan's reply, and the refunds to send when a part of it (one call per cluster slot) refused."""
        self._charge_back(plan, request)
        parts = self.parts(plan)
        if len(parts) == 1:
            return self.limiter._run(plan.call()), []
        replies = [self.limiter._run(part.call()) for part in parts]
        return plan.combined(parts, replies), plan.refunds(parts, replies)

    def _give_back(self, refunds: list[Call[Any]]) -> None:
        """Each refund in a call of its own, within its own deadline; one that fails leaves the request refused
        (`refund_failed`), and the others are still sent."""
        for refund in refunds:
            try:
                self._within_deadline(partial(self.limiter._run, refund))
            except Exception as error:
                self.refund_failed(refund, error)

    def _charge_back(self, plan: _plan.Plan, request: Mapping[str, Any]) -> None:
        """Brings Redis down to the in-memory buckets of the plan's diverged keys, before the plan's call. A
        charge-back that meets a fault fails the call, and what it and the ones after it covered stays owed; one
        refused for good is dropped, and the call goes on."""
        charges = self.charge_backs(plan)
        settled = 0
        try:
            for charge in charges:
                try:
                    self.limiter._run(_decide.charge_back_call(charge))
                except Exception as error:
                    if not self.charge_refused(charge, error, request):
                        raise
                else:
                    self.charge_accepted(charge)
                settled += 1
        finally:
            self.charges_unsent(charges[settled:])

    def _probe(self) -> None:
        try:
            self.limiter.redis.ping()
        except Exception as error:
            self.guard.probed(error)
        else:
            self.guard.probed(None)


def _respond(start_response: StartResponse, verdict: _decide.Verdict) -> Iterable[bytes]:
    headers = [*verdict.headers, ("Content-Length", str(len(verdict.body)))]
    start_response(_status_line(verdict.status), headers)
    return [verdict.body]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:  # a code without a registered phrase
        return f"{status} Error"
