//! The module must not leak inside the server: every server string it creates per call is freed. A few hundred
//! thousand calls of every kind on a handful of keys must leave `used_memory` where it was.

mod common;

use common::Server;

/// Calls of each kind; a leak of even 8 bytes per call would show as megabytes.
const ROUNDS: usize = 20_000;
/// Pipelined per round trip.
const BATCH: usize = 500;

fn used_memory(conn: &mut redis::Connection) -> i64 {
    common::info_int(conn, "memory", "used_memory")
}

#[test]
fn many_calls_of_every_kind_leave_memory_flat() {
    let server = Server::start();
    let mut conn = server.conn();
    let commands: [&[&str]; 12] = [
        &["TB.ACQUIRE", "allowed", "0.001", "1e12"],
        &["TB.ACQUIRE", "drained", "1e-9", "1", "1"],
        &["TB.ACQUIRE", "allowed", "0.001", "1e12", "0"],
        &["TB.ACQUIRE", "allowed", "0.001", "1e12", "1e13"],
        &["TB.ACQUIRE", "allowed", "nope", "1e12"],
        &[
            "TB.ACQUIREALL",
            "1.5",
            "a",
            "0.001",
            "1e12",
            "b",
            "0.001",
            "1e12",
        ],
        &[
            "TB.ACQUIREALL",
            "1",
            "a",
            "0.001",
            "1e12",
            "drained",
            "1e-9",
            "1",
        ],
        &[
            "TB.ACQUIREALL",
            "1",
            "a",
            "0.001",
            "1e12",
            "a",
            "0.001",
            "1e12",
        ],
        &[
            "TB.ACQUIREEACH",
            "a",
            "0.001",
            "1e12",
            "1.5",
            "b",
            "0.001",
            "1e12",
            "0",
        ],
        &[
            "TB.ACQUIREEACH",
            "a",
            "0.001",
            "1e12",
            "1",
            "drained",
            "1e-9",
            "1",
            "1",
        ],
        &["TB.ACQUIREATMOST", "a", "0.001", "1e12", "3"],
        &["TB.ACQUIREATMOST", "drained", "1e-9", "1", "3"],
    ];
    let run = |conn: &mut redis::Connection, rounds: usize| {
        for _ in 0..rounds / BATCH {
            let mut pipe = redis::pipe();
            for _ in 0..BATCH {
                for command in commands {
                    pipe.cmd(command[0]).arg(&command[1..]).ignore();
                }
            }
            // Error replies are expected for some commands; the pipeline still runs them all.
            let _: redis::RedisResult<()> = pipe.query(conn);
        }
    };
    // Warm up: create the keys, grow the server's buffers and the client's query buffer to their working size.
    run(&mut conn, 2 * BATCH);
    let before = used_memory(&mut conn);
    run(&mut conn, ROUNDS);
    let after = used_memory(&mut conn);
    let calls = (ROUNDS * commands.len()) as i64;
    println!("used_memory {before} -> {after} over {calls} calls");
    assert!(
        after - before < 256 * 1024,
        "used_memory grew by {} bytes over {calls} calls",
        after - before
    );
    common::ping(&mut conn);
}
