//! The glue between the server and the pure bucket: parse arguments, read the hash, decide, write, replicate,
//! reply. It owns the command contract; the README mirrors it.
//!
//! ```text
//! TB.ACQUIRE key rate burst [cost]
//!
//!   rate    tokens added per second        decimal, finite, > 0
//!   burst   capacity in tokens             decimal, finite, > 0
//!   cost    tokens this call takes         decimal, finite, >= 0, default 1; 0 is a peek
//!
//! Reply: array of 4 integers
//!   1) allowed          1 or 0
//!   2) remaining        whole tokens left after this call (floor)
//!   3) retry_after_ms   0 when allowed; -1 when cost > burst (never succeeds); else ms until cost tokens are there
//!   4) reset_after_ms   ms until the bucket is full again (rounded up); 0 when full
//!
//! State: a hash with exactly two fields
//!   tokens   decimal text that parses back to the exact f64 written
//!   ts       server wall-clock time of the last write, integer microseconds since the Unix epoch
//!   A missing key is a full bucket; an allowed call sets the key to expire when the bucket is full again.
//!
//! Errors (nothing is changed by a call that errors):
//!   ERR wrong number of arguments for 'tb.acquire' command
//!   ERR rate must be a positive number          (likewise burst; cost must be a non-negative number)
//!   WRONGTYPE Operation against a key holding the wrong kind of value
//!   ERR key is not a valid token bucket (...)   a hash with other fields or unparsable values
//! ```
//!
//! Only allowed calls with a non-zero cost write. Denials and peeks leave the key, its expiry and the replication
//! stream untouched: the refill is a pure function of time, so there is nothing to record.
//!
//! Replication sends the *effects*, `HSET key tokens T ts TS` and `PEXPIREAT key MS`, with exactly the bytes
//! written here, never the command itself. `RM_ReplicateVerbatim` is for commands that "deterministically
//! re-create the new state" (`module.c`); ours reads the clock, so a replica re-running it would compute with its
//! own clock, and a replica or AOF loader without the module could not run it at all.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::bucket::{self, Cost, ParamError, Params, State, Write};
use crate::codec::{decode_state, with_encoded};
use crate::server::{self, Call, Command, Interned, Key, KeyKind};

/// The command's name as registered.
pub const ACQUIRE_NAME: &CStr = c"tb.acquire";
/// Registration flags: it writes, may grow memory (refused under OOM), and is O(1).
pub const ACQUIRE_FLAGS: &CStr = c"write deny-oom fast";

/// Hash field holding the token count. A `static`, not a `const`: the server string is made once and reused.
static FIELD_TOKENS: Interned = Interned::new(c"tokens");
/// Hash field holding the time of the last write, in microseconds.
static FIELD_UPDATED_US: Interned = Interned::new(c"ts");

/// Everything a call can refuse with. Its wire text is API: integration tests assert it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TbError {
    WrongArity,
    Param(ParamError),
    WrongType,
    NotABucket,
    WriteFailed,
}

impl TbError {
    /// The error line sent to the client, prefix included.
    pub fn wire_text(self) -> &'static CStr {
        match self {
            TbError::WrongArity => c"ERR wrong number of arguments for 'tb.acquire' command",
            TbError::Param(ParamError::Rate) => c"ERR rate must be a positive number",
            TbError::Param(ParamError::Burst) => c"ERR burst must be a positive number",
            TbError::Param(ParamError::Cost) => c"ERR cost must be a non-negative number",
            TbError::WrongType => c"WRONGTYPE Operation against a key holding the wrong kind of value",
            TbError::NotABucket => {
                c"ERR key is not a valid token bucket (expected a hash with only the fields tokens and ts)"
            }
            TbError::WriteFailed => c"ERR failed to write the token bucket",
        }
    }
}

impl From<ParamError> for TbError {
    fn from(error: ParamError) -> TbError {
        TbError::Param(error)
    }
}

/// `TB.ACQUIRE key rate burst [cost]`.
pub struct Acquire;

impl Command for Acquire {
    fn run(call: &Call<'_>) {
        match acquire(call) {
            Ok(reply) => call.reply_integers(&reply),
            Err(error) => call.reply_error(error.wire_text()),
        }
    }
}

