//! Example cases with explicit clocks, then properties over random histories.

use super::*;
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

fn cost(tokens: f64) -> Cost {
    Cost::new(tokens).expect("valid cost")
}

/// Replays calls `(offset_us, cost)` against one bucket, writing back what each decision asks for, as the glue
/// does. Returns every decision.
fn replay(p: &Params, calls: &[(i64, f64)]) -> Vec<Decision> {
    let mut stored: Option<State> = None;
    calls
        .iter()
        .map(|&(offset_us, c)| {
            let decision = acquire(stored, T0 + offset_us, p, cost(c));
            if let Some(write) = decision.write {
                stored = Some(write.state);
            }
            decision
        })
        .collect()
}

#[test]
#[rustfmt::skip]
fn rate_limits_case_table() {
    // rate 10/s, burst 3: one token per 100 ms.
    let p = params(10.0, 3.0);
    struct Case { num: u32, at_us: i64, cost: f64, allowed: bool, remaining: i64, retry_ms: i64, reset_ms: i64 }
    let cases = [
        Case { num: 0,  at_us: 0,         cost: 1.0, allowed: true,  remaining: 2, retry_ms: 0,   reset_ms: 100 },
        Case { num: 1,  at_us: 0,         cost: 1.0, allowed: true,  remaining: 1, retry_ms: 0,   reset_ms: 200 },
        Case { num: 2,  at_us: 0,         cost: 1.0, allowed: true,  remaining: 0, retry_ms: 0,   reset_ms: 300 },
        Case { num: 3,  at_us: 0,         cost: 1.0, allowed: false, remaining: 0, retry_ms: 100, reset_ms: 300 },
        Case { num: 4,  at_us: 50_000,    cost: 1.0, allowed: false, remaining: 0, retry_ms: 50,  reset_ms: 250 },
        Case { num: 5,  at_us: 100_000,   cost: 1.0, allowed: true,  remaining: 0, retry_ms: 0,   reset_ms: 300 },
        Case { num: 6,  at_us: 100_000,   cost: 0.0, allowed: true,  remaining: 0, retry_ms: 0,   reset_ms: 300 },
        Case { num: 7,  at_us: 100_000,   cost: 4.0, allowed: false, remaining: 0, retry_ms: -1,  reset_ms: 300 },
        Case { num: 8,  at_us: 250_000,   cost: 1.5, allowed: true,  remaining: 0, retry_ms: 0,   reset_ms: 300 },
        Case { num: 9,  at_us: 10_000_000, cost: 0.0, allowed: true, remaining: 3, retry_ms: 0,   reset_ms: 0 },
        Case { num: 10, at_us: 10_000_000, cost: 3.0, allowed: true, remaining: 0, retry_ms: 0,   reset_ms: 300 },
    ];
    let calls: Vec<(i64, f64)> = cases.iter().map(|c| (c.at_us, c.cost)).collect();
    for (case, got) in cases.iter().zip(replay(&p, &calls)) {
        assert_eq!(
            (got.allowed(), got.remaining, got.retry_after_ms, got.reset_after_ms),
            (case.allowed, case.remaining, case.retry_ms, case.reset_ms),
            "case {}", case.num
        );
    }
}

#[test]
fn missing_bucket_is_full() {
    let d = acquire(None, T0, &params(1.0, 5.0), cost(0.0));
    assert_eq!(
        (d.allowed(), d.remaining, d.reset_after_ms, d.write),
        (true, 5, 0, None)
    );
}

#[test]
fn allowed_write_expires_when_full_again() {
    let d = acquire(None, T0, &params(2.0, 10.0), cost(3.0));
    let write = d.write.expect("an allowed call writes");
    assert_eq!(
        write.state,
        State {
            tokens: 7.0,
            updated_us: T0
        }
    );
    // 3 tokens at 2/s: 1.5 s.
    assert_eq!(write.expire_at_ms, T0 / 1_000 + 1_500);
    assert_eq!(d.reset_after_ms, 1_500);
}

#[test]
fn denies_when_cost_exceeds_burst() {
    let d = acquire(None, T0, &params(1.0, 2.0), cost(2.5));
    assert_eq!(d.outcome, Outcome::Impossible);
    assert_eq!((d.retry_after_ms, d.remaining, d.write), (-1, 2, None));
}

#[test]
fn denied_call_writes_nothing() {
    let stored = State {
        tokens: 0.25,
        updated_us: T0,
    };
    let d = acquire(Some(stored), T0, &params(1.0, 2.0), cost(1.0));
    assert_eq!((d.outcome, d.write), (Outcome::Denied, None));
    assert_eq!(d.retry_after_ms, 750);
}

#[test]
fn smaller_burst_caps_stored_tokens() {
    let stored = State {
        tokens: 100.0,
        updated_us: T0,
    };
    let d = acquire(Some(stored), T0, &params(1.0, 10.0), cost(1.0));
    assert_eq!((d.allowed(), d.remaining), (true, 9));
}

#[test]
fn fractional_values_work() {
    let p = params(0.5, 1.5);
    let d = replay(&p, &[(0, 1.0), (0, 1.0), (1_000_000, 1.0)]);
    assert_eq!(
        d.iter().map(Decision::allowed).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(d[1].retry_after_ms, 1_000);
}

#[test]
#[rustfmt::skip]
fn extreme_values_saturate() {
    let cases: [(f64, f64, f64); 6] = [
        (1e-9, 1e15, 1e15), (1e12, 1e15, 1.0), (1e-9, 2.0, 2.0),
        (f64::MAX, f64::MAX, f64::MAX), (f64::MIN_POSITIVE, f64::MAX, 1.0), (5e-324, 1.0, 1.0),
    ];
    for (rate, burst, c) in cases {
        let p = params(rate, burst);
        let first = acquire(None, T0, &p, cost(c));
        assert!(first.allowed(), "{rate} {burst} {c}");
        let write = first.write.expect("allowed with cost > 0 writes");
        assert!(write.expire_at_ms <= T0 / 1_000 + MAX_TTL_MS);
        assert!(write.expire_at_ms >= T0 / 1_000);
        let second = acquire(Some(write.state), T0 + 1, &p, cost(burst));
        assert!(second.reset_after_ms >= 0 && second.retry_after_ms >= -1);
        assert!(second.remaining >= 0);
    }
}

#[test]
fn top_of_the_range_replies_are_true() {
    // rate 1e308/s, burst 1.7e308: the bucket fills in 1.7 s. Each reply and expiry is the true one; before,
    // `burst - tokens` and `cost - tokens` overflowed to infinity and saturated them.
    let p = params(1e308, 1.7e308);
    let c = cost(1.7e308);
    let limit = MaxWait::new(10_000).expect("valid");
    let first = reserve(None, T0, &p, c, limit);
    assert_eq!(
        (
            first.granted(),
            first.wait_ms,
            first.remaining,
            first.reset_after_ms
        ),
        (true, 0, 0, 1_700)
    );
    let write = first.write.expect("a grant writes");
    assert_eq!(write.expire_at_ms, T0 / 1_000 + 1_700);
    // Granted with a wait of 1.7 s: 1.7e308 in debt, full again after 3.4 s.
    let second = reserve(Some(write.state), T0, &p, c, limit);
    assert_eq!(
        (
            second.granted(),
            second.wait_ms,
            second.remaining,
            second.reset_after_ms
        ),
        (true, 1_700, 0, 3_400)
    );
    let write = second.write.expect("a grant writes");
    assert_eq!(write.state.tokens, -1.7e308);
    assert_eq!(write.expire_at_ms, T0 / 1_000 + 3_400);
    // A third would wait 3.4 s, but its debt (-3.4e308) does not fit a double: refused, with the true wait.
    let third = reserve(Some(write.state), T0, &p, c, limit);
    assert_eq!(
        (
            third.granted(),
            third.wait_ms,
            third.remaining,
            third.reset_after_ms,
            third.write
        ),
        (false, 3_400, 0, 3_400, None)
    );
    // 2.55 s on, the refill (2.55e308, beyond f64::MAX) is counted in units of the rate: 0.85e308 tokens
    // (`remaining` saturates), full 850 ms later (851: the doubles round the moment of full up by a microsecond).
    let later = acquire(Some(write.state), T0 + 2_550_000, &p, cost(0.0));
    assert_eq!((later.remaining, later.reset_after_ms), (i64::MAX, 851));
    let acquired = acquire(Some(write.state), T0, &p, cost(1.0));
    assert_eq!(
        (acquired.outcome, acquired.retry_after_ms),
        (Outcome::Denied, 1_701)
    );
}

#[test]
fn fast_reservations_share_whole_millisecond_slots() {
    // Above 1,000 tokens/s a slot is shorter than the reply's unit: waits round up to whole milliseconds, and
    // several reservations share one (docs/commands.md says so). Each still acts no earlier than its slot.
    let p = params(5_000.0, 1.0);
    let mut stored = None;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let r = reserve(
            stored,
            T0,
            &p,
            cost(1.0),
            MaxWait::new(1_000).expect("valid"),
        );
        assert!(r.granted());
        waits.push(r.wait_ms);
        stored = r.write.map(|w| w.state);
    }
    assert_eq!(waits, [0, 1, 1, 1, 1, 1, 2, 2]);
}

