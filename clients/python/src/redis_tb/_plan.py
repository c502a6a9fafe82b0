"""Which limits apply to a request, without I/O: each limit's bucket key and cost, the split into the enforced limits
and the shadow ones (each decided in a call of its own), and the calls that decide them (one per identity on a
cluster slot, with the refunds that keep a refused request from taking anything). The middleware (`_decide`) does the
rest: the calls, the fail mode, the response and the metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from . import _protocol as protocol
from ._local import limiting_index
from .identity import SKIP, tag_of, tagged_key
from .limit import KeyFunction, Limit, check_limits
from .replies import Acquired, AcquiredEach, BucketResult

logger = logging.getLogger("redis_tb")
#: The limits of a request: the same for every request, or chosen from the request (by path, say).
LimitsSpec = Limit | Sequence[Limit] | Callable[[Mapping[str, Any]], Sequence[Limit]]


def by_path(routes: Mapping[str, Sequence[Limit]]) -> Callable[[Mapping[str, Any]], Sequence[Limit]]:
    """Limits by path prefix, longest prefix first: `by_path({"/search": [...], "/": [...]})`. A path no prefix
    matches is not limited, nor one whose limits are empty. Works on an ASGI scope (`path`) and a WSGI environ
    (`PATH_INFO`). Each route's limits are checked here, as the middleware checks a fixed list."""
    checked = {prefix: check_limits(limits, allow_empty=True) for prefix, limits in routes.items()}
    ordered = sorted(checked.items(), key=lambda item: len(item[0]), reverse=True)

    def limits_for(request: Mapping[str, Any]) -> Sequence[Limit]:
        path = str(request.get("path", request.get("PATH_INFO", "")))
        for prefix, limits in ordered:
            if path.startswith(prefix):
                return limits
        return ()

    return limits_for


@dataclass(frozen=True)
class Plan:
    """The limits that apply to one request, each with its bucket key and the identity's tag in that key."""

    limits: tuple[Limit, ...]
    keys: tuple[str, ...]
    tags: tuple[str, ...]

    def call(self) -> protocol.Call[Acquired | AcquiredEach]:
        """`TB.ACQUIRE` for one limit; `TB.ACQUIREEACH` for several (one result per limit, for the headers)."""
        if len(self.limits) == 1:
            limit = self.limits[0]
            return protocol.acquire(self.keys[0], limit.rate, limit.burst, limit.cost)
        return protocol.acquire_each(
            [(key, limit.rate, limit.burst, limit.cost) for key, limit in zip(self.keys, self.limits, strict=True)]
        )

    def split(self, shadow_all: bool) -> tuple[Plan | None, Plan | None]:
        """The enforced limits and the shadow ones (every limit with `shadow_all`), each a plan of its own, decided in
        a call of its own: None where there are none."""
        if shadow_all:
            return None, self
        shadows = [limit.shadow for limit in self.limits]
        if not any(shadows):
            return self, None
        if all(shadows):
            return None, self
        return self._chosen(not shadow for shadow in shadows), self._chosen(shadows)

    def only(self, index: int) -> Plan:
        """The plan of the limit at `index` alone."""
        return self._chosen(position == index for position in range(len(self.limits)))

    def without(self, index: int) -> Plan:
        """The plan without the limit at `index`."""
        return self._chosen(position != index for position in range(len(self.limits)))

    def _chosen(self, flags: Iterable[bool]) -> Plan:
        chosen = [index for index, flag in enumerate(flags) if flag]
        return Plan(
            tuple(self.limits[i] for i in chosen),
            tuple(self.keys[i] for i in chosen),
            tuple(self.tags[i] for i in chosen),
        )

    def parts(self) -> tuple[Plan, ...]:
        """The plan split by cluster slot, as Node's middleware splits it (its slots.cjs): limits with their own key
        function (per tenant next to per user) may have buckets in other slots, which no single call can reach.
        Each part is one atomic call, in the order of its first limit."""
        indexes: dict[int, list[int]] = {}
        for index, key in enumerate(self.keys):
            indexes.setdefault(key_slot(key.encode()), []).append(index)
        if len(indexes) == 1:
            return (self,)
        return tuple(self._chosen(index in chosen for index in range(len(self.limits))) for chosen in indexes.values())

    def combined(self, parts: Sequence[Plan], replies: Sequence[Acquired | AcquiredEach]) -> AcquiredEach:
        """The replies of `parts` as the one `TB.ACQUIREEACH` reply of the whole plan, buckets in plan order."""
        found: dict[str, BucketResult] = {}
        for part, reply in zip(parts, replies, strict=True):
            results = reply.buckets if isinstance(reply, AcquiredEach) else (bucket_result(reply),)
            found.update(zip(part.keys, results, strict=True))
        buckets = tuple(found[key] for key in self.keys)
        allowed = all(reply.allowed for reply in replies)
        return AcquiredEach(allowed, limiting_index(buckets, allowed), buckets)

    def refunds(self, parts: Sequence[Plan], replies: Sequence[Acquired | AcquiredEach]) -> list[protocol.Call[Any]]:
        """When some part was refused: `TB.REFUND` of what the allowed parts took, so the request takes nothing."""
        if all(reply.allowed for reply in replies):
            return []
        return [
            protocol.refund(key, limit.rate, limit.burst, limit.cost)
            for part, reply in zip(parts, replies, strict=True)
            if reply.allowed
            for key, limit in zip(part.keys, part.limits, strict=True)
        ]


def bucket_result(reply: Acquired) -> BucketResult:
    """A `TB.ACQUIRE` reply as the result of its one bucket."""
    return BucketResult(reply.allowed, reply.remaining, reply.retry_after_ms, reply.reset_after_ms)


def plan(request: Mapping[str, Any], limits: LimitsSpec, key: KeyFunction, prefix: str) -> Plan | None:
    """The limits for `request` and their keys; None when nothing applies. Keys are
    `<prefix>{<tag>}:<limit name>` (docs/clients.md, "Identity and keys"): the tag is the escaped identity,
    never empty and never a brace, so one identity's buckets share one cluster slot and go in one atomic call.
    A key function's SKIP skips its limit; no identity is limited under the anonymous one (warned once)."""
    chosen = limits(request) if callable(limits) else (limits,) if isinstance(limits, Limit) else limits
    applied: list[Limit] = []
    keys: list[str] = []
    tags: list[str] = []
    for limit in chosen:
        identity = (limit.key or key)(request)
        if identity is SKIP:
            continue
        if identity is None or identity == "":
            _warn_anonymous(limit)
            identity = None
        applied.append(limit)
        tag = tag_of(None if identity is None else str(identity))
        tags.append(tag)
        keys.append(tagged_key(prefix, tag, limit.name))
    if not applied:
        return None
    return Plan(tuple(applied), tuple(keys), tuple(tags))


_anonymous_warned = False


def _warn_anonymous(limit: Limit) -> None:
    global _anonymous_warned
    if not _anonymous_warned:
        _anonymous_warned = True
        logger.warning(
            "redis-tb: the key function found no identity for a request (limit %r): such requests share the "
            "anonymous bucket. A Unix socket or a proxy that drops the peer address does this: give the "
            "middleware a key function that finds the client (logged once per process)",
            limit.name,
        )
