"""WSGI middleware (Flask, Django, any WSGI app): the same behaviour as `redis_tb.asgi`, with the sync client.

app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=TokenBucket(redis.Redis()),
                                   limits=[Limit("per-client", rate=10, burst=20)])
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from http import HTTPStatus
from typing import Any, TypeVar

from . import _decide
from ._decide import Decision, client_address
from ._guard import MAX_IN_FLIGHT, STALL_FRACTION, NotSent
from ._leases import Waiting
from ._plan import by_path
from .client import TokenBucket

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
T = TypeVar("T")

__all__ = ["Decision", "RateLimitMiddleware", "by_path", "client_address"]


class RateLimitMiddleware(_decide.Middleware[WSGIApp, TokenBucket]):
    """Rate limits requests of a WSGI app; the options are those of `redis_tb.asgi.RateLimitMiddleware`."""

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        verdict = self._run(self.decide(environ))
        if verdict is not None and not verdict.allowed:
            return _respond(start_response, verdict)
        if verdict is None or not verdict.headers:
            return self.app(environ, start_response)
        headers = verdict.headers

        def start_with_headers(status: str, own: list[tuple[str, str]], exc_info: Any | None = None) -> Any:
            return start_response(status, [*own, *headers], exc_info)

        return self.app(environ, start_with_headers)

    def _run(self, flow: _decide.Flow[T]) -> T:
        """Runs a decision (`_decide.Flow`): each lane of calls within its deadline, a probe in a thread of its own."""
        try:
            action = next(flow)
            while True:
                if isinstance(action, _decide.Probe):
                    threading.Thread(target=self._probe, name="redis-tb probe", daemon=True).start()
                    action = next(flow)
                    continue
                if isinstance(action, Waiting):
                    action = flow.send(_waited(action))
                    continue
                try:
                    result = self._within_deadline(partial(self._send, action))
                except Exception as error:
                    action = flow.throw(error)
                else:
                    action = flow.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            # Interrupted by anything else than an error (gevent's GreenletExit): the flow ends now, not when it is
            # collected, so that a leased limit's refill it sent is ended for the requests waiting on it.
            flow.close()

    def _within_deadline(self, send: Callable[[], T]) -> T:
        """Runs `send()`, a lane, once one of the `MAX_IN_FLIGHT` slots is free and no call out has waited more than
        `STALL_FRACTION` of the deadline (waiting up to the deadline); the fail mode's if the gate closes meanwhile.
        Each call's own deadline is the socket timeout (`_guard.configure`)."""
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

    def _send(self, calls: _decide.Calls[T]) -> T:
        """Sends a lane's calls one after the other, each reply sent back in, each error thrown in."""
        run = self.limiter._run
        try:
            call = next(calls)
            while True:
                try:
                    reply = run(call)
                except BaseException as error:
                    call = calls.throw(error)
                else:
                    call = calls.send(reply)
        except StopIteration as done:
            value: T = done.value
            return value

    def _probe(self) -> None:
        try:
            self.limiter.redis.ping()
        except Exception as error:
            self.guard.probed(error)
        else:
            self.guard.probed(None)


def _waited(waiting: Waiting) -> bool:
    """Waits for a leased limit's refill in flight to end, until the wait's deadline: whether it ended."""
    ended = threading.Event()
    waiting.register(ended.set)
    return ended.wait(max(waiting.deadline - time.monotonic(), 0.0)) or waiting.ended


def _respond(start_response: StartResponse, verdict: _decide.Verdict) -> Iterable[bytes]:
    headers = [*verdict.headers, ("Content-Length", str(len(verdict.body)))]
    start_response(_status_line(verdict.status), headers)
    return [verdict.body]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:  # a code without a registered phrase
        return f"{status} Error"
