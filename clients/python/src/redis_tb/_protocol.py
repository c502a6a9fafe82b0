"""What every client shares, without I/O: each command's arguments for the module and for the script, reply
parsing, and error translation. The sync and asyncio clients only send what this builds."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Generic, TypeVar

from redis.exceptions import ResponseError

from . import errors
from .replies import (
    Acquired,
    AcquiredAll,
    AcquiredEach,
    BucketResult,
    Charged,
    PartialGrant,
    Refunded,
    Reservation,
    ThrottleReply,
)

Number = int | float
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


def _load_script() -> str:
    """`lua/tb.lua`: packaged as `redis_tb/tb.lua` by the build, or read from the repository in a checkout."""
    packaged = resources.files("redis_tb").joinpath("tb.lua")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[4] / "lua" / "tb.lua"
    return checkout.read_text(encoding="utf-8")


def _package_version() -> str:
    try:
        return metadata.version("redis-tb")
    except metadata.PackageNotFoundError:  # imported from a checkout's src/ without an install
        return "0.0.0"


SCRIPT: str = _load_script()
SCRIPT_SHA: str = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()

#: The Redis Functions library built from the same script: versioned (`tb_0_5_0`), so that two versions of the
#: package can share a server, each calling its own functions.
LIBRARY_NAME: str = "tb_" + re.sub(r"[^0-9A-Za-z]", "_", _package_version())
LIBRARY: str = f"#!lua name={LIBRARY_NAME}\nlocal TB_LIBRARY = '{LIBRARY_NAME}'\n{SCRIPT}"

#: The three ways a command can run, in the order the client tries them.
MODULE = "module"
FUNCTION = "function"
SCRIPT_BACKEND = "script"


def number_text(value: Number) -> str:
    """A number as the server parses it: `10`, `0.5`, `1e-05`. Refuses bools and non-finite values early, with
    the same error the server would send."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected an int or float, got {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    return repr(value) if math.isfinite(value) else str(value)


@dataclass(frozen=True)
class Call(Generic[T_co]):
    """One command: its name, its arguments for the module, its keys and other arguments for the script, and how
    its reply is parsed."""

    name: str
    module_args: tuple[str, ...]
    keys: tuple[str, ...]
    script_args: tuple[str, ...]
    parse: Callable[[Any], T_co]

    def eval_args(self, caller_us: int | None = None) -> tuple[str, ...]:
        """`key... [@caller_us] command arg...` for EVAL/EVALSHA, after `numkeys` (`len(keys)`)."""
        return (*self.keys, *_caller_time(caller_us), self.name, *self.script_args)

    def fcall_args(self, caller_us: int | None = None) -> tuple[str | int, ...]:
        """`FCALL <function> numkeys key... [@caller_us] arg...`: the library's function for this command."""
        function = f"{LIBRARY_NAME}_{function_suffix(self.name)}"
        return ("FCALL", function, len(self.keys), *self.keys, *_caller_time(caller_us), *self.script_args)


def function_suffix(command: str) -> str:
    """The library's function for a command, after the library name: `TB.ACQUIRE` -> `acquire`, and for the one
    command that is not the module's own, `CL.THROTTLE` -> `cl_throttle`."""
    if command.startswith("TB."):
        return command[len("TB.") :].lower()
    return command.lower().replace(".", "_")


def _caller_time(caller_us: int | None) -> tuple[str, ...]:
    """The first script argument that replaces the server's TIME with the caller's clock, where TIME is refused."""
    return () if caller_us is None else (f"@{caller_us}",)


def _flag(value: Any) -> bool:
    return int(value) == 1


def _acquired(reply: Any) -> Acquired:
    allowed, remaining, retry, reset = reply
    return Acquired(_flag(allowed), int(remaining), int(retry), int(reset))


def _acquired_all(reply: Any) -> AcquiredAll:
    allowed, remaining, retry, reset, index = reply
    return AcquiredAll(_flag(allowed), int(remaining), int(retry), int(reset), int(index))


def _acquired_each(reply: Any) -> AcquiredEach:
    buckets = tuple(
        BucketResult(_flag(fits), int(remaining), int(retry), int(reset)) for fits, remaining, retry, reset in reply[2:]
    )
    return AcquiredEach(_flag(reply[0]), int(reply[1]), buckets)


def _partial(reply: Any) -> PartialGrant:
    granted, remaining, retry, reset = reply
    return PartialGrant(int(granted), int(remaining), int(retry), int(reset))


def _reservation(reply: Any) -> Reservation:
    granted, wait, remaining, reset = reply
    return Reservation(_flag(granted), int(wait), int(remaining), int(reset))


def _refunded(reply: Any) -> Refunded:
    refunded, remaining, reset = reply
    return Refunded(_flag(refunded), int(remaining), int(reset))


