//! The only module that holds `unsafe`: a thin, safe face over the few server calls the commands need.
//!
//! Why not the `redis-module` crate's high-level API? Its command trampoline retains every argument into a
//! `Vec`, its `hash_set` writes one field per call and needs a `RedisString` per value, it has no absolute
//! expiry, and `Context::replicate` builds `CString`s on every call. Each costs on a path that must stay within
//! a small factor of `HSET`. So this module calls the crate's generated `raw` bindings directly (no hand-written
//! FFI declarations) and exposes only safe types. Nothing here knows what a token bucket is. By concern:
//!
//! - this file: [`Call`] for one command invocation (arguments, replies, replication, keyspace events),
//!   [`CallString`] for a string a call made, [`Interned`] for a fixed string made once per process (hash field
//!   names: the server allocates nothing per call for them), the clock, and the helpers the others share;
//! - `key`: [`Key`], one opened key (type, hash fields, expiry, deletion);
//! - `register`: load-time work (command registration, `COMMAND DOCS`, key specs, ACL categories, checks);
//! - `info`: the module's `INFO` section.
//!
//! Every function pointer is checked before use: a server that lacks one (say `RedisModule_SetAbsExpire` on 6.2)
//! gets a fallback or an error, never a null call. Nothing here panics.

mod info;
mod key;
mod register;

pub use info::{add_info_section, InfoValue};
pub use key::{has_abs_expire, signal_only_modified_keys, Key, KeyKind};
pub use register::{
    add_acl_category, command_exists, on_shutdown, set_acl_categories, set_command_info, ArgDoc,
    ArgKind, CommandDocs, ShutdownHook, Support,
};

use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_long};
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;
/// What a command handler reports back to the trampoline.
pub trait Command {
    /// Runs one invocation. Must reply exactly once through `call`.
    fn run(call: &Call<'_>);
}

/// Registers `C` under `name` with the server. Called from the module's init function only.
pub fn create_command<C: Command>(
    ctx: &redis_module::Context,
    name: &CStr,
    flags: &CStr,
    first_key: c_int,
    last_key: c_int,
    key_step: c_int,
) -> redis_module::Status {
    let Some(create) = (unsafe { raw::RedisModule_CreateCommand }) else {
        return redis_module::Status::Err;
    };
    // SAFETY: `ctx` is the live module context of `RedisModule_OnLoad`; `name` and `flags` are NUL-terminated
    // and outlive the call (the server copies them).
    let status = unsafe {
        create(
            ctx.ctx,
            name.as_ptr(),
            Some(trampoline::<C>),
            flags.as_ptr(),
            first_key,
            last_key,
            key_step,
        )
    };
    if status == raw::REDISMODULE_OK as c_int {
        redis_module::Status::Ok
    } else {
        redis_module::Status::Err
    }
}

extern "C" fn trampoline<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let args: &[*mut raw::RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: the server passes `argc` valid string pointers at `argv` for the duration of the call.
        Ok(len) if !argv.is_null() => unsafe { slice::from_raw_parts(argv, len) },
        _ => &[],
    };
    C::run(&Call { ctx, args });
    raw::REDISMODULE_OK as c_int
}

/// One command invocation: its arguments (name included, at index 0) and the means to reply.
pub struct Call<'a> {
    ctx: *mut raw::RedisModuleCtx,
    args: &'a [*mut raw::RedisModuleString],
}

impl<'a> Call<'a> {
    /// Number of arguments, the command name included.
    pub fn arg_count(&self) -> usize {
        self.args.len()
    }

