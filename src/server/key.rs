//! One opened key: what it holds, its hash fields, its expiry. Closed (and signalled as modified only if it was
//! written) when dropped.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int};
use std::ptr;

use redis_module::raw;

use super::{errno, now_us, set_errno, status, string_bytes, CallString, Interned};

/// Milliseconds taken off an expiry rebuilt from a relative TTL (see [`Key::expire_at_ms`]).
const RELATIVE_EXPIRY_MARGIN_MS: i64 = 2;

/// What an opened key holds, as far as the commands care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    String,
    Other,
}

/// An opened key, closed when dropped. Borrowed from the [`Call`] that opened it.
pub struct Key<'c> {
    pub(super) ctx: *mut raw::RedisModuleCtx,
    pub(super) name: *mut raw::RedisModuleString,
    pub(super) key: *mut raw::RedisModuleKey,
    /// Whether this handle attempted a write; only then does dropping it signal the key as modified (see
    /// [`signal_only_modified_keys`]).
    pub(super) modified: Cell<bool>,
    pub(super) _call: PhantomData<&'c ()>,
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
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
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

    /// Hands the bytes of a string key to `read` (`None`: not a string). The bytes live only for that closure.
    ///
    /// The server gives direct access to its own buffer (`RedisModule_StringDMA`); a short or integer-encoded
    /// value is first converted to a plain buffer, once, after which the key's own writes keep it that way (see
    /// [`Key::string_set`]).
    pub fn string_get<R>(&self, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let dma = unsafe { raw::RedisModule_StringDMA }?;
        let mut len: usize = 0;
        // SAFETY: `self.key` is open until drop; READ access does not change the value.
        let data = unsafe { dma(self.key, &mut len, raw::REDISMODULE_READ as c_int) };
        if data.is_null() {
            return None;
        }
        // SAFETY: the server guarantees `len` readable bytes at `data` until the key is written or closed; the
        // slice does not outlive `read`, which cannot write or close the key (it gets only the bytes).
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        Some(read(bytes))
    }

    /// Makes the key a string holding exactly `bytes` (creating it if it is empty), keeping its expiry. Written in
    /// place through `RedisModule_StringTruncate` and `RedisModule_StringDMA`: no new value object, no delete and
    /// re-insert of the key, as `RedisModule_StringSet` would do. Only for a key that is empty or a string.
    pub fn string_set(&self, bytes: &[u8]) -> Result<(), ()> {
        let (truncate, dma) = (unsafe { raw::RedisModule_StringTruncate }, unsafe {
            raw::RedisModule_StringDMA
        });
        let (Some(truncate), Some(dma)) = (truncate, dma) else {
            return Err(());
        };
        self.modified.set(true);
        // SAFETY: `self.key` is open for writing until drop and holds nothing or a string.
        status(unsafe { truncate(self.key, bytes.len()) })?;
        let mut len: usize = 0;
        // SAFETY: as above; WRITE access gives a buffer of `len` bytes the module may change.
        let data = unsafe { dma(self.key, &mut len, raw::REDISMODULE_WRITE as c_int) };
        if data.is_null() || len != bytes.len() {
            return Err(());
        }
        // SAFETY: `data` holds `len` writable bytes, the same count as `bytes`, and the two cannot overlap.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), data.cast::<u8>(), len) };
        Ok(())
    }

    /// Deletes the key.
    pub fn delete(&self) -> Result<(), ()> {
        let delete = unsafe { raw::RedisModule_DeleteKey }.ok_or(())?;
        self.modified.set(true);
        // SAFETY: `self.key` is open for writing until drop.
        status(unsafe { delete(self.key) })
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
    /// 8.2's `RedisModule_GetAbsExpire` crashes on an empty key.
    ///
    /// Servers without it (6.2) only tell the TTL, so the expiry is rebuilt as now + TTL, and never later than the
    /// truth: the clock is read before the TTL (which the server measures from a later instant), and
    /// [`RELATIVE_EXPIRY_MARGIN_MS`] more is taken off, because there the primary's own expiry, set relative to
    /// now, can be a millisecond later than the absolute one its replicas and AOF hold. A caller deciding whether
    /// the expiry is late enough then errs towards moving it.
    pub fn expire_at_ms(&self) -> Option<i64> {
        let at_ms = if let Some(get_abs) = unsafe { raw::RedisModule_GetAbsExpire } {
            // SAFETY: `self.key` is open until drop, and the caller knows it exists.
            unsafe { get_abs(self.key) }
        } else {
            let get_relative = unsafe { raw::RedisModule_GetExpire }?;
            let now_ms = now_us() / 1_000;
            // SAFETY: as above.
            let ttl_ms = unsafe { get_relative(self.key) };
            if ttl_ms < 0 {
                return None;
            }
            now_ms
                .saturating_add(ttl_ms)
                .saturating_sub(RELATIVE_EXPIRY_MARGIN_MS)
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
