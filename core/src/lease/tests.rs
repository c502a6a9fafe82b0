//! `Lease`: a case table at explicit instants, properties of one lease, and processes sharing one simulated bucket.

use super::super::{acquire_at_most, refund, Amount, AtMost, State};
use super::*;
use proptest::prelude::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

fn params(rate_per_sec: f64, burst: f64) -> Params {
    Params::new(rate_per_sec, burst).expect("valid params")
}

const MS: i64 = 1_000;

#[test]
fn a_grant_is_worth_rate_times_the_time_to_its_reset() {
    // 10/s, burst 100: a grant of 10 that leaves the bucket full again 2 s later.
    let p = params(10.0, 100.0);
    let mut lease = Lease::new(p, 0);
    // The first lease knows no rate yet: it asks for the request's own cost.
    assert_eq!(lease.admit(0, 1.0), Admit::Call { max: 1 });
    assert_eq!(lease.admit(0, 1.0), Admit::Wait, "one refill in flight");
    // Sent at 0, answered 5 ms later: the asking request takes one, the reset counts from the sending, less a
    // millisecond of rounding.
    assert_eq!(lease.answered(0, 5 * MS, 10, 0, 2_000), Some(Admit::Spent));
    assert!((lease.spendable(5 * MS) - 9.0).abs() < 1e-9);
    // 1,999 ms after sending the bucket counts none of them; 100 ms before that, one.
    assert!((lease.spendable(1_899 * MS) - 1.0).abs() < 1e-9);
    assert_eq!(lease.spendable(1_999 * MS), 0.0);
    assert!(lease.spend(5 * MS, 3.0));
    assert!((lease.spendable(5 * MS) - 6.0).abs() < 1e-9);
    // At 1,550 ms the 6 left are worth 4.49 tokens: a cost of 5 does not fit.
    assert!(!lease.spend(1_550 * MS, 5.0));
    assert!(lease.spend(1_550 * MS, 4.0));
}

#[test]
fn a_refusal_is_remembered_until_the_retry_time() {
    let p = params(10.0, 20.0);
    let mut lease = Lease::new(p, 0);
    assert!(matches!(lease.admit(0, 1.0), Admit::Call { .. }));
    assert_eq!(
        lease.answered(0, MS, 0, 100, 2_000),
        Some(Admit::Refused { retry_after_ms: 99 })
    );
    assert_eq!(lease.admit(MS, 1.0), Admit::Refused { retry_after_ms: 99 });
    assert_eq!(
        lease.admit(99_500, 1.0),
        Admit::Refused { retry_after_ms: 1 }
    );
    assert!(matches!(lease.admit(100 * MS, 1.0), Admit::Call { .. }));
    // -1: the burst is below one token, no refill ever grants one.
    assert_eq!(
        lease.answered(100 * MS, 101 * MS, 0, -1, 0),
        Some(Admit::Refused { retry_after_ms: -1 })
    );
    assert_eq!(
        lease.admit(1_000_000 * MS, 1.0),
        Admit::Refused { retry_after_ms: -1 }
    );
}

#[test]
fn a_failed_refill_leaves_the_held_tokens_to_spend() {
    let p = params(10.0, 100.0);
    let mut lease = Lease::new(p, 0);
    assert!(matches!(lease.admit(0, 1.0), Admit::Call { .. }));
    assert_eq!(lease.answered(0, 0, 3, 0, 1_000), Some(Admit::Spent));
    assert_eq!(lease.admit(MS, 1.0), Admit::Spent);
    assert_eq!(lease.admit(MS, 1.0), Admit::Spent);
    assert!(matches!(lease.admit(MS, 1.0), Admit::Call { .. }));
    lease.failed();
    assert!(!lease.in_flight());
    // Nothing is known to be granted: the next request asks again, and the caller's fail mode decides it meanwhile.
    assert!(matches!(lease.admit(2 * MS, 1.0), Admit::Call { .. }));
}