    /// The bytes of argument `index`, or `None` past the end.
    pub fn arg(&self, index: usize) -> Option<&'a [u8]> {
        self.args.get(index).map(|&s| string_bytes(s))
    }

    /// Opens argument `index` as a key for reading and writing. `None` past the end of the arguments.
    pub fn open_key(&self, index: usize) -> Option<Key<'_>> {
        let name = *self.args.get(index)?;
        let open = unsafe { raw::RedisModule_OpenKey }?;
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: `ctx` and `name` are live for this call; the key is closed by `Key::drop`.
        let key = unsafe { open(self.ctx, name, mode) }.cast::<raw::RedisModuleKey>();
        (!key.is_null()).then_some(Key {
            ctx: self.ctx,
            name,
            key,
            modified: Cell::new(false),
            _call: PhantomData,
        })
    }

    /// Whether this call runs inside a Lua script (`EVAL`, `EVALSHA`, `FCALL`).
    pub fn in_script(&self) -> bool {
        let Some(flags) = (unsafe { raw::RedisModule_GetContextFlags }) else {
            return false;
        };
        // SAFETY: `ctx` is the live context of this call.
        let flags = unsafe { flags(self.ctx) };
        flags & raw::REDISMODULE_CTX_FLAGS_LUA as c_int != 0
    }

    /// Whether the server is above its `maxmemory` and could not evict below it: the state in which Redis refuses
    /// its own `deny-oom` commands. The context flags compute it from the memory in use on each read.
    pub fn out_of_memory(&self) -> bool {
        let Some(flags) = (unsafe { raw::RedisModule_GetContextFlags }) else {
            return false;
        };
        // SAFETY: `ctx` is the live context of this call.
        let flags = unsafe { flags(self.ctx) };
        flags & raw::REDISMODULE_CTX_FLAGS_OOM as c_int != 0
    }

    /// Replies with an array of integers.
    pub fn reply_integers(&self, values: &[i64]) {
        self.reply_integers_and_rows::<0>(values, std::iter::empty());
    }

    /// Replies with one array: the integers of `head`, then one nested array of `N` integers per row.
    pub fn reply_integers_and_rows<const N: usize>(
        &self,
        head: &[i64],
        rows: impl ExactSizeIterator<Item = [i64; N]>,
    ) {
        let (Some(array), Some(integer)) = (unsafe { raw::RedisModule_ReplyWithArray }, unsafe {
            raw::RedisModule_ReplyWithLongLong
        }) else {
            return;
        };
        let (Ok(len), Ok(row_len)) = (
            c_long::try_from(head.len().saturating_add(rows.len())),
            c_long::try_from(N),
        ) else {
            return;
        };
        // SAFETY: `ctx` is the live context of this call; exactly `len` elements follow the outer array, and
        // exactly `row_len` integers each nested one.
        unsafe {
            array(self.ctx, len);
            for &value in head {
                integer(self.ctx, value);
            }
            for row in rows {
                array(self.ctx, row_len);
                for value in row {
                    integer(self.ctx, value);
                }
            }
        }
    }

    /// Replies with an error. `message` must carry its own prefix (`ERR `, `WRONGTYPE `): the server sends it
    /// as it is.
    pub fn reply_error(&self, message: &CStr) {
        if let Some(reply) = unsafe { raw::RedisModule_ReplyWithError } {
            // SAFETY: live context, NUL-terminated message copied by the server.
            unsafe { reply(self.ctx, message.as_ptr()) };
        }
    }

    /// A server string holding a copy of `bytes`, freed when the returned value drops. `None` if the server
    /// could not make one.
    pub fn create_string(&self, bytes: &[u8]) -> Option<CallString<'_>> {
        let create = unsafe { raw::RedisModule_CreateString }?;
        // SAFETY: live context; the server copies `bytes`. The string is freed by `CallString::drop`.
        let string = unsafe { create(self.ctx, bytes.as_ptr().cast::<c_char>(), bytes.len()) };
        Some(CallString {
            ctx: self.ctx,
            string: NonNull::new(string)?,
            _call: PhantomData,
        })
    }

    /// Sends `HSET <key> <field_a> <value_a> <field_b> <value_b>` to replicas and the AOF, after this command. A
    /// command that propagates one command only sends it alone (Redis 7.0+); with more, the server wraps them all
    /// in one `MULTI`/`EXEC`.
    pub fn replicate_hset(
        &self,
        key: &Key<'_>,
        fields: [(&Interned, &CallString<'_>); 2],
    ) -> Result<(), ()> {
        let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(())?;
        let [(field_a, value_a), (field_b, value_b)] = fields;
        let (field_a, field_b) = (field_a.get().ok_or(())?, field_b.get().ok_or(())?);
        // SAFETY: format "sssss" takes five live RedisModuleStrings, which the server only references (it holds
        // its own count on each until the propagation is done).
        status(unsafe {
            replicate(
                self.ctx,
                c"HSET".as_ptr(),
                c"sssss".as_ptr(),
                key.name,
                field_a,
                value_a.string.as_ptr(),
                field_b,
                value_b.string.as_ptr(),
            )
        })
    }

    /// Sends `SET <key> <value> PXAT <at_ms>` to replicas and the AOF, after this command: one command, which the
    /// server sends alone (Redis 7.0+), and which every supported server accepts (PXAT is Redis 6.2+).
    pub fn replicate_set_pxat(&self, key: &Key<'_>, value: &[u8], at_ms: i64) -> Result<(), ()> {
        let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(())?;
        let pxat = PXAT.get().ok_or(())?;
        // SAFETY: format "sbsl" takes a live RedisModuleString, a buffer with its length (copied), a live
        // RedisModuleString and a long long.
        status(unsafe {
            replicate(
                self.ctx,
                c"SET".as_ptr(),
                c"sbsl".as_ptr(),
                key.name,
                value.as_ptr().cast::<c_char>(),
                value.len(),
                pxat,
                at_ms,
            )
        })
    }

    /// Sends `PEXPIREAT <key> <at_ms>` to replicas and the AOF, after this command.
    pub fn replicate_pexpireat(&self, key: &Key<'_>, at_ms: i64) -> Result<(), ()> {
        let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(())?;
        // SAFETY: format "sl" takes a live RedisModuleString and a long long.
        status(unsafe {
            replicate(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                key.name,
                at_ms,
            )
        })
    }
}

impl Call<'_> {
    /// Sends `DEL <key>` to replicas and the AOF, after this command.
    pub fn replicate_del(&self, key: &Key<'_>) -> Result<(), ()> {
        let replicate = unsafe { raw::RedisModule_Replicate }.ok_or(())?;
        // SAFETY: format "s" takes one live RedisModuleString.
        status(unsafe { replicate(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), key.name) })
    }
}

