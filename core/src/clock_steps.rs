//! A clock that steps back (NTP, a corrected clock, a failover to a server whose clock is behind): case tables
//! with exact replies for steps of 1 ms, 1 hour and 10 years, before and after a drain, and a jump forward then
//! back; then properties over random histories with arbitrary backward steps.

use super::*;
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000;
const MS: i64 = 1_000;
const HOUR: i64 = 3_600_000_000;
const TEN_YEARS: i64 = 10 * 36_525 * 24 * HOUR / 100;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

fn cost(tokens: f64) -> Cost {
    Cost::new(tokens).expect("valid cost")
}

/// One call of a table: at `at_us` take `cost`; expect the reply and whether (and what) it writes.
struct Case {
    at_us: i64,
    cost: f64,
    reply: [i64; 4],
    /// The written `tokens`, or `None` for no write (its time is always `at_us`).
    writes: Option<f64>,
}

/// Replays `cases` on one bucket through [`acquire`], writing back as the glue does, and checks every reply, every
/// write, and that each write expires when its bucket is full again.
fn check(p: &Params, cases: &[Case], label: &str) {
    let mut stored: Option<State> = None;
    for (num, case) in cases.iter().enumerate() {
        let d = acquire(stored, case.at_us, p, cost(case.cost));
        let reply = [
            i64::from(d.allowed()),
            d.remaining,
            d.retry_after_ms,
            d.reset_after_ms,
        ];
        assert_eq!(reply, case.reply, "{label}: case {num}");
        let written = d.write.map(|write| {
            assert_eq!(write.state.updated_us, case.at_us, "{label}: case {num}");
            let full_us = write.state.updated_us
                + ((p.burst() - write.state.tokens) / p.rate_per_sec() * 1e6).ceil() as i64;
            assert_eq!(
                write.expire_at_ms,
                ceil_div(full_us, MS),
                "{label}: case {num}"
            );
            write.state.tokens
        });
        assert_eq!(written, case.writes, "{label}: case {num}");
        if let Some(write) = d.write {
            stored = Some(write.state);
        }
    }
}

