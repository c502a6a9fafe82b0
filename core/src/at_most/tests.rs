//! `acquire_at_most`: a case table at explicit instants, then properties against `acquire`.

use super::super::acquire;
use super::*;
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

fn at_most(tokens: i64) -> AtMost {
    AtMost::new(tokens).expect("valid max")
}

/// The reply as the command sends it: `[granted, remaining, retry_after_ms, reset_after_ms]`.
fn reply(partial: &Partial) -> [i64; 4] {
    [
        partial.granted,
        partial.remaining,
        partial.retry_after_ms,
        partial.reset_after_ms,
    ]
}

#[test]
#[rustfmt::skip]
fn at_most_case_table() {
    // 10/s, burst 5: one token per 100 ms.
    let p = params(10.0, 5.0);
    struct Case { num: u32, at_ms: i64, max: i64, reply: [i64; 4] }
    let cases = [
        Case { num: 0, at_ms: 0,      max: 3,           reply: [3, 2, 0, 300] },
        Case { num: 1, at_ms: 0,      max: 10,          reply: [2, 0, 0, 500] },
        Case { num: 2, at_ms: 0,      max: 1,           reply: [0, 0, 100, 500] },
        Case { num: 3, at_ms: 50,     max: 1,           reply: [0, 0, 50, 450] },
        // 1.5 tokens: one whole token is granted, the half stays.
        Case { num: 4, at_ms: 150,    max: 4,           reply: [1, 0, 0, 450] },
        Case { num: 5, at_ms: 200,    max: 4,           reply: [1, 0, 0, 500] },
        Case { num: 6, at_ms: 10_000, max: MAX_AT_MOST, reply: [5, 0, 0, 500] },
    ];
    let mut stored = None;
    for case in &cases {
        let got = acquire_at_most(stored, T0 + case.at_ms * 1_000, &p, at_most(case.max));
        assert_eq!(reply(&got), case.reply, "case {}", case.num);
        assert_eq!(got.write.is_some(), got.granted > 0, "case {}", case.num);
        if let Some(write) = got.write {
            stored = Some(write.state);
        }
    }
}

#[test]
fn burst_below_one_token_never_grants() {
    let got = acquire_at_most(None, T0, &params(1.0, 0.5), at_most(1));
    assert_eq!(reply(&got), [0, 0, -1, 0]);
    assert_eq!((got.outcome(), got.write), (Outcome::Impossible, None));
}

#[test]
fn bucket_in_debt_holds_no_whole_token() {
    let in_debt = State {
        tokens: -2.0,
        updated_us: T0,
    };
    let got = acquire_at_most(Some(in_debt), T0, &params(10.0, 5.0), at_most(3));
    assert_eq!(reply(&got), [0, 0, 300, 700]);
    assert_eq!((got.outcome(), got.write), (Outcome::Denied, None));
}

#[test]
fn max_is_an_integer_from_one_to_two_to_the_53() {
    for bad in [0, -1, MAX_AT_MOST + 1, i64::MAX, i64::MIN] {
        assert_eq!(AtMost::new(bad), Err(ParamError::AtMost), "{bad}");
    }
    assert_eq!(AtMost::new(1).map(|m| m.tokens()), Ok(1));
    assert_eq!(
        AtMost::new(9_007_199_254_740_992).map(|m| m.tokens()),
        Ok(MAX_AT_MOST)
    );
}

#[test]
fn huge_burst_grants_at_most_max() {
    let got = acquire_at_most(None, T0, &params(1.0, 1e300), at_most(MAX_AT_MOST));
    assert_eq!((got.granted, got.remaining), (MAX_AT_MOST, i64::MAX));
    assert_eq!(got.outcome(), Outcome::Allowed);
}

fn arb_params() -> impl Strategy<Value = Params> {
    (1e-3f64..1e4, 1e-2f64..1e4).prop_map(|(rate, burst)| params(rate, burst))
}

fn arb_at_most() -> impl Strategy<Value = AtMost> {
    prop_oneof![1i64..20, 1i64..=MAX_AT_MOST].prop_map(at_most)
}

proptest! {
    /// A grant of `n` is `min(max, whole tokens)` and replies and writes exactly what `acquire` with cost `n`
    /// does; no grant replies as a peek, with a wait after which one whole token is there and not a millisecond
    /// before. Stored times ahead of the clock (a step back) included.
    #[test]
    fn grant_is_acquire_of_what_is_there(p in arb_params(), frac in -1.0f64..=1.0, stored_off in -2_000_000i64..2_000_000,
                                         missing in any::<bool>(), now_off in -1_000_000i64..3_000_000,
                                         max in arb_at_most()) {
        let stored = (!missing).then_some(State { tokens: p.burst() * frac, updated_us: T0 + stored_off });
        let now_us = T0 + now_off;
        let got = acquire_at_most(stored, now_us, &p, max);
        let peek = acquire(stored, now_us, &p, Cost(0.0));
        prop_assert_eq!(got.granted, peek.remaining.min(max.tokens()));
        if got.granted > 0 {
            let own = acquire(stored, now_us, &p, Cost(got.granted as f64));
            prop_assert!(own.allowed());
            prop_assert_eq!((got.remaining, got.retry_after_ms, got.reset_after_ms, got.write),
                            (own.remaining, 0, own.reset_after_ms, own.write));
        } else {
            // Nothing taken: written only to record a new time base, as a denial of one token would.
            let one = acquire(stored, now_us, &p, Cost(1.0));
            prop_assert_eq!((got.remaining, got.reset_after_ms, got.write), (0, peek.reset_after_ms, one.write));
            prop_assert_eq!(got.retry_after_ms, one.retry_after_ms);
            if got.retry_after_ms > 0 {
                // Exact against the bucket as this call left it (rebased to now after a clock step back).
                let left = got.write.map_or(stored, |write| Some(write.state));
                let at = |ms: i64| acquire_at_most(left, now_us + ms * 1_000, &p, max).granted;
                prop_assert!(at(got.retry_after_ms) >= 1);
                prop_assert_eq!(at(got.retry_after_ms - 1), 0);
            }
        }
    }

    /// Partial grants never take more than the burst plus the refill over any window.
    #[test]
    fn grants_never_exceed_burst_plus_refill(p in arb_params(),
                                             steps in prop::collection::vec((0i64..1_000_000, arb_at_most()), 1..60)) {
        let mut stored = None;
        let mut now_us = T0;
        let mut grants: Vec<(i64, f64)> = Vec::new();
        for (gap_us, max) in steps {
            now_us += gap_us;
            let got = acquire_at_most(stored, now_us, &p, max);
            prop_assert!(got.granted <= max.tokens());
            if let Some(write) = got.write {
                prop_assert!(write.state.tokens >= 0.0 && write.state.tokens <= p.burst());
                stored = Some(write.state);
                grants.push((now_us, got.granted as f64));
            }
        }
        for i in 0..grants.len() {
            let mut sum = 0.0;
            for grant in &grants[i..] {
                sum += grant.1;
                let bound = p.burst() + p.rate_per_sec() * (grant.0 - grants[i].0) as f64 / 1e6;
                prop_assert!(sum <= bound * (1.0 + 1e-9) + 1e-9, "{} > {}", sum, bound);
            }
        }
    }
}