/// The `PXAT` option of a replicated `SET`, made once.
static PXAT: Interned = Interned::new(c"PXAT");

/// The class of a keyspace event, as `notify-keyspace-events` filters them.
#[derive(Clone, Copy)]
pub enum EventClass {
    /// `$`: string events such as `set`.
    String,
    /// `g`: generic events such as `expire` and `del`.
    Generic,
    /// `h`: hash events such as `hset`.
    Hash,
}

impl Call<'_> {
    /// Fires keyspace event `event` on `key`, as a native command would. A no-op for the classes the server's
    /// `notify-keyspace-events` leaves out.
    pub fn notify(&self, class: EventClass, event: &CStr, key: &Key<'_>) {
        let Some(notify) = (unsafe { raw::RedisModule_NotifyKeyspaceEvent }) else {
            return;
        };
        let class = match class {
            EventClass::Generic => raw::REDISMODULE_NOTIFY_GENERIC,
            EventClass::Hash => raw::REDISMODULE_NOTIFY_HASH,
            EventClass::String => raw::REDISMODULE_NOTIFY_STRING,
        };
        // SAFETY: live context and key name; the server copies what it publishes.
        unsafe { notify(self.ctx, class, event.as_ptr(), key.name) };
    }
}

/// A server string owned by one call (see [`Call::create_string`]), freed when dropped.
pub struct CallString<'c> {
    ctx: *mut raw::RedisModuleCtx,
    pub(super) string: NonNull<raw::RedisModuleString>,
    _call: PhantomData<&'c ()>,
}

impl Drop for CallString<'_> {
    fn drop(&mut self) {
        if let Some(free) = unsafe { raw::RedisModule_FreeString } {
            // SAFETY: created with `self.ctx` by `Call::create_string`, freed exactly once.
            unsafe { free(self.ctx, self.string.as_ptr()) };
        }
    }
}

