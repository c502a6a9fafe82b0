//! Tests of the pure CL.THROTTLE core: redis-cell's own case table at controlled instants, the edges of its
//! arithmetic, and properties over the whole argument range.
use super::*;
use proptest::prelude::*;

const S: i128 = NS_PER_S;
const MS: i128 = NS_PER_MS;
/// 2030-01-01 00:00:00.123456789 UTC in ns: an instant with every sub-second digit set.
const START_NS: i64 = 1_893_456_000_123_456_789;

/// One call against a key whose TAT `store` holds, updated as the module would.
fn call(store: &mut Option<i64>, now_ns: i64, limit: &Limit, quantity: i64) -> Throttle {
    let quantity = Quantity::new(quantity).expect("valid quantity");
    let decision = throttle(*store, now_ns, limit, quantity).expect("in range");
    if let Some(write) = decision.write {
        *store = Some(write.tat_ns);
    }
    decision
}

fn at(offset_ms: i64) -> i64 {
    START_NS + offset_ms * 1_000_000
}

#[rustfmt::skip]
#[test]
fn follows_redis_cells_rate_limit_table() {
    // redis-cell's `it_rate_limits`: max_burst 4 (limit 5), one per second, one key, the clock set per case.
    let limit = Limit::new(4, 1, 1).expect("valid");
    let mut store = None;
    // (case, ms after the start, quantity, remaining, reset_after ns, retry_after ns, limited)
    let cases: [(u32, i64, i64, i64, i128, i128, bool); 15] = [
        // A request larger than the limit can never succeed.
        ( 0,    0, 6, 5, 0,          -S,         true),
        // Normal requests are limited once the burst is used.
        ( 1,    0, 1, 4, S,          -S,         false),
        ( 2,    0, 1, 3, 2 * S,      -S,         false),
        ( 3,    0, 1, 2, 3 * S,      -S,         false),
        ( 4,    0, 1, 1, 4 * S,      -S,         false),
        ( 5,    0, 1, 0, 5 * S,      -S,         false),
        ( 6,    0, 1, 0, 5 * S,      S,          true),
        ( 7, 3000, 1, 2, 3000 * MS,  -S,         false),
        ( 8, 3100, 1, 1, 3900 * MS,  -S,         false),
        ( 9, 4000, 1, 1, 4000 * MS,  -S,         false),
        (10, 8000, 1, 4, 1000 * MS,  -S,         false),
        (11, 9500, 1, 4, 1000 * MS,  -S,         false),
        // Quantity 0 peeks (and still writes).
        (12, 9500, 0, 4, S,          -S,         false),
        // A larger quantity uses more of the limit.
        (13, 9500, 2, 2, 3 * S,      -S,         false),
        // and cannot exceed it.
        (14, 9500, 5, 2, 3 * S,      3 * S,      true),
    ];
    for (case, offset_ms, quantity, remaining, reset_after_ns, retry_after_ns, limited) in cases {
        let decision = call(&mut store, at(offset_ms), &limit, quantity);
        assert_eq!(decision.limited, limited, "case {case}");
        assert_eq!(decision.limit, 5, "case {case}");
        assert_eq!(decision.remaining, remaining, "case {case}");
        assert_eq!(decision.reset_after_ns, reset_after_ns, "case {case}");
        assert_eq!(decision.retry_after_ns, retry_after_ns, "case {case}");
        assert_eq!(decision.write.is_some(), !limited, "case {case}");
    }
}

#[test]
fn waits_round_to_whole_seconds_as_redis_cell_does() {
    for (ns, seconds) in [
        (2 * S, 2),
        (2 * S + MS, 3),
        // Less than a millisecond past the second is dropped.
        (2 * S + MS - 1, 2),
        (4_000, 0),
        (0, 0),
        (-S, -1),
        (-S / 2, 0),
        (-3 * S / 2, -1),
        // Through f64, seconds + 0.999999999 rounds up to the next second past 2^24 s (194 days): redis-cell
        // then reads two seconds high, and so do we.
        ((1 << 23) * S + S - 1, (1 << 23) + 1),
        ((1 << 24) * S + S - 1, (1 << 24) + 2),
    ] {
        assert_eq!(whole_seconds_up(ns), seconds, "{ns} ns");
    }
}

