//! Load-time work: registering commands, describing them (`COMMAND DOCS`, key specs, arity), ACL categories, and
//! checking what the server offers.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

use redis_module::raw;

use super::{errno, set_errno, status};

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
    Integer,
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
                ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
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

/// Something to run when the server shuts down.
pub trait ShutdownHook {
    fn on_shutdown();
}

/// Runs `H::on_shutdown` when the server begins to shut down (the `Shutdown` server event, Redis 6.0+). Load time
/// only.
pub fn on_shutdown<H: ShutdownHook>(ctx: &redis_module::Context) -> Support {
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return Support::Unsupported;
    };
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_SHUTDOWN,
        dataver: 1,
    };
    // SAFETY: live load-time context; the callback is a plain function that lives as long as the module.
    match status(unsafe { subscribe(ctx.ctx, event, Some(shutdown_callback::<H>)) }) {
        Ok(()) => Support::Done,
        Err(()) => Support::Failed,
    }
}

extern "C" fn shutdown_callback<H: ShutdownHook>(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut std::os::raw::c_void,
) {
    H::on_shutdown();
}
