//! `acquire_each`: a case table at explicit instants, then properties against `acquire` and `acquire_all`.

use super::super::{acquire_all, Write};
use super::*;
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

fn cost(tokens: f64) -> Cost {
    Cost::new(tokens).expect("valid cost")
}

/// One bucket's reply as the command sends it: `[fits, remaining, retry_after_ms, reset_after_ms]`.
fn row(decision: &Decision) -> [i64; 4] {
    [
        i64::from(decision.allowed()),
        decision.remaining,
        decision.retry_after_ms,
        decision.reset_after_ms,
    ]
}

/// Stores what an answer writes, as the glue does.
fn apply(stored: &mut [Option<State>], each: &Each) {
    for (slot, decision) in stored.iter_mut().zip(&each.buckets) {
        if let Some(write) = decision.write {
            *slot = Some(write.state);
        }
    }
}

#[test]
#[rustfmt::skip]
fn each_case_table() {
    // Requests: 10/s, burst 3 (one per 100 ms). Bytes: 1,000/s, burst 2,000.
    let shapes = [params(10.0, 3.0), params(1_000.0, 2_000.0)];
    struct Case { num: u32, at_ms: i64, costs: [f64; 2], allowed: bool, limiting: usize, rows: [[i64; 4]; 2] }
    let cases = [
        Case { num: 0, at_ms: 0,   costs: [1.0, 1_500.0], allowed: true,  limiting: 0, rows: [[1, 2, 0, 100], [1, 500, 0, 1_500]] },
        // The bytes bucket is short: nothing is taken, and the requests bucket reports as it stands.
        Case { num: 1, at_ms: 0,   costs: [1.0, 1_000.0], allowed: false, limiting: 1, rows: [[1, 2, 0, 100], [0, 500, 500, 1_500]] },
        Case { num: 2, at_ms: 500, costs: [1.0, 1_000.0], allowed: true,  limiting: 1, rows: [[1, 2, 0, 100], [1, 0, 0, 2_000]] },
        // Costs of 0 report without taking, even from an empty bucket.
        Case { num: 3, at_ms: 500, costs: [0.0, 0.0],     allowed: true,  limiting: 1, rows: [[1, 2, 0, 100], [1, 0, 0, 2_000]] },
        Case { num: 4, at_ms: 500, costs: [4.0, 0.0],     allowed: false, limiting: 0, rows: [[0, 2, -1, 100], [1, 0, 0, 2_000]] },
        Case { num: 5, at_ms: 600, costs: [1.0, 2_500.0], allowed: false, limiting: 1, rows: [[1, 3, 0, 0], [0, 100, -1, 1_900]] },
        Case { num: 6, at_ms: 600, costs: [3.0, 100.0],   allowed: true,  limiting: 0, rows: [[1, 0, 0, 300], [1, 0, 0, 2_000]] },
        Case { num: 7, at_ms: 650, costs: [1.0, 1.0],     allowed: false, limiting: 0, rows: [[0, 0, 50, 250], [1, 50, 0, 1_950]] },
    ];
    let mut stored = [None, None];
    for case in &cases {
        let members: Vec<Member> = shapes.iter().zip(stored).zip(case.costs)
            .map(|((&params, stored), c)| Member { stored, params, cost: cost(c) })
            .collect();
        let each = acquire_each(&members, T0 + case.at_ms * 1_000);
        let rows: Vec<[i64; 4]> = each.buckets.iter().map(row).collect();
        assert_eq!((each.allowed(), each.limiting_index, rows), (case.allowed, case.limiting, case.rows.to_vec()),
                   "case {}", case.num);
        let takes = case.allowed && case.costs.iter().any(|&c| c > 0.0);
        assert_eq!(each.buckets.iter().any(|d| d.write.is_some()), takes, "case {}", case.num);
        apply(&mut stored, &each);
    }
}

