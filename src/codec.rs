//! The stored form of a bucket: how a [`State`] becomes the two hash values `tokens` and `ts`, and back.
//!
//! Pure byte work, like `bucket`: no Redis types, no clock, no I/O, so benches and property tests drive it
//! directly. `command/state.rs` is its only caller in the module; it writes exactly the bytes [`with_encoded`] hands it
//! (to the hash and to the replication stream alike) and reads them back with [`decode_state`].
#![forbid(unsafe_code)]

use crate::bucket::State;
use crate::number::{parse_f64, parse_i64};

/// Largest magnitude of a token count stored as an integer literal (2^53: every integer below it is an exact
/// `f64`). Integral values below it are written as `"7"` or `"-7"` rather than `"7.0"`: shorter, and a listpack
/// stores them as integers.
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// Decodes the two stored fields; `None` if either is missing or not what [`with_encoded`] writes.
///
/// Any finite `tokens` is accepted, negative included: a bucket in debt after a reservation stores negative
/// tokens, and the core stays finite for every finite value (a hand-written `-1e300` is a very long debt).
pub fn decode_state(tokens: Option<&[u8]>, updated_us: Option<&[u8]>) -> Option<State> {
    let tokens = parse_f64(tokens?)?;
    let updated_us = parse_i64(updated_us?)?;
    (tokens.is_finite() && updated_us >= 0).then_some(State { tokens, updated_us })
}

/// Encodes a state to the bytes stored and replicated, without allocating, and hands them to `use_bytes` as
/// `(tokens, updated_us)`. `tokens` is the shortest text that parses back to the same `f64` (ryu), or an integer
/// literal when exact.
pub fn with_encoded<R>(state: &State, use_bytes: impl FnOnce(&[u8], &[u8]) -> R) -> R {
    let mut float_text = ryu::Buffer::new();
    let mut integer_text = itoa::Buffer::new();
    let mut updated_text = itoa::Buffer::new();
    // `abs`: a large negative integral value (`-1e300`) must not take the integer path, where `as` saturates.
    let tokens = if state.tokens.fract() == 0.0 && state.tokens.abs() < MAX_EXACT_INTEGER {
        // Lossless: an integral f64 of magnitude below 2^53 converts to i64 exactly.
        integer_text.format(state.tokens as i64)
    } else {
        float_text.format(state.tokens)
    };
    use_bytes(
        tokens.as_bytes(),
        updated_text.format(state.updated_us).as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(state: State) -> Option<State> {
        with_encoded(&state, |tokens, updated_us| {
            decode_state(Some(tokens), Some(updated_us))
        })
    }

    #[test]
    fn integral_tokens_are_stored_as_integers() {
        let state = State {
            tokens: 7.0,
            updated_us: 1_700_000_000_000_000,
        };
        with_encoded(&state, |tokens, updated_us| {
            assert_eq!((tokens, updated_us), (&b"7"[..], &b"1700000000000000"[..]));
        });
        let fractional = State {
            tokens: 0.1,
            updated_us: 0,
        };
        with_encoded(&fractional, |tokens, _| assert_eq!(tokens, b"0.1"));
    }

    #[test]
    fn decode_refuses_what_we_never_write() {
        for (tokens, updated) in [
            ("abc", "5"),
            ("inf", "5"),
            ("-inf", "5"),
            ("NaN", "5"),
            ("1e400", "5"),
            ("-1e400", "5"),
            ("1", "x"),
            ("1", "1.5"),
            ("1", "-3"),
        ] {
            assert_eq!(
                decode_state(Some(tokens.as_bytes()), Some(updated.as_bytes())),
                None
            );
        }
        assert_eq!(decode_state(None, Some(b"1")), None);
        assert_eq!(decode_state(Some(b"1"), None), None);
    }

    #[test]
    fn negative_tokens_decode_as_debt() {
        // Issue #15: a reservation leaves the bucket in debt, stored as a plain negative decimal.
        for (text, tokens) in [
            ("-1", -1.0),
            ("-0.5", -0.5),
            ("-1e300", -1e300),
            ("-0", 0.0),
        ] {
            assert_eq!(
                decode_state(Some(text.as_bytes()), Some(b"5")),
                Some(State {
                    tokens,
                    updated_us: 5
                }),
                "{text}"
            );
        }
        let in_debt = State {
            tokens: -3.0,
            updated_us: 1,
        };
        with_encoded(&in_debt, |tokens, _| assert_eq!(tokens, b"-3"));
    }

    #[test]
    fn huge_integral_values_keep_every_digit() {
        // Beyond 2^53 an integral value takes the float path; `as i64` would saturate `-1e300` to i64::MIN.
        for tokens in [-1e300, 1e300, -f64::MAX, f64::MAX, -9_007_199_254_740_992.0] {
            let state = State {
                tokens,
                updated_us: 1,
            };
            assert_eq!(round_trip(state), Some(state), "{tokens}");
        }
    }

    proptest! {
        #[test]
        fn state_round_trips_exactly(tokens in 0.0f64..f64::MAX, updated_us in 0i64..i64::MAX) {
            let state = State { tokens, updated_us };
            prop_assert_eq!(round_trip(state), Some(state));
        }

        /// Every finite value, negative ones (debts) included, comes back bit for bit.
        #[test]
        fn any_finite_tokens_round_trip_bit_for_bit(bits in any::<u64>(), updated_us in 0i64..i64::MAX) {
            let tokens = f64::from_bits(bits);
            prop_assume!(tokens.is_finite() && tokens != 0.0);
            let back = round_trip(State { tokens, updated_us }).expect("finite tokens decode");
            prop_assert_eq!(back.tokens.to_bits(), tokens.to_bits());
            prop_assert_eq!(back.updated_us, updated_us);
        }

        #[test]
        fn negative_tokens_round_trip(tokens in -f64::MAX..0.0, updated_us in 0i64..i64::MAX) {
            let state = State { tokens, updated_us };
            prop_assert_eq!(round_trip(state), Some(state));
        }

        #[test]
        fn small_and_integral_debts_round_trip(tokens in 1u64..(1u64 << 53), scale in -20i32..20) {
            let state = State { tokens: -(tokens as f64) * 10f64.powi(scale), updated_us: 1 };
            prop_assert_eq!(round_trip(state), Some(state));
        }

        #[test]
        fn small_and_integral_tokens_round_trip(tokens in 0u64..(1u64 << 53), scale in -20i32..20) {
            let state = State { tokens: tokens as f64 * 10f64.powi(scale), updated_us: 1 };
            prop_assert_eq!(round_trip(state), Some(state));
        }
    }
}
