//! Criterion benches of the pure parts of a call: the bucket arithmetic (ns per decision) and the codec that turns
//! a `State` into the stored `tokens`/`ts` bytes and back.
//!
//! Time is synthetic: each iteration advances a local clock by one microsecond, as governor's
//! `benches/single_threaded.rs` does, so the allowed bench refills a little on every call like a hot key would.
//! `make bench` runs a quick variant (`--warm-up-time 0.5 --measurement-time 1`); `cargo bench --bench core`
//! runs the full one.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use redis_tb::bucket::{acquire, Cost, Params, State};
use redis_tb::codec::{decode_state, with_encoded};

/// An arbitrary wall-clock start, microseconds since the Unix epoch (November 2023).
const T0_US: i64 = 1_700_000_000_000_000;

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire");
    let cost = Cost::new(1.0).expect("valid cost");

    // The hot-key case of `make bench`: a huge rate, so every call is allowed and writes.
    let generous = Params::new(1e12, 1e12).expect("valid params");
    group.bench_function("allowed", |b| {
        let mut stored = Some(State {
            tokens: 5e11,
            updated_us: T0_US,
        });
        let mut now_us = T0_US;
        b.iter(|| {
            now_us += 1;
            let decision = acquire(black_box(stored), black_box(now_us), &generous, cost);
            if let Some(write) = decision.write {
                stored = Some(write.state);
            }
            decision
        });
    });

    // A drained bucket that refills one token in 1e9 s: every call is denied and computes an exact retry time.
    let stingy = Params::new(1e-9, 1.0).expect("valid params");
    let drained = Some(State {
        tokens: 0.0,
        updated_us: T0_US,
    });
    group.bench_function("denied", |b| {
        let mut now_us = T0_US;
        b.iter(|| {
            now_us += 1;
            acquire(black_box(drained), black_box(now_us), &stingy, cost)
        });
    });

    // A missing key: a full bucket, the first call on each of many distinct keys.
    let typical = Params::new(10.0, 100.0).expect("valid params");
    group.bench_function("missing_key", |b| {
        let mut now_us = T0_US;
        b.iter(|| {
            now_us += 1;
            acquire(black_box(None), black_box(now_us), &typical, cost)
        });
    });
    group.finish();
}

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    let integral = State {
        tokens: 999_999_999_999.0,
        updated_us: T0_US,
    };
    let fractional = State {
        tokens: 8.7,
        updated_us: T0_US,
    };
    group.bench_function("encode_integral", |b| {
        b.iter(|| with_encoded(black_box(&integral), |tokens, ts| tokens.len() + ts.len()));
    });
    group.bench_function("encode_fractional", |b| {
        b.iter(|| with_encoded(black_box(&fractional), |tokens, ts| tokens.len() + ts.len()));
    });
    group.bench_function("decode_integral", |b| {
        b.iter(|| {
            decode_state(
                black_box(Some(&b"999999999999"[..])),
                black_box(Some(&b"1700000000000000"[..])),
            )
        });
    });
    group.bench_function("decode_fractional", |b| {
        b.iter(|| {
            decode_state(
                black_box(Some(&b"8.7"[..])),
                black_box(Some(&b"1700000000000000"[..])),
            )
        });
    });
    group.finish();
}

criterion_group!(benches, decisions, codec);
criterion_main!(benches);
