//! Lowering: a case table at known instants, the floor's bound, then properties (never raises, lands on the
//! minimum, idempotent, finite at extreme parameters).

use super::*;
use crate::{acquire, charge, Cost, MAX_TTL_MS};
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000;
const MS: i64 = 1_000;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

fn floor(tokens: f64, p: &Params) -> Floor {
    Floor::new(tokens, p).expect("valid floor")
}

fn at(tokens: f64, updated_us: i64) -> State {
    State { tokens, updated_us }
}

fn fields(c: &Charge) -> (i64, i64, i64) {
    (c.remaining, c.retry_after_ms, c.reset_after_ms)
}

#[test]
#[rustfmt::skip]
fn lower_case_table() {
    // rate 10/s, burst 5: one token per 100 ms. Each row lowers the bucket `before` (stored at T0, None: missing)
    // at T0 + at_ms. Replies are (remaining, retry_after_ms, reset_after_ms).
    let p = params(10.0, 5.0);
    struct Case { num: u32, before: Option<f64>, at_ms: i64, tokens: f64, reply: (i64, i64, i64), tokens_after: Option<f64> }
    let cases = [
        // A missing bucket is full: lowered to 2, it is written with 2 (full again in 300 ms).
        Case { num: 0,  before: None,       at_ms: 0,   tokens: 2.0,   reply: (2, 0, 300),     tokens_after: Some(2.0) },
        // A floor at or above the burst lowers nothing, and writes nothing.
        Case { num: 1,  before: None,       at_ms: 0,   tokens: 5.0,   reply: (5, 0, 0),       tokens_after: None },
        Case { num: 2,  before: None,       at_ms: 0,   tokens: 1e300, reply: (5, 0, 0),       tokens_after: None },
        // Never raises: a bucket holding 1 is left at 1 by a floor of 3.
        Case { num: 3,  before: Some(1.0),  at_ms: 0,   tokens: 3.0,   reply: (1, 0, 400),     tokens_after: None },
        // Exactly at the floor: nothing to do.
        Case { num: 4,  before: Some(3.0),  at_ms: 0,   tokens: 3.0,   reply: (3, 0, 200),     tokens_after: None },
        // The refill counts first: 1 token at T0 holds 3 at 200 ms, so a floor of 2 lowers it by one.
        Case { num: 5,  before: Some(1.0),  at_ms: 200, tokens: 2.0,   reply: (2, 0, 300),     tokens_after: Some(2.0) },
        // ... and a floor of 4 at 200 ms (the bucket holds 3) changes nothing.
        Case { num: 6,  before: Some(1.0),  at_ms: 200, tokens: 4.0,   reply: (3, 0, 200),     tokens_after: None },
        // A negative floor puts the bucket in debt: one token back in 300 ms, full in 700 ms.
        Case { num: 7,  before: None,       at_ms: 0,   tokens: -2.0,  reply: (0, 300, 700),   tokens_after: Some(-2.0) },
        // A deeper debt than the floor is kept.
        Case { num: 8,  before: Some(-8.0), at_ms: 0,   tokens: -2.0,  reply: (0, 900, 1_300), tokens_after: None },
        // Zero empties the bucket; -0 is the same floor.
        Case { num: 9,  before: None,       at_ms: 0,   tokens: 0.0,   reply: (0, 100, 500),   tokens_after: Some(0.0) },
        Case { num: 10, before: None,       at_ms: 0,   tokens: -0.0,  reply: (0, 100, 500),   tokens_after: Some(0.0) },
        // Fractions stay: 2.5 tokens, 2 whole ones.
        Case { num: 11, before: None,       at_ms: 0,   tokens: 2.5,   reply: (2, 0, 250),     tokens_after: Some(2.5) },
    ];
    for case in cases {
        let stored = case.before.map(|tokens| at(tokens, T0));
        let now_us = T0 + case.at_ms * MS;
        let got = lower(stored, now_us, &p, floor(case.tokens, &p));
        assert_eq!(fields(&got), case.reply, "case {}", case.num);
        let written = got.write.map(|w| w.state);
        assert_eq!(written, case.tokens_after.map(|tokens| at(tokens, now_us)), "case {}", case.num);
        if let Some(write) = got.write {
            // Never `-0`, which would be stored as the text `-0`.
            assert!(write.state.tokens != 0.0 || write.state.tokens.is_sign_positive(), "case {}", case.num);
            // The key lasts until the bucket is full again, as every write's does.
            assert_eq!(write.expire_at_ms, now_us / MS + case.reply.2, "case {}", case.num);
        }
    }
}