#[test]
#[rustfmt::skip]
fn step_back_after_a_drain_costs_no_more_than_the_wait_it_interrupted() {
    // rate 10/s, burst 3: one token per 100 ms. Drained at T0, the clock then reads `step` earlier.
    // Measured from the drained state, a denial at T0 - step would answer `step + 100 ms`: an hour, or ten years.
    let p = params(10.0, 3.0);
    for (step, label) in [(MS, "1 ms"), (HOUR, "1 hour"), (TEN_YEARS, "10 years")] {
        let back = T0 - step;
        check(&p, &[
            Case { at_us: T0,              cost: 3.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
            Case { at_us: T0,              cost: 1.0, reply: [0, 0, 100, 300], writes: None },
            // The first call behind the stored time keeps the 0 tokens, refills from now, and records it.
            Case { at_us: back,            cost: 1.0, reply: [0, 0, 100, 300], writes: Some(0.0) },
            // Later denials write nothing again.
            Case { at_us: back + 50 * MS,  cost: 1.0, reply: [0, 0, 50, 250],  writes: None },
            Case { at_us: back + 50 * MS,  cost: 0.0, reply: [1, 0, 0, 250],   writes: None },
            Case { at_us: back + 100 * MS, cost: 1.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
            Case { at_us: back + 400 * MS, cost: 0.0, reply: [1, 3, 0, 0],     writes: None },
        ], label);
    }
}

#[test]
#[rustfmt::skip]
fn step_back_before_a_drain_keeps_the_tokens_and_mints_none() {
    // Two tokens left at T0; after the step they are still two, then the bucket drains and refills from the
    // new reading as usual.
    let p = params(10.0, 3.0);
    for (step, label) in [(MS, "1 ms"), (HOUR, "1 hour"), (TEN_YEARS, "10 years")] {
        let back = T0 - step;
        check(&p, &[
            Case { at_us: T0,              cost: 1.0, reply: [1, 2, 0, 100],   writes: Some(2.0) },
            // A peek behind the stored time sees the same two tokens, and records the new time base.
            Case { at_us: back,            cost: 0.0, reply: [1, 2, 0, 100],   writes: Some(2.0) },
            Case { at_us: back,            cost: 1.0, reply: [1, 1, 0, 200],   writes: Some(1.0) },
            Case { at_us: back,            cost: 1.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
            Case { at_us: back,            cost: 1.0, reply: [0, 0, 100, 300], writes: None },
            Case { at_us: back + 100 * MS, cost: 1.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
        ], label);
    }
}

#[test]
#[rustfmt::skip]
fn jump_forward_then_back_locks_nothing_out() {
    // The clock jumps 10 years ahead (refilling the bucket: a forward jump is time that passed, as far as any
    // clock can tell), a call drains the bucket there, then the clock is corrected to 1 s after T0. Before this
    // rule, that bucket stayed drained for ten years.
    let p = params(10.0, 3.0);
    let ahead = T0 + TEN_YEARS;
    let fixed = T0 + 1_000 * MS;
    check(&p, &[
        Case { at_us: T0,               cost: 3.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
        Case { at_us: ahead,            cost: 3.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
        Case { at_us: fixed,            cost: 1.0, reply: [0, 0, 100, 300], writes: Some(0.0) },
        Case { at_us: fixed + 100 * MS, cost: 1.0, reply: [1, 0, 0, 300],   writes: Some(0.0) },
    ], "forward then back");
}

#[test]
fn step_back_keeps_a_debt_and_a_full_bucket_needs_no_write() {
    let p = params(10.0, 3.0);
    // In debt by 2 tokens at T0: after a step back of an hour the debt is still there, so a reservation queues
    // behind it (wait 300 ms for 1 token) and nothing can be refunded.
    let in_debt = State {
        tokens: -2.0,
        updated_us: T0,
    };
    let back = T0 - HOUR;
    let r = reserve(
        Some(in_debt),
        back,
        &p,
        cost(1.0),
        MaxWait::new(1_000).expect("valid"),
    );
    assert_eq!((r.granted(), r.wait_ms, r.reset_after_ms), (true, 300, 600));
    assert_eq!(
        r.write.map(|w| (w.state.tokens, w.state.updated_us)),
        Some((-3.0, back))
    );
    let refused = reserve(
        Some(in_debt),
        back,
        &p,
        cost(1.0),
        MaxWait::new(10).expect("valid"),
    );
    assert_eq!((refused.granted(), refused.wait_ms), (false, 300));
    assert_eq!(
        refused.write.map(|w| w.state),
        Some(State {
            tokens: -2.0,
            updated_us: back
        })
    );
    let refunded = refund(Some(in_debt), back, &p, Amount::new(1.0).expect("valid"));
    assert!(!refunded.refunded);
    assert_eq!(
        refunded.change,
        KeyChange::Write(write_expiring(
            State {
                tokens: -2.0,
                updated_us: back
            },
            back + 500 * MS,
            back,
            &p
        ))
    );
    // A bucket holding its burst reads the same from any time base: no write.
    let full = State {
        tokens: 5.0,
        updated_us: T0,
    };
    let peek = acquire(Some(full), back, &p, cost(0.0));
    assert_eq!(
        (peek.remaining, peek.reset_after_ms, peek.write),
        (3, 0, None)
    );
    let impossible = acquire(Some(full), back, &p, cost(4.0));
    assert_eq!(
        (impossible.outcome, impossible.write),
        (Outcome::Impossible, None)
    );
}

#[test]
fn refused_acquire_all_records_the_time_base_of_each_bucket_behind_the_clock() {
    let p = params(10.0, 3.0);
    let back = T0 - HOUR;
    let behind = State {
        tokens: 1.0,
        updated_us: T0,
    };
    let current = State {
        tokens: 0.0,
        updated_us: back,
    };
    let all = acquire_all(
        &[(Some(behind), p), (Some(current), p), (None, p)],
        back,
        cost(1.0),
    );
    assert_eq!(
        (all.outcome, all.retry_after_ms, all.limiting_index),
        (Outcome::Denied, 100, 1)
    );
    let written: Vec<Option<State>> = all.writes.iter().map(|w| w.map(|w| w.state)).collect();
    assert_eq!(
        written,
        [
            Some(State {
                tokens: 1.0,
                updated_us: back
            }),
            None,
            None
        ]
    );
}

/// One step of a history whose clock may step back: real time passes, the clock steps back, a call.
#[derive(Debug, Clone)]
struct Move {
    /// Real microseconds that pass before the call.
    real_gap_us: i64,
    /// How far the clock steps back just before the call (0: no step).
    back_us: i64,
    /// The call: `acquire` (cost as a fraction of the burst) or, when `None`, a peek.
    cost_frac: Option<f64>,
}

fn arb_moves() -> impl Strategy<Value = (Params, Vec<Move>)> {
    let params = (1e-3f64..1e4, 1e-2f64..1e4).prop_map(|(rate, burst)| params(rate, burst));
    let back = prop_oneof![
        6 => Just(0i64),
        1 => 1i64..1_000,
        1 => 1i64..5_000_000,
        1 => 1i64..TEN_YEARS,
    ];
    let step = (
        prop_oneof![Just(0i64), 0i64..300_000, 0i64..5_000_000],
        back,
        prop::option::weighted(0.9, 0.0f64..=1.2),
    )
        .prop_map(|(real_gap_us, back_us, cost_frac)| Move {
            real_gap_us,
            back_us,
            cost_frac,
        });
    (params, prop::collection::vec(step, 1..60))
}

proptest! {
    /// Over real time, grants never exceed `burst + rate · t`, however often and however far the clock steps
    /// back; denials and peeks write only right after a step back, and at most once per step.
    #[test]
    fn grants_over_real_time_stay_within_the_bound_under_backward_steps((p, moves) in arb_moves()) {
        let mut stored: Option<State> = None;
        let mut real_us = T0;
        let mut offset_us = 0i64;
        let mut grants: Vec<(i64, f64)> = Vec::new();
        let mut steps = 0u32;
        let mut non_granting_writes = 0u32;
        for m in moves {
            real_us += m.real_gap_us;
            if m.back_us > 0 {
                offset_us += m.back_us;
                steps += 1;
            }
            let now_us = real_us - offset_us;
            let c = m.cost_frac.map_or(0.0, |frac| p.burst() * frac);
            let d = acquire(stored, now_us, &p, cost(c));
            if let Some(write) = d.write {
                if !(d.allowed() && c > 0.0) {
                    non_granting_writes += 1;
                    let behind = stored.is_some_and(|s| now_us < s.updated_us);
                    prop_assert!(behind, "a write without a grant while the clock was not behind");
                }
                stored = Some(write.state);
            }
            if d.allowed() && c > 0.0 {
                grants.push((real_us, c));
            }
        }
        prop_assert!(non_granting_writes <= steps);
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

    /// The size of a step back does not matter: every call behind the stored time answers as a call at the
    /// stored time itself would, and writes the same tokens.
    #[test]
    fn a_step_back_of_any_size_answers_as_at_the_last_write(
        rate in 1e-3f64..1e4, burst in 1e-2f64..1e4, tokens_frac in -2.0f64..=1.2,
        step_us in 1i64..TEN_YEARS, cost_frac in 0.0f64..=1.2,
    ) {
        let p = params(rate, burst);
        let stored = State { tokens: burst * tokens_frac, updated_us: T0 };
        let c = cost(burst * cost_frac);
        let at_write = acquire(Some(stored), T0, &p, c);
        let behind = acquire(Some(stored), T0 - step_us, &p, c);
        prop_assert_eq!(
            (behind.outcome, behind.remaining, behind.retry_after_ms, behind.reset_after_ms),
            (at_write.outcome, at_write.remaining, at_write.retry_after_ms, at_write.reset_after_ms)
        );
        prop_assert_eq!(behind.write.map(|w| w.state.tokens), at_write.write.map(|w| w.state.tokens).or(
            (stored.tokens < burst).then_some(stored.tokens)
        ));
    }
}