#[test]
fn the_lease_size_follows_the_process_own_rate() {
    // Burst 1000: at most 100 a lease.
    let p = params(1_000.0, 1_000.0);
    let mut lease = Lease::new(p, 0);
    // The first lease knows no rate yet: the request's own cost.
    assert_eq!(lease.next_size(0, 1.0), 1);
    // 200 tokens asked for over 100 ms (2,000/s): 50 ms of that is 100, then capped by a tenth of the burst.
    for i in 0..200 {
        lease.used(i * 500, 1.0);
    }
    assert_eq!(lease.next_size(100 * MS, 1.0), 100);
    // 20 over the next 100 ms: 10 (plus the request asking).
    for i in 0..20 {
        lease.used(100 * MS + i * 5 * MS, 1.0);
    }
    assert_eq!(lease.next_size(200 * MS, 1.0), 11);
    // A cost above the cap is asked for whole.
    assert_eq!(lease.next_size(300 * MS, 250.0), 250);
    // A small burst leases one token at a time.
    assert_eq!(Lease::new(params(1_000.0, 5.0), 0).max_lease(), 1);
}

/// A hot limit (its bucket far from full, so grants keep their worth), one request a millisecond, each refill
/// answered a millisecond after it was sent: the lease grows from what the process asks for, and the calls become
/// far fewer than the requests. Counting only the requests admitted from held tokens, each lease stayed at the one
/// token the request that asked for it took: a call per request.
#[test]
fn under_steady_load_the_leases_grow_and_calls_become_few() {
    let p = params(1_000.0, 2_000.0);
    let mut lease = Lease::new(p, 0);
    let mut calls = 0;
    let mut in_flight: Option<(i64, i64)> = None;
    for ms in 0..1_000 {
        let now = ms * MS;
        if let Some((sent, max)) = in_flight.filter(|(sent, _)| now >= sent + MS) {
            in_flight = None;
            assert_eq!(lease.answered(sent, now, max, 0, 1_900), Some(Admit::Spent));
        }
        match lease.admit(now, 1.0) {
            Admit::Spent | Admit::Wait => {}
            Admit::Call { max } => {
                calls += 1;
                in_flight = Some((now, max));
            }
            Admit::Refused { .. } => panic!("refused with tokens in the bucket"),
            Admit::Direct => panic!("a direct call with the bucket far from full"),
        }
    }
    assert!(calls < 100, "{calls} calls for 1,000 requests");
}

/// One process at about 95% of a limit's rate, from a full bucket, on the core's own bucket, each call answered
/// half a millisecond after it was sent: the first grant (one token, the process has no history yet) is worth
/// nothing and turns to calls of their own, but the next reply shows a lease of the process's demand would pay,
/// and leasing resumes: far fewer calls than requests.
#[test]
fn near_its_rate_a_limit_resumes_leasing_after_a_full_bucket() {
    let p = params(1_000.0, 1_000.0);
    let mut lease = Lease::new(p, 0);
    let mut stored: Option<State> = None;
    let (mut calls, mut direct, mut admitted) = (0, 0, 0);
    // A request every 1.05 ms for 2 s; the reply of a refill in flight arrives 0.5 ms after it was sent.
    let mut in_flight: Option<(i64, i64)> = None;
    for step in 0..1_905i64 {
        let now = step * 1_050;
        if let Some((sent, max)) = in_flight.filter(|(sent, _)| now >= sent + 500) {
            in_flight = None;
            let partial = acquire_at_most(stored, sent, &p, AtMost::new(max).expect("max"));
            if let Some(write) = partial.write {
                stored = Some(write.state);
            }
            let reply = (
                partial.granted,
                partial.retry_after_ms,
                partial.reset_after_ms,
            );
            if lease.answered(sent, now, reply.0, reply.1, reply.2) == Some(Admit::Spent) {
                admitted += 1;
            }
        }
        match lease.admit(now, 1.0) {
            Admit::Spent => admitted += 1,
            Admit::Wait | Admit::Refused { .. } => {}
            Admit::Call { max } => {
                calls += 1;
                in_flight = Some((now, max));
            }
            Admit::Direct => {
                direct += 1;
                let partial = acquire_at_most(stored, now, &p, AtMost::new(1).expect("max"));
                if let Some(write) = partial.write {
                    stored = Some(write.state);
                }
                if partial.granted > 0 {
                    admitted += 1;
                }
                lease.observed(
                    now,
                    now + 500,
                    partial.granted > 0,
                    partial.retry_after_ms,
                    partial.reset_after_ms,
                );
            }
        }
    }
    assert!(
        direct >= 1,
        "the first grant is worth nothing: {direct} calls of their own"
    );
    assert!(
        (calls + direct) * 5 < 1_905,
        "{calls} refills and {direct} calls of their own for 1,905 requests ({admitted} admitted)"
    );
}

