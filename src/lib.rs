//! redis-tb: a native token-bucket rate limiter for Redis, `TB.ACQUIRE key rate burst [cost]`.
//!
//! Layout:
//! - `bucket`: the pure token-bucket arithmetic (state + now + parameters -> decision + new state), the workspace
//!   crate `redis-tb-core` (core/) re-exported. No Redis, no clock, no I/O; public, so benches drive it directly.
//! - `codec`: the stored form of a bucket (`State` <-> the `tokens`/`ts` hash values). Pure and public, like
//!   `bucket`, so benches measure it.
//! - `number`: decimal text to numbers, for arguments and stored fields alike. Pure and public.
//! - `gcra`: the pure GCRA behind `CL.THROTTLE`, redis-cell's arithmetic (stored TAT + now + limit -> decision +
//!   new TAT). Public, like `bucket`.
//! - `command`: the glue and the command contract: parsing, hash state I/O, expiry, replication, replies.
//! - `stats`: the counters behind `INFO tb`.
//! - `server`: the one place with `unsafe`, a safe face over the few raw server calls `command` needs.
//!
//! This file only declares the module (name `tb`, version from Cargo.toml) and hands its load, unload and `INFO`
//! callbacks to `command` and `stats`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub use redis_tb_core as bucket;
pub mod codec;
mod command;
pub mod gcra;
pub mod number;
mod server;
mod stats;

use redis_module::{redis_module, Context, InfoContext, RedisResult, RedisString, Status};

/// The module version reported by `MODULE LIST`, from Cargo.toml: `major*10000 + minor*100 + patch`.
const MODULE_VERSION: i32 = decimal(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
    + decimal(env!("CARGO_PKG_VERSION_MINOR")) * 100
    + decimal(env!("CARGO_PKG_VERSION_PATCH"));

/// A decimal version component, evaluated at compile time.
const fn decimal(digits: &str) -> i32 {
    let mut value = 0;
    let mut rest = digits.as_bytes();
    while let [digit, tail @ ..] = rest {
        value = value * 10 + (*digit - b'0') as i32;
        rest = tail;
    }
    value
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    command::register(ctx, args)
}

fn deinit(ctx: &Context) -> Status {
    command::refuse_unload(ctx)
}

fn info(ctx: &InfoContext, _for_crash_report: bool) {
    stats::add_info(ctx);
}

redis_module! {
    name: "tb",
    version: MODULE_VERSION,
    // The system allocator, not the server's: no call path allocates, and it lets tests and benches link the
    // rlib (the crate's Redis allocator aborts outside a server).
    allocator: (std::alloc::System, std::alloc::System),
    data_types: [],
    init: init,
    deinit: deinit,
    info: info,
}