#[test]
fn refuses_limits_it_cannot_compute() {
    assert_eq!(Limit::new(-1, 1, 1), Err(GcraError::MaxBurst));
    assert_eq!(Limit::new(i64::MAX, 1, 1), Err(GcraError::MaxBurst));
    assert_eq!(Limit::new(0, 0, 1), Err(GcraError::CountPerPeriod));
    assert_eq!(Limit::new(0, -5, 1), Err(GcraError::CountPerPeriod));
    assert_eq!(Limit::new(0, 1, 0), Err(GcraError::Period));
    assert_eq!(Limit::new(0, 1, -1), Err(GcraError::Period));
    // Two billion a second is under 1 ns apart: redis-cell's "zero rate".
    assert_eq!(
        Limit::new(0, 2_000_000_000, 1),
        Err(GcraError::IntervalUnderOneNs)
    );
    assert_eq!(Limit::new(0, 1, i64::MAX), Err(GcraError::ToleranceTooLong));
    // T fits, L * T does not.
    assert_eq!(
        Limit::new(300, 1, 86_400 * 365),
        Err(GcraError::ToleranceTooLong)
    );
    assert_eq!(Quantity::new(-1), Err(GcraError::Quantity));
    let limit = Limit::new(1_000_000_000, 1_000_000_000, 1).expect("1 ns apart");
    assert_eq!(
        (limit.limit(), limit.interval_ns(), limit.tolerance_ns()),
        (1_000_000_001, 1, 1_000_000_001)
    );
}

#[test]
fn divides_the_interval_in_f64_as_redis_cell_does() {
    // Up to period * 10^9 = 2^53 the f64 quotient truncates to the integer one.
    assert_eq!(
        Limit::new(0, 3, 1).expect("valid").interval_ns(),
        333_333_333
    );
    assert_eq!(
        Limit::new(0, 7, 86_400).expect("valid").interval_ns(),
        86_400_000_000_000 / 7
    );
    // Above, f64 rounding shows: 10^19 / 3 is not 3333333333333333333.
    let limit = Limit::new(0, 3, 10_000_000_000).expect("valid");
    assert_eq!(limit.interval_ns(), (1e19_f64 / 3.0) as i64);
    assert_ne!(limit.interval_ns(), 3_333_333_333_333_333_333);
}

#[test]
fn counts_remaining_over_whole_microseconds() {
    // T = 1/3 s: after one call, 2T is left, 666666 µs / 333333 µs = 2.000002 -> 2.
    let limit = Limit::new(2, 3, 1).expect("valid");
    let mut store = None;
    assert_eq!(
        call(&mut store, START_NS, &limit, 1).reply(),
        [0, 3, 2, -1, 1]
    );
    // An interval under 1 µs divides by zero whole microseconds: i64::MAX left, or 0 for 0 / 0.
    let limit = Limit::new(10_000, 1_000_000_000, 1).expect("1 ns apart");
    assert_eq!(call(&mut None, START_NS, &limit, 1).remaining, i64::MAX);
    let limit = Limit::new(0, 1_000_000_000, 1).expect("1 ns apart");
    assert_eq!(call(&mut None, START_NS, &limit, 0).remaining, 0);
}

#[test]
fn writes_the_tat_and_expires_at_its_millisecond_rounded_up() {
    let start_ms = START_NS / 1_000_000;
    // 10 per minute: T = 6 s; one call stores now + 6 s, in the millisecond after now's + 6 s.
    let limit = Limit::new(9, 10, 60).expect("valid");
    let decision = call(&mut None, START_NS, &limit, 1);
    let write = decision.write.expect("allowed");
    assert_eq!(write.tat_ns, START_NS + 6_000_000_000);
    assert_eq!(write.expire_at_ms, start_ms + 6_001);
    // From a stored TAT 2.5 ms past now: .456789 + 2.5 ms + 6 s is .956789 ms past start + 6,002 ms.
    let stored = START_NS + 2_500_000;
    let write = call(&mut Some(stored), START_NS, &limit, 1)
        .write
        .expect("allowed");
    assert_eq!(write.tat_ns, stored + 6_000_000_000);
    assert_eq!(write.expire_at_ms, start_ms + 6_003);
    // T = 600 µs: the TAT is 1.056789 ms past now's millisecond. redis-cell expires the key trunc_ms(600 µs) = 0 ms
    // after now's millisecond, a millisecond before its TAT's; ours lasts past the TAT.
    let limit = Limit::new(0, 5_000, 3).expect("valid");
    let write = call(&mut None, START_NS, &limit, 1).write.expect("allowed");
    assert_eq!(write.tat_ns, START_NS + 600_000);
    assert_eq!(write.expire_at_ms, start_ms + 2);
    // A TAT on a whole millisecond expires at that millisecond (Redis keeps the key through it).
    let whole_ms = start_ms * 1_000_000;
    let limit = Limit::new(0, 1_000, 1).expect("valid");
    let write = call(&mut None, whole_ms, &limit, 1).write.expect("allowed");
    assert_eq!(write.expire_at_ms, start_ms + 1);
    // Quantity 0 on a missing key writes now, expiring at now rounded up.
    let write = call(&mut None, START_NS, &limit, 0).write.expect("allowed");
    assert_eq!((write.tat_ns, write.expire_at_ms), (START_NS, start_ms + 1));
    let write = call(&mut None, whole_ms, &limit, 0).write.expect("allowed");
    assert_eq!((write.tat_ns, write.expire_at_ms), (whole_ms, start_ms));
}