#[test]
fn params_refuse_bad_numbers() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(Params::new(bad, 1.0), Err(ParamError::Rate));
        assert_eq!(Params::new(1.0, bad), Err(ParamError::Burst));
    }
    for bad in [-1.0, -1e-300, f64::NAN, f64::INFINITY] {
        assert_eq!(Cost::new(bad), Err(ParamError::Cost));
    }
    assert_eq!(
        Cost::new(-0.0).map(|c| c.tokens().is_sign_positive()),
        Ok(true)
    );
}

fn arb_params() -> impl Strategy<Value = Params> {
    (1e-3f64..1e4, 1e-2f64..1e4).prop_map(|(rate, burst)| params(rate, burst))
}

fn arb_history() -> impl Strategy<Value = (Params, Vec<(i64, f64)>)> {
    arb_params().prop_flat_map(|p| {
        let step = (0i64..2_000_000, 0.0..=p.burst() * 1.2);
        (Just(p), prop::collection::vec(step, 1..60))
    })
}

/// A reply read back as a bucket: full again at its reset, and what it lacks falls to 0 then.
#[test]
fn a_reply_reads_back_as_the_bucket_that_answered() {
    let p = params(10.0, 5.0);
    let drained = replay(&p, &[(T0, 5.0)]);
    assert_eq!(drained[0].reset_after_ms, 500);
    let read = State::of_reply(drained[0].reset_after_ms, T0, &p);
    assert_eq!(read.tokens, 0.0);
    assert_eq!(read.tokens_at(T0 + 200_000, &p), 2.0);
    assert_eq!(read.tokens_at(T0 + 500_000, &p), 5.0);
    // Rounded up to a millisecond: at most rate · 1 ms short of the bucket, never above it.
    let d = acquire(None, T0, &p, cost(0.55));
    let read = State::of_reply(d.reset_after_ms, T0, &p);
    assert_eq!(d.reset_after_ms, 55);
    assert!((read.tokens - 4.45).abs() < 1e-12, "{read:?}");
    // A reset too far for any rate stays finite.
    let read = State::of_reply(i64::MAX, T0, &params(f64::MAX, 1.0));
    assert_eq!(read.tokens, -f64::MAX);
}

proptest! {
    #[test]
    fn tokens_stay_within_zero_and_burst((p, steps) in arb_history()) {
        let mut stored: Option<State> = None;
        let mut now_us = T0;
        for (gap_us, c) in steps {
            now_us += gap_us;
            let d = acquire(stored, now_us, &p, cost(c));
            if let Some(write) = d.write {
                prop_assert!(write.state.tokens >= 0.0 && write.state.tokens <= p.burst());
                stored = Some(write.state);
            }
        }
    }

    #[test]
    fn allowed_call_takes_exactly_cost(p in arb_params(), now_off in 0i64..5_000_000,
                                       frac in 0.0f64..1.0, state_frac in 0.0f64..=1.0) {
        let stored = State { tokens: p.burst() * state_frac, updated_us: T0 };
        let now_us = T0 + now_off;
        let before = stored.tokens_at(now_us, &p);
        let c = before * frac;
        let d = acquire(Some(stored), now_us, &p, cost(c));
        prop_assert!(d.allowed());
        if c > 0.0 {
            let write = d.write.expect("allowed with cost > 0 writes");
            prop_assert_eq!(write.state.tokens, before - c);
            prop_assert_eq!(write.state.updated_us, now_us);
        } else {
            prop_assert_eq!(d.write, None);
        }
    }

    #[test]
    fn waiting_never_lowers_tokens(p in arb_params(), at in -5_000_000i64..5_000_000,
                                   wait in 0i64..5_000_000, tokens_frac in 0.0f64..=1.0) {
        let state = State { tokens: p.burst() * tokens_frac, updated_us: T0 };
        prop_assert!(state.tokens_at(T0 + at + wait, &p) >= state.tokens_at(T0 + at, &p));
        let peek_now = acquire(Some(state), T0 + at, &p, cost(0.0));
        let peek_later = acquire(Some(state), T0 + at + wait, &p, cost(0.0));
        prop_assert!(peek_later.remaining >= peek_now.remaining);
        prop_assert!(peek_later.reset_after_ms <= peek_now.reset_after_ms);
    }

    #[test]
    fn retry_after_is_exact(p in arb_params(), state_seed in any::<u64>(),
                            now_off in -2_000_000i64..2_000_000, cost_frac in 0.0f64..=1.0) {
        let state = State {
            tokens: p.burst() * (state_seed % 1_000) as f64 / 2_000.0,
            updated_us: T0,
        };
        let now_us = T0 + now_off;
        let c = cost(p.burst() * cost_frac);
        let d = acquire(Some(state), now_us, &p, c);
        prop_assume!(d.outcome == Outcome::Denied);
        prop_assert!(d.retry_after_ms >= 1);
        // Exact against the bucket as this call left it (a clock behind the stored time rebases it).
        let after = d.write.map_or(state, |write| write.state);
        let at = |ms: i64| acquire(Some(after), now_us + ms * 1_000, &p, c);
        prop_assert!(at(d.retry_after_ms).allowed(), "not allowed after {} ms", d.retry_after_ms);
        prop_assert!(!at(d.retry_after_ms - 1).allowed(), "allowed 1 ms before {} ms", d.retry_after_ms);
    }

    #[test]
    fn denial_leaves_state_untouched(p in arb_params(), seed in any::<u64>(), extra in 0.0f64..1.0) {
        let state = State { tokens: p.burst() * (seed % 100) as f64 / 200.0, updated_us: T0 };
        let c = cost((state.tokens + extra * p.burst()).min(p.burst()));
        let d = acquire(Some(state), T0, &p, c);
        if !d.allowed() {
            prop_assert_eq!(d.write, None);
        }
    }

    #[test]
    fn grants_never_exceed_burst_plus_refill((p, steps) in arb_history()) {
        let mut stored: Option<State> = None;
        let mut now_us = T0;
        let mut grants: Vec<(i64, f64)> = Vec::new();
        for (gap_us, c) in steps {
            now_us += gap_us;
            let d = acquire(stored, now_us, &p, cost(c));
            if let Some(write) = d.write {
                stored = Some(write.state);
            }
            if d.allowed() {
                grants.push((now_us, c));
            }
        }
        // Every window [grants[i], grants[j]] granted at most burst + rate · (its length).
        for i in 0..grants.len() {
            let mut sum = 0.0;
            for j in i..grants.len() {
                sum += grants[j].1;
                let window_s = (grants[j].0 - grants[i].0) as f64 / 1e6;
                let bound = p.burst() + p.rate_per_sec() * window_s;
                prop_assert!(sum <= bound * (1.0 + 1e-9) + 1e-9, "{} > {}", sum, bound);
            }
        }
    }

    #[test]
    fn expiry_is_when_full(p in arb_params(), frac in 0.0f64..=1.0) {
        let c = cost(p.burst() * frac);
        let d = acquire(None, T0, &p, c);
        if let Some(write) = d.write {
            let full = write.state.tokens_at(write.expire_at_ms * 1_000, &p);
            prop_assert!(full >= p.burst());
            // And not a whole millisecond later than needed.
            let early = write.state.tokens_at((write.expire_at_ms - 1) * 1_000, &p);
            prop_assert!(early < p.burst());
        }
    }
}

