//! Charges and blocks: case tables at known instants, then properties (the bound on grants with charges in the
//! mix, finite answers at extreme parameters).

use super::*;
use crate::{
    acquire, acquire_all, refund, reserve, Amount, KeyChange, MaxWait, Outcome, MAX_TTL_MS,
};
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000;
const MS: i64 = 1_000;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

fn cost(tokens: f64) -> Cost {
    Cost::new(tokens).expect("valid cost")
}

fn block_ms(ms: i64) -> BlockMs {
    BlockMs::new(ms).expect("valid block")
}

fn max_wait(ms: i64) -> MaxWait {
    MaxWait::new(ms).expect("valid max_wait")
}

fn at(tokens: f64, updated_us: i64) -> State {
    State { tokens, updated_us }
}

/// The reply fields of a charge or block, for comparing rows.
fn fields(c: &Charge) -> (i64, i64, i64) {
    (c.remaining, c.retry_after_ms, c.reset_after_ms)
}

#[test]
fn block_ms_refuses_what_the_contract_does() {
    for bad in [0, -1, MAX_WAIT_LIMIT_MS + 1, i64::MIN, i64::MAX] {
        assert_eq!(BlockMs::new(bad), Err(ParamError::BlockMs));
    }
    assert_eq!(BlockMs::new(1).map(|b| b.ms()), Ok(1));
    assert_eq!(BlockMs::new(86_400_000).map(|b| b.ms()), Ok(86_400_000));
}

/// What one step of [`charge_case_table`] calls.
#[derive(Debug, Clone, Copy)]
enum Call {
    Charge(f64),
    Acquire(f64),
    Reserve(f64, i64),
    Refund(f64),
}

#[test]
#[rustfmt::skip]
fn charge_case_table() {
    // rate 10/s, burst 5: one token per 100 ms. Replies are (remaining, retry_after_ms, reset_after_ms); for
    // ACQUIRE and RESERVE the middle one is retry_after_ms / wait_ms, for REFUND it is 0.
    let p = params(10.0, 5.0);
    use Call::*;
    struct Case { num: u32, at_ms: i64, call: Call, ok: bool, reply: (i64, i64, i64), tokens_after: Option<f64> }
    let cases = [
        // A charge the bucket holds is just a take.
        Case { num: 0,  at_ms: 0,   call: Charge(2.0),        ok: true,  reply: (3, 0, 200),   tokens_after: Some(3.0) },
        // One it does not hold lands anyway: 2 tokens of debt, one token back in 300 ms, full in 700 ms.
        Case { num: 1,  at_ms: 0,   call: Charge(5.0),        ok: true,  reply: (0, 300, 700), tokens_after: Some(-2.0) },
        // A zero charge reports and changes nothing.
        Case { num: 2,  at_ms: 0,   call: Charge(0.0),        ok: true,  reply: (0, 300, 700), tokens_after: None },
        // ACQUIRE treats the debt as a reservation's: denied until debt (1 left) and cost are refilled.
        Case { num: 3,  at_ms: 100, call: Acquire(1.0),       ok: false, reply: (0, 200, 600), tokens_after: None },
        Case { num: 4,  at_ms: 100, call: Acquire(0.0),       ok: true,  reply: (0, 0, 600),   tokens_after: None },
        // RESERVE waits behind it, and takes its slot (debt 2 now).
        Case { num: 5,  at_ms: 100, call: Reserve(1.0, 1_000), ok: true, reply: (0, 200, 700), tokens_after: Some(-2.0) },
        // REFUND gives nothing back to a bucket in debt.
        Case { num: 6,  at_ms: 100, call: Refund(1.0),        ok: false, reply: (0, 0, 700),   tokens_after: None },
        // A charge above the burst lands too, as long as the debt stays within a day of refill.
        Case { num: 7,  at_ms: 100, call: Charge(8.0),        ok: true,  reply: (0, 1_100, 1_500), tokens_after: Some(-10.0) },
        // Once repaid, ACQUIRE is allowed again at the advertised instant and not a millisecond earlier.
        Case { num: 8,  at_ms: 1_199, call: Acquire(1.0),     ok: false, reply: (0, 1, 401),   tokens_after: None },
        Case { num: 9,  at_ms: 1_200, call: Acquire(1.0),     ok: true,  reply: (0, 0, 500),   tokens_after: Some(0.0) },
        // A refund out of debt works as before.
        Case { num: 10, at_ms: 1_200, call: Refund(1.0),      ok: true,  reply: (1, 0, 400),   tokens_after: Some(1.0) },
    ];
    let mut stored: Option<State> = None;
    for case in cases {
        let now_us = T0 + case.at_ms * MS;
        let (ok, reply, write) = match case.call {
            Charge(c) => {
                let got = charge(stored, now_us, &p, cost(c)).expect("within the bound");
                (true, fields(&got), got.write)
            }
            Acquire(c) => {
                let d = acquire(stored, now_us, &p, cost(c));
                (d.allowed(), (d.remaining, d.retry_after_ms, d.reset_after_ms), d.write)
            }
            Reserve(c, limit) => {
                let r = reserve(stored, now_us, &p, cost(c), max_wait(limit));
                (r.granted(), (r.remaining, r.wait_ms, r.reset_after_ms), r.write)
            }
            Refund(a) => {
                let back = refund(stored, now_us, &p, Amount::new(a).expect("valid amount"));
                let write = match back.change {
                    KeyChange::Write(write) => Some(write),
                    KeyChange::Keep | KeyChange::Delete => None,
                };
                (back.refunded, (back.remaining, 0, back.reset_after_ms), write)
            }
        };
        assert_eq!((ok, reply), (case.ok, case.reply), "case {}", case.num);
        // Up to rounding: 1.1 s of refill at 10/s is not exactly 11 tokens in binary.
        let close = match (write.map(|w| w.state.tokens), case.tokens_after) {
            (Some(got), Some(expected)) => (got - expected).abs() <= 1e-9,
            (got, expected) => got.is_none() && expected.is_none(),
        };
        assert!(close, "case {}: wrote {:?}", case.num, write);
        if let Some(write) = write {
            assert_eq!(write.state.updated_us, now_us, "case {}", case.num);
            stored = Some(write.state);
        }
    }
}