#[test]
fn only_the_latest_grant_is_refunded_and_only_when_the_bucket_is_unchanged() {
    let p = params(10.0, 100.0);
    let mut lease = Lease::new(p, 0);
    assert_eq!(lease.answered(0, MS, 5, 0, 5_000), None, "no request asked");
    assert_eq!(lease.answered(10 * MS, 11 * MS, 4, 0, 9_000), None);
    assert!((lease.spendable(20 * MS) - 9.0).abs() < 1e-9);
    assert!(!lease.refund_due(20 * MS), "used 20 ms ago");
    assert!(lease.refund_due(LEASE_IDLE_US));
    assert!((lease.refundable(LEASE_IDLE_US) - 4.0).abs() < 1e-9);
    let mut changed = lease.clone();
    assert_eq!(changed.give_back(LEASE_IDLE_US, false), 0.0);
    assert_eq!(changed.spendable(LEASE_IDLE_US), 0.0, "dropped, not kept");
    assert!((lease.give_back(LEASE_IDLE_US, true) - 4.0).abs() < 1e-9);
    assert_eq!(lease.spendable(LEASE_IDLE_US), 0.0);
    assert!(!lease.refund_due(2 * LEASE_IDLE_US));
}

#[test]
fn the_request_that_asked_is_decided_by_its_grant_however_late_the_reply() {
    // 5/s, burst 1: a lease is one token, and a grant of it leaves the bucket full again 200 ms later. Answered
    // 150 ms after the sending, the grant is worth 5 · (199 - 150) ms = 0.245 tokens: too little for anyone else,
    // but the request that asked takes the token Redis granted to its call.
    let p = params(5.0, 1.0);
    let mut lease = Lease::new(p, 0);
    assert_eq!(lease.admit(0, 1.0), Admit::Call { max: 1 });
    assert_eq!(lease.admit(MS, 1.0), Admit::Wait);
    assert_eq!(lease.answered(0, 150 * MS, 1, 0, 200), Some(Admit::Spent));
    assert_eq!(lease.spendable(150 * MS), 0.0);
    // The waiting request asks in turn, and is decided by its own reply: here a refusal, remembered.
    assert_eq!(lease.admit(150 * MS, 1.0), Admit::Call { max: 1 });
    assert_eq!(
        lease.answered(150 * MS, 300 * MS, 0, 50, 200),
        Some(Admit::Refused { retry_after_ms: 0 })
    );
    assert!(matches!(lease.admit(300 * MS, 1.0), Admit::Call { .. }));
}

#[test]
fn a_grant_below_the_cost_refuses_the_request_and_is_held_for_others() {
    // 10/s: a request of 3 that was granted 2 (the bucket held two whole tokens) is refused for the missing one.
    let p = params(10.0, 100.0);
    let mut lease = Lease::new(p, 0);
    assert_eq!(lease.admit(0, 3.0), Admit::Call { max: 3 });
    assert_eq!(
        lease.answered(0, 2 * MS, 2, 0, 9_800),
        Some(Admit::Refused {
            retry_after_ms: 100
        })
    );
    assert!((lease.spendable(2 * MS) - 2.0).abs() < 1e-9);
    assert_eq!(lease.admit(3 * MS, 2.0), Admit::Spent);
}

