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
import re
from dataclasses import dataclass

from redis import exceptions as redis_errors

from . import errors
from ._protocol import is_unknown_command


@dataclass(frozen=True)
class Failure:
    """One row: its name in `fixtures/failures.json` (`row`: "timeout", "OOM", "other ERR", as the Node and Rust
    packages name it; the logs give it beside the error's own text, which carries the code or the exception's
    message), its `class` there (the label of `redis_tb_redis_failures_total`), and whether it is a configuration
    error (logged at ERROR level)."""

    #: The fixture's row name.
    row: str
    config_error: bool
    #: A timeout or a connection that could not be made or was lost (not an error reply).
    lost_connection: bool = False
    #: The row's class: `timeout`, `connection`, `oom`, `readonly`, ... (`class` is a keyword in Python).
    class_: str = "other"

    @property
    def fault(self) -> bool:
        """A row whose action is the fail mode: the server cannot run the call now, and will again. Not the
        configuration errors, nor the rows the client answers by loading the script or switching to it, which
        reach the middleware only when that retry failed too."""
        return not self.config_error and self.class_ not in RETRIED_CLASSES


#: The rows the client answers itself, by loading the script or library, or by switching to it, and retrying once.
RETRIED_CLASSES = ("noscript", "function_missing", "unknown_command")


def answered_by_server(error: BaseException) -> bool:
    """Whether `error` is the server's own error reply, as redis-py raises it or as the client translated it. An
    exception of the client's (a connection closed under it, a bug) says nothing of what the server did."""
    return isinstance(error, (redis_errors.ResponseError, errors.ServerError, errors.ModuleNotLoaded))


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


#: The class of each error code a server's reply starts with (the fixture's `class` of its row).
_CODE_CLASSES = {
    "CLUSTERDOWN": "clusterdown",
    "MASTERDOWN": "masterdown",
    "LOADING": "loading",
    "BUSY": "busy",
    "READONLY": "readonly",
    "OOM": "oom",
    "NOREPLICAS": "noreplicas",
    "MISCONF": "misconf",
    "MOVED": "moved",
    "ASK": "moved",
    "TRYAGAIN": "tryagain",
    "NOSCRIPT": "noscript",
    "CROSSSLOT": "crossslot",
    "NOAUTH": "noauth",
    "WRONGPASS": "wrongpass",
    "NOPERM": "noperm",
    "WRONGTYPE": "wrongtype",
}
#: The class of the exceptions redis-py raises with the code taken off the text; subclasses first.
_TYPE_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (redis_errors.NoPermissionError, "noperm"),
    (redis_errors.AuthorizationError, "noperm"),
    (redis_errors.BusyLoadingError, "loading"),
    (redis_errors.SlotNotCoveredError, "cluster_unreachable"),
    (redis_errors.MasterDownError, "masterdown"),
    (redis_errors.ClusterDownError, "clusterdown"),
    (redis_errors.ReadOnlyError, "readonly"),
    (redis_errors.OutOfMemoryError, "oom"),
    (redis_errors.TryAgainError, "tryagain"),
    (redis_errors.AskError, "moved"),
    (redis_errors.NoScriptError, "noscript"),
    (redis_errors.TimeoutError, "timeout"),
    (asyncio.TimeoutError, "timeout"),
    (TimeoutError, "timeout"),
    (redis_errors.ConnectionError, "connection"),
    (redis_errors.RedisClusterException, "cluster_unreachable"),
    (OSError, "connection"),
)
#: What Redis puts before an error that a script's `redis.call` met (Redis 7+): the error itself follows. redis-py
#: drops the leading `ERR ` of the reply (`user_script:795: OOM ...`).
_SCRIPT_ERROR = re.compile(r"^(?:ERR )?user_script:\d+: ")


def _type_class(error: BaseException) -> str:
    if isinstance(error, redis_errors.AuthenticationError):
        return "noauth" if str(error).startswith("Authentication required") else "wrongpass"
    if isinstance(error, redis_errors.ConnectionError) and "max number of clients" in str(error):
        return "max_clients"
    for kind, class_ in _TYPE_CLASSES:
        if isinstance(error, kind):
            return class_
    return "other"


#: The fixture's row name of each class that has one row; `connection` and `other` have two (see `_row`).
_CLASS_ROWS = {
    "timeout": "timeout",
    "cluster_unreachable": "cluster unreachable",
    "max_clients": "too many clients",
    "clusterdown": "CLUSTERDOWN",
    "masterdown": "MASTERDOWN",
    "loading": "LOADING",
    "busy": "BUSY",
    "readonly": "READONLY",
    "oom": "OOM",
    "noreplicas": "NOREPLICAS",
    "misconf": "MISCONF",
    "moved": "MOVED/ASK that do not settle",
    "tryagain": "TRYAGAIN",
    "crossslot": "CROSSSLOT",
    "noscript": "NOSCRIPT",
    "function_missing": "function missing",
    "unknown_command": "unknown command",
    "noauth": "NOAUTH",
    "wrongpass": "WRONGPASS",
    "noperm": "NOPERM",
    "wrongtype": "WRONGTYPE",
}


def _row(class_: str, error: BaseException) -> str:
    """The fixture's row name of `error`, whose class is `class_`."""
    if class_ == "connection":
        refused = isinstance(error, ConnectionRefusedError) or "connection refused" in str(error).lower()
        return "connection refused" if refused else "connection reset"
    if class_ == "other":
        # A server's error reply, or something else gone wrong (a bug to see).
        return "other ERR" if isinstance(error, (errors.ServerError, redis_errors.ResponseError)) else "any other error"
    return _CLASS_ROWS.get(class_, "any other error")


def _failure(error: BaseException, config_error: bool, class_: str, lost_connection: bool = False) -> Failure:
    return Failure(_row(class_, error), config_error, lost_connection, class_)


def classify(error: BaseException) -> Failure:
    """The row of the failure table `error` belongs to."""
    if isinstance(error, _CONFIG_TYPES):
        return _failure(error, True, _type_class(error))
    if isinstance(error, redis_errors.ClusterCrossSlotError) or (
        isinstance(error, redis_errors.RedisClusterException) and "same key slot" in str(error)
    ):
        # The key layout keeps a request's buckets in one slot: if this happens anyway, it is a bug to see.
        return _failure(error, True, "crossslot")
    if isinstance(error, _UNAVAILABLE_TYPES):
        return _failure(error, False, _type_class(error), _is_lost_connection(error))
    if isinstance(error, errors.ServerError):
        code = error.server_message.split(" ", 1)[0]
        return _failure(error, True, _CODE_CLASSES.get(code, "other"))
    if isinstance(error, redis_errors.ResponseError):
        text = _SCRIPT_ERROR.sub("", str(error), count=1)
        code = text.split(" ", 1)[0]
        if code in UNAVAILABLE_CODES:
            return _failure(error, False, _CODE_CLASSES[code])
        if code in _CODE_CLASSES:
            return _failure(error, True, _CODE_CLASSES[code])
        if is_unknown_command(error):
            # The client switches to the script and retries once: this is the retry failing too.
            return _failure(error, False, "unknown_command")
        if text.startswith(("Function not found", "ERR Function not found")):
            # The client loads the library and retries once: this is the retry failing too.
            return _failure(error, False, "function_missing")
        return _failure(error, True, "other")
    return _failure(error, True, "other")