#[test]
fn limited_calls_report_a_past_tat_as_a_negative_reset() {
    // A stored TAT 1.5 s in the past (a key not yet expired) and a quantity beyond the limit: limited, never
    // possible, reset -1.5 s (reads -1), and the unused tolerance counts more than the limit.
    let limit = Limit::new(4, 1, 1).expect("valid");
    let decision = call(&mut Some(START_NS - 1_500_000_000), START_NS, &limit, 6);
    assert!(decision.limited && decision.exceeds_limit && decision.write.is_none());
    assert_eq!(decision.reply(), [1, 5, 6, -1, -1]);
}

#[test]
fn refuses_a_tat_past_2262() {
    let limit = Limit::new(0, 1, 1).expect("valid");
    let quantity = Quantity::new(1).expect("valid");
    assert_eq!(
        throttle(None, i64::MAX - 10, &limit, quantity),
        Err(GcraError::TatOutOfRange)
    );
    // Limited calls store nothing, so they still answer.
    let limited = throttle(Some(i64::MAX), 0, &limit, quantity).expect("no write");
    assert!(limited.limited);
}

/// Limits whose waits stay under 2^23 s, where the reply's f64 seconds are exact.
fn limits() -> impl Strategy<Value = Limit> {
    (0i64..50, 1i64..1_000, 1i64..86_400)
        .prop_map(|(burst, count, period)| Limit::new(burst, count, period).expect("valid"))
}

/// A key's history: calls at increasing instants (ms apart) with their quantities.
fn histories() -> impl Strategy<Value = Vec<(i64, i64)>> {
    prop::collection::vec((0i64..5_000_000, 0i64..60), 0..12)
}

fn replay(limit: &Limit, history: &[(i64, i64)]) -> (Option<i64>, i64) {
    let mut store = None;
    let mut now = START_NS;
    for &(step_us, quantity) in history {
        now += step_us * 1_000 + 7;
        call(&mut store, now, limit, quantity);
    }
    (store, now)
}

proptest! {
    #[test]
    fn retry_after_is_exact(limit in limits(), history in histories(), wait_us in 0i64..10_000_000,
                            quantity in 1i64..60) {
        let (store, last) = replay(&limit, &history);
        let now = last + wait_us * 1_000;
        let quantity = Quantity::new(quantity).expect("valid");
        let decision = throttle(store, now, &limit, quantity).expect("in range");
        prop_assume!(decision.limited && !decision.exceeds_limit);
        let wait_ns = i64::try_from(decision.retry_after_ns).expect("fits");
        prop_assert!(wait_ns > 0);
        prop_assert!(!throttle(store, now + wait_ns, &limit, quantity).expect("in range").limited);
        prop_assert!(throttle(store, now + wait_ns - 1, &limit, quantity).expect("in range").limited);
        // In the reply's whole seconds: allowed once they have passed (with the dropped sub-millisecond), refused a
        // second earlier.
        let wait_s = decision.retry_after_s();
        prop_assert!(wait_s >= 0);
        let allowed_at = now + wait_s * 1_000_000_000 + 999_999;
        prop_assert!(!throttle(store, allowed_at, &limit, quantity).expect("in range").limited);
        if wait_s >= 1 {
            let early = now + (wait_s - 1) * 1_000_000_000;
            prop_assert!(throttle(store, early, &limit, quantity).expect("in range").limited);
        }
    }

    #[test]
    fn only_allowed_calls_write(limit in limits(), history in histories(), wait_us in 0i64..10_000_000,
                                quantity in 0i64..60) {
        let (store, last) = replay(&limit, &history);
        let now = last + wait_us * 1_000;
        let decision = throttle(store, now, &limit, Quantity::new(quantity).expect("valid")).expect("in range");
        match decision.write {
            None => {
                prop_assert!(decision.limited);
                prop_assert!(decision.retry_after_s() >= 0 || decision.exceeds_limit);
            }
            Some(write) => {
                prop_assert!(!decision.limited);
                prop_assert_eq!(decision.retry_after_s(), -1);
                let base = store.map_or(now, |tat| tat.max(now));
                prop_assert_eq!(write.tat_ns, base + quantity * limit.interval_ns());
                // The key expires at the TAT rounded up to the millisecond.
                prop_assert!(i128::from(write.expire_at_ms) * MS >= i128::from(write.tat_ns));
                prop_assert!(i128::from(write.expire_at_ms - 1) * MS < i128::from(write.tat_ns));
                prop_assert!(write.tat_ns - now <= limit.tolerance_ns());
            }
        }
    }

    #[test]
    fn remaining_is_never_negative_and_nothing_panics(
        burst in any::<i64>(), count in any::<i64>(), period in any::<i64>(),
        stored in any::<Option<i64>>(), now in any::<i64>(), quantity in any::<i64>(),
    ) {
        if let (Ok(limit), Ok(quantity)) = (Limit::new(burst, count, period), Quantity::new(quantity)) {
            if let Ok(decision) = throttle(stored, now, &limit, quantity) {
                prop_assert!(decision.remaining >= 0);
                prop_assert_eq!(decision.limit, burst + 1);
                prop_assert_eq!(decision.write.is_none(), decision.limited);
            }
        }
    }

    #[test]
    fn extreme_small_limits_never_panic(burst in 0i64..1_000_000_000, count in 1i64..i64::MAX,
                                         period in 1i64..1_000, stored in any::<Option<i64>>(),
                                         now in any::<i64>(), quantity in 0i64..i64::MAX) {
        if let Ok(limit) = Limit::new(burst, count, period) {
            if let Ok(decision) = throttle(stored, now, &limit, Quantity::new(quantity).expect("valid")) {
                prop_assert!(decision.remaining >= 0);
            }
        }
    }
}

