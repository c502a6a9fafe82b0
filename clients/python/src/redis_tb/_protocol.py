"""What every client shares, without I/O: each command's arguments for the module and for the script, reply
parsing, and error translation. The sync and asyncio clients only send what this builds."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
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


SCRIPT: str = _load_script()
SCRIPT_SHA: str = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()

#: The two ways a command can run.
MODULE = "module"
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

    def eval_args(self) -> tuple[str, ...]:
        """`key... command arg...` for EVAL/EVALSHA, after `numkeys` (`len(keys)`)."""
        return (*self.keys, self.name, *self.script_args)


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


def block(key: str, rate: Number, burst: Number, ms: int) -> Call[Charged]:
    args = (number_text(rate), number_text(burst), number_text(ms))
    return _one_key("TB.BLOCK", key, args, _charged)


def is_unknown_command(error: Exception) -> bool:
    """Whether the server (or a cluster client's command table) does not know the command: no module."""
    text = str(error).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text


def translate(error: ResponseError) -> Exception:
    """The package's exception for a server error, or the error itself when it is none of ours."""
    text = str(error)
    # redis-py strips a leading `ERR ` (a code it knows); put it back so `server_message` is the wire text.
    full = text if text.startswith(("ERR ", "WRONGTYPE ")) else f"ERR {text}"
    if text.startswith("WRONGTYPE"):
        return errors.WrongType(text)
    body = full[len("ERR ") :]
    if body.startswith(("rate ", "burst ", "cost ", "max_wait_ms ", "amount ", "max ", "ms ")):
        return errors.InvalidArgument(full)
    if body.startswith("key is not a valid token bucket"):
        return errors.NotABucket(full)
    if body.startswith("each key may appear only once"):
        return errors.DuplicateKey(full)
    if body.startswith("too many buckets"):
        return errors.TooManyBuckets(full)
    if "debt" in body and ("charge" in body or "24 hours" in body):
        return errors.DebtLimitExceeded(full)
    return error