#[test]
fn acquire_all_takes_from_every_bucket_or_none() {
    let user = params(10.0, 2.0);
    let tenant = params(100.0, 5.0);
    let mut stored = [None, None];
    let mut replies = Vec::new();
    for _ in 0..3 {
        let combined = acquire_all(&[(stored[0], user), (stored[1], tenant)], T0, cost(1.0));
        for (slot, write) in stored.iter_mut().zip(&combined.writes) {
            if let Some(write) = write {
                *slot = Some(write.state);
            }
        }
        replies.push(combined);
    }
    // Two pass; the third is refused by the user bucket (index 0), and the tenant keeps its 3 tokens.
    assert_eq!(replies[0].outcome, Outcome::Allowed);
    assert_eq!((replies[0].remaining, replies[0].limiting_index), (1, 0));
    assert_eq!(replies[1].outcome, Outcome::Allowed);
    let refused = &replies[2];
    assert_eq!(refused.outcome, Outcome::Denied);
    assert_eq!(
        (
            refused.remaining,
            refused.retry_after_ms,
            refused.limiting_index
        ),
        (0, 100, 0)
    );
    assert_eq!(refused.writes, [None, None]);
    assert_eq!(stored[1].map(|s| s.tokens), Some(3.0));
    assert_eq!(refused.reset_after_ms, 200);
}

#[test]
fn acquire_all_reports_impossible_and_longest_wait() {
    let a = params(1.0, 10.0);
    let b = params(1.0, 2.0);
    let combined = acquire_all(&[(None, a), (None, b)], T0, cost(3.0));
    assert_eq!(
        (
            combined.outcome,
            combined.retry_after_ms,
            combined.limiting_index
        ),
        (Outcome::Impossible, -1, 1)
    );
    assert_eq!(combined.remaining, 2);
    let drained = State {
        tokens: 0.0,
        updated_us: T0,
    };
    let slow = params(0.5, 10.0);
    let combined = acquire_all(&[(Some(drained), a), (Some(drained), slow)], T0, cost(1.0));
    assert_eq!(
        (
            combined.outcome,
            combined.retry_after_ms,
            combined.limiting_index
        ),
        (Outcome::Denied, 2_000, 1)
    );
}

fn arb_multi_history() -> impl Strategy<Value = (Vec<Params>, Vec<(i64, f64)>)> {
    prop::collection::vec(arb_params(), 1..4).prop_flat_map(|ps| {
        let max_burst = ps.iter().map(Params::burst).fold(0.0, f64::max);
        let step = (0i64..1_000_000, 0.0..=max_burst);
        (Just(ps), prop::collection::vec(step, 1..50))
    })
}

