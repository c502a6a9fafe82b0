//! redis-tb: a native token-bucket rate limiter for Redis, `TB.ACQUIRE key rate burst [cost]`.
//!
//! Layout:
//! - `bucket`: the pure token-bucket arithmetic (state + now + parameters -> decision + new state). No Redis,
//!   no clock, no I/O; the only public module, so benches and property tests drive it directly.
//! - `command`: the glue and the command contract: parsing, hash state I/O, expiry, replication, replies.
//! - `stats`: the counters behind `INFO tb`.
//! - `server`: the one place with `unsafe`, a safe face over the few raw server calls `command` needs.
//!
//! This file only registers the module (name `tb`): its command, the command's docs and ACL categories, the
//! `INFO` section and the `CONFIG RESETSTAT` hook. Each server feature is detected by the presence of its API,
//! never by version number; a missing one is logged once and skipped.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod bucket;
mod command;
mod server;
mod stats;

use redis_module::{redis_module, Context, InfoContext, RedisResult, RedisString, Status};

use server::{InfoValue, Support};

/// The module's own ACL category, on servers that let modules add one.
const ACL_CATEGORY: &std::ffi::CStr = c"ratelimit";

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
    if !args.is_empty() {
        let given: Vec<String> = args.iter().map(RedisString::to_string_lossy).collect();
        ctx.log_warning(&format!(
            "redis-tb takes no module arguments; refusing to load with: {}",
            given.join(" ")
        ));
        return Status::Err;
    }
    // Registered now, while loading: AddACLCategory is refused afterwards.
    let own_category = server::add_acl_category(ctx, ACL_CATEGORY);
    if server::create_command::<command::Acquire>(
        ctx,
        command::ACQUIRE_NAME,
        command::ACQUIRE_FLAGS,
        1,
        1,
        1,
    ) == Status::Err
    {
        return Status::Err;
    }
    match server::set_command_info(ctx, command::ACQUIRE_NAME, &command::ACQUIRE_DOCS) {
        Support::Done => {}
        Support::Unsupported => ctx.log_notice(
            "redis-tb: this server has no RedisModule_SetCommandInfo (Redis < 7.0): no COMMAND DOCS or key specs",
        ),
        Support::Failed => {
            ctx.log_warning("redis-tb: RedisModule_SetCommandInfo refused the command docs");
            return Status::Err;
        }
    }
    let categories = if own_category == Support::Done {
        c"write fast ratelimit"
    } else {
        c"write fast"
    };
    match server::set_acl_categories(ctx, command::ACQUIRE_NAME, categories) {
        Support::Done => {}
        Support::Unsupported => ctx.log_notice(
            "redis-tb: this server has no module ACL categories (Redis < 7.2): grant TB.ACQUIRE with +tb.acquire",
        ),
        Support::Failed => {
            ctx.log_warning("redis-tb: RedisModule_SetCommandACLCategories refused the categories");
            return Status::Err;
        }
    }
    if server::on_config_resetstat::<StatsReset>(ctx) != Support::Done {
        ctx.log_notice("redis-tb: no command filter API: CONFIG RESETSTAT will not reset INFO tb");
    }
    Status::Ok
}

struct StatsReset;

impl server::ResetHook for StatsReset {
    fn reset() {
        stats::reset();
    }
}

/// `INFO tb`: one section, `tb_stats`.
fn info(ctx: &InfoContext, _for_crash_report: bool) {
    let now = stats::snapshot();
    server::add_info_section(
        ctx,
        c"stats",
        &[
            (c"calls", InfoValue::Count(now.calls)),
            (c"allowed", InfoValue::Count(now.allowed)),
            (c"denied", InfoValue::Count(now.denied)),
            (
                c"denied_cost_exceeds_burst",
                InfoValue::Count(now.denied_cost_exceeds_burst),
            ),
            (c"peeks", InfoValue::Count(now.peeks)),
            (c"errors", InfoValue::Count(now.errors)),
            (c"tokens_granted", InfoValue::Number(now.tokens_granted)),
        ],
    );
}

redis_module! {
    name: "tb",
    version: MODULE_VERSION,
    // The system allocator, not the server's: no call path allocates, and it lets tests and benches link the
    // rlib (the crate's Redis allocator aborts outside a server).
    allocator: (std::alloc::System, std::alloc::System),
    data_types: [],
    init: init,
    info: info,
}