#[test]
fn charge_bound_is_a_day_of_refill_exactly() {
    // rate 10/s: a day of refill is 864,000 tokens. From full (5), 864,005 lands exactly at the edge.
    let p = params(10.0, 5.0);
    let edge = charge(None, T0, &p, cost(864_005.0)).expect("the edge itself lands");
    let write = edge.write.expect("a charge above 0 writes");
    assert_eq!(write.state, at(-864_000.0, T0));
    assert_eq!(fields(&edge), (0, 86_400_100, 86_400_500));
    // The key outlives the debt: it expires when full, far below the 100-year cap.
    assert_eq!(write.expire_at_ms, T0 / MS + 86_400_500);
    // Beyond the edge, by any amount: refused, from the same full bucket and from the bucket at the edge.
    assert_eq!(charge(None, T0, &p, cost(864_005.5)), Err(DebtBeyondLimit));
    assert_eq!(
        charge(Some(write.state), T0, &p, cost(0.5)),
        Err(DebtBeyondLimit)
    );
    // A zero charge still reports, however deep the debt.
    assert_eq!(
        charge(Some(write.state), T0, &p, cost(0.0)).map(|c| (fields(&c), c.write)),
        Ok(((0, 86_400_100, 86_400_500), None))
    );
    // A millisecond of refill later, a millisecond's worth (0.01 token) fits again.
    assert!(charge(Some(write.state), T0 + MS, &p, cost(0.01)).is_ok());
    // A debt deeper than a day (hand-written, or from a writer with a higher rate) refuses every charge above 0.
    let deeper = at(-1e300, T0);
    assert_eq!(
        charge(Some(deeper), T0, &p, cost(1e-9)),
        Err(DebtBeyondLimit)
    );
}