/// Limits up to the largest rate the arguments allow (10^9 a second, T = 1 ns): max_burst, count_per_period and
/// period with count spread over every order of magnitude.
fn any_rate_limits() -> impl Strategy<Value = Limit> {
    (0i64..20, 1i64..4, 0u32..10, 1i64..10).prop_map(|(burst, period, magnitude, digit)| {
        let count = (digit * 10i64.pow(magnitude)).min(1_000_000_000 * period);
        Limit::new(burst, count, period).expect("valid")
    })
}

/// Gaps between calls in ns: none (a tight loop), a few ns, under a millisecond, and now and then a few ms.
fn gaps() -> impl Strategy<Value = Vec<(i64, i64)>> {
    let gap = prop_oneof![
        3 => Just(0i64),
        2 => 1i64..2_000,
        4 => 1i64..1_000_000,
        1 => 1_000_000i64..5_000_000,
    ];
    let quantity = prop_oneof![8 => Just(1i64), 1 => Just(0i64), 1 => 2i64..4];
    prop::collection::vec((gap, quantity), 1..400)
}

proptest! {
    /// The GCRA bound, over every window of a run in which the key expires as Redis expires keys (gone once the
    /// clock's millisecond is past the expiry's): requests allowed between two allowed calls, both included, never
    /// exceed L + t / T, i.e. their quantities times T never exceed tau + t.
    #[test]
    fn never_admits_more_than_the_limit_over_any_window(limit in any_rate_limits(), start_ns in 0i64..1_000_000,
                                                         calls in gaps()) {
        let mut key: Option<(i64, i64)> = None;
        let mut now = START_NS + start_ns;
        let mut allowed: Vec<(i64, i64)> = Vec::new();
        for (gap, quantity) in calls {
            now += gap;
            if key.is_some_and(|(_, expire_at_ms)| now.div_euclid(1_000_000) > expire_at_ms) {
                key = None;
            }
            let decision = throttle(key.map(|(tat, _)| tat), now, &limit, Quantity::new(quantity).expect("valid"))
                .expect("in range");
            if let Some(write) = decision.write {
                key = Some((write.tat_ns, write.expire_at_ms));
                allowed.push((now, quantity));
            }
        }
        let interval = i128::from(limit.interval_ns());
        let tolerance = i128::from(limit.tolerance_ns());
        for first in 0..allowed.len() {
            let mut taken = 0i128;
            for &(at, quantity) in &allowed[first..] {
                taken += i128::from(quantity);
                let window = i128::from(at - allowed[first].0);
                prop_assert!(taken * interval <= tolerance + window,
                    "{} allowed in {} ns from {}: L {}, T {} ns", taken, window, allowed[first].0,
                    limit.limit(), interval);
            }
        }
    }
}
