//! The errors of the crate: a bad option when something is built ([`ConfigError`]), and a limiter call that
//! failed ([`Error`]). [`Error::failure`] says which row of the failure table (docs/clients.md) a call's error
//! belongs to.
#![forbid(unsafe_code)]

use std::fmt;
use std::time::Duration;

use crate::failure::{self, Failure};

/// An option refused when a client, a limit or a layer is built; the message names the option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    pub(crate) fn new(message: String) -> ConfigError {
        ConfigError(message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Why a limiter call failed.
#[derive(Debug)]
pub enum Error {
    /// No reply within the call's deadline. Nothing more is sent on the connection it used, which is dropped.
    Timeout(Duration),
    /// No connection to send the call on: Redis refused or dropped it, or a call timed out and no probe has
    /// answered since. The call was not sent.
    Unavailable(String),
    /// Redis answered with an error, or the connection failed while the call was out (redis-rs's error).
    Redis(redis::RedisError),
    /// A reply of another shape than the command's.
    Protocol(String),
    /// An argument refused before anything was sent (a rate that is not a finite positive number, ...).
    InvalidArgument(String),
}

impl Error {
    /// The row of the failure table this error belongs to, and what a middleware does about it.
    pub fn failure(&self) -> Failure {
        match self {
            Error::Timeout(_) => failure::TIMEOUT,
            Error::Unavailable(_) => failure::CONNECTION_REFUSED,
            Error::Redis(err) => failure::classify_redis(err),
            Error::Protocol(_) | Error::InvalidArgument(_) => failure::ANY_OTHER,
        }
    }

    /// Whether this error is the server's own error reply (`NOPERM ...`, `OOM ...`), as opposed to an error of
    /// the client's (no reply, a lost connection, a reply of an unexpected shape), which says nothing of what the
    /// server did with the call.
    pub fn is_server_reply(&self) -> bool {
        matches!(self, Error::Redis(err) if failure::wire_text(err).is_some())
    }

    /// The error reply as the server sent it (`ERR rate must be a positive number`), if this is one.
    pub fn server_text(&self) -> Option<String> {
        match self {
            Error::Redis(err) => failure::wire_text(err),
            _ => None,
        }
    }

    /// Whether this error means no call should be sent until a probe answers: a timeout or a lost connection.
    /// An error reply (`OOM`, `READONLY`, ...) fails only its own call.
    pub fn stops_calls(&self) -> bool {
        match self {
            Error::Timeout(_) | Error::Unavailable(_) => true,
            Error::Redis(err) => {
                err.is_timeout()
                    || err.is_io_error()
                    || err.is_connection_dropped()
                    || err.is_connection_refusal()
            }
            Error::Protocol(_) | Error::InvalidArgument(_) => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout(deadline) => {
                write!(f, "no reply from redis within {} ms", deadline.as_millis())
            }
            Error::Unavailable(why) => write!(f, "redis unavailable: {why}"),
            Error::Redis(err) => match failure::wire_text(err) {
                Some(text) => f.write_str(&failure::summary(&text)),
                None => write!(f, "{err}"),
            },
            Error::Protocol(why) => write!(f, "unexpected reply: {why}"),
            Error::InvalidArgument(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(err) => Some(err),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Error {
        Error::Redis(err)
    }
}