#[test]
#[rustfmt::skip]
fn block_case_table() {
    // rate 10/s, burst 5. Each row blocks the bucket `before` (stored at T0) for `ms` at T0.
    let p = params(10.0, 5.0);
    struct Case { num: u32, before: Option<f64>, ms: i64, reply: (i64, i64, i64), tokens_after: Option<f64> }
    let cases = [
        // Missing (full), full, partial, empty: all become a debt of rate · ms; one token back at ms + 100.
        Case { num: 0, before: None,        ms: 1_000, reply: (0, 1_100, 1_500), tokens_after: Some(-10.0) },
        Case { num: 1, before: Some(5.0),   ms: 1_000, reply: (0, 1_100, 1_500), tokens_after: Some(-10.0) },
        Case { num: 2, before: Some(2.5),   ms: 500,   reply: (0, 600, 1_000),   tokens_after: Some(-5.0) },
        Case { num: 3, before: Some(0.0),   ms: 1,     reply: (0, 101, 501),     tokens_after: Some(-0.01) },
        // In debt for less than the block: the block wins.
        Case { num: 4, before: Some(-3.0),  ms: 1_000, reply: (0, 1_100, 1_500), tokens_after: Some(-10.0) },
        // In debt for longer (2 s): kept as it is, nothing written; the block never shortens a debt.
        Case { num: 5, before: Some(-20.0), ms: 1_000, reply: (0, 2_100, 2_500), tokens_after: None },
        // Exactly as deep: nothing to change either.
        Case { num: 6, before: Some(-10.0), ms: 1_000, reply: (0, 1_100, 1_500), tokens_after: None },
        // The longest block: a day.
        Case { num: 7, before: None, ms: 86_400_000, reply: (0, 86_400_100, 86_400_500), tokens_after: Some(-864_000.0) },
    ];
    for case in cases {
        let stored = case.before.map(|tokens| at(tokens, T0));
        let got = block(stored, T0, &p, block_ms(case.ms));
        assert_eq!(fields(&got), case.reply, "case {}", case.num);
        assert_eq!(got.write.map(|w| w.state.tokens), case.tokens_after, "case {}", case.num);
        let after = got.write.map_or(stored, |w| Some(w.state));
        // Every other command then sees the block (or the longer debt).
        let ends_ms = case.reply.1 - 100;
        let acquire_at = |ms: i64, c: f64| acquire(after, T0 + ms * MS, &p, cost(c));
        assert!(!acquire_at(ends_ms - 1, 1e-9).allowed(), "case {}", case.num);
        assert_eq!(acquire_at(ends_ms, 0.0).remaining, 0, "case {}", case.num);
        assert!(!acquire_at(case.reply.1 - 1, 1.0).allowed(), "case {}", case.num);
        assert!(acquire_at(case.reply.1, 1.0).allowed(), "case {}", case.num);
        let r = reserve(after, T0, &p, cost(1.0), max_wait(MAX_WAIT_LIMIT_MS));
        let within_a_day = case.reply.1 <= MAX_WAIT_LIMIT_MS;
        assert_eq!((r.granted(), r.wait_ms), (within_a_day, case.reply.1), "case {}", case.num);
        let back = refund(after, T0 + (ends_ms - 1) * MS, &p, Amount::new(5.0).expect("valid"));
        assert!(!back.refunded, "case {}", case.num);
    }
}

#[test]
fn block_written_state_expires_when_full_and_keeps_reserved_slots() {
    let p = params(10.0, 5.0);
    // Three reservations promised slots up to 300 ms out; a 100 ms block leaves them all in place.
    let mut stored = None;
    for _ in 0..8 {
        let r = reserve(stored, T0, &p, cost(1.0), max_wait(1_000));
        stored = r.write.map(|w| w.state);
    }
    assert_eq!(stored.map(|s| s.tokens), Some(-3.0));
    let kept = block(stored, T0, &p, block_ms(100));
    assert_eq!((kept.write, fields(&kept)), (None, (0, 400, 800)));
    // A 1 s block goes beyond them: written, and the key expires when the bucket is full again.
    let longer = block(stored, T0 + 50 * MS, &p, block_ms(1_000));
    let write = longer.write.expect("a deeper debt is written");
    assert_eq!(write.state, at(-10.0, T0 + 50 * MS));
    assert_eq!(write.expire_at_ms, T0 / MS + 50 + 1_500);
}

