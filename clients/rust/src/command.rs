//! Each command's arguments, once for the module and once for the script and the library (keys apart), and the
//! parser of its reply. The client only sends what this builds.
#![forbid(unsafe_code)]

use redis::Value;

use crate::error::Error;
use crate::replies;

/// One bucket of a multi-bucket call without its own cost (`TB.ACQUIREALL`).
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket<'a> {
    pub key: &'a str,
    /// Tokens per second.
    pub rate: f64,
    /// Capacity in tokens.
    pub burst: f64,
}

/// One bucket of `TB.ACQUIREEACH`, with its own cost.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketWithCost<'a> {
    pub key: &'a str,
    pub rate: f64,
    pub burst: f64,
    /// Tokens to take from this bucket; 0 reports on it without taking.
    pub cost: f64,
}

/// One command: its name, its arguments for the module, its keys and other arguments for the script, and how its
/// reply is parsed.
pub(crate) struct Call<T> {
    pub name: &'static str,
    pub keys: Vec<String>,
    /// The module's arguments after the name.
    pub module_args: Vec<String>,
    /// The script's and the library's arguments after the keys (and the caller's clock).
    pub script_args: Vec<String>,
    pub parse: fn(&Value) -> Result<T, Error>,
}

/// A number as the server parses it: `10`, `0.5`, `0.00001` (never an exponent). Non-finite values go out as
/// `inf`/`NaN`, which the server refuses with the argument's name.
pub(crate) fn number(value: f64) -> String {
    // Whole numbers below 2^53 (the usual rate, burst and cost) as integers, without the float formatter: the
    // same text (`10`, `-3`, `0`), about a tenth of the work. `-0` keeps its sign through the formatter.
    if value.fract() == 0.0
        && value.abs() < 9_007_199_254_740_992.0
        && value.to_bits() != (-0.0f64).to_bits()
    {
        return itoa::Buffer::new().format(value as i64).to_owned();
    }
    format!("{value}")
}

fn one_key<T>(
    name: &'static str,
    key: &str,
    args: Vec<String>,
    parse: fn(&Value) -> Result<T, Error>,
) -> Call<T> {
    let mut module_args = vec![key.to_owned()];
    module_args.extend(args.iter().cloned());
    Call {
        name,
        keys: vec![key.to_owned()],
        module_args,
        script_args: args,
        parse,
    }
}

pub(crate) fn acquire(key: &str, rate: f64, burst: f64, cost: f64) -> Call<replies::Acquired> {
    let args = vec![number(rate), number(burst), number(cost)];
    one_key("TB.ACQUIRE", key, args, replies::acquired)
}

pub(crate) fn acquire_all(buckets: &[Bucket<'_>], cost: f64) -> Call<replies::AcquiredAll> {
    let mut module_args = vec![number(cost)];
    let mut script_args = vec![number(cost)];
    for bucket in buckets {
        module_args.extend([
            bucket.key.to_owned(),
            number(bucket.rate),
            number(bucket.burst),
        ]);
        script_args.extend([number(bucket.rate), number(bucket.burst)]);
    }
    Call {
        name: "TB.ACQUIREALL",
        keys: buckets.iter().map(|bucket| bucket.key.to_owned()).collect(),
        module_args,
        script_args,
        parse: replies::acquired_all,
    }
}

pub(crate) fn acquire_each(buckets: &[BucketWithCost<'_>]) -> Call<replies::AcquiredEach> {
    let mut module_args = Vec::with_capacity(buckets.len() * 4);
    let mut script_args = Vec::with_capacity(buckets.len() * 3);
    for bucket in buckets {
        let numbers = [
            number(bucket.rate),
            number(bucket.burst),
            number(bucket.cost),
        ];
        module_args.push(bucket.key.to_owned());
        module_args.extend(numbers.iter().cloned());
        script_args.extend(numbers);
    }
    Call {
        name: "TB.ACQUIREEACH",
        keys: buckets.iter().map(|bucket| bucket.key.to_owned()).collect(),
        module_args,
        script_args,
        parse: replies::acquired_each,
    }
}

pub(crate) fn acquire_at_most(
    key: &str,
    rate: f64,
    burst: f64,
    max: u64,
) -> Call<replies::PartialGrant> {
    let args = vec![number(rate), number(burst), max.to_string()];
    one_key("TB.ACQUIREATMOST", key, args, replies::partial)
}

pub(crate) fn reserve(
    key: &str,
    rate: f64,
    burst: f64,
    cost: f64,
    max_wait_ms: u64,
) -> Call<replies::Reservation> {
    let args = vec![
        number(rate),
        number(burst),
        number(cost),
        max_wait_ms.to_string(),
    ];
    one_key("TB.RESERVE", key, args, replies::reservation)
}

pub(crate) fn refund(key: &str, rate: f64, burst: f64, amount: f64) -> Call<replies::Refunded> {
    let args = vec![number(rate), number(burst), number(amount)];
    one_key("TB.REFUND", key, args, replies::refunded)
}

pub(crate) fn charge(key: &str, rate: f64, burst: f64, cost: f64) -> Call<replies::Charged> {
    let args = vec![number(rate), number(burst), number(cost)];
    one_key("TB.CHARGE", key, args, replies::charged)
}

pub(crate) fn lower(key: &str, rate: f64, burst: f64, tokens: f64) -> Call<replies::Charged> {
    let args = vec![number(rate), number(burst), number(tokens)];
    one_key("TB.LOWER", key, args, replies::charged)
}

pub(crate) fn block(key: &str, rate: f64, burst: f64, ms: u64) -> Call<replies::Charged> {
    let args = vec![number(rate), number(burst), ms.to_string()];
    one_key("TB.BLOCK", key, args, replies::charged)
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn number_is_the_float_formatters_text() {
        let values = [
            0.0,
            -0.0,
            1.0,
            -5.0,
            10.0,
            1e9,
            9_007_199_254_740_991.0,
            9_007_199_254_740_992.0,
            -9_007_199_254_740_993.0,
            1e21,
            0.5,
            0.001,
            1e-300,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for value in values {
            assert_eq!(number(value), format!("{value}"), "{value:e}");
        }
    }
}