#[test]
fn impossible_bucket_decides_before_a_longer_wait() {
    let drained = State {
        tokens: 0.0,
        updated_us: T0,
    };
    let members = [
        Member {
            stored: Some(drained),
            params: params(0.001, 10.0),
            cost: cost(1.0),
        },
        Member {
            stored: None,
            params: params(1.0, 2.0),
            cost: cost(3.0),
        },
    ];
    let each = acquire_each(&members, T0);
    assert_eq!(
        (each.outcome, each.limiting_index),
        (Outcome::Impossible, 1)
    );
    assert_eq!(each.buckets[0].retry_after_ms, 1_000_000);
    assert_eq!(each.largest_cost_taken(&members), 0.0);
}

#[test]
fn bucket_in_debt_denies_a_cost_but_answers_a_peek() {
    let in_debt = State {
        tokens: -2.0,
        updated_us: T0,
    };
    let p = params(10.0, 5.0);
    let peek = acquire_each(
        &[Member {
            stored: Some(in_debt),
            params: p,
            cost: cost(0.0),
        }],
        T0,
    );
    assert!(peek.allowed());
    assert_eq!(row(&peek.buckets[0]), [1, 0, 0, 700]);
    let take = acquire_each(
        &[Member {
            stored: Some(in_debt),
            params: p,
            cost: cost(1.0),
        }],
        T0,
    );
    assert_eq!(row(&take.buckets[0]), [0, 0, 300, 700]);
}

#[test]
fn largest_cost_taken_counts_a_grant_once() {
    let members = [
        Member {
            stored: None,
            params: params(1.0, 10.0),
            cost: cost(2.0),
        },
        Member {
            stored: None,
            params: params(1.0, 10.0),
            cost: cost(7.5),
        },
    ];
    let each = acquire_each(&members, T0);
    assert_eq!(each.largest_cost_taken(&members), 7.5);
    assert_eq!(acquire_each(&[], T0).limiting_index, 0);
}

fn arb_params() -> impl Strategy<Value = Params> {
    (1e-3f64..1e4, 1e-2f64..1e4).prop_map(|(rate, burst)| params(rate, burst))
}

/// A stored bucket between a debt of one burst and full, or missing.
fn arb_stored(p: Params) -> impl Strategy<Value = Option<State>> {
    let burst = p.burst();
    prop::option::of(
        (-1.0f64..=1.0, -2_000_000i64..2_000_000).prop_map(move |(frac, off)| State {
            tokens: burst * frac,
            updated_us: T0 + off,
        }),
    )
}

/// A cost for a bucket of `burst`: 0 (a report), within the burst, or beyond it.
fn arb_cost(burst: f64) -> impl Strategy<Value = f64> {
    prop_oneof![1 => Just(0.0), 6 => 0.0..=burst, 1 => burst..burst * 2.0]
}

/// 1 to 5 buckets as they might be stored, each with its own cost.
fn arb_members() -> impl Strategy<Value = Vec<Member>> {
    prop::collection::vec(
        arb_params().prop_flat_map(|p| (Just(p), arb_stored(p), arb_cost(p.burst()))),
        1..6,
    )
    .prop_map(|buckets| {
        buckets
            .into_iter()
            .map(|(params, stored, c)| Member {
                stored,
                params,
                cost: cost(c),
            })
            .collect()
    })
}

/// A history over 1 to 3 bucket shapes: per step a gap and a cost fraction per bucket (of 1.2 bursts).
fn arb_each_history() -> impl Strategy<Value = (Vec<Params>, Vec<(i64, Vec<f64>)>)> {
    prop::collection::vec(arb_params(), 1..4).prop_flat_map(|ps| {
        let n = ps.len();
        let step = (
            0i64..1_000_000,
            prop::collection::vec(prop_oneof![1 => Just(0.0), 5 => 0.0f64..1.2], n),
        );
        (Just(ps), prop::collection::vec(step, 1..50))
    })
}

