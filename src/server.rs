//! The only module that holds `unsafe`: a thin, safe face over the few server calls the commands need.
//!
//! Why not the `redis-module` crate's high-level API? Its command trampoline retains every argument into a
//! `Vec`, its `hash_set` writes one field per call and needs a `RedisString` per value, it has no absolute
//! expiry, and `Context::replicate` builds `CString`s on every call. Each costs on a path that must stay within
//! a small factor of `HSET`. So this module calls the crate's generated `raw` bindings directly (no hand-written
//! FFI declarations) and exposes only safe types: [`Call`] for one command invocation, [`Key`] for one opened
//! key, [`CallString`] for a string a call made, and [`Interned`] for a fixed string made once per process (hash
//! field names: the server allocates nothing per call for them). Nothing here knows what a token bucket is.
//!
//! Every function pointer is checked before use: a server that lacks one (say `RedisModule_SetAbsExpire` on 6.2)
//! gets a fallback or an error, never a null call. Nothing here panics.

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

    /// Replies with an array of integers.
    pub fn reply_integers(&self, values: &[i64]) {
        let (Some(array), Some(integer)) = (unsafe { raw::RedisModule_ReplyWithArray }, unsafe {
            raw::RedisModule_ReplyWithLongLong
        }) else {
            return;
        };
        let Ok(len) = c_long::try_from(values.len()) else {
            return;
        };
        // SAFETY: `ctx` is the live context of this call.
        unsafe {
            array(self.ctx, len);
            for &value in values {
                integer(self.ctx, value);
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

/// The class of a keyspace event, as `notify-keyspace-events` filters them.
#[derive(Clone, Copy)]
pub enum EventClass {
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
        };
        // SAFETY: live context and key name; the server copies what it publishes.
        unsafe { notify(self.ctx, class, event.as_ptr(), key.name) };
    }
}

/// A server string owned by one call (see [`Call::create_string`]), freed when dropped.
pub struct CallString<'c> {
    ctx: *mut raw::RedisModuleCtx,
    string: NonNull<raw::RedisModuleString>,
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
    fn get(&self) -> Option<*mut raw::RedisModuleString> {
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

/// What an opened key holds, as far as the commands care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    Other,
}

/// An opened key, closed when dropped. Borrowed from the [`Call`] that opened it.
pub struct Key<'c> {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    /// Whether this handle attempted a write; only then does dropping it signal the key as modified (see
    /// [`signal_only_modified_keys`]).
    modified: Cell<bool>,
    _call: PhantomData<&'c ()>,
}