/// A server string made on first use and kept for the life of the process, for a fixed text such as a hash field
/// name. Passing field names as C strings (`REDISMODULE_HASH_CFIELDS`, the `c` format of `RM_Replicate`) makes
/// the server allocate and free a fresh string per field on every call; this makes one, once.
pub struct Interned {
    text: &'static CStr,
    string: AtomicPtr<raw::RedisModuleString>,
}

impl Interned {
    pub const fn new(text: &'static CStr) -> Interned {
        Interned {
            text,
            string: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The server string; `None` only if the server cannot make one.
    pub(super) fn get(&self) -> Option<*mut raw::RedisModuleString> {
        let existing = self.string.load(Ordering::Acquire);
        if !existing.is_null() {
            return Some(existing);
        }
        let create = unsafe { raw::RedisModule_CreateString }?;
        let bytes = self.text.to_bytes();
        // SAFETY: a NULL context makes a string that belongs to no call, so nothing frees it behind our back. We
        // never free it either: one small string per field name, for the life of the process.
        let created = unsafe {
            create(
                ptr::null_mut(),
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            )
        };
        if created.is_null() {
            return None;
        }
        // Commands run on the server's main thread, so nothing races us here; should anything ever do so, the
        // first string wins and ours is freed.
        match self.string.compare_exchange(
            ptr::null_mut(),
            created,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Some(created),
            Err(winner) => {
                if let Some(free) = unsafe { raw::RedisModule_FreeString } {
                    // SAFETY: made above with a NULL context and never shared.
                    unsafe { free(ptr::null_mut(), created) };
                }
                Some(winner)
            }
        }
    }
}

/// The server's version as `(major, minor, patch)`, from `RedisModule_GetServerVersion`; `None` where the server
/// does not say (Redis before 6.0.9). Valkey gives the Redis version it is compatible with.
pub fn server_version() -> Option<(i32, i32, i32)> {
    let version = unsafe { raw::RedisModule_GetServerVersion }?;
    // SAFETY: takes no arguments and only reads a constant.
    let packed = unsafe { version() };
    Some((packed >> 16 & 0xff, packed >> 8 & 0xff, packed & 0xff))
}

/// The server's wall clock in microseconds since the Unix epoch (`CLOCK_REALTIME`, the clock Redis itself uses
/// for expiry). Read once per call. Redis 7.0 exports no microsecond clock to modules, so we ask the OS.
pub fn now_us() -> i64 {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `spec` is a valid out-pointer; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut spec) };
    spec.tv_sec
        .saturating_mul(1_000_000)
        .saturating_add(spec.tv_nsec / 1_000)
}

/// The server's wall clock in nanoseconds since the Unix epoch (`CLOCK_REALTIME`, what redis-cell reads), for
/// `CL.THROTTLE`. Read once per call.
pub fn now_ns() -> i64 {
    let mut spec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `spec` is a valid out-pointer; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut spec) };
    spec.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(spec.tv_nsec)
}

pub(super) fn string_bytes<'a>(string: *const raw::RedisModuleString) -> &'a [u8] {
    let Some(ptr_len) = (unsafe { raw::RedisModule_StringPtrLen }) else {
        return &[];
    };
    let mut len: usize = 0;
    // SAFETY: `string` is a live server string; the bytes stay valid while it does, which every caller bounds.
    let data = unsafe { ptr_len(string, &mut len) };
    if data.is_null() {
        return &[];
    }
    // SAFETY: the server guarantees `len` readable bytes at `data`.
    unsafe { slice::from_raw_parts(data.cast::<u8>(), len) }
}

pub(super) fn errno() -> c_int {
    // SAFETY: the calling thread's errno location is always valid.
    unsafe { *libc::__errno_location() }
}

pub(super) fn set_errno(value: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value };
}

pub(super) fn status(code: c_int) -> Result<(), ()> {
    if code == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(())
    }
}