proptest! {
    #[test]
    fn acquire_all_grants_equally_within_every_bound((ps, steps) in arb_multi_history()) {
        let mut stored: Vec<Option<State>> = vec![None; ps.len()];
        let mut now_us = T0;
        let mut grants: Vec<(i64, f64)> = Vec::new();
        for (gap_us, c) in steps {
            now_us += gap_us;
            let members: Vec<(Option<State>, Params)> = stored.iter().copied().zip(ps.iter().copied()).collect();
            let combined = acquire_all(&members, now_us, cost(c));
            let wrote = combined.writes.iter().filter(|w| w.is_some()).count();
            // All or nothing: every bucket writes (cost > 0 allowed) or none does.
            prop_assert!(wrote == 0 || wrote == ps.len());
            prop_assert_eq!(wrote == ps.len(), combined.outcome == Outcome::Allowed && c > 0.0);
            for (slot, write) in stored.iter_mut().zip(&combined.writes) {
                if let Some(write) = write {
                    *slot = Some(write.state);
                }
            }
            if combined.outcome == Outcome::Allowed {
                grants.push((now_us, c));
            }
            if combined.outcome == Outcome::Denied {
                let later = acquire_all(&members, now_us + combined.retry_after_ms * 1_000, cost(c));
                prop_assert_eq!(later.outcome, Outcome::Allowed);
                let earlier = acquire_all(&members, now_us + (combined.retry_after_ms - 1) * 1_000, cost(c));
                prop_assert_ne!(earlier.outcome, Outcome::Allowed);
            }
        }
        // Every bucket granted the same sequence, and none beyond its own burst + rate · t.
        for p in &ps {
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
}

/// Regression for issue #12 (overflow): with a huge finite rate, `elapsed_us · rate` overflowed to infinity before
/// the division to seconds and refilled a drained bucket at once.
#[test]
fn huge_rate_refills_only_what_elapsed_time_earned() {
    let p = params(1e303, 1e308);
    let drained = State {
        tokens: 0.0,
        updated_us: T0,
    };
    // 250 ms at 1e303/s earns 2.5e302 tokens, far below the burst.
    let earned = drained.tokens_at(T0 + 250_000, &p);
    assert!((earned - 2.5e302).abs() <= 2.5e302 * 1e-12, "{earned}");
    assert!(!acquire(Some(drained), T0 + 250_000, &p, cost(1e307)).allowed());
}

proptest! {
    /// However large the finite parameters, a drained bucket grants no more than elapsed time earned, and
    /// nothing the core computes is infinite or NaN.
    #[test]
    fn extreme_parameters_never_grant_unearned_tokens(
        rate in prop_oneof![1e280f64..f64::MAX, 1e-300f64..1e-280, 1e-3f64..1e4],
        burst in prop_oneof![1e280f64..f64::MAX, 1e-3f64..1e4],
        gap_us in prop_oneof![0i64..1_000, 0i64..10_000_000, 0i64..i64::MAX / 2],
        cost_frac in 0.0f64..=1.0,
    ) {
        let p = params(rate, burst);
        let drained = State { tokens: 0.0, updated_us: T0 };
        let now_us = T0 + gap_us;
        let c = burst * cost_frac;
        let d = acquire(Some(drained), now_us, &p, cost(c));
        let earned = gap_us as f64 / 1e6 * rate; // may be +inf: then every cost <= burst was earned
        if d.allowed() && c > 0.0 {
            prop_assert!(c <= earned * (1.0 + 1e-12), "granted {c} after earning {earned}");
            let write = d.write.expect("allowed with cost > 0 writes");
            prop_assert!(write.state.tokens.is_finite() && write.state.tokens >= 0.0);
        } else if c > 0.0 {
            prop_assert!(c >= earned.min(burst) * (1.0 - 1e-12), "denied {c} after earning {earned}");
        }
        prop_assert!(d.remaining >= 0 && d.reset_after_ms >= 0 && d.retry_after_ms >= -1);
    }
}

// ---- Issue #15: reservations (debt) and refunds ----

fn max_wait(ms: i64) -> MaxWait {
    MaxWait::new(ms).expect("valid max_wait")
}

fn amount(tokens: f64) -> Amount {
    Amount::new(tokens).expect("valid amount")
}

fn in_debt(tokens: f64) -> State {
    State {
        tokens,
        updated_us: T0,
    }
}

#[test]
fn pacing_params_refuse_bad_numbers() {
    assert_eq!(MaxWait::new(-1), Err(ParamError::MaxWait));
    assert_eq!(
        MaxWait::new(MAX_WAIT_LIMIT_MS + 1),
        Err(ParamError::MaxWait)
    );
    assert_eq!(MaxWait::new(i64::MAX), Err(ParamError::MaxWait));
    assert_eq!(MaxWait::new(0).map(|w| w.ms()), Ok(0));
    assert_eq!(
        MaxWait::new(MAX_WAIT_LIMIT_MS).map(|w| w.ms()),
        Ok(86_400_000)
    );
    for bad in [-1.0, -1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(Amount::new(bad), Err(ParamError::Amount));
    }
    assert_eq!(
        Amount::new(-0.0).map(|a| a.tokens().is_sign_positive()),
        Ok(true)
    );
}

/// What one step of [`pacing_case_table`] calls.
#[derive(Debug, Clone, Copy)]
enum Call {
    Acquire,
    Reserve(i64),
}

#[test]
#[rustfmt::skip]
fn pacing_case_table() {
    // rate 10/s, burst 2: one token per 100 ms. Five callers at once get slots 0, 0, 100, 200, 300 ms.
    let p = params(10.0, 2.0);
    struct Case { num: u32, at_us: i64, call: Call, cost: f64, granted: bool, wait_ms: i64, remaining: i64, reset_ms: i64, tokens_after: Option<f64> }
    use Call::*;
    let cases = [
        Case { num: 0,  at_us: 0,       call: Reserve(1_000), cost: 1.0, granted: true,  wait_ms: 0,   remaining: 1, reset_ms: 100, tokens_after: Some(1.0) },
        Case { num: 1,  at_us: 0,       call: Reserve(1_000), cost: 1.0, granted: true,  wait_ms: 0,   remaining: 0, reset_ms: 200, tokens_after: Some(0.0) },
        Case { num: 2,  at_us: 0,       call: Reserve(1_000), cost: 1.0, granted: true,  wait_ms: 100, remaining: 0, reset_ms: 300, tokens_after: Some(-1.0) },
        Case { num: 3,  at_us: 0,       call: Reserve(1_000), cost: 1.0, granted: true,  wait_ms: 200, remaining: 0, reset_ms: 400, tokens_after: Some(-2.0) },
        Case { num: 4,  at_us: 0,       call: Reserve(1_000), cost: 1.0, granted: true,  wait_ms: 300, remaining: 0, reset_ms: 500, tokens_after: Some(-3.0) },
        // Too long a wait: refused with the wait it would have needed, nothing written.
        Case { num: 5,  at_us: 0,       call: Reserve(399),   cost: 1.0, granted: false, wait_ms: 400, remaining: 0, reset_ms: 500, tokens_after: None },
        // ACQUIRE on a bucket in debt: denied until the debt (3) and the cost (1) are refilled.
        Case { num: 6,  at_us: 0,       call: Acquire,        cost: 1.0, granted: false, wait_ms: 400, remaining: 0, reset_ms: 500, tokens_after: None },
        // A peek on a bucket in debt: allowed, remaining 0, the reset counting the debt, nothing written.
        Case { num: 7,  at_us: 150_000, call: Acquire,        cost: 0.0, granted: true,  wait_ms: 0,   remaining: 0, reset_ms: 350, tokens_after: None },
        Case { num: 8,  at_us: 150_000, call: Reserve(1_000), cost: 0.0, granted: true,  wait_ms: 0,   remaining: 0, reset_ms: 350, tokens_after: None },
        Case { num: 9,  at_us: 150_000, call: Reserve(1_000), cost: 3.0, granted: false, wait_ms: -1,  remaining: 0, reset_ms: 350, tokens_after: None },
        Case { num: 10, at_us: 150_000, call: Reserve(1_000), cost: 0.5, granted: true,  wait_ms: 200, remaining: 0, reset_ms: 400, tokens_after: Some(-2.0) },
        Case { num: 11, at_us: 350_000, call: Acquire,        cost: 1.0, granted: false, wait_ms: 100, remaining: 0, reset_ms: 200, tokens_after: None },
        Case { num: 12, at_us: 450_000, call: Acquire,        cost: 1.0, granted: true,  wait_ms: 0,   remaining: 0, reset_ms: 200, tokens_after: Some(0.0) },
        // Back in credit, max_wait 0 is a plain ACQUIRE.
        Case { num: 13, at_us: 500_000, call: Reserve(0),     cost: 1.0, granted: false, wait_ms: 50,  remaining: 0, reset_ms: 150, tokens_after: None },
        Case { num: 14, at_us: 550_000, call: Reserve(0),     cost: 1.0, granted: true,  wait_ms: 0,   remaining: 0, reset_ms: 200, tokens_after: Some(0.0) },
    ];
    let mut stored: Option<State> = None;
    for case in &cases {
        let now_us = T0 + case.at_us;
        let (granted, wait_ms, remaining, reset_ms, write) = match case.call {
            Acquire => {
                let d = acquire(stored, now_us, &p, cost(case.cost));
                (d.allowed(), d.retry_after_ms, d.remaining, d.reset_after_ms, d.write)
            }
            Reserve(ms) => {
                let r = reserve(stored, now_us, &p, cost(case.cost), max_wait(ms));
                (r.granted(), r.wait_ms, r.remaining, r.reset_after_ms, r.write)
            }
        };
        assert_eq!(
            (granted, wait_ms, remaining, reset_ms, write.map(|w| w.state.tokens)),
            (case.granted, case.wait_ms, case.remaining, case.reset_ms, case.tokens_after),
            "case {}", case.num
        );
        if let Some(write) = write {
            assert_eq!(write.state.updated_us, now_us, "case {}", case.num);
            // The key expires when the bucket is full again, which with debt is later.
            assert_eq!(write.expire_at_ms, now_us / 1_000 + case.reset_ms, "case {}", case.num);
            stored = Some(write.state);
        }
    }
}

#[test]
fn acquire_all_waits_for_a_bucket_in_debt() {
    let user = params(10.0, 2.0);
    let tenant = params(100.0, 5.0);
    let combined = acquire_all(
        &[(None, tenant), (Some(in_debt(-2.0)), user)],
        T0,
        cost(1.0),
    );
    // The debt of 2 and the cost of 1 take 300 ms at 10/s; the full tenant bucket is reported as it stands.
    assert_eq!(
        (
            combined.outcome,
            combined.retry_after_ms,
            combined.limiting_index
        ),
        (Outcome::Denied, 300, 1)
    );
    assert_eq!((combined.remaining, combined.reset_after_ms), (0, 400));
    assert_eq!(combined.writes, [None, None]);
    let later = acquire_all(
        &[(None, tenant), (Some(in_debt(-2.0)), user)],
        T0 + 300_000,
        cost(1.0),
    );
    assert_eq!(later.outcome, Outcome::Allowed);
    let earlier = acquire_all(
        &[(None, tenant), (Some(in_debt(-2.0)), user)],
        T0 + 299_000,
        cost(1.0),
    );
    assert_eq!(earlier.outcome, Outcome::Denied);
}

/// What a refund case expects the glue to do with the key.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Keep,
    Write(f64),
    Delete,
}

#[test]
#[rustfmt::skip]
fn refund_case_table() {
    // rate 10/s, burst 3, every stored state written at T0, every refund 100 ms later (one token refilled).
    let p = params(10.0, 3.0);
    struct Case { num: u32, stored: Option<f64>, amount: f64, refunded: bool, remaining: i64, reset_ms: i64, change: Expect }
    let cases = [
        // A missing key is a full bucket: nothing to refund.
        Case { num: 0, stored: None,       amount: 1.0, refunded: false, remaining: 3, reset_ms: 0,   change: Expect::Keep },
        Case { num: 1, stored: Some(0.0),  amount: 1.0, refunded: true,  remaining: 2, reset_ms: 100, change: Expect::Write(2.0) },
        Case { num: 2, stored: Some(0.0),  amount: 0.5, refunded: true,  remaining: 1, reset_ms: 150, change: Expect::Write(1.5) },
        // Full again: the key is deleted, whether the amount fits exactly or overshoots the burst.
        Case { num: 3, stored: Some(0.0),  amount: 2.0, refunded: true,  remaining: 3, reset_ms: 0,   change: Expect::Delete },
        Case { num: 4, stored: Some(0.0),  amount: 9.0, refunded: true,  remaining: 3, reset_ms: 0,   change: Expect::Delete },
        // Amount 0 writes nothing.
        Case { num: 5, stored: Some(0.0),  amount: 0.0, refunded: false, remaining: 1, reset_ms: 200, change: Expect::Keep },
        // Already full (the key has not expired yet): nothing changes.
        Case { num: 6, stored: Some(2.5),  amount: 1.0, refunded: false, remaining: 3, reset_ms: 0,   change: Expect::Keep },
        // In debt after the refill: refunds nothing, so promised slots stay promised.
        Case { num: 7, stored: Some(-2.0), amount: 1.0, refunded: false, remaining: 0, reset_ms: 400, change: Expect::Keep },
        Case { num: 8, stored: Some(-2.0), amount: 9.0, refunded: false, remaining: 0, reset_ms: 400, change: Expect::Keep },
        // Exactly repaid (0 tokens): no longer in debt, so the refund goes through.
        Case { num: 9, stored: Some(-1.0), amount: 1.0, refunded: true,  remaining: 1, reset_ms: 200, change: Expect::Write(1.0) },
    ];
    let now_us = T0 + 100_000;
    for case in &cases {
        let stored = case.stored.map(in_debt);
        let got = refund(stored, now_us, &p, amount(case.amount));
        let change = match got.change {
            KeyChange::Keep => Expect::Keep,
            KeyChange::Delete => Expect::Delete,
            KeyChange::Write(write) => {
                assert_eq!(write.state.updated_us, now_us, "case {}", case.num);
                assert_eq!(write.expire_at_ms, now_us / 1_000 + case.reset_ms, "case {}", case.num);
                Expect::Write(write.state.tokens)
            }
        };
        assert_eq!(
            (got.refunded, got.remaining, got.reset_after_ms, change),
            (case.refunded, case.remaining, case.reset_ms, case.change),
            "case {}", case.num
        );
    }
}

#[test]
fn refund_cannot_shorten_a_debt() {
    // Issue #15: the tokens of a reservation made while in debt cannot be given back; the slot goes unused.
    let p = params(10.0, 1.0);
    let first = reserve(None, T0, &p, cost(1.0), max_wait(1_000));
    let second = reserve(
        first.write.map(|w| w.state),
        T0,
        &p,
        cost(1.0),
        max_wait(1_000),
    );
    assert_eq!((second.granted(), second.wait_ms), (true, 100));
    let in_debt = second.write.map(|w| w.state);
    let back = refund(in_debt, T0 + 50_000, &p, amount(1.0));
    assert_eq!(
        (back.refunded, back.remaining, back.change),
        (false, 0, KeyChange::Keep)
    );
    // Once the slot has passed and the debt is repaid, a refund goes through again.
    let back = refund(in_debt, T0 + 100_000, &p, amount(1.0));
    assert_eq!((back.refunded, back.change), (true, KeyChange::Delete));
}

#[test]
fn refund_soon_after_its_grant_keeps_the_bound() {
    // burst 1: take 0.5, give it back at once, then 1 token passes: never more than the burst at one instant.
    let p = params(1.0, 1.0);
    let taken = acquire(None, T0, &p, cost(0.5));
    let back = refund(taken.write.map(|w| w.state), T0, &p, amount(0.5));
    assert_eq!(back.change, KeyChange::Delete);
    assert!(acquire(None, T0, &p, cost(1.0)).allowed());
}

#[test]
fn refund_long_after_its_grant_can_exceed_the_bound() {
    // Documents the limit stated on `refund`: the core cannot tell how old the refunded grant is. burst 1, rate
    // 1/s: 0.5 at t=0; at 250 ms 0.75 is there and taken; a refund of the first 0.5 then lets 0.5 more through,
    // 1.25 tokens at one instant. Had the first grant never happened, the cap would have dropped 0.25 of refill
    // by 250 ms and the last call would have been denied: here the excess is 0.25.
    let p = params(1.0, 1.0);
    let first = acquire(None, T0, &p, cost(0.5));
    let at_us = T0 + 250_000;
    let second = acquire(first.write.map(|w| w.state), at_us, &p, cost(0.75));
    assert!(second.allowed());
    let back = refund(second.write.map(|w| w.state), at_us, &p, amount(0.5));
    assert!(back.refunded);
    let KeyChange::Write(write) = back.change else {
        panic!("a partial refund writes, got {:?}", back.change);
    };
    assert!(acquire(Some(write.state), at_us, &p, cost(0.5)).allowed());
    let never_first = acquire(None, at_us, &p, cost(0.75));
    assert!(!acquire(never_first.write.map(|w| w.state), at_us, &p, cost(0.5)).allowed());
}

/// A stored bucket between a debt of three bursts and full, written at T0.
fn arb_state(p: &Params) -> impl Strategy<Value = State> {
    let burst = p.burst();
    (-3.0f64..=1.0).prop_map(move |frac| State {
        tokens: burst * frac,
        updated_us: T0,
    })
}

fn arb_max_wait() -> impl Strategy<Value = MaxWait> {
    prop_oneof![Just(0), 0i64..2_000, 0i64..=MAX_WAIT_LIMIT_MS].prop_map(max_wait)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn max_wait_zero_is_exactly_acquire(
        (p, state) in arb_params().prop_flat_map(|p| (Just(p), arb_state(&p))),
        missing in any::<bool>(), now_off in -2_000_000i64..2_000_000, cost_frac in 0.0f64..=1.2,
    ) {
        let stored = (!missing).then_some(state);
        let now_us = T0 + now_off;
        let c = cost(p.burst() * cost_frac);
        let d = acquire(stored, now_us, &p, c);
        let r = reserve(stored, now_us, &p, c, max_wait(0));
        prop_assert_eq!(
            (r.outcome, r.wait_ms, r.remaining, r.reset_after_ms, r.write),
            (d.outcome, d.retry_after_ms, d.remaining, d.reset_after_ms, d.write)
        );
    }

    /// A reservation's wait is exact (an acquire is allowed after `wait_ms` and not 1 ms earlier), a grant takes
    /// exactly `cost` now, within `max_wait`, and a refusal writes nothing.
    #[test]
    fn reservation_wait_is_exact_and_bounded(
        (p, state) in arb_params().prop_flat_map(|p| (Just(p), arb_state(&p))),
        now_off in -2_000_000i64..2_000_000, cost_frac in 0.0f64..=1.0, limit in arb_max_wait(),
    ) {
        let now_us = T0 + now_off;
        let c = cost(p.burst() * cost_frac);
        let r = reserve(Some(state), now_us, &p, c, limit);
        // A clock behind the stored time keeps the stored tokens and refills from now.
        let current_tokens = if now_us < T0 { state.tokens.min(p.burst()) } else { state.tokens_at(now_us, &p) };
        let rebased = State { tokens: current_tokens, updated_us: now_us };
        if r.wait_ms > 0 {
            let at = |ms: i64| acquire(Some(rebased), now_us + ms * 1_000, &p, c);
            prop_assert!(at(r.wait_ms).allowed(), "not allowed after {} ms", r.wait_ms);
            prop_assert!(!at(r.wait_ms - 1).allowed(), "allowed 1 ms before {} ms", r.wait_ms);
        }
        prop_assert_eq!(r.granted(), r.wait_ms <= limit.ms());
        match r.write {
            Some(write) if !r.granted() || c.tokens() == 0.0 => {
                // Only the one write that records a new time base after the clock stepped back.
                prop_assert!(now_us < T0);
                prop_assert_eq!(write.state, rebased);
            }
            Some(write) => {
                // Now or in debt alike (`current ≥ cost` makes the difference ≥ 0, so acquire's clamp changes nothing).
                prop_assert_eq!(write.state.tokens, current_tokens - c.tokens());
                prop_assert_eq!(write.state.updated_us, now_us);
                // The debt is what the refill repays by the slot: at most rate · wait.
                let debt_bound = p.rate_per_sec() * r.wait_ms as f64 / 1e3;
                prop_assert!(-write.state.tokens <= debt_bound * (1.0 + 1e-9) + 1e-9);
                // The key expires when full, debt repaid, and not a whole millisecond later.
                prop_assert!(write.state.tokens_at(write.expire_at_ms * 1_000, &p) >= p.burst());
                prop_assert!(write.state.tokens_at((write.expire_at_ms - 1) * 1_000, &p) < p.burst());
            }
            None => prop_assert!((!r.granted() || c.tokens() == 0.0) && (now_us >= T0 || rebased.tokens >= p.burst())),
        }
        prop_assert!(r.remaining >= 0 && r.reset_after_ms >= 0 && r.wait_ms >= -1);
    }

    /// For every finite stored value, however extreme the parameters, no reply field or written state is
    /// infinite or NaN, written tokens never exceed the burst, and expiries stay within the 100-year cap.
    #[test]
    fn every_finite_state_gives_finite_answers(
        token_bits in any::<u64>(), updated_us in 0i64..i64::MAX,
        now_us in prop_oneof![Just(T0), 0i64..i64::MAX],
        rate in prop_oneof![1e280f64..f64::MAX, 1e-300f64..1e-280, 1e-3f64..1e4],
        burst in prop_oneof![1e280f64..f64::MAX, 1e-3f64..1e4],
        cost_frac in 0.0f64..=1.0, limit in arb_max_wait(), amount_tokens in prop_oneof![0.0f64..1e4, 0.0f64..f64::MAX],
    ) {
        let tokens = f64::from_bits(token_bits);
        prop_assume!(tokens.is_finite());
        let p = params(rate, burst);
        let stored = Some(State { tokens, updated_us });
        let c = cost(burst * cost_frac);
        let cap_ms = now_us / 1_000 + MAX_TTL_MS;
        let check_write = |write: &Write| -> Result<(), TestCaseError> {
            prop_assert!(write.state.tokens.is_finite() && write.state.tokens <= burst, "{:?}", write);
            prop_assert!(write.state.updated_us == now_us);
            prop_assert!(write.expire_at_ms <= cap_ms, "{:?}", write);
            Ok(())
        };

        let d = acquire(stored, now_us, &p, c);
        prop_assert!(d.remaining >= 0 && d.reset_after_ms >= 0 && d.retry_after_ms >= -1);
        if let Some(write) = &d.write {
            check_write(write)?;
        }
        let r = reserve(stored, now_us, &p, c, limit);
        prop_assert!(r.remaining >= 0 && r.reset_after_ms >= 0 && r.wait_ms >= -1);
        prop_assert!(!r.granted() || r.wait_ms <= limit.ms());
        if let Some(write) = &r.write {
            check_write(write)?;
        }
        let back = refund(stored, now_us, &p, amount(amount_tokens));
        prop_assert!(back.remaining >= 0 && back.reset_after_ms >= 0);
        prop_assert!(!back.refunded || back.change != KeyChange::Keep);
        if let KeyChange::Write(write) = &back.change {
            check_write(write)?;
            prop_assert!(write.state.tokens < burst);
            // A write that refunds nothing only records a new time base, tokens unchanged.
            prop_assert!(back.refunded || (now_us < updated_us && write.state.tokens == tokens));
            prop_assert!(!back.refunded || write.state.tokens >= 0.0);
        }
        let all = acquire_all(&[(stored, p), (None, p)], now_us, c);
        prop_assert!(all.remaining >= 0 && all.reset_after_ms >= 0 && all.retry_after_ms >= -1);
    }
}

/// One step of a random history on one bucket, for the pacing guarantee.
#[derive(Debug, Clone)]
enum Step {
    /// Advance the clock by this many microseconds.
    Wait(i64),
    /// `acquire` this fraction of the burst.
    Acquire(f64),
    /// `reserve` this fraction of the burst, waiting at most this long.
    Reserve(f64, MaxWait),
    /// Refund the grant at this index among those not yet refunded, for its full cost.
    Refund(prop::sample::Index),
    /// Refund the latest grant not yet refunded: often at the very instant it was granted.
    RefundLatest,
}

fn arb_steps() -> impl Strategy<Value = (Params, Vec<Step>)> {
    let step = prop_oneof![
        3 => prop_oneof![Just(0i64), 0i64..300_000, 0i64..3_000_000].prop_map(Step::Wait),
        2 => (0.0f64..=1.1).prop_map(Step::Acquire),
        4 => ((0.0f64..=1.1), arb_max_wait()).prop_map(|(frac, limit)| Step::Reserve(frac, limit)),
        1 => any::<prop::sample::Index>().prop_map(Step::Refund),
        1 => Just(Step::RefundLatest),
    ];
    (arb_params(), prop::collection::vec(step, 1..80))
}

/// A grant as the model counts it.
#[derive(Debug, Clone, Copy)]
struct Grant {
    /// When the call was made.
    taken_us: i64,
    /// When the caller acts: the grant's time plus its `wait_ms`.
    act_us: i64,
    tokens: f64,
    refunded: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The guarantee of issue #15. Count each grant at its act time and leave out the grants a successful refund
    /// gave back: over every interval `[s, s + t]`, the tokens granted stay within `burst + rate · (t + 1 ms)`,
    /// plus the tokens that *late* refunds put back into the bucket within 1 ms before or during the interval;
    /// and no caller waits longer than its `max_wait_ms`.
    ///
    /// The extra millisecond: a slot is rounded up to a whole millisecond, so a caller acts up to 1 ms after the
    /// refill has paid for it, and two slots can sit up to 1 ms closer than `cost / rate`.
    ///
    /// Late refunds: a refund at the very instant of an immediate grant (no clock step in between) undoes it
    /// exactly, and gets no allowance. Any other refund may hand back tokens that the refill, capped at burst,
    /// or another refund had already replaced: `refund` cannot tell how old the grant is. Such a refund can let
    /// through as much more as it put back, no less (`refund_long_after_its_grant_can_exceed_the_bound`, and the
    /// committed regression where one refund's cap absorbs another grant), so that is its allowance.
    #[test]
    fn paced_grants_never_exceed_burst_plus_refill((p, steps) in arb_steps()) {
        let mut stored: Option<State> = None;
        let mut now_us = T0;
        let mut grants: Vec<Grant> = Vec::new();
        // (time, tokens put back) of each successful late refund.
        let mut late_refunds: Vec<(i64, f64)> = Vec::new();
        for step in steps {
            match step {
                Step::Wait(gap_us) => now_us += gap_us,
                Step::Acquire(frac) => {
                    let c = p.burst() * frac;
                    let d = acquire(stored, now_us, &p, cost(c));
                    if let Some(write) = d.write {
                        stored = Some(write.state);
                    }
                    if d.allowed() && c > 0.0 {
                        grants.push(Grant { taken_us: now_us, act_us: now_us, tokens: c, refunded: false });
                    }
                }
                Step::Reserve(frac, limit) => {
                    let c = p.burst() * frac;
                    let r = reserve(stored, now_us, &p, cost(c), limit);
                    if let Some(write) = r.write {
                        stored = Some(write.state);
                    }
                    if r.granted() {
                        prop_assert!((0..=limit.ms()).contains(&r.wait_ms), "waited {} ms", r.wait_ms);
                        if c > 0.0 {
                            let act_us = now_us + r.wait_ms * 1_000;
                            grants.push(Grant { taken_us: now_us, act_us, tokens: c, refunded: false });
                        }
                    } else {
                        prop_assert_eq!(r.write, None);
                        prop_assert!(r.wait_ms == -1 || r.wait_ms > limit.ms());
                    }
                }
                Step::Refund(_) | Step::RefundLatest => {
                    let open: Vec<usize> = (0..grants.len()).filter(|&i| !grants[i].refunded).collect();
                    let pick = match &step {
                        Step::Refund(index) if !open.is_empty() => Some(open[index.index(open.len())]),
                        _ => open.last().copied(),
                    };
                    let Some(i) = pick else { continue };
                    let before = stored.map_or(p.burst(), |state| state.tokens_at(now_us.max(state.updated_us), &p));
                    let back = refund(stored, now_us, &p, amount(grants[i].tokens));
                    let after = match back.change {
                        KeyChange::Keep => {
                            prop_assert!(!back.refunded);
                            before
                        }
                        KeyChange::Delete => {
                            stored = None;
                            p.burst()
                        }
                        KeyChange::Write(write) => {
                            prop_assert!(write.state.tokens >= 0.0 && write.state.tokens < p.burst());
                            stored = Some(write.state);
                            write.state.tokens
                        }
                    };
                    // Up to one rounding of the burst: a deletion stands for `burst` exactly.
                    prop_assert!(after - before <= grants[i].tokens + p.burst() * f64::EPSILON);
                    if back.refunded {
                        grants[i].refunded = true;
                        let at_its_instant = grants[i].taken_us == now_us && grants[i].act_us == now_us;
                        if !at_its_instant {
                            late_refunds.push((now_us, after - before));
                        }
                    }
                }
            }
            if let Some(state) = stored {
                prop_assert!(state.tokens <= p.burst() && state.tokens.is_finite());
            }
        }

        let mut counted: Vec<Grant> = grants.iter().copied().filter(|g| !g.refunded).collect();
        counted.sort_by_key(|g| g.act_us);
        let rate_per_us = p.rate_per_sec() / 1e6;
        // Checking windows between act times suffices: the bound only grows as a window widens.
        for (i, first) in counted.iter().enumerate() {
            let mut sum = 0.0;
            for last in &counted[i..] {
                sum += last.tokens;
                let put_back: f64 = late_refunds
                    .iter()
                    .filter(|(at_us, _)| (first.act_us - 1_000..=last.act_us).contains(at_us))
                    .map(|(_, tokens)| tokens)
                    .sum();
                let bound = p.burst() + rate_per_us * (last.act_us - first.act_us + 1_000) as f64 + put_back;
                prop_assert!(sum <= bound * (1.0 + 1e-9) + 1e-9,
                    "{} tokens act in [{}, {}] µs, bound {}", sum, first.act_us - T0, last.act_us - T0, bound);
            }
        }
    }
}

/// The key's expiry as the glue keeps it: moved (to the end of the window) only when it falls outside the
/// window of the write. Returns the new expiry and whether it moved.
fn glue_expiry(current_ms: Option<i64>, write: &Write) -> (i64, bool) {
    if write.keeps_expiry(current_ms) {
        (current_ms.expect("kept"), false)
    } else {
        (write.new_expiry_ms(), true)
    }
}

#[test]
fn expiry_slack_is_one_percent_of_the_fill_time_within_bounds() {
    assert_eq!(expiry_slack_ms(&params(10.0, 20.0)), MIN_EXPIRY_SLACK_MS);
    // 1,000 s to fill: 10 s of slack.
    assert_eq!(expiry_slack_ms(&params(1.0, 1_000.0)), 10_000);
    assert_eq!(expiry_slack_ms(&params(1e-9, 1e15)), MAX_EXPIRY_SLACK_MS);
    assert_eq!(
        expiry_slack_ms(&params(f64::MIN_POSITIVE, f64::MAX)),
        MAX_EXPIRY_SLACK_MS
    );
}

/// Issue #13: a hot key drained at its rate moves its expiry about once per slack (1 s), not on every call.
#[test]
fn hot_key_moves_its_expiry_about_once_a_second() {
    let p = params(1_000.0, 50.0);
    let mut stored = None;
    let mut expiry_ms = None;
    let mut moves = 0;
    // 10 s of calls every 500 µs, each taking 1 token: twice the rate, so the bucket stays drained.
    for n in 0..20_000 {
        let d = acquire(stored, T0 + n * 500, &p, cost(1.0));
        if let Some(write) = d.write {
            let (at_ms, moved) = glue_expiry(expiry_ms, &write);
            moves += i32::from(moved);
            expiry_ms = Some(at_ms);
            stored = Some(write.state);
        }
    }
    assert!((9..=12).contains(&moves), "{moves} expiry moves in 10 s");
}

proptest! {
    /// With the glue's slack rule and the key really expiring at its expiry, the key never expires before its
    /// bucket is full, never outlives that moment by more than the slack, and grants stay within
    /// `burst + rate · t` over every window.
    #[test]
    fn expiry_window_never_expires_a_bucket_early((p, steps) in arb_history()) {
        let slack_ms = expiry_slack_ms(&p);
        let mut stored: Option<State> = None;
        let mut expiry_ms: Option<i64> = None;
        let mut now_us = T0;
        let mut grants: Vec<(i64, f64)> = Vec::new();
        for (gap_us, c) in steps {
            now_us += gap_us;
            if expiry_ms.is_some_and(|at_ms| at_ms * 1_000 <= now_us) {
                // The key expired: the bucket must have been full by then.
                let state = stored.expect("an expiry implies a bucket");
                prop_assert!(state.tokens_at(expiry_ms.expect("set") * 1_000, &p) >= p.burst());
                stored = None;
                expiry_ms = None;
            }
            let d = acquire(stored, now_us, &p, cost(c));
            if d.allowed() {
                grants.push((now_us, c));
            }
            if let Some(write) = d.write {
                let current = if stored.is_some() { expiry_ms } else { None };
                let (at_ms, _) = glue_expiry(current, &write);
                prop_assert!(at_ms >= write.expire_at_ms);
                prop_assert!(at_ms <= write.expire_at_ms + slack_ms);
                prop_assert!(write.state.tokens_at(at_ms * 1_000, &p) >= p.burst());
                expiry_ms = Some(at_ms);
                stored = Some(write.state);
            }
        }
        for i in 0..grants.len() {
            let mut sum = 0.0;
            for grant in &grants[i..] {
                sum += grant.1;
                let window_s = (grant.0 - grants[i].0) as f64 / 1e6;
                let bound = p.burst() + p.rate_per_sec() * window_s;
                prop_assert!(sum <= bound * (1.0 + 1e-9) + 1e-9, "{} > {}", sum, bound);
            }
        }
    }
}

proptest! {
    /// At the top of the range (rate and burst above 1e300, any finite debt down to `-f64::MAX`), waits and
    /// resets are the true ones: within a millisecond of `(target - tokens) / rate` computed term by term (which
    /// cannot overflow there), never saturated while that is below a day, exact against `tokens_at`, and the
    /// expiry follows the moment of full. A reservation is refused only when its wait exceeds `max_wait` or its
    /// debt would not fit a double.
    #[test]
    fn top_of_the_range_waits_and_resets_are_true(
        rate in 1e300f64..f64::MAX, burst in 1e300f64..f64::MAX, tokens_frac in -1.0f64..=1.0,
        cost_frac in 0.0f64..=1.0, now_off in 0i64..5_000_000, limit in arb_max_wait(),
    ) {
        let p = params(rate, burst);
        let tokens = if tokens_frac < 0.0 { tokens_frac * f64::MAX } else { tokens_frac * burst };
        let stored = State { tokens, updated_us: T0 };
        let now_us = T0 + now_off;
        let c = cost(burst * cost_frac);
        let current = stored.tokens_at(now_us, &p);
        prop_assert!(current.is_finite());
        let true_ms = |target: f64, from: f64| (target / rate - from / rate) * 1e3;
        let day_ms = 86_400_000.0;

        let d = acquire(Some(stored), now_us, &p, c);
        let left = if d.allowed() { current - c.tokens() } else { current };
        let full_ms = true_ms(burst, left);
        if full_ms < day_ms {
            prop_assert!((d.reset_after_ms as f64 - full_ms.max(0.0)).abs() <= 1.0, "{:?} vs {}", d, full_ms);
        }
        if d.outcome == Outcome::Denied {
            let wait_ms = true_ms(c.tokens(), current);
            if wait_ms < day_ms {
                prop_assert!((d.retry_after_ms as f64 - wait_ms).abs() <= 1.0, "{:?} vs {}", d, wait_ms);
            }
            let at = |ms: i64| acquire(Some(stored), now_us + ms * 1_000, &p, c).allowed();
            prop_assert!(at(d.retry_after_ms) && !at(d.retry_after_ms - 1));
        }
        if let Some(write) = d.write {
            prop_assert!(write.state.tokens_at(write.expire_at_ms * 1_000, &p) >= burst);
            prop_assert!(write.state.tokens_at((write.expire_at_ms - 1) * 1_000, &p) < burst);
        }

        let r = reserve(Some(stored), now_us, &p, c, limit);
        if r.outcome != Outcome::Impossible {
            let wait_ms = true_ms(c.tokens(), current).max(0.0);
            if wait_ms < day_ms {
                prop_assert!((r.wait_ms as f64 - wait_ms).abs() <= 1.0, "{:?} vs {}", r, wait_ms);
            }
            let fits = (current - c.tokens()).is_finite();
            prop_assert_eq!(r.granted(), r.wait_ms <= limit.ms() && (fits || r.wait_ms == 0));
        }
        if let Some(write) = r.write {
            prop_assert!(write.state.tokens.is_finite());
            prop_assert!(write.state.tokens_at(write.expire_at_ms * 1_000, &p) >= burst);
            prop_assert!(write.state.tokens_at((write.expire_at_ms - 1) * 1_000, &p) < burst);
        }
    }
}