fn acquire(call: &Call<'_>) -> Result<[i64; 4], TbError> {
    if !(4..=5).contains(&call.arg_count()) {
        return Err(TbError::WrongArity);
    }
    let params = Params::new(
        parse_number(call.arg(2)).ok_or(ParamError::Rate)?,
        parse_number(call.arg(3)).ok_or(ParamError::Burst)?,
    )?;
    let cost = match call.arg(4) {
        Some(bytes) => Cost::new(parse_number(Some(bytes)).ok_or(ParamError::Cost)?)?,
        None => Cost::new(1.0)?,
    };
    let key = call.open_key(1).ok_or(TbError::WriteFailed)?;
    let stored = read_state(&key)?;
    let decision = bucket::acquire(stored, server::now_us(), &params, cost);
    if let Some(write) = decision.write {
        write_state(call, &key, &write)?;
    }
    Ok([
        i64::from(decision.allowed()),
        decision.remaining,
        decision.retry_after_ms,
        decision.reset_after_ms,
    ])
}

/// Parses a decimal argument: what Rust's `f64` grammar accepts (`1`, `0.5`, `2.5e-3`), finite only. Hex, empty
/// strings, surrounding spaces and trailing junk are refused by the grammar; `inf`, `nan` and overflowing values
/// such as `1e400` by the finiteness check.
fn parse_number(bytes: Option<&[u8]>) -> Option<f64> {
    let value: f64 = std::str::from_utf8(bytes?).ok()?.parse().ok()?;
    value.is_finite().then_some(value)
}

/// Reads the bucket: `None` for a missing key, the decoded state for a bucket hash.
fn read_state(key: &Key<'_>) -> Result<Option<State>, TbError> {
    match key.kind() {
        KeyKind::Empty => Ok(None),
        KeyKind::Other => Err(TbError::WrongType),
        KeyKind::Hash if key.hash_len() != 2 => Err(TbError::NotABucket),
        KeyKind::Hash => key
            .hash_get2([&FIELD_TOKENS, &FIELD_UPDATED_US], decode_state)
            .map(Some)
            .ok_or(TbError::NotABucket),
    }
}

/// Writes the new state and its expiry, then replicates exactly those effects: the same value strings go to the
/// hash and to the replicated `HSET`.
fn write_state(call: &Call<'_>, key: &Key<'_>, write: &Write) -> Result<(), TbError> {
    let (tokens, updated_us) = with_encoded(&write.state, |tokens, updated_us| {
        (call.create_string(tokens), call.create_string(updated_us))
    });
    let (Some(tokens), Some(updated_us)) = (tokens, updated_us) else {
        return Err(TbError::WriteFailed);
    };
    let fields = [(&FIELD_TOKENS, &tokens), (&FIELD_UPDATED_US, &updated_us)];
    key.hash_set2(fields)
        .and_then(|()| key.set_expire_at(write.expire_at_ms))
        .and_then(|()| call.replicate_hset_pexpireat(key, fields, write.expire_at_ms))
        .map_err(|()| TbError::WriteFailed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_number_accepts_decimals_only() {
        for (text, want) in [
            ("1", 1.0),
            ("0.5", 0.5),
            ("2.5e-3", 0.0025),
            ("1e15", 1e15),
            ("-1", -1.0),
        ] {
            assert_eq!(parse_number(Some(text.as_bytes())), Some(want), "{text}");
        }
        for text in [
            "", "abc", "nan", "inf", "-inf", "1e400", "0x10", " 1", "1 ", "1abc", "1,5",
        ] {
            assert_eq!(parse_number(Some(text.as_bytes())), None, "{text:?}");
        }
        assert_eq!(parse_number(Some(&[0xff, b'1'])), None);
        assert_eq!(parse_number(None), None);
    }

    #[test]
    fn error_texts_carry_a_redis_prefix() {
        let all = [
            TbError::WrongArity,
            TbError::Param(ParamError::Rate),
            TbError::Param(ParamError::Burst),
            TbError::Param(ParamError::Cost),
            TbError::WrongType,
            TbError::NotABucket,
            TbError::WriteFailed,
        ];
        for error in all {
            let text = error.wire_text().to_str().expect("ascii");
            assert!(
                text.starts_with("ERR ") || text.starts_with("WRONGTYPE "),
                "{text}"
            );
        }
    }
}