#[test]
fn a_spent_latest_grant_leaves_nothing_to_refund() {
    // Tokens of an older grant may lie below another process's later grant: once the latest grant is spent,
    // nothing is refunded though older tokens are held.
    let p = params(10.0, 100.0);
    let mut lease = Lease::new(p, 0);
    assert_eq!(lease.answered(0, MS, 5, 0, 5_000), None);
    assert_eq!(lease.admit(2 * MS, 1.0), Admit::Spent);
    assert_eq!(lease.answered(3 * MS, 4 * MS, 2, 0, 8_000), None);
    assert!(
        lease.spend(5 * MS, 5.0),
        "closest to reset first: 4 of the first grant, 1 of the second"
    );
    assert!((lease.refundable(5 * MS) - 1.0).abs() < 1e-9);
    assert!(lease.spend(5 * MS, 1.0));
    assert_eq!(lease.spendable(5 * MS), 0.0);
    let mut older = Lease::new(p, 0);
    assert_eq!(older.answered(0, MS, 5, 0, 9_000), None);
    assert_eq!(older.answered(3 * MS, 4 * MS, 2, 0, 5_000), None);
    // The later grant resets first, so it is spent first; the older grant's tokens are not the latest grant's.
    assert!(older.spend(5 * MS, 2.0));
    assert!((older.spendable(5 * MS) - 5.0).abs() < 1e-9);
    assert_eq!(older.refundable(5 * MS), 0.0);
    assert!(!older.refund_due(LEASE_IDLE_US * 2));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// One grant: whatever the spends, never more than granted, and from any spend on never more than
    /// `rate · (sent + reset_after - 1 ms - now)`.
    #[test]
    fn a_grant_is_never_spent_beyond_its_worth(
        rate in 1.0f64..2_000.0,
        granted in 1i64..200,
        reset_after_ms in 0i64..5_000,
        spends in prop::collection::vec((0i64..6_000_000, 1u8..4), 0..60),
    ) {
        let p = params(rate, 1e9);
        let mut lease = Lease::new(p, 0);
        lease.answered(0, 0, granted, 0, reset_after_ms);
        let mut spends = spends;
        spends.sort();
        let mut done = Vec::new();
        for (at_us, cost) in spends {
            if lease.spend(at_us, f64::from(cost)) {
                done.push((at_us, f64::from(cost)));
            }
        }
        let total: f64 = done.iter().map(|(_, cost)| cost).sum();
        prop_assert!(total <= granted as f64 + 1e-9);
        let reset_us = reset_after_ms * MS - MS;
        for (k, (at_us, _)) in done.iter().enumerate() {
            let after: f64 = done.iter().skip(k).map(|(_, cost)| cost).sum();
            let worth = rate * (reset_us - at_us).max(0) as f64 / 1e6;
            prop_assert!(after <= worth + 1e-6, "{after} spent from {at_us} µs on, worth {worth}");
        }
    }

}

proptest! {
    // Seeded: the same cases on every run.
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x1ea5e),
        ..ProptestConfig::default()
    })]

    /// Processes sharing one bucket, each with its lease, calls with latency (up to 16 ms a round trip, longer
    /// than many grants' worth), some lost, idle refunds checked under WATCH: every window of admissions holds at
    /// most `burst + rate · t`, every request is decided, and a request whose call Redis granted is admitted.
    #[test]
    fn processes_together_stay_within_burst_plus_rate_times_t(
        rate in 5.0f64..500.0,
        burst in 1.0f64..60.0,
        processes in 1usize..5,
        arrivals in prop::collection::vec((0i64..20_000, 0usize..5), 1..120),
        latencies in prop::collection::vec((0i64..8_000, 0i64..8_000, any::<bool>()), 1..20),
    ) {
        let run = simulate(params(rate, burst), processes, &arrivals, &latencies)?;
        prop_assert_eq!(run.decided, arrivals.len(), "every request decided");
        check_bound(&run.admitted, rate, burst)?;
    }
}

/// Every window `[a, b]` of admission instants holds at most `burst + rate · (b - a)` admissions (of one token).
fn check_bound(admitted: &[i64], rate: f64, burst: f64) -> Result<(), TestCaseError> {
    let mut times = admitted.to_vec();
    times.sort();
    for (i, first) in times.iter().enumerate() {
        for (j, last) in times.iter().enumerate().skip(i) {
            let count = (j - i + 1) as f64;
            let bound = burst + rate * (last - first) as f64 / 1e6;
            prop_assert!(
                count <= bound + 1e-6,
                "{count} admitted in [{first}, {last}] µs, bound {bound}"
            );
        }
    }
    Ok(())
}

