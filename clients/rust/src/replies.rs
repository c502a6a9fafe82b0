//! Typed replies of the commands (docs/commands.md gives each field), and their parsing from what Redis sends.
#![forbid(unsafe_code)]

use redis::Value;

use crate::error::Error;

/// `TB.ACQUIRE`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    pub allowed: bool,
    /// Whole tokens left after the call (rounded down; 0 in debt).
    pub remaining: i64,
    /// 0 when allowed; else ms until `cost` tokens will be there (exact, rounded up); -1 when `cost > burst`.
    pub retry_after_ms: i64,
    /// ms until the bucket is full again (rounded up); 0 for a full bucket.
    pub reset_after_ms: i64,
}

/// `TB.ACQUIREALL`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquiredAll {
    pub allowed: bool,
    /// The smallest `remaining` over the buckets.
    pub remaining: i64,
    /// 0 when allowed; -1 if the cost exceeds some bucket's burst; else the longest wait.
    pub retry_after_ms: i64,
    /// The longest time until a bucket is full again.
    pub reset_after_ms: i64,
    /// 0-based index of the bucket that decided the reply.
    pub limiting_index: usize,
}

/// One bucket of `TB.ACQUIREEACH`'s reply, as `TB.ACQUIRE` would answer for it alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketResult {
    /// Whether this bucket alone holds its cost now.
    pub fits: bool,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

/// `TB.ACQUIREEACH`'s reply: all or nothing over several buckets, each reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquiredEach {
    pub allowed: bool,
    /// The bucket that decided: when refused, the limit that was hit.
    pub limiting_index: usize,
    /// One result per bucket, in call order.
    pub buckets: Vec<BucketResult>,
}

impl AcquiredEach {
    /// The limiting bucket's wait: when to retry a refused call (-1: never as it is).
    pub fn retry_after_ms(&self) -> i64 {
        self.buckets
            .get(self.limiting_index)
            .map_or(0, |bucket| bucket.retry_after_ms)
    }
}

/// `TB.ACQUIREATMOST`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartialGrant {
    /// Whole tokens taken, 0 when less than one whole token was there.
    pub granted: i64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

/// `TB.RESERVE`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub granted: bool,
    /// ms to wait before acting (when granted), or the wait that was too long (when not).
    pub wait_ms: i64,
    pub remaining: i64,
    pub reset_after_ms: i64,
}

/// `TB.REFUND`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refunded {
    /// Whether the bucket changed.
    pub refunded: bool,
    pub remaining: i64,
    pub reset_after_ms: i64,
}

/// `TB.CHARGE`'s, `TB.BLOCK`'s and `TB.LOWER`'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charged {
    /// Whole tokens left (0 in debt).
    pub remaining: i64,
    /// ms until one whole token is there again; -1 when `burst` is below 1.
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

fn integers(value: &Value, count: usize, what: &str) -> Result<Vec<i64>, Error> {
    let Value::Array(items) = value else {
        return Err(Error::Protocol(format!(
            "{what}: expected an array, got {value:?}"
        )));
    };
    if items.len() != count {
        return Err(Error::Protocol(format!(
            "{what}: expected {count} elements, got {}",
            items.len()
        )));
    }
    items
        .iter()
        .map(|item| match item {
            Value::Int(number) => Ok(*number),
            other => Err(Error::Protocol(format!(
                "{what}: expected an integer, got {other:?}"
            ))),
        })
        .collect()
}

fn index(number: i64, what: &str) -> Result<usize, Error> {
    usize::try_from(number).map_err(|_| Error::Protocol(format!("{what}: index {number}")))
}

/// A reply of four integers: `[a, b, c, d]`.
fn four(value: &Value, what: &str) -> Result<[i64; 4], Error> {
    match integers(value, 4, what)?.as_slice() {
        &[a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::Protocol(format!("{what}: expected 4 elements"))),
    }
}

fn three(value: &Value, what: &str) -> Result<[i64; 3], Error> {
    match integers(value, 3, what)?.as_slice() {
        &[a, b, c] => Ok([a, b, c]),
        _ => Err(Error::Protocol(format!("{what}: expected 3 elements"))),
    }
}

pub(crate) fn acquired(value: &Value) -> Result<Acquired, Error> {
    let [allowed, remaining, retry_after_ms, reset_after_ms] = four(value, "TB.ACQUIRE")?;
    Ok(Acquired {
        allowed: allowed == 1,
        remaining,
        retry_after_ms,
        reset_after_ms,
    })
}

pub(crate) fn acquired_all(value: &Value) -> Result<AcquiredAll, Error> {
    match integers(value, 5, "TB.ACQUIREALL")?.as_slice() {
        &[allowed, remaining, retry_after_ms, reset_after_ms, limiting] => Ok(AcquiredAll {
            allowed: allowed == 1,
            remaining,
            retry_after_ms,
            reset_after_ms,
            limiting_index: index(limiting, "TB.ACQUIREALL")?,
        }),
        _ => Err(Error::Protocol(
            "TB.ACQUIREALL: expected 5 elements".to_owned(),
        )),
    }
}

pub(crate) fn acquired_each(value: &Value) -> Result<AcquiredEach, Error> {
    let what = "TB.ACQUIREEACH";
    let Value::Array(items) = value else {
        return Err(Error::Protocol(format!(
            "{what}: expected an array, got {value:?}"
        )));
    };
    let (Some(Value::Int(allowed)), Some(Value::Int(limiting))) = (items.first(), items.get(1))
    else {
        return Err(Error::Protocol(format!(
            "{what}: expected two integers first"
        )));
    };
    let buckets = items
        .iter()
        .skip(2)
        .map(|bucket| {
            let [fits, remaining, retry_after_ms, reset_after_ms] = four(bucket, what)?;
            Ok(BucketResult {
                fits: fits == 1,
                remaining,
                retry_after_ms,
                reset_after_ms,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let limiting_index = index(*limiting, what)?;
    if limiting_index >= buckets.len() {
        return Err(Error::Protocol(format!("{what}: index {limiting_index}")));
    }
    Ok(AcquiredEach {
        allowed: *allowed == 1,
        limiting_index,
        buckets,
    })
}

pub(crate) fn partial(value: &Value) -> Result<PartialGrant, Error> {
    let [granted, remaining, retry_after_ms, reset_after_ms] = four(value, "TB.ACQUIREATMOST")?;
    Ok(PartialGrant {
        granted,
        remaining,
        retry_after_ms,
        reset_after_ms,
    })
}

pub(crate) fn reservation(value: &Value) -> Result<Reservation, Error> {
    let [granted, wait_ms, remaining, reset_after_ms] = four(value, "TB.RESERVE")?;
    Ok(Reservation {
        granted: granted == 1,
        wait_ms,
        remaining,
        reset_after_ms,
    })
}

pub(crate) fn refunded(value: &Value) -> Result<Refunded, Error> {
    let [refunded, remaining, reset_after_ms] = three(value, "TB.REFUND")?;
    Ok(Refunded {
        refunded: refunded == 1,
        remaining,
        reset_after_ms,
    })
}

pub(crate) fn charged(value: &Value) -> Result<Charged, Error> {
    let [remaining, retry_after_ms, reset_after_ms] = three(value, "TB.CHARGE")?;
    Ok(Charged {
        remaining,
        retry_after_ms,
        reset_after_ms,
    })
}
