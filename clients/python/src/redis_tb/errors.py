"""Exceptions: each names the problem. They all derive from `TokenBucketError`; the argument errors are also
`ValueError`s, and the ones the server sent keep its exact text in `server_message`."""

from __future__ import annotations


class TokenBucketError(Exception):
    """Base class of every error this package raises."""


class ServerError(TokenBucketError):
    """The server refused a call; `server_message` is its error line, prefix included (`ERR ...`)."""

    def __init__(self, server_message: str) -> None:
        super().__init__(server_message)
        self.server_message = server_message


class InvalidArgument(ServerError, ValueError):
    """An argument the command refuses: `rate`, `burst`, `cost`, `max_wait_ms`, `amount`, `max`, `ms` or `tokens`, or
    `CL.THROTTLE`'s `max_burst`, `count_per_period`, `period` or `quantity` (the message names it)."""


class WrongType(ServerError):
    """The key holds something other than a hash (a string, a list, ...)."""


class NotABucket(ServerError):
    """The key is a hash but not a token bucket (other fields, or values that do not parse), or, for
    `CL.THROTTLE`, a string that is not a decimal TAT."""


class DuplicateKey(ServerError, ValueError):
    """A multi-bucket call names the same key twice."""


class TooManyBuckets(ServerError, ValueError):
    """A multi-bucket call names more than 1,000 buckets."""


class DebtLimitExceeded(ServerError):
    """`TB.CHARGE` refused: the bucket would owe more than 24 hours of refill."""


class ModuleNotLoaded(TokenBucketError):
    """The client was told to use the module (`backend="module"`) and the server does not know the command."""


class LimiterUnavailable(TokenBucketError):
    """Redis could not be reached. Nothing in this package raises it: a middleware that fails closed answers
    503 instead."""