#[test]
fn floor_bound_is_a_day_of_refill_exactly() {
    // rate 10/s: a day of refill is 864,000 tokens. The edge itself is a valid floor; anything below is refused.
    let p = params(10.0, 5.0);
    assert_eq!(
        Floor::new(-864_000.0, &p).map(|f| f.tokens()),
        Ok(-864_000.0)
    );
    assert_eq!(
        Floor::new(-(10.0 * 86_400.0), &p).map(|f| f.tokens()),
        Ok(-864_000.0)
    );
    assert_eq!(Floor::new(-864_000.000_001, &p), Err(ParamError::Floor));
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -f64::MAX] {
        assert_eq!(Floor::new(bad, &p), Err(ParamError::Floor), "{bad}");
    }
    assert_eq!(Floor::new(f64::MAX, &p).map(|f| f.tokens()), Ok(f64::MAX));
    // The edge lands on a full bucket: a day of debt, repaid a day later, and the key outlives it.
    let edge = lower(None, T0, &p, floor(-864_000.0, &p));
    assert_eq!(fields(&edge), (0, 86_400_100, 86_400_500));
    let write = edge.write.expect("lowered");
    assert_eq!(write.state, at(-864_000.0, T0));
    assert_eq!(write.expire_at_ms, T0 / MS + 86_400_500);
    // Where `rate · 86400` overflows, every finite floor is accepted (no debt can be deeper than `f64::MAX`).
    let huge = params(f64::MAX, 1.0);
    assert_eq!(
        Floor::new(-f64::MAX, &huge).map(|f| f.tokens()),
        Ok(-f64::MAX)
    );
}

#[test]
fn lower_after_a_clock_step_back_records_the_new_time_base() {
    // Stored at T0 with 1 token; the clock now reads 1 s earlier. The bucket keeps its token (no refill) and
    // refills from the new reading: a floor of 3 changes nothing but the time base, written once.
    let p = params(10.0, 5.0);
    let stored = Some(at(1.0, T0));
    let earlier = T0 - 1_000 * MS;
    let got = lower(stored, earlier, &p, floor(3.0, &p));
    assert_eq!(got.write.map(|w| w.state), Some(at(1.0, earlier)));
    // A floor below it lowers and writes at the new reading.
    let got = lower(stored, earlier, &p, floor(0.5, &p));
    assert_eq!(got.write.map(|w| w.state), Some(at(0.5, earlier)));
}

/// What a bucket holds at `now_us`, by the clock-step rule: a clock behind the stored time adds nothing and
/// refills from now on.
fn tokens_now(stored: Option<State>, now_us: i64, p: &Params) -> f64 {
    match stored {
        None => p.burst(),
        Some(state) if now_us < state.updated_us => state.tokens.min(p.burst()),
        Some(state) => state.tokens_at(now_us, p),
    }
}

fn arb_params() -> impl Strategy<Value = Params> {
    (1e-3f64..1e4, 1e-2f64..1e4).prop_map(|(rate, burst)| params(rate, burst))
}

/// A stored bucket between a debt of three bursts and full, written at T0.
fn arb_state(p: &Params) -> impl Strategy<Value = State> {
    let burst = p.burst();
    (-3.0f64..=1.0).prop_map(move |frac| at(burst * frac, T0))
}

