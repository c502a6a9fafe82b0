"""The failure table of docs/clients.md, without I/O: which row an exception from a limiter call belongs to.
`fixtures/failures.json` holds example errors for each row; the Node package classifies the same texts alike.

Every row ends in the middleware's fail mode. What differs is how loudly: a fault of the server or the network
(refused, timeout, OOM, READONLY, ...) passes by itself and is logged as a warning; a configuration error (a
password, an ACL, a key of another type, an error this package does not know) does not pass by itself, so it is
logged at ERROR level whatever the fail mode. And what follows: only a timeout or a lost connection
(`lost_connection`) stops the calls after it; an error reply fails its own call only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from redis import exceptions as redis_errors

from . import errors


@dataclass(frozen=True)
class Failure:
    """One row: its name in the table, and whether it is a configuration error (logged at ERROR level)."""

    row: str
    config_error: bool
    #: A timeout or a connection that could not be made or was lost (not an error reply).
    lost_connection: bool = False


#: Error codes a server puts first in its reply, for the rows where the server cannot run the call now. Older
#: redis-py versions raise a plain ResponseError with the code in the text, so the text is checked too.
UNAVAILABLE_CODES = (
    "CLUSTERDOWN",
    "MASTERDOWN",
    "LOADING",
    "BUSY",
    "READONLY",
    "OOM",
    "NOREPLICAS",
    "MISCONF",
    "MOVED",
    "ASK",
    "TRYAGAIN",
    "NOSCRIPT",
)
CONFIG_CODES = ("NOAUTH", "WRONGPASS", "NOPERM", "WRONGTYPE")

# redis-py raises these for a server's reply (codes stripped from the text) or for the client's own conditions.
_CONFIG_TYPES: tuple[type[BaseException], ...] = (
    redis_errors.AuthenticationError,
    redis_errors.AuthorizationError,
    redis_errors.NoPermissionError,
    redis_errors.AuthenticationWrongNumberOfArgsError,
)
_UNAVAILABLE_TYPES: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,  # refused, reset, LOADING, too many clients
    redis_errors.TimeoutError,
    redis_errors.ClusterError,  # CLUSTERDOWN, MASTERDOWN
    redis_errors.RedisClusterException,  # cannot be connected, slot not covered
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.TryAgainError,
    redis_errors.AskError,  # MOVED too
    redis_errors.NoScriptError,
    asyncio.TimeoutError,
    TimeoutError,
    OSError,
)


# An error reply redis-py raises as a ConnectionError or a cluster exception: the server answered.
_ANSWERED_TYPES: tuple[type[BaseException], ...] = (redis_errors.BusyLoadingError, redis_errors.SlotNotCoveredError)
_LOST_TYPES: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.RedisClusterException,  # no node of the cluster could be reached
    asyncio.TimeoutError,
    TimeoutError,
    OSError,
)


def _is_lost_connection(error: BaseException) -> bool:
    return isinstance(error, _LOST_TYPES) and not isinstance(error, _ANSWERED_TYPES)


def classify(error: BaseException) -> Failure:
    """The row of the failure table `error` belongs to."""
    if isinstance(error, _CONFIG_TYPES):
        return Failure(type(error).__name__, True)
    if isinstance(error, redis_errors.ClusterCrossSlotError) or (
        isinstance(error, redis_errors.RedisClusterException) and "same key slot" in str(error)
    ):
        # The key layout keeps a request's buckets in one slot: if this happens anyway, it is a bug to see.
        return Failure("CROSSSLOT", True)
    if isinstance(error, _UNAVAILABLE_TYPES):
        return Failure(type(error).__name__, False, _is_lost_connection(error))
    if isinstance(error, errors.ServerError):
        return Failure(error.server_message.split(" ", 1)[0], True)
    if isinstance(error, redis_errors.ResponseError):
        text = str(error)
        code = text.split(" ", 1)[0]
        if code in UNAVAILABLE_CODES:
            return Failure(code, False)
        if code == "CROSSSLOT" or code in CONFIG_CODES:
            return Failure(code, True)
        if "unknown command" in text or text.startswith(("Function not found", "ERR Function not found")):
            # The client reloads or switches to the script and retries once: this is the retry failing too.
            return Failure("script or module missing", False)
        return Failure("ERR", True)
    return Failure(type(error).__name__, True)