#[test]
fn burst_below_one_token_never_retries() {
    let p = params(10.0, 0.5);
    let c = charge(None, T0, &p, cost(0.25)).expect("lands");
    assert_eq!(fields(&c), (0, -1, 25));
    let b = block(None, T0, &p, block_ms(1_000));
    assert_eq!(fields(&b), (0, -1, 1_050));
}

#[test]
#[rustfmt::skip]
fn extreme_parameters_saturate_and_stay_finite() {
    let cases: [(f64, f64); 6] = [
        (1e300, 1e300), (f64::MAX, f64::MAX), (f64::MAX, 1.0), (1e-300, 1e300), (5e-324, 1.0), (1e305, 1e-3),
    ];
    for (rate, burst) in cases {
        let p = params(rate, burst);
        for stored in [None, Some(at(-f64::MAX, T0)), Some(at(f64::MAX, T0)), Some(at(0.0, T0))] {
            let b = block(stored, T0, &p, block_ms(MAX_WAIT_LIMIT_MS));
            let c = charge(stored, T0, &p, cost(burst));
            let huge = charge(stored, T0, &p, cost(f64::MAX));
            for got in [Ok(b), c, huge].into_iter().flatten() {
                assert!(got.remaining >= 0 && got.retry_after_ms >= -1 && got.reset_after_ms >= 0);
                if let Some(write) = got.write {
                    assert!(write.state.tokens.is_finite() && write.state.tokens <= burst, "{rate} {burst} {write:?}");
                    assert!(write.expire_at_ms <= T0 / MS + MAX_TTL_MS);
                }
            }
        }
    }
    // A block at a rate whose day of refill overflows saturates at the deepest finite debt.
    let b = block(None, T0, &params(f64::MAX, 1.0), block_ms(1_000));
    assert_eq!(b.write.map(|w| w.state.tokens), Some(-f64::MAX));
}