#[test]
fn the_bound_check_fails_on_one_admission_too_many() {
    // 10/s, burst 2: three at once is one too many; a third 100 ms later is not.
    assert!(check_bound(&[0, 0, 0], 10.0, 2.0).is_err());
    assert!(check_bound(&[0, 0, 100 * MS], 10.0, 2.0).is_ok());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    Tick(usize),
    /// A refill runs on the server: process, sent at, max, the reply is lost.
    Acquire(usize, i64, i64, bool),
    /// A refund runs on the server, under WATCH: process, amount in millionths, the version the grant left.
    Refund(usize, i64, u64),
    /// The refill's reply reaches the process: process, sent at, run at (on the server), reply, the version the
    /// grant left.
    Reply(usize, i64, i64, [i64; 3], u64),
    /// The process gives up on a refill whose reply was lost.
    Lost(usize),
    /// A request's own call (`Admit::Direct`) runs on the server: process, sent at, the reply is lost.
    Direct(usize, i64, bool),
    /// Its reply reaches the process: process, sent at, run at (on the server), [granted, retry_after_ms,
    /// reset_after_ms].
    DirectReply(usize, i64, i64, [i64; 3]),
}

struct Process {
    lease: Lease,
    waiting: usize,
    version: u64,
}

/// What a simulation admitted (the instants) and how many requests it decided (admitted or refused).
struct Run {
    admitted: Vec<i64>,
    decided: usize,
}

