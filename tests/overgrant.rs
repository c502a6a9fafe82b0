//! Exactness under contention: many clients hammering one key never get more than burst + rate · t.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::Server;

const CLIENTS: usize = 64;
const BURST: f64 = 10.0;
const RATE: f64 = 10.0;
/// How long each client keeps issuing calls.
const RUN: Duration = Duration::from_millis(2_900);

#[test]
fn sixty_four_clients_never_over_grant() {
    let server = Server::start();
    let granted = Arc::new(AtomicI64::new(0));
    let calls = Arc::new(AtomicI64::new(0));
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut conn = server.conn();
            let (granted, calls, barrier) = (granted.clone(), calls.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                while start.elapsed() < RUN {
                    let reply: Vec<i64> = redis::cmd("TB.ACQUIRE")
                        .arg("hot")
                        .arg(RATE)
                        .arg(BURST)
                        .query(&mut conn)
                        .expect("TB.ACQUIRE");
                    calls.fetch_add(1, Ordering::Relaxed);
                    if reply.first() == Some(&1) {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Read before the barrier releases anyone: no worker can send a call before `start`, and every reply is in
    // before `join` returns, so the server granted everything within `elapsed` (on a loaded machine this thread
    // may be scheduled late after the barrier, and a start read then would shrink the window it bounds).
    let start = Instant::now();
    barrier.wait();
    for worker in workers {
        worker.join().expect("worker");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let granted = granted.load(Ordering::Relaxed);
    let calls = calls.load(Ordering::Relaxed);
    // Every grant happened within `elapsed` of the first one, so burst + rate · elapsed bounds them.
    let bound = (BURST + RATE * elapsed).floor() as i64;
    println!("over-grant: {granted} grants of {calls} calls in {elapsed:.3} s (bound {bound})");
    assert!(
        calls > 1_000,
        "the load was too light to prove anything: {calls} calls"
    );
    assert!(
        granted <= bound,
        "{granted} grants exceed burst + rate * t = {bound}"
    );
    // And the limiter is not simply refusing: the refill must have been granted too.
    assert!(
        granted >= (BURST + RATE * RUN.as_secs_f64() * 0.8) as i64,
        "only {granted} grants"
    );
}
