//! Decimal text to numbers, for command arguments and stored hash fields alike. Pure: no Redis types, no I/O.
//!
//! The grammar is Rust's (`str::parse` for `f64` and `i64`), finite values only. Most texts a limiter sees are
//! short runs of digits (`10`, `1`, a `ts` of 16 digits), so those take a fast path that gives exactly what the
//! standard parser would, without UTF-8 validation or the general float algorithm: it showed in the profile of
//! an allowed call.
#![forbid(unsafe_code)]

/// Longest run of digits parsed as an `f64` on the fast path: below 10^15 < 2^53 every integer is exact.
const FAST_F64_DIGITS: usize = 15;
/// Longest run of digits parsed as an `i64` on the fast path: 10^19 - 1 < u64::MAX, so the digits never overflow,
/// and `i64::try_from` refuses what exceeds i64::MAX. A `CL.THROTTLE` TAT has 19 digits.
const FAST_I64_DIGITS: usize = 19;

/// The value of `bytes` if it is 1 to `max_digits` ASCII digits.
fn digits(bytes: &[u8], max_digits: usize) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > max_digits {
        return None;
    }
    bytes.iter().try_fold(0u64, |value, &byte| {
        byte.is_ascii_digit()
            .then(|| value * 10 + u64::from(byte - b'0'))
    })
}

/// A finite decimal number: what `str::parse::<f64>` accepts (`1`, `0.5`, `+2.5e-3`), except infinities, NaN and
/// values that overflow (`1e400`). Spaces, hex, empty text and trailing junk are refused.
pub fn parse_f64(bytes: &[u8]) -> Option<f64> {
    if let Some(integer) = digits(bytes, FAST_F64_DIGITS) {
        // Lossless: below 2^53.
        return Some(integer as f64);
    }
    let value: f64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    value.is_finite().then_some(value)
}

/// An integer in `i64` range: what `str::parse::<i64>` accepts (an optional sign, then digits).
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if let Some(integer) = digits(bytes, FAST_I64_DIGITS) {
        return i64::try_from(integer).ok();
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decimals_follow_the_standard_grammar() {
        for (text, want) in [
            ("1", 1.0),
            ("007", 7.0),
            ("0.5", 0.5),
            ("+2.5e-3", 0.0025),
            ("1e15", 1e15),
            ("-1", -1.0),
            ("999999999999999", 999_999_999_999_999.0),
            ("12345678901234567890", 12_345_678_901_234_567_890.0),
        ] {
            assert_eq!(parse_f64(text.as_bytes()), Some(want), "{text}");
        }
        for text in [
            "", "abc", "nan", "inf", "-inf", "1e400", "0x10", " 1", "1 ", "1abc", "1,5",
        ] {
            assert_eq!(parse_f64(text.as_bytes()), None, "{text:?}");
        }
        assert_eq!(parse_f64(&[0xff, b'1']), None);
    }

    #[test]
    fn integers_follow_the_standard_grammar() {
        assert_eq!(parse_i64(b"1700000000000000"), Some(1_700_000_000_000_000));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-3"), Some(-3));
        assert_eq!(
            parse_i64(b"1893456000123456789"),
            Some(1_893_456_000_123_456_789)
        );
        for text in [
            "",
            "1.5",
            "x",
            "9223372036854775808",
            "9999999999999999999",
            " 1",
        ] {
            assert_eq!(parse_i64(text.as_bytes()), None, "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn fast_path_agrees_with_the_standard_parser(text in "[0-9+.eE-]{0,20}") {
            let standard: Option<f64> = text.parse().ok().filter(|v: &f64| v.is_finite());
            prop_assert_eq!(parse_f64(text.as_bytes()).map(f64::to_bits), standard.map(f64::to_bits));
            prop_assert_eq!(parse_i64(text.as_bytes()), text.parse::<i64>().ok());
        }

        #[test]
        fn every_integer_text_parses_exactly(value in any::<i64>()) {
            let text = value.to_string();
            prop_assert_eq!(parse_i64(text.as_bytes()), Some(value));
            prop_assert_eq!(parse_f64(text.as_bytes()), text.parse::<f64>().ok());
        }
    }
}