/// Runs the arrivals (gap in µs since the previous one, process) through `processes` leases on one bucket held by
/// the core's own commands; calls take the next latencies (to the server, back, lost) in turn. A request admitted
/// by its own call's grant is admitted at the instant the server granted it, as a `TB.ACQUIRE` call's would be;
/// every other admission at the instant the lease spent it. The fail mode refuses.
fn simulate(
    p: Params,
    processes: usize,
    arrivals: &[(i64, usize)],
    latencies: &[(i64, i64, bool)],
) -> Result<Run, TestCaseError> {
    let mut events = BinaryHeap::new();
    let mut seq = 0u64;
    let mut at = 0i64;
    for (gap, process) in arrivals {
        at += gap;
        events.push(Reverse((at, seq, Event::Arrival(process % processes))));
        seq += 1;
    }
    let mut procs: Vec<Process> = (0..processes)
        .map(|_| Process {
            lease: Lease::new(p, 0),
            waiting: 0,
            version: 0,
        })
        .collect();
    let mut stored: Option<State> = None;
    let mut version = 0u64;
    let mut next_latency = 0usize;
    let mut run = Run {
        admitted: Vec::new(),
        decided: 0,
    };
    let mut steps = 0usize;
    while let Some(Reverse((now, _, event))) = events.pop() {
        steps += 1;
        // Each request takes a few events at most; many more is a request asking again for ever.
        prop_assert!(
            steps < 100 * arrivals.len() + 1_000,
            "no progress at {now} µs"
        );
        let mut schedule = |at: i64, event: Event| {
            seq += 1;
            events.push(Reverse((at, seq, event)));
        };
        let mut latency = || {
            next_latency += 1;
            latencies[next_latency % latencies.len()]
        };
        // Requests of a process to decide now: an arrival, or those waiting when a refill ends.
        let decide = |process: usize,
                      count: usize,
                      procs: &mut Vec<Process>,
                      run: &mut Run,
                      schedule: &mut dyn FnMut(i64, Event),
                      latency: &mut dyn FnMut() -> (i64, i64, bool)| {
            for _ in 0..count {
                match procs[process].lease.admit(now, 1.0) {
                    Admit::Spent => {
                        run.admitted.push(now);
                        run.decided += 1;
                    }
                    Admit::Refused { .. } => run.decided += 1,
                    Admit::Wait => procs[process].waiting += 1,
                    Admit::Call { max } => {
                        procs[process].waiting += 1;
                        let (up, _, lost) = latency();
                        schedule(now + up, Event::Acquire(process, now, max, lost));
                    }
                    Admit::Direct => {
                        let (up, _, lost) = latency();
                        schedule(now + up, Event::Direct(process, now, lost));
                    }
                }
            }
            schedule(now + LEASE_IDLE_US, Event::Tick(process));
        };
        match event {
            Event::Arrival(process) => decide(
                process,
                1,
                &mut procs,
                &mut run,
                &mut schedule,
                &mut latency,
            ),
            Event::Tick(process) => {
                let proc = &mut procs[process];
                if proc.lease.refund_due(now) {
                    let amount = proc.lease.refundable(now);
                    // The amount is sent; whether it lands is the server's to check (WATCH).
                    proc.lease.give_back(now, true);
                    let (up, _, _) = latency();
                    schedule(
                        now + up,
                        Event::Refund(process, (amount * 1e6) as i64, proc.version),
                    );
                }
            }
            Event::Acquire(process, sent, max, lost) => {
                let partial = acquire_at_most(stored, now, &p, AtMost::new(max).expect("max"));
                if let Some(write) = partial.write {
                    stored = Some(write.state);
                    version += 1;
                }
                let (_, down, _) = latency();
                if lost {
                    schedule(now + down, Event::Lost(process));
                } else {
                    let reply = [
                        partial.granted,
                        partial.retry_after_ms,
                        partial.reset_after_ms,
                    ];
                    schedule(now + down, Event::Reply(process, sent, now, reply, version));
                }
            }
            Event::Refund(_, millionths, seen) => {
                if seen == version {
                    let amount = Amount::new(millionths as f64 / 1e6).expect("amount");
                    let answer = refund(stored, now, &p, amount);
                    match answer.change {
                        super::super::KeyChange::Write(write) => stored = Some(write.state),
                        super::super::KeyChange::Delete => stored = None,
                        super::super::KeyChange::Keep => {}
                    }
                    version += 1;
                }
            }
            Event::Reply(process, sent, ran, [granted, retry, reset], seen) => {
                let proc = &mut procs[process];
                let asker = proc.lease.answered(sent, now, granted, retry, reset);
                if granted > 0 {
                    proc.version = seen;
                    prop_assert_eq!(asker, Some(Admit::Spent), "granted, so admitted");
                    run.admitted.push(ran);
                } else {
                    let refused = matches!(asker, Some(Admit::Refused { .. }));
                    prop_assert!(refused, "refused by Redis, so refused");
                }
                run.decided += 1;
                let waiting = std::mem::take(&mut proc.waiting) - 1;
                decide(
                    process,
                    waiting,
                    &mut procs,
                    &mut run,
                    &mut schedule,
                    &mut latency,
                );
            }
            Event::Direct(process, sent, lost) => {
                // TB.ACQUIRE of one token: what TB.ACQUIREATMOST with a max of one takes.
                let one = AtMost::new(1).expect("max");
                let partial = acquire_at_most(stored, now, &p, one);
                if let Some(write) = partial.write {
                    stored = Some(write.state);
                    version += 1;
                }
                let (_, down, _) = latency();
                if lost {
                    // The fail mode here refuses.
                    run.decided += 1;
                } else {
                    let reply = [
                        partial.granted,
                        partial.retry_after_ms,
                        partial.reset_after_ms,
                    ];
                    schedule(now + down, Event::DirectReply(process, sent, now, reply));
                }
            }
            Event::DirectReply(process, sent, ran, [granted, retry, reset]) => {
                if granted > 0 {
                    run.admitted.push(ran);
                }
                run.decided += 1;
                procs[process]
                    .lease
                    .observed(sent, now, granted > 0, retry, reset);
            }
            Event::Lost(process) => {
                let proc = &mut procs[process];
                proc.lease.failed();
                // The fail mode here refuses; the waiting requests are decided again, leased tokens first.
                let waiting = std::mem::take(&mut proc.waiting);
                for _ in 0..waiting {
                    if proc.lease.spend(now, 1.0) {
                        run.admitted.push(now);
                    }
                }
                run.decided += waiting;
            }
        }
    }
    Ok(run)
}
