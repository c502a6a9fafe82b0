//! A bucket's stored form on the server: reading the hash into a `State`, and writing a new state with its expiry,
//! its replication and its keyspace events.
#![forbid(unsafe_code)]

use std::ffi::CStr;

use crate::bucket::{State, Write};
use crate::codec::{decode_state, with_encoded};
use crate::server::{Call, EventClass, Interned, Key, KeyKind};

use super::TbError;

/// Keyspace events a write fires: those of the native commands it replicates as (`HSET`, `PEXPIREAT`, `DEL`).
const EVENT_HSET: &CStr = c"hset";
const EVENT_EXPIRE: &CStr = c"expire";
const EVENT_DEL: &CStr = c"del";

/// Hash field holding the token count. A `static`, not a `const`: the server string is made once and reused.
static FIELD_TOKENS: Interned = Interned::new(c"tokens");
/// Hash field holding the time of the last write, in microseconds.
static FIELD_UPDATED_US: Interned = Interned::new(c"ts");

/// A bucket this call opened for writing, with what it held before the call. Every command reads and writes its
/// buckets through this, so that each decision's write lands with the same expiry, replication and events.
pub(super) struct OpenBucket<'c> {
    key: Key<'c>,
    /// The state before this call: `None` for a missing key (a full bucket).
    pub(super) stored: Option<State>,
}

impl<'c> OpenBucket<'c> {
    /// Opens the key at argument `key_index` and reads its bucket.
    pub(super) fn open(call: &'c Call<'_>, key_index: usize) -> Result<OpenBucket<'c>, TbError> {
        let key = call.open_key(key_index).ok_or(TbError::WriteFailed)?;
        let stored = read_state(&key)?;
        Ok(OpenBucket { key, stored })
    }

    /// Opens and reads the buckets at `key_indexes`, in order: the first that is not a bucket is the error, and
    /// nothing has been written by then.
    pub(super) fn open_all(
        call: &'c Call<'_>,
        key_indexes: &[usize],
    ) -> Result<Vec<OpenBucket<'c>>, TbError> {
        key_indexes
            .iter()
            .map(|&key_index| OpenBucket::open(call, key_index))
            .collect()
    }

    /// Stores the decision's write, if it made one (see [`write_state`]); refused above `maxmemory` (see
    /// [`memory_for_writes`]).
    pub(super) fn write(&self, call: &Call<'_>, write: Option<&Write>) -> Result<(), TbError> {
        memory_for_writes(call, write.is_some())?;
        self.write_at_any_memory(call, write)
    }

    /// Stores each bucket's write, if it made one: all of them, or (above `maxmemory`) none.
    pub(super) fn write_each<'b, 'w>(
        call: &Call<'_>,
        writes: impl Iterator<Item = (&'b OpenBucket<'c>, Option<&'w Write>)> + Clone,
    ) -> Result<(), TbError>
    where
        'c: 'b,
    {
        memory_for_writes(call, writes.clone().any(|(_, write)| write.is_some()))?;
        for (bucket, write) in writes {
            bucket.write_at_any_memory(call, write)?;
        }
        Ok(())
    }

    /// Stores the decision's write even above `maxmemory`: for `TB.REFUND`, which only gives tokens back.
    pub(super) fn write_at_any_memory(
        &self,
        call: &Call<'_>,
        write: Option<&Write>,
    ) -> Result<(), TbError> {
        match write {
            Some(write) => write_state(call, &self.key, write, self.stored.is_some()),
            None => Ok(()),
        }
    }

    /// Deletes the bucket (see [`delete_state`]).
    pub(super) fn delete(&self, call: &Call<'_>) -> Result<(), TbError> {
        delete_state(call, &self.key)
    }
}

/// Refuses a call that `writes` while the server is above `maxmemory` and could not evict below it, with Redis's
/// own OOM reply, before anything is written. The commands are not `deny-oom`, which would have the server refuse
/// every call, refusals and peeks too, before it runs: a call that writes nothing is answered at any memory, as
/// redis-cell answers. Only a call that writes asks the server (the flags are computed on each read).
pub(super) fn memory_for_writes(call: &Call<'_>, writes: bool) -> Result<(), TbError> {
    if writes && call.out_of_memory() {
        Err(TbError::OutOfMemory)
    } else {
        Ok(())
    }
}

/// Reads the bucket: `None` for a missing key, the decoded state for a bucket hash.
fn read_state(key: &Key<'_>) -> Result<Option<State>, TbError> {
    match key.kind() {
        KeyKind::Empty => Ok(None),
        KeyKind::Other | KeyKind::String => Err(TbError::WrongType),
        KeyKind::Hash if key.hash_len() != 2 => Err(TbError::NotABucket),
        KeyKind::Hash => key
            .hash_get2([&FIELD_TOKENS, &FIELD_UPDATED_US], decode_state)
            .map(Some)
            .ok_or(TbError::NotABucket),
    }
}

/// Writes the new state, moves the key's expiry only when it falls outside the write's window (see
/// [`Write`]), replicates exactly those effects (the same value strings go to the hash and to the replicated
/// `HSET`), and fires the keyspace events the equivalent native commands would.
///
/// On a live bucket whose expiry still fits, the write replicates as one `HSET`, which the server sends alone;
/// creating a bucket, or moving its expiry (about once per slack on a hot key), adds a `PEXPIREAT`, and the server
/// wraps the pair in `MULTI`/`EXEC`. `existed` says whether the key was there before this call.
///
/// Nothing here can fail after the first write for a reason we could have checked first: the value strings are
/// made up front, the key was opened for writing and holds a hash or nothing, and the module refused to load where
/// `HSET` or `PEXPIREAT` is renamed (see `REPLICATED_COMMANDS`).
fn write_state(
    call: &Call<'_>,
    key: &Key<'_>,
    write: &Write,
    existed: bool,
) -> Result<(), TbError> {
    let (tokens, updated_us) = with_encoded(&write.state, |tokens, updated_us| {
        (call.create_string(tokens), call.create_string(updated_us))
    });
    let (Some(tokens), Some(updated_us)) = (tokens, updated_us) else {
        return Err(TbError::WriteFailed);
    };
    // Only ask an existing key for its expiry (Redis 8.2 crashes on an empty one).
    let current_expiry_ms = if existed { key.expire_at_ms() } else { None };
    let new_expiry_ms = (!write.keeps_expiry(current_expiry_ms)).then(|| write.new_expiry_ms());
    let fields = [(&FIELD_TOKENS, &tokens), (&FIELD_UPDATED_US, &updated_us)];
    key.hash_set2(fields)
        .and_then(|()| call.replicate_hset(key, fields))
        .map_err(|()| TbError::WriteFailed)?;
    call.notify(EventClass::Hash, EVENT_HSET, key);
    if let Some(at_ms) = new_expiry_ms {
        key.set_expire_at(at_ms)
            .and_then(|()| call.replicate_pexpireat(key, at_ms))
            .map_err(|()| TbError::WriteFailed)?;
        call.notify(EventClass::Generic, EVENT_EXPIRE, key);
    }
    Ok(())
}

/// Deletes a bucket that is full again (a missing key is a full bucket), replicates a `DEL` and fires its
/// keyspace event. The key exists and was checked by [`read_state`]; `DEL` was checked at load time.
fn delete_state(call: &Call<'_>, key: &Key<'_>) -> Result<(), TbError> {
    key.delete()
        .and_then(|()| call.replicate_del(key))
        .map_err(|()| TbError::WriteFailed)?;
    call.notify(EventClass::Generic, EVENT_DEL, key);
    Ok(())
}
