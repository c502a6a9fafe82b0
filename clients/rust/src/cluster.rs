//! Redis Cluster: the connection one call uses, which sends every command of the call to the primary serving the
//! slot of the call's keys, and the slot of a call's keys.
//!
//! ```text
//! routing     every command of a call (the module's, FCALL, FUNCTION LOAD, EVALSHA, EVAL) goes to the primary of
//!             the slot of the call's keys, from the slot map of redis-rs's cluster connection: the library is
//!             loaded on the primary that lacked it, and TB.ACQUIREALL (whose first argument is the cost, not a
//!             key) goes where its keys are
//! one slot    a call whose keys are in several slots is refused before anything is sent (CROSSSLOT)
//! redirects   redis-rs's cluster connection is built with retries(0): in redis-rs 0.27 one retry count covers
//!             MOVED and ASK as well as timeouts and lost connections, and a call that timed out may have been
//!             charged. MOVED and ASK prove the node ran nothing, so they are followed here, to the node they
//!             name (after ASKING for ASK), at most MAX_REDIRECTS times; then the error is the call's (the
//!             failure table's `moved`). A MOVED also makes redis-rs refresh its slot map.
//! ```
#![forbid(unsafe_code)]

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

/// Redirects (MOVED, ASK) one command follows before its error is the call's.
pub const MAX_REDIRECTS: usize = 3;

/// The Redis Cluster hash slot of `key` (its hash tag's, if it has one).
pub fn key_slot(key: &str) -> u16 {
    get_slot(key.as_bytes())
}

/// The one slot of `keys` (slot 0 for none), or the error of keys in several slots, sent nowhere.
pub(crate) fn slot_of(keys: &[String]) -> Result<u16, RedisError> {
    let mut slots = keys.iter().map(|key| key_slot(key));
    let first = slots.next().unwrap_or(0);
    if slots.all(|slot| slot == first) {
        Ok(first)
    } else {
        Err(RedisError::from((
            ErrorKind::CrossSlot,
            "keys in several slots",
            "Keys in request don't hash to the same slot (not sent: give them one hash tag)"
                .to_owned(),
        )))
    }
}

/// The cluster connection as one call sees it: every command to the primary of `slot`, MOVED and ASK followed.
/// For a caller with a cluster connection of its own (tb-rls), built with `retries(0)`.
pub struct Routed<'a> {
    connection: &'a mut ClusterConnection,
    slot: u16,
}

impl<'a> Routed<'a> {
    /// `connection` as seen by a call whose keys are in `slot` ([`key_slot`]).
    pub fn new(connection: &'a mut ClusterConnection, slot: u16) -> Routed<'a> {
        Routed { connection, slot }
    }

    fn primary(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::SpecificNode(Route::new(self.slot, SlotAddr::Master))
    }
}

/// Where a MOVED or ASK error sends the command, and whether it needs ASKING first; `None` for other errors.
fn redirect(err: &RedisError) -> Option<(SingleNodeRoutingInfo, bool)> {
    let asking = match err.kind() {
        ErrorKind::Moved => false,
        ErrorKind::Ask => true,
        _ => return None,
    };
    let (address, _slot) = err.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host.to_owned();
    Some((SingleNodeRoutingInfo::ByAddress { host, port }, asking))
}

impl ConnectionLike for Routed<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut target = self.primary();
            let mut asking = false;
            let mut redirects = 0;
            loop {
                let result = if asking {
                    let mut pipeline = redis::pipe();
                    pipeline.cmd("ASKING").add_command(cmd.clone());
                    self.connection
                        .route_pipeline(&pipeline, 1, 1, target.clone())
                        .await
                        .and_then(|values| {
                            values.into_iter().next().ok_or_else(|| {
                                RedisError::from((ErrorKind::ClientError, "no reply after ASKING"))
                            })
                        })
                } else {
                    self.connection
                        .route_command(cmd, RoutingInfo::SingleNode(target.clone()))
                        .await
                };
                let err = match result {
                    Ok(value) => return Ok(value),
                    Err(err) => err,
                };
                match redirect(&err) {
                    Some((next, ask)) if redirects < MAX_REDIRECTS => {
                        redirects += 1;
                        target = next;
                        asking = ask;
                    }
                    _ => return Err(err),
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let target = self.primary();
        Box::pin(
            self.connection
                .route_pipeline(pipeline, offset, count, target),
        )
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_hash_tag_share_a_slot_and_others_are_refused_unsent() {
        let tagged = [
            "ratelimit:{1.2.3.4}:a".to_owned(),
            "ratelimit:{1.2.3.4}:b".to_owned(),
        ];
        assert_eq!(slot_of(&tagged).expect("one slot"), key_slot("1.2.3.4"));
        let split = ["ratelimit:{a}:x".to_owned(), "ratelimit:{b}:x".to_owned()];
        let err = slot_of(&split).expect_err("two slots");
        assert_eq!(err.kind(), ErrorKind::CrossSlot);
        assert_eq!(crate::Error::from(err).failure().class, "crossslot");
    }

    #[test]
    fn moved_and_ask_name_the_node_to_follow() {
        let moved = RedisError::from((
            ErrorKind::Moved,
            "An error was signalled by the server",
            "3999 127.0.0.1:6381".to_owned(),
        ));
        let (target, asking) = redirect(&moved).expect("a redirect");
        assert!(!asking);
        assert!(matches!(
            target,
            SingleNodeRoutingInfo::ByAddress { ref host, port: 6381 } if host == "127.0.0.1"
        ));
        let ask = RedisError::from((
            ErrorKind::Ask,
            "An error was signalled by the server",
            "3999 127.0.0.1:6382".to_owned(),
        ));
        assert!(redirect(&ask).expect("a redirect").1);
        let busy = RedisError::from((ErrorKind::TryAgain, "try again"));
        assert!(redirect(&busy).is_none());
    }
}