proptest! {
    /// With one cost for every bucket, the call decides and writes exactly what `acquire_all` does, and the
    /// combined reply fields are the per-bucket ones aggregated.
    #[test]
    fn one_cost_everywhere_is_acquire_all(members in arb_members(), now_off in -1_000_000i64..3_000_000,
                                          cost_frac in 0.0f64..1.2) {
        let smallest_burst = members.iter().map(|m| m.params.burst()).fold(f64::MAX, f64::min);
        let c = cost(smallest_burst * cost_frac);
        let members: Vec<Member> = members.into_iter().map(|m| Member { cost: c, ..m }).collect();
        let pairs: Vec<(Option<State>, Params)> = members.iter().map(|m| (m.stored, m.params)).collect();
        let now_us = T0 + now_off;
        let each = acquire_each(&members, now_us);
        let all = acquire_all(&pairs, now_us, c);
        prop_assert_eq!(each.outcome, all.outcome);
        prop_assert_eq!(each.limiting_index, all.limiting_index);
        let writes: Vec<Option<Write>> = each.buckets.iter().map(|d| d.write).collect();
        prop_assert_eq!(writes, all.writes);
        prop_assert_eq!(each.buckets.iter().map(|d| d.remaining).min(), Some(all.remaining));
        prop_assert_eq!(each.buckets.iter().map(|d| d.reset_after_ms).max(), Some(all.reset_after_ms));
        let limiting_retry = if each.allowed() { 0 } else { each.buckets[each.limiting_index].retry_after_ms };
        prop_assert_eq!(limiting_retry, all.retry_after_ms);
        let counted = if each.allowed() { c.tokens() } else { 0.0 };
        prop_assert_eq!(each.largest_cost_taken(&members), counted);
    }

    /// Each bucket's reply is what `acquire` says of that bucket alone at the same instant: its decision when the
    /// call is allowed; when refused, a peek for a bucket that fits and its own denial for one that does not.
    #[test]
    fn each_bucket_answers_as_acquire_alone(members in arb_members(), now_off in -1_000_000i64..3_000_000) {
        let now_us = T0 + now_off;
        let each = acquire_each(&members, now_us);
        prop_assert_eq!(each.buckets.len(), members.len());
        let alone: Vec<Decision> = members.iter().map(|m| acquire(m.stored, now_us, &m.params, m.cost)).collect();
        prop_assert_eq!(each.allowed(), alone.iter().all(Decision::allowed));
        for ((member, got), own) in members.iter().zip(&each.buckets).zip(&alone) {
            if each.allowed() {
                prop_assert_eq!(got, own);
            } else if own.allowed() {
                // Nothing taken: a peek, which writes only to record a new time base after a clock step back.
                let peek = acquire(member.stored, now_us, &member.params, cost(0.0));
                prop_assert_eq!(row(got), [1, peek.remaining, 0, peek.reset_after_ms]);
                prop_assert_eq!(got.write, peek.write);
            } else {
                prop_assert_eq!(got, own);
            }
            if !each.allowed() && member.stored.is_none_or(|state| state.updated_us <= now_us) {
                prop_assert_eq!(got.write, None);
            }
        }
    }

    /// All or nothing, and no bucket ever grants more than its burst plus its refill over any window.
    #[test]
    fn grants_never_exceed_burst_plus_refill((ps, steps) in arb_each_history()) {
        let mut stored: Vec<Option<State>> = vec![None; ps.len()];
        let mut granted: Vec<Vec<(i64, f64)>> = vec![Vec::new(); ps.len()];
        let mut now_us = T0;
        for (gap_us, fracs) in steps {
            now_us += gap_us;
            let members: Vec<Member> = ps.iter().zip(&stored).zip(&fracs)
                .map(|((&params, &stored), frac)| Member { stored, params, cost: cost(params.burst() * frac) })
                .collect();
            let each = acquire_each(&members, now_us);
            let wrote = each.buckets.iter().filter(|d| d.write.is_some()).count();
            let taking = members.iter().filter(|m| m.cost.tokens() > 0.0).count();
            prop_assert_eq!(wrote, if each.allowed() { taking } else { 0 });
            if each.allowed() {
                for (grants, member) in granted.iter_mut().zip(&members) {
                    grants.push((now_us, member.cost.tokens()));
                }
            }
            apply(&mut stored, &each);
            for state in stored.iter().flatten() {
                prop_assert!(state.tokens.is_finite() && state.tokens >= 0.0);
            }
        }
        for (p, grants) in ps.iter().zip(&granted) {
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
