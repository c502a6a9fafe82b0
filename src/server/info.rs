//! The module's `INFO` section.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

/// A field of the module's `INFO` section.
pub enum InfoValue {
    Count(u64),
    Number(f64),
}

/// Adds `section` (shown as `tb_<section>` under `INFO tb`) with its fields.
pub fn add_info_section(
    ctx: &redis_module::InfoContext,
    section: &CStr,
    fields: &[(&CStr, InfoValue)],
) {
    let (Some(add_section), Some(add_count), Some(add_number)) = (
        unsafe { raw::RedisModule_InfoAddSection },
        unsafe { raw::RedisModule_InfoAddFieldULongLong },
        unsafe { raw::RedisModule_InfoAddFieldDouble },
    ) else {
        return;
    };
    // SAFETY: `ctx.ctx` is the live INFO context of this callback; names are NUL-terminated.
    unsafe {
        if add_section(ctx.ctx, section.as_ptr()) != raw::REDISMODULE_OK as c_int {
            return;
        }
        for (name, value) in fields {
            match *value {
                InfoValue::Count(count) => add_count(ctx.ctx, name.as_ptr(), count),
                InfoValue::Number(number) => add_number(ctx.ctx, name.as_ptr(), number),
            };
        }
    }
}