impl Key<'_> {
    pub fn kind(&self) -> KeyKind {
        let Some(key_type) = (unsafe { raw::RedisModule_KeyType }) else {
            return KeyKind::Other;
        };
        // SAFETY: `self.key` is open until drop.
        match unsafe { key_type(self.key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            _ => KeyKind::Other,
        }
    }

    /// Number of fields of a hash (0 for an empty key).
    pub fn hash_len(&self) -> usize {
        match unsafe { raw::RedisModule_ValueLength } {
            // SAFETY: `self.key` is open until drop.
            Some(value_length) => unsafe { value_length(self.key) },
            None => 0,
        }
    }

    /// Reads two fields of a hash in one call and hands their bytes (`None`: field missing) to `read`. The
    /// bytes live only for that closure: the server's copies are freed right after.
    pub fn hash_get2<R>(
        &self,
        fields: [&Interned; 2],
        read: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R,
    ) -> R {
        let mut value_a: *mut raw::RedisModuleString = ptr::null_mut();
        let mut value_b: *mut raw::RedisModuleString = ptr::null_mut();
        if let (Some(hash_get), Some(field_a), Some(field_b)) = (
            unsafe { raw::RedisModule_HashGet },
            fields[0].get(),
            fields[1].get(),
        ) {
            // SAFETY: without flags, HashGet takes RedisModuleString field names, each followed by a pointer that
            // receives a new string (or NULL); the list ends with a NULL.
            unsafe {
                hash_get(
                    self.key,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    field_a,
                    &mut value_a as *mut *mut raw::RedisModuleString,
                    field_b,
                    &mut value_b as *mut *mut raw::RedisModuleString,
                    ptr::null::<c_char>(),
                );
            }
        }
        let result = read(
            (!value_a.is_null()).then(|| string_bytes(value_a)),
            (!value_b.is_null()).then(|| string_bytes(value_b)),
        );
        self.free_string(value_a);
        self.free_string(value_b);
        result
    }

    /// Sets two fields of the hash (creating the key if it is empty) in one call.
    pub fn hash_set2(&self, fields: [(&Interned, &CallString<'_>); 2]) -> Result<(), ()> {
        let hash_set = unsafe { raw::RedisModule_HashSet }.ok_or(())?;
        // Before the attempt: a write that fails halfway may still have changed the key.
        self.modified.set(true);
        let [(field_a, value_a), (field_b, value_b)] = fields;
        let (field_a, field_b) = (field_a.get().ok_or(())?, field_b.get().ok_or(())?);
        set_errno(0);
        // SAFETY: without flags, pairs of (RedisModuleString field, RedisModuleString value), NULL-terminated;
        // the server copies both.
        let counted = unsafe {
            hash_set(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field_a,
                value_a.string.as_ptr(),
                field_b,
                value_b.string.as_ptr(),
                ptr::null::<c_char>(),
            )
        };
        // HashSet counts only the fields it replaced, so 0 is normal for a new bucket; a failure is 0 with errno
        // EINVAL or ENOTSUP (ENOENT just says nothing was counted).
        if counted == 0 && matches!(errno(), libc::EINVAL | libc::ENOTSUP) {
            Err(())
        } else {
            Ok(())
        }
    }

    /// Makes the key expire at `at_ms` (Unix milliseconds). Servers without `SetAbsExpire` (6.2) get the
    /// equivalent relative expiry; replicas still receive the absolute `PEXPIREAT`.
    pub fn set_expire_at(&self, at_ms: i64) -> Result<(), ()> {
        self.modified.set(true);
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            // SAFETY: `self.key` is open for writing until drop.
            return status(unsafe { set_abs(self.key, at_ms) });
        }
        let set_relative = unsafe { raw::RedisModule_SetExpire }.ok_or(())?;
        let ttl_ms = at_ms.saturating_sub(now_us() / 1_000).max(1);
        // SAFETY: as above.
        status(unsafe { set_relative(self.key, ttl_ms) })
    }

    /// The key's absolute expiry in Unix milliseconds; `None` if it has none. Only for a key that exists: Redis
    /// 8.2's `RedisModule_GetAbsExpire` crashes on an empty key. Servers without it (6.2) get now + the TTL.
    pub fn expire_at_ms(&self) -> Option<i64> {
        let at_ms = if let Some(get_abs) = unsafe { raw::RedisModule_GetAbsExpire } {
            // SAFETY: `self.key` is open until drop, and the caller knows it exists.
            unsafe { get_abs(self.key) }
        } else {
            let get_relative = unsafe { raw::RedisModule_GetExpire }?;
            // SAFETY: as above.
            let ttl_ms = unsafe { get_relative(self.key) };
            if ttl_ms < 0 {
                return None;
            }
            (now_us() / 1_000).saturating_add(ttl_ms)
        };
        (at_ms >= 0).then_some(at_ms)
    }

    fn free_string(&self, string: *mut raw::RedisModuleString) {
        if string.is_null() {
            return;
        }
        if let Some(free) = unsafe { raw::RedisModule_FreeString } {
            // SAFETY: `string` was created for us with `self.ctx` and is freed once.
            unsafe { free(self.ctx, string) };
        }
    }
}

impl Drop for Key<'_> {
    fn drop(&mut self) {
        if self.modified.get() {
            if let Some(signal) = unsafe { raw::RedisModule_SignalModifiedKey } {
                // SAFETY: live context and key name of this call.
                unsafe { signal(self.ctx, self.name) };
            }
        }
        if let Some(close) = unsafe { raw::RedisModule_CloseKey } {
            // SAFETY: opened by `Call::open_key`, closed exactly once.
            unsafe { close(self.key) };
        }
    }
}