/// A valid floor: from the day's debt bound to beyond the burst.
fn arb_floor(p: &Params) -> impl Strategy<Value = f64> {
    let (burst, bound) = (p.burst(), p.rate_per_sec() * 86_400.0);
    prop_oneof![
        (-3.0f64..=1.5).prop_map(move |frac| (burst * frac).max(-bound)),
        (-1.0f64..=0.0).prop_map(move |frac| bound * frac),
        Just(0.0),
        Just(-bound),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A lower leaves exactly `min(refilled, tokens)`: it never raises a bucket, writes only when it brings it
    /// down (or records a new time base after a clock step back), and a second lower with the same floor at the
    /// same instant, or any later one with a higher floor, changes nothing. Its `retry_after_ms` is exact for one
    /// token, as `acquire`'s is.
    #[test]
    fn lower_lands_on_the_minimum_and_is_idempotent(
        (p, state, tokens) in arb_params().prop_flat_map(|p| (Just(p), arb_state(&p), arb_floor(&p))),
        missing in any::<bool>(), now_off in -2_000_000i64..2_000_000, later_us in 0i64..5_000_000,
        higher in 0.0f64..10.0,
    ) {
        let stored = (!missing).then_some(state);
        let now_us = T0 + now_off;
        let current = tokens_now(stored, now_us, &p);
        let f = floor(tokens, &p);
        let got = lower(stored, now_us, &p, f);
        let after = got.write.map_or(stored, |w| Some(w.state));
        let lowered = tokens_now(after, now_us, &p);
        prop_assert!(lowered <= current, "raised {} -> {}", current, lowered);
        prop_assert_eq!(lowered, current.min(f.tokens()));
        if current > f.tokens() {
            prop_assert_eq!(got.write.map(|w| w.state), Some(at(f.tokens(), now_us)));
        } else {
            prop_assert_eq!(got.write, crate::rebased_write(stored, now_us, &p));
        }
        // Applying it twice is applying it once: same reply, nothing more written.
        let again = lower(after, now_us, &p, f);
        prop_assert_eq!(fields(&again), fields(&got));
        prop_assert_eq!(again.write, None);
        // Nor does a higher floor later raise it back.
        let later = now_us + later_us;
        let higher_floor = floor(f.tokens() + higher, &p);
        let raised = lower(after, later, &p, higher_floor);
        let after_raise = raised.write.map_or(after, |w| Some(w.state));
        prop_assert!(tokens_now(after_raise, later, &p) <= tokens_now(after, later, &p));
        // The reply is the bucket as it is left, and its wait for a token is exact.
        prop_assert_eq!(got.remaining, (lowered.floor().max(0.0)) as i64);
        if got.retry_after_ms > 0 {
            let one = |ms: i64| acquire(after, now_us + ms * MS, &p, Cost::new(1.0).expect("valid")).allowed();
            prop_assert!(one(got.retry_after_ms), "not allowed after {} ms", got.retry_after_ms);
            prop_assert!(!one(got.retry_after_ms - 1), "allowed 1 ms before {} ms", got.retry_after_ms);
        }
        prop_assert_eq!(got.retry_after_ms == -1, p.burst() < 1.0);
    }

    /// Lowering to what a charge leaves is the charge: from a bucket that holds at least the cost, `lower` to
    /// `refilled - cost` writes what `charge(cost)` writes. (The difference between the two is what happens when
    /// the bucket refilled meanwhile: a lower takes nothing twice.)
    #[test]
    fn lower_to_what_a_charge_leaves_writes_the_same(
        (p, state) in arb_params().prop_flat_map(|p| (Just(p), arb_state(&p))),
        now_off in 0i64..2_000_000, frac in 1e-6f64..1.0,
    ) {
        let now_us = T0 + now_off;
        let current = tokens_now(Some(state), now_us, &p);
        let c = p.burst() * frac;
        prop_assume!(current - c >= -p.rate_per_sec() * 86_400.0);
        let charged = charge(Some(state), now_us, &p, Cost::new(c).expect("valid")).expect("within a day");
        let lowered = lower(Some(state), now_us, &p, floor(current - c, &p));
        prop_assert_eq!(lowered, charged);
    }

    /// Whatever finite state is stored and however extreme the parameters, a lower answers with finite integers,
    /// and what it writes is finite, at most the burst, read back exactly, and answered finitely afterwards.
    #[test]
    fn lower_leaves_finite_state_at_extreme_parameters(
        token_bits in any::<u64>(), updated_us in 0i64..i64::MAX / 2,
        now_us in prop_oneof![Just(T0), 0i64..i64::MAX / 2],
        rate in prop_oneof![1e280f64..f64::MAX, 1e-300f64..1e-280, 1e-3f64..1e4, Just(f64::MAX), Just(1e300)],
        burst in prop_oneof![1e280f64..f64::MAX, 1e-3f64..1e4, Just(f64::MAX), Just(1e300)],
        frac in -1.0f64..=2.0,
    ) {
        let tokens = f64::from_bits(token_bits);
        prop_assume!(tokens.is_finite());
        let p = params(rate, burst);
        let bound = (rate * 86_400.0).min(f64::MAX);
        let f = Floor::new(if frac < 0.0 { bound * frac } else { (burst * frac).min(f64::MAX) }, &p);
        let Ok(f) = f else { return Ok(()) };
        let got = lower(Some(at(tokens, updated_us)), now_us, &p, f);
        prop_assert!(got.remaining >= 0 && got.retry_after_ms >= -1 && got.reset_after_ms >= 0);
        if let Some(write) = got.write {
            prop_assert!(write.state.tokens.is_finite() && write.state.tokens <= burst, "{:?}", write);
            prop_assert!(write.expire_at_ms <= now_us / MS + MAX_TTL_MS);
            // What is written is read back as it is: the module's codec round-trips every finite state bit for bit
            // (its own property tests), so the next call sees exactly this state.
            let read_back = Some(write.state);
            let again = lower(read_back, now_us + 1, &p, f);
            prop_assert!(again.remaining >= 0 && again.retry_after_ms >= -1 && again.reset_after_ms >= 0);
        }
    }
}