def _charged(reply: Any) -> Charged:
    remaining, retry, reset = reply
    return Charged(int(remaining), int(retry), int(reset))


def _throttled(reply: Any) -> ThrottleReply:
    limited, limit, remaining, retry, reset = reply
    return ThrottleReply(_flag(limited), int(limit), int(remaining), int(retry), int(reset))


def _one_key(name: str, key: str, args: Sequence[str], parse: Callable[[Any], T]) -> Call[T]:
    return Call(name, (key, *args), (key,), tuple(args), parse)


def acquire(key: str, rate: Number, burst: Number, cost: Number = 1) -> Call[Acquired]:
    args = (number_text(rate), number_text(burst), number_text(cost))
    return _one_key("TB.ACQUIRE", key, args, _acquired)


#: One bucket of a multi-bucket call: (key, rate, burst).
Bucket = tuple[str, Number, Number]
#: One bucket of `acquire_each`: (key, rate, burst, cost).
BucketWithCost = tuple[str, Number, Number, Number]


def acquire_all(buckets: Sequence[Bucket], cost: Number = 1) -> Call[AcquiredAll]:
    module_args: list[str] = [number_text(cost)]
    script_args: list[str] = [number_text(cost)]
    for key, rate, burst in buckets:
        module_args += [key, number_text(rate), number_text(burst)]
        script_args += [number_text(rate), number_text(burst)]
    keys = tuple(key for key, _, _ in buckets)
    return Call("TB.ACQUIREALL", tuple(module_args), keys, tuple(script_args), _acquired_all)


def acquire_each(buckets: Sequence[BucketWithCost]) -> Call[AcquiredEach]:
    module_args: list[str] = []
    script_args: list[str] = []
    for key, rate, burst, cost in buckets:
        numbers = [number_text(rate), number_text(burst), number_text(cost)]
        module_args += [key, *numbers]
        script_args += numbers
    keys = tuple(bucket[0] for bucket in buckets)
    return Call("TB.ACQUIREEACH", tuple(module_args), keys, tuple(script_args), _acquired_each)


def acquire_at_most(key: str, rate: Number, burst: Number, max_tokens: int) -> Call[PartialGrant]:
    args = (number_text(rate), number_text(burst), number_text(max_tokens))
    return _one_key("TB.ACQUIREATMOST", key, args, _partial)


def reserve(key: str, rate: Number, burst: Number, cost: Number, max_wait_ms: int) -> Call[Reservation]:
    args = (number_text(rate), number_text(burst), number_text(cost), number_text(max_wait_ms))
    return _one_key("TB.RESERVE", key, args, _reservation)


def refund(key: str, rate: Number, burst: Number, amount: Number) -> Call[Refunded]:
    args = (number_text(rate), number_text(burst), number_text(amount))
    return _one_key("TB.REFUND", key, args, _refunded)


def charge(key: str, rate: Number, burst: Number, cost: Number) -> Call[Charged]:
    args = (number_text(rate), number_text(burst), number_text(cost))
    return _one_key("TB.CHARGE", key, args, _charged)


def lower(key: str, rate: Number, burst: Number, tokens: Number) -> Call[Charged]:
    args = (number_text(rate), number_text(burst), number_text(tokens))
    return _one_key("TB.LOWER", key, args, _charged)


def block(key: str, rate: Number, burst: Number, ms: int) -> Call[Charged]:
    args = (number_text(rate), number_text(burst), number_text(ms))
    return _one_key("TB.BLOCK", key, args, _charged)


def throttle(key: str, max_burst: int, count_per_period: int, period: int, quantity: int = 1) -> Call[ThrottleReply]:
    args = (number_text(max_burst), number_text(count_per_period), number_text(period), number_text(quantity))
    return _one_key("CL.THROTTLE", key, args, _throttled)


def is_unknown_command(error: Exception) -> bool:
    """Whether the server (or a cluster client's command table) does not know the command sent: no module, or no
    FCALL (Redis 6.2). A command unknown to a script's `redis.call` is not this: see `is_time_refused`."""
    text = str(error).lower()
    if "from script" in text or "from lua script" in text:
        return False
    return "unknown command" in text or "doesn't exist in redis commands" in text


def summary(error: Exception) -> str:
    """An error's text for a log line, without the arguments a server quotes after it (they hold keys, so
    identities)."""
    return str(error).split(", with args beginning with", 1)[0]


def is_function_missing(error: Exception) -> bool:
    """FCALL of a function the server does not hold: the library was never loaded, or was lost (FUNCTION FLUSH,
    a restart without persistence, a failover to a primary that never had it)."""
    return "function not found" in str(error).lower()


def is_library_loaded(error: Exception) -> bool:
    """FUNCTION LOAD refused because another client loaded the same library first."""
    return "already exists" in str(error).lower()