fn arb_params() -> impl Strategy<Value = Params> {
    (1e-3f64..1e4, 1e-2f64..1e4).prop_map(|(rate, burst)| params(rate, burst))
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

/// A stored bucket between a debt of three bursts and full, written at T0.
fn arb_state(p: &Params) -> impl Strategy<Value = State> {
    let burst = p.burst();
    (-3.0f64..=1.0).prop_map(move |frac| at(burst * frac, T0))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A charge takes exactly `cost` (from the refilled bucket, into debt if need be) or, beyond a day of refill,
    /// nothing; its `retry_after_ms` is exact for one token, as `acquire`'s is.
    #[test]
    fn charge_takes_exactly_cost_or_refuses(
        (p, state) in arb_params().prop_flat_map(|p| (Just(p), arb_state(&p))),
        missing in any::<bool>(), now_off in -2_000_000i64..2_000_000,
        c in prop_oneof![0.0f64..10.0, 0.0f64..1e8, 0.0f64..1e9],
    ) {
        let stored = (!missing).then_some(state);
        let now_us = T0 + now_off;
        let current = tokens_now(stored, now_us, &p);
        let rebase = crate::rebased_write(stored, now_us, &p);
        let limit = p.rate_per_sec() * 86_400.0;
        match charge(stored, now_us, &p, cost(c)) {
            Err(DebtBeyondLimit) => prop_assert!(current - c < -limit),
            Ok(got) => {
                prop_assert!(current - c >= -limit);
                if c > 0.0 {
                    let write = got.write.expect("a charge above 0 writes");
                    prop_assert_eq!(write.state, at(current - c, now_us));
                } else {
                    // A zero charge writes only to record a new time base after a clock step back.
                    prop_assert_eq!(got.write, rebase);
                }
                let after = got.write.map_or(stored, |w| Some(w.state));
                if got.retry_after_ms > 0 {
                    let one = |ms: i64| acquire(after, now_us + ms * MS, &p, cost(1.0)).allowed();
                    prop_assert!(one(got.retry_after_ms), "not allowed after {} ms", got.retry_after_ms);
                    prop_assert!(!one(got.retry_after_ms - 1), "allowed 1 ms before {} ms", got.retry_after_ms);
                }
                prop_assert_eq!(got.retry_after_ms == -1, p.burst() < 1.0);
            }
        }
    }

    /// A block leaves `min(current, -rate · ms)`: no call with a cost above 0 gets through before `ms` from now,
    /// the bucket is empty then (up to rounding) unless an older debt is longer, and a debt is never shortened.
    #[test]
    fn block_denies_until_it_ends_and_never_shortens_a_debt(
        (p, state) in arb_params().prop_flat_map(|p| (Just(p), arb_state(&p))),
        missing in any::<bool>(), now_off in -2_000_000i64..2_000_000,
        ms in prop_oneof![1i64..2_000, 1i64..=MAX_WAIT_LIMIT_MS], c_frac in 1e-9f64..=1.0,
    ) {
        let stored = (!missing).then_some(state);
        let now_us = T0 + now_off;
        let current = tokens_now(stored, now_us, &p);
        let rebase = crate::rebased_write(stored, now_us, &p);
        let got = block(stored, now_us, &p, block_ms(ms));
        let blocked = -(ms as f64 / 1e3 * p.rate_per_sec());
        let after = got.write.map_or(stored, |w| Some(w.state));
        prop_assert_eq!(tokens_now(after, now_us, &p), current.min(blocked));
        if current > blocked {
            prop_assert_eq!(got.write.map(|w| w.state), Some(at(blocked, now_us)));
        } else {
            // A longer debt is kept; written only to record a new time base after a clock step back.
            prop_assert_eq!(got.write, rebase);
        }
        let c = cost(p.burst() * c_frac);
        prop_assert!(!acquire(after, now_us + (ms - 1) * MS, &p, c).allowed());
        let r = reserve(after, now_us, &p, c, max_wait(MAX_WAIT_LIMIT_MS));
        prop_assert!(!r.granted() || r.wait_ms >= ms, "reserved a slot {} ms into a {} ms block", r.wait_ms, ms);
        if current > blocked {
            let write = got.write.expect("a block that deepens the debt writes");
            let at_end = write.state.tokens_at(write.state.updated_us + ms * MS, &p);
            prop_assert!(at_end.abs() <= -blocked * 1e-12, "{} tokens at the end", at_end);
        }
        prop_assert_eq!(got.remaining, 0);
    }
}

/// One step of a random history on one bucket.
#[derive(Debug, Clone)]
enum Step {
    Wait(i64),
    Acquire(f64),
    Reserve(f64, i64),
    /// Refund the latest grant not yet refunded, for its full cost.
    RefundLatest,
    /// Charge this fraction of the burst (above 1: more than the bucket can ever hold).
    Charge(f64),
    Block(i64),
}

fn arb_steps() -> impl Strategy<Value = (Params, Vec<Step>)> {
    let step = prop_oneof![
        3 => prop_oneof![Just(0i64), 0i64..300_000, 0i64..3_000_000].prop_map(Step::Wait),
        2 => (0.0f64..=1.1).prop_map(Step::Acquire),
        2 => ((0.0f64..=1.1), prop_oneof![Just(0i64), 0i64..3_000]).prop_map(|(f, w)| Step::Reserve(f, w)),
        1 => Just(Step::RefundLatest),
        2 => (0.0f64..=3.0).prop_map(Step::Charge),
        1 => (1i64..3_000).prop_map(Step::Block),
    ];
    (arb_params(), prop::collection::vec(step, 1..80))
}

/// Tokens taken, as the bound counts them.
#[derive(Debug, Clone, Copy)]
struct Taken {
    /// When the tokens are used: now for a take or a charge, after the wait for a reservation.
    act_us: i64,
    tokens: f64,
    /// For a charge: the part the bucket did not hold (it went into debt). 0 for grants.
    into_debt: f64,
    /// A charge rather than a grant (never refunded here).
    is_charge: bool,
    /// Refunded: not counted.
    refunded: bool,
    taken_us: i64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Grants of every kind (takes now, reservations at their act time) and charges together stay, over every
    /// interval `[s, s + t]`, within `burst + rate · (t + 1 ms)` plus what charges in the interval put into debt
    /// (a charge takes even what is not there) plus what late refunds gave back (see the same property without
    /// charges in `bucket/tests.rs`). Blocks take nothing and only lower the bound's use. The stored state stays
    /// finite and at most the burst throughout.
    #[test]
    fn grants_and_charges_never_exceed_burst_plus_refill_plus_debt((p, steps) in arb_steps()) {
        let mut stored: Option<State> = None;
        let mut now_us = T0;
        let mut taken: Vec<Taken> = Vec::new();
        let mut late_refunds: Vec<(i64, f64)> = Vec::new();
        let level = |stored: Option<State>, now_us: i64| {
            stored.map_or(p.burst(), |s: State| s.tokens_at(now_us.max(s.updated_us), &p))
        };
        for step in steps {
            let grant = |act_us, tokens| Taken { act_us, tokens, into_debt: 0.0, is_charge: false, refunded: false, taken_us: now_us };
            match step {
                Step::Wait(gap_us) => now_us += gap_us,
                Step::Acquire(frac) => {
                    let c = p.burst() * frac;
                    let d = acquire(stored, now_us, &p, cost(c));
                    if let Some(write) = d.write {
                        stored = Some(write.state);
                        taken.push(grant(now_us, c));
                    }
                }
                Step::Reserve(frac, limit) => {
                    let c = p.burst() * frac;
                    let r = reserve(stored, now_us, &p, cost(c), max_wait(limit));
                    if let Some(write) = r.write {
                        stored = Some(write.state);
                        taken.push(grant(now_us + r.wait_ms * MS, c));
                    }
                }
                Step::RefundLatest => {
                    let Some(i) = (0..taken.len()).rev().find(|&i| !taken[i].is_charge && !taken[i].refunded) else {
                        continue;
                    };
                    let before = level(stored, now_us);
                    let back = refund(stored, now_us, &p, Amount::new(taken[i].tokens).expect("valid"));
                    let after = match back.change {
                        KeyChange::Keep => before,
                        KeyChange::Delete => { stored = None; p.burst() }
                        KeyChange::Write(write) => { stored = Some(write.state); write.state.tokens }
                    };
                    if back.refunded {
                        taken[i].refunded = true;
                        if !(taken[i].taken_us == now_us && taken[i].act_us == now_us) {
                            late_refunds.push((now_us, after - before));
                        }
                    }
                }
                Step::Charge(frac) => {
                    let c = p.burst() * frac;
                    let before = level(stored, now_us);
                    if let Ok(got) = charge(stored, now_us, &p, cost(c)) {
                        if let Some(write) = got.write {
                            stored = Some(write.state);
                            let held = before.clamp(0.0, c);
                            taken.push(Taken { act_us: now_us, tokens: c, into_debt: c - held, is_charge: true, refunded: false, taken_us: now_us });
                        }
                    }
                }
                Step::Block(ms) => {
                    let got = block(stored, now_us, &p, block_ms(ms));
                    prop_assert_eq!(got.remaining, 0);
                    if let Some(write) = got.write {
                        stored = Some(write.state);
                    }
                }
            }
            if let Some(state) = stored {
                prop_assert!(state.tokens <= p.burst() && state.tokens.is_finite(), "{:?}", state);
                prop_assert!(state.tokens >= -p.rate_per_sec() * 86_400.0);
            }
        }

        let mut counted: Vec<Taken> = taken.iter().copied().filter(|t| !t.refunded).collect();
        counted.sort_by_key(|t| t.act_us);
        let rate_per_us = p.rate_per_sec() / 1e6;
        for (i, first) in counted.iter().enumerate() {
            let (mut sum, mut into_debt) = (0.0, 0.0);
            for last in &counted[i..] {
                sum += last.tokens;
                into_debt += last.into_debt;
                let put_back: f64 = late_refunds
                    .iter()
                    .filter(|(at_us, _)| (first.act_us - MS..=last.act_us).contains(at_us))
                    .map(|(_, tokens)| tokens)
                    .sum();
                let bound = p.burst() + rate_per_us * (last.act_us - first.act_us + MS) as f64 + put_back + into_debt;
                prop_assert!(sum <= bound * (1.0 + 1e-9) + 1e-9,
                    "{} tokens in [{}, {}] µs, bound {}", sum, first.act_us - T0, last.act_us - T0, bound);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever finite state is stored and however extreme the parameters, charges and blocks answer with finite
    /// integers, and what they write is finite, at most the burst, stored and read back exactly, and answered
    /// finitely by every command.
    #[test]
    fn charges_and_blocks_leave_finite_state_every_command_reads(
        token_bits in any::<u64>(), updated_us in 0i64..i64::MAX / 2,
        now_us in prop_oneof![Just(T0), 0i64..i64::MAX / 2],
        rate in prop_oneof![1e280f64..f64::MAX, 1e-300f64..1e-280, 1e-3f64..1e4, Just(f64::MAX), Just(1e300)],
        burst in prop_oneof![1e280f64..f64::MAX, 1e-3f64..1e4, Just(f64::MAX), Just(1e300)],
        c in prop_oneof![0.0f64..1e4, 0.0f64..f64::MAX, Just(f64::MAX)],
        ms in prop_oneof![1i64..1_000, Just(MAX_WAIT_LIMIT_MS)],
    ) {
        let tokens = f64::from_bits(token_bits);
        prop_assume!(tokens.is_finite());
        let p = params(rate, burst);
        let stored = Some(at(tokens, updated_us));
        let b = block(stored, now_us, &p, block_ms(ms));
        let charged = charge(stored, now_us, &p, cost(c));
        for got in [Some(b), charged.ok()].into_iter().flatten() {
            prop_assert!(got.remaining >= 0 && got.retry_after_ms >= -1 && got.reset_after_ms >= 0);
            let Some(write) = got.write else { continue };
            prop_assert!(write.state.tokens.is_finite() && write.state.tokens <= burst, "{:?}", write);
            prop_assert!(write.expire_at_ms <= now_us / MS + MAX_TTL_MS);
            // What is written is read back as it is: the module's codec round-trips every finite state bit for bit
            // (its own property tests), so the next call sees exactly this state.
            let read_back = Some(write.state);
            let later = now_us + 1;
            let d = acquire(read_back, later, &p, cost(burst));
            prop_assert!(d.remaining >= 0 && d.retry_after_ms >= -1 && d.reset_after_ms >= 0);
            let r = reserve(read_back, later, &p, cost(burst), max_wait(MAX_WAIT_LIMIT_MS));
            prop_assert!(r.remaining >= 0 && r.wait_ms >= -1 && r.reset_after_ms >= 0);
            let back = refund(read_back, later, &p, Amount::new(burst).expect("valid"));
            prop_assert!(back.remaining >= 0 && back.reset_after_ms >= 0);
            let all = acquire_all(&[(read_back, p), (None, p)], later, cost(burst));
            prop_assert!(all.outcome != Outcome::Impossible && all.reset_after_ms >= 0);
            let again = block(read_back, later, &p, block_ms(ms));
            prop_assert!(again.write.is_none_or(|w| w.state.tokens.is_finite()));
            if let Ok(more) = charge(read_back, later, &p, cost(c)) {
                prop_assert!(more.write.is_none_or(|w| w.state.tokens.is_finite()));
            }
        }
    }
}