/// Whether the server knows the command `name`: `false` when the configuration renamed it away
/// (`rename-command PEXPIREAT ""`), and then the module cannot replicate what it writes.
///
/// Asks `RM_Call` to run `name` with no arguments. An unknown name fails with `ENOENT` before anything runs; a
/// known one fails its arity check (`EINVAL`) and runs neither. So `name` must be a command that needs at least
/// one argument. Load time only.
pub fn command_exists(ctx: &redis_module::Context, name: &CStr) -> bool {
    let Some(call) = (unsafe { raw::RedisModule_Call }) else {
        return false;
    };
    set_errno(0);
    // SAFETY: live load-time context, NUL-terminated name, and an empty format: no variadic arguments follow.
    let reply = unsafe { call(ctx.ctx, name.as_ptr(), c"".as_ptr()) };
    let unknown = reply.is_null() && errno() == libc::ENOENT;
    if !reply.is_null() {
        if let Some(free) = unsafe { raw::RedisModule_FreeCallReply } {
            // SAFETY: a reply `RM_Call` just returned to us, freed once.
            unsafe { free(reply) };
        }
    }
    !unknown
}

/// Whether the server can set an absolute expiry (`RedisModule_SetAbsExpire`, Redis 7.0+).
pub fn has_abs_expire() -> bool {
    unsafe { raw::RedisModule_SetAbsExpire }.is_some()
}

/// Stops the server from signalling every key the module opens for writing as modified when it is closed, its
/// default. A denial or a peek opens the bucket for writing but changes nothing, and that signal would abort a
/// client's `WATCH` on it and invalidate client-side caches of it. [`Key`] signals the keys it wrote instead.
/// Called once from the module's init function; it replaces any other module option (we set none). A server
/// without module options keeps the implicit signal: spurious, never missing.
pub fn signal_only_modified_keys(ctx: &redis_module::Context) {
    if let Some(set_options) = unsafe { raw::RedisModule_SetModuleOptions } {
        // SAFETY: `ctx` is the live module context of `RedisModule_OnLoad`.
        unsafe {
            set_options(
                ctx.ctx,
                raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int,
            )
        };
    }
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

fn string_bytes<'a>(string: *const raw::RedisModuleString) -> &'a [u8] {
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

fn errno() -> c_int {
    // SAFETY: the calling thread's errno location is always valid.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value };
}

fn status(code: c_int) -> Result<(), ()> {
    if code == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(())
    }
}

/// Static self-description of a command for `COMMAND DOCS`/`COMMAND INFO`: what `RedisModule_SetCommandInfo`
/// takes, in safe types.
pub struct CommandDocs {
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub since: &'static CStr,
    /// Redis arity: positive for exact, negative for "at least |arity|" (command name included).
    pub arity: c_int,
    /// Where the keys are: index of the first key, then the range (`last_key` relative to it, -1 for the last
    /// argument) and the step between keys. Every key is read, returned and updated (RW + ACCESS + UPDATE).
    pub first_key: c_int,
    pub last_key: c_int,
    pub key_step: c_int,
    pub args: &'static [ArgDoc],
}

impl CommandDocs {
    /// The `lastkey` of the legacy `RedisModule_CreateCommand` triple: absolute, or -1 for "the last argument".
    pub fn legacy_last_key(&self) -> c_int {
        if self.last_key < 0 {
            self.last_key
        } else {
            self.first_key + self.last_key
        }
    }
}

/// One argument of [`CommandDocs`].
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub optional: bool,
    pub multiple: bool,
    /// Nested arguments (a block).
    pub subargs: &'static [ArgDoc],
}

#[derive(Clone, Copy)]
pub enum ArgKind {
    Key,
    Double,
    Block,
}

/// What became of a request for an optional server feature. Ordered from worst to best, so the `min` over
/// several requests is the one to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Support {
    Failed,
    /// The server lacks the API (e.g. `SetCommandInfo` on Redis 6.2).
    Unsupported,
    Done,
}

/// The layout version of the structures below, as `redismodule.h` defines it for `RedisModule_SetCommandInfo`.
static COMMAND_INFO_VERSION: raw::RedisModuleCommandInfoVersion =
    raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };

/// Gives the registered command `name` its arity, key spec and documentation. Load time only.
pub fn set_command_info(ctx: &redis_module::Context, name: &CStr, docs: &CommandDocs) -> Support {
    let (Some(get_command), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Support::Unsupported;
    };
    // SAFETY: live load-time context and a NUL-terminated name.
    let command = unsafe { get_command(ctx.ctx, name.as_ptr()) };
    if command.is_null() {
        return Support::Failed;
    }
    let key_specs = [
        raw::RedisModuleCommandKeySpec {
            notes: ptr::null(),
            // RW + ACCESS + UPDATE, as Redis declares its own read-modify-write commands that return what they
            // read (INCR, HINCRBY): the reply carries the bucket's state, so ACL needs read and write access.
            flags: u64::from(
                raw::REDISMODULE_CMD_KEY_RW
                    | raw::REDISMODULE_CMD_KEY_ACCESS
                    | raw::REDISMODULE_CMD_KEY_UPDATE,
            ),
            begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
            bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 {
                    pos: docs.first_key,
                },
            },
            find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
            fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                    lastkey: docs.last_key,
                    keystep: docs.key_step,
                    limit: 0,
                },
            },
        },
        // SAFETY: an all-zero key spec is the documented terminator.
        unsafe { std::mem::zeroed() },
    ];
    let mut arg_storage: Vec<Vec<raw::RedisModuleCommandArg>> = Vec::new();
    let args = raw_args(docs.args, &mut arg_storage);
    let info = raw::RedisModuleCommandInfo {
        version: &COMMAND_INFO_VERSION,
        summary: docs.summary.as_ptr(),
        complexity: docs.complexity.as_ptr(),
        since: docs.since.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: docs.arity,
        key_specs: key_specs.as_ptr().cast_mut(),
        args,
    };
    // SAFETY: every pointer in `info` is live until this returns; the server copies what it keeps.
    match status(unsafe { set_info(command, &info) }) {
        Ok(()) => Support::Done,
        Err(()) => Support::Failed,
    }
}

/// Lays out `docs` as a NULL-terminated raw array kept alive by `storage`, subargs first.
fn raw_args(
    docs: &[ArgDoc],
    storage: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    if docs.is_empty() {
        return ptr::null_mut();
    }
    let mut array: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(docs.len() + 1);
    for doc in docs {
        let subargs = raw_args(doc.subargs, storage);
        let mut flags = 0;
        if doc.optional {
            flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
        }
        if doc.multiple {
            flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
        }
        array.push(raw::RedisModuleCommandArg {
            name: doc.name.as_ptr(),
            type_: match doc.kind {
                ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                ArgKind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
                ArgKind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            },
            key_spec_index: if matches!(doc.kind, ArgKind::Key) {
                0
            } else {
                -1
            },
            token: ptr::null(),
            summary: ptr::null(),
            since: ptr::null(),
            flags: c_int::try_from(flags).unwrap_or(0),
            deprecated_since: ptr::null(),
            subargs,
            display_text: ptr::null(),
        });
    }
    // SAFETY: an all-zero argument is the documented terminator.
    array.push(unsafe { std::mem::zeroed() });
    // Moving the Vec into `storage` does not move its heap buffer, so the pointer stays valid.
    let pointer = array.as_mut_ptr();
    storage.push(array);
    pointer
}

/// Adds a module-defined ACL category (Redis 7.4+, Valkey). Load time only.
pub fn add_acl_category(ctx: &redis_module::Context, name: &CStr) -> Support {
    let Some(add) = (unsafe { raw::RedisModule_AddACLCategory }) else {
        return Support::Unsupported;
    };
    // SAFETY: live load-time context, NUL-terminated name.
    match status(unsafe { add(ctx.ctx, name.as_ptr()) }) {
        Ok(()) => Support::Done,
        Err(()) => Support::Failed,
    }
}

/// Puts the registered command `name` in the space-separated ACL `categories` (Redis 7.2+, Valkey).
pub fn set_acl_categories(ctx: &redis_module::Context, name: &CStr, categories: &CStr) -> Support {
    let (Some(get_command), Some(set_categories)) =
        (unsafe { raw::RedisModule_GetCommand }, unsafe {
            raw::RedisModule_SetCommandACLCategories
        })
    else {
        return Support::Unsupported;
    };
    // SAFETY: live load-time context and NUL-terminated strings.
    let command = unsafe { get_command(ctx.ctx, name.as_ptr()) };
    if command.is_null() {
        return Support::Failed;
    }
    // SAFETY: as above.
    match status(unsafe { set_categories(command, categories.as_ptr()) }) {
        Ok(()) => Support::Done,
        Err(()) => Support::Failed,
    }
}

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