class LibraryRefused(ResponseError):
    """FUNCTION LOAD refused the library itself with a plain `ERR` (it does not compile or register there): no
    passing state (those have their own codes: LOADING, BUSY, OOM, READONLY, MASTERDOWN, ...) and no permission
    (NOPERM), so the library cannot serve this server and the client goes on to the script."""


def library_refused(error: ResponseError) -> LibraryRefused | None:
    """`error` as a `LibraryRefused` when it is a plain `ERR` reply to FUNCTION LOAD (redis-py drops the `ERR`;
    other codes stay at the start of the text, and some have their own exception classes)."""
    text = str(error)
    if type(error) is not ResponseError or is_library_loaded(error) or re.match(r"[A-Z]+ ", text):
        return None
    return LibraryRefused(text)


def is_functions_unavailable(error: Exception) -> bool:
    """Whether Redis Functions cannot serve this client: the server has no FCALL/FUNCTION (Redis 6.2), or its
    ACL user may not run them (`NOPERM ... 'fcall'`, `NOPERM ... 'function|load'`)."""
    text = str(error).lower()  # redis-py drops the NOPERM prefix (NoPermissionError); other clients keep it
    refused = "permissions to run the 'fcall'" in text or "permissions to run the 'function" in text
    return refused or is_unknown_command(error) or isinstance(error, LibraryRefused)


# What a script's `redis.call('TIME')` meets where TIME is refused, by server:
#   a provider that forbids it (ElastiCache Serverless)    ERR This Redis command is not allowed from script
#   TIME renamed (rename-command), Redis 6.2                ... Unknown Redis command called from Lua script
#   TIME renamed, Redis 7.0+                                ERR Unknown Redis command called from script ...
#   TIME renamed, Valkey                                    ERR Unknown command called from script ...
#   an ACL user without TIME, Redis 6.2 and 7.0             ERR The user executing the script can't run this command
#   an ACL user without TIME, Redis 7.2+ and Valkey         ERR ACL failure in script: ... the 'time' command ...
_TIME_REFUSED = re.compile(
    r"not allowed from script|unknown (redis )?command called from|user executing the script can't run"
    r"|acl failure in script",
    re.IGNORECASE,
)


def is_time_refused(error: Exception) -> bool:
    """Whether a script or function call failed on a command the server refuses inside scripts. The script calls
    TIME before any write, so such a call wrote nothing, and the client retries it once with its own
    clock; if that fails the same way, the refused command was another one (an ACL that is too narrow)."""
    return _TIME_REFUSED.search(str(error)) is not None


def backend_error_class(error: Exception) -> str:
    """The class of fixtures/backends.json (docs/clients.md, "Which backend runs the calls") an error reply falls
    in, the first in the order the client acts on them: "time-refused" (retry with the caller's clock),
    "unknown-command" (the next backend), "functions-unavailable" (the script), "function-missing" (load the
    library), "library-loaded" (another client loaded it: retry), else "other" (the error goes to the caller)."""
    if is_time_refused(error):
        return "time-refused"
    if is_unknown_command(error):
        return "unknown-command"
    if is_functions_unavailable(error):
        return "functions-unavailable"
    if is_function_missing(error):
        return "function-missing"
    if is_library_loaded(error):
        return "library-loaded"
    return "other"


def translate(error: ResponseError) -> Exception:
    """The package's exception for a server error, or the error itself when it is none of ours."""
    text = str(error)
    # redis-py strips a leading `ERR ` (a code it knows); put it back so `server_message` is the wire text.
    full = text if text.startswith(("ERR ", "WRONGTYPE ")) else f"ERR {text}"
    if text.startswith("WRONGTYPE"):
        return errors.WrongType(text)
    body = full[len("ERR ") :]
    if body.startswith(("rate ", "burst ", "cost ", "max_wait_ms ", "amount ", "max ", "ms ", "tokens ")):
        return errors.InvalidArgument(full)
    # CL.THROTTLE's arguments, and limits whose nanoseconds do not fit 64 bits.
    if body.startswith(("max_burst ", "count_per_period ", "period ", "quantity ", "(max_burst + 1) ")):
        return errors.InvalidArgument(full)
    if body.startswith("the key's theoretical arrival time"):
        return errors.InvalidArgument(full)
    if body.startswith(("key is not a valid token bucket", "key does not hold a CL.THROTTLE state")):
        return errors.NotABucket(full)
    if body.startswith("each key may appear only once"):
        return errors.DuplicateKey(full)
    if body.startswith("too many buckets"):
        return errors.TooManyBuckets(full)
    if "debt" in body and ("charge" in body or "24 hours" in body):
        return errors.DebtLimitExceeded(full)
    return error
