//! Several buckets, each with its own cost, decided at once: all or nothing, with a result per bucket.
//!
//! [`acquire_each`] is [`acquire_all`](super::acquire_all) with a cost per bucket (requests per second *and* bytes
//! per second, say), and it reports every bucket, not only the one that decided. It shares the core's refill and
//! decision ([`acquire`](super::acquire)), so each bucket's answer is exactly what a lone `acquire` would say of
//! it at the same instant. Pure, like the rest of the crate: no Redis, no clock, no I/O.
#![forbid(unsafe_code)]

use super::{acquire, limiting_index, Cost, Decision, Outcome, Params, State};

/// One bucket of an [`acquire_each`] call: its stored state (`None`: missing, hence full), its parameters and the
/// tokens this call takes from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Member {
    pub stored: Option<State>,
    pub params: Params,
    pub cost: Cost,
}

/// The answer to an [`acquire_each`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct Each {
    /// `Allowed` only if every bucket holds its own cost now. When refused, the limiting bucket's outcome:
    /// `Impossible` if some bucket's cost exceeds its burst, else `Denied`.
    pub outcome: Outcome,
    /// 0-based index of the bucket that decided, by `acquire_all`'s rule: when refused, the first whose cost
    /// exceeds its burst, else the first with the longest wait; when allowed, the first with the fewest tokens
    /// left. 0 for an empty call.
    pub limiting_index: usize,
    /// One entry per bucket, in order. `outcome` says whether that bucket alone holds its cost now (`Allowed`:
    /// it fits), not whether anything was taken. When the call is allowed, each entry is the bucket's
    /// [`acquire`] decision, writes included. When refused, nothing is taken from any bucket: an entry that fits
    /// reports `remaining` and `reset_after_ms` as the bucket stands (a peek) with `retry_after_ms` 0, the
    /// others are their own denial (`retry_after_ms` the wait for that bucket's cost, -1 when it exceeds the
    /// burst), and no entry carries a write except where a bucket records a new time base after a clock step
    /// back (see `refilled`), as `acquire_all` does.
    pub buckets: Vec<Decision>,
}

impl Each {
    pub fn allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// The largest cost a granted call took from one bucket (0 for a refused call or one of peeks only): what
    /// `INFO tb` counts, so that a call with one cost for every bucket counts what `acquire_all` would.
    pub fn largest_cost_taken(&self, members: &[Member]) -> f64 {
        if !self.allowed() {
            return 0.0;
        }
        members
            .iter()
            .map(|member| member.cost.tokens())
            .fold(0.0, f64::max)
    }
}

/// Decides one call that takes each member's own cost from its bucket at `now_us`, from every bucket or none.
///
/// A cost of 0 reports on its bucket without taking and never refuses the call, also on a bucket in debt. A
/// bucket in debt refuses any other cost until the refill has repaid the debt and brought the cost on top.
pub fn acquire_each(members: &[Member], now_us: i64) -> Each {
    let decisions: Vec<Decision> = members
        .iter()
        .map(|member| acquire(member.stored, now_us, &member.params, member.cost))
        .collect();
    if decisions.iter().all(Decision::allowed) {
        return Each {
            outcome: Outcome::Allowed,
            limiting_index: limiting_index(
                true,
                decisions.iter().map(|d| (d.remaining, d.retry_after_ms)),
            ),
            buckets: decisions,
        };
    }
    let buckets: Vec<Decision> = members
        .iter()
        .zip(decisions)
        .map(|(member, decision)| match decision.outcome {
            // Nothing is taken: report the bucket as it stands. A peek is allowed and writes nothing.
            Outcome::Allowed => acquire(member.stored, now_us, &member.params, Cost(0.0)),
            Outcome::Denied | Outcome::Impossible => decision,
        })
        .collect();
    let limiting_index = limiting_index(
        false,
        buckets.iter().map(|d| (d.remaining, d.retry_after_ms)),
    );
    let outcome = buckets
        .get(limiting_index)
        .map_or(Outcome::Denied, |d| d.outcome);
    Each {
        outcome,
        limiting_index,
        buckets,
    }
}

#[cfg(test)]
mod tests;
