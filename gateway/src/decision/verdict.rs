//! From the module's reply to the `RateLimitResponse`: the descriptor statuses, the overall code, shadow mode and
//! quota mode (see `decision`'s module doc), and the call again when only shadow or quota buckets did not fit.
//! Pure.
#![forbid(unsafe_code)]

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration;

use redis_tb_client::AcquiredEach;

use super::{Options, Plan, Slot};
use crate::config::{Limit, Policy};

impl Plan {
    /// After a refused call: if every bucket that did not fit is shadow-only, or quota-only while some quota
    /// descriptor still fits, charge those 0 and return true (call again); otherwise the refusal stands and this
    /// returns false.
    pub fn unshadow(&mut self, reply: &AcquiredEach) -> bool {
        if reply.allowed {
            return false;
        }
        let quota_refuses = self.every_quota_over(Some(reply));
        let misfits: Vec<usize> = reply
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, bucket)| !bucket.fits)
            .map(|(index, _)| index)
            .collect();
        let all_soft = !misfits.is_empty()
            && misfits.iter().all(|&index| {
                self.buckets.get(index).is_some_and(|bucket| {
                    !bucket.charged_zero && (bucket.shadow || (bucket.quota && !quota_refuses))
                })
            });
        if !all_soft {
            return false;
        }
        for index in misfits {
            if let Some(bucket) = self.buckets.get_mut(index) {
                bucket.charged_zero = true;
            }
        }
        true
    }

    /// Whether the bucket at `index` is over its limit: charged 0 after an earlier refusal, or not fitting.
    fn bucket_over(&self, index: usize, reply: Option<&AcquiredEach>) -> bool {
        self.buckets
            .get(index)
            .is_some_and(|bucket| bucket.charged_zero)
            || reply
                .and_then(|reply| reply.buckets.get(index))
                .is_some_and(|bucket| !bucket.fits)
    }

    /// For one slot: over its limit, and reported OK anyway by its limit's own shadow mode.
    fn slot_over(&self, slot: &Slot, reply: Option<&AcquiredEach>) -> (bool, bool) {
        match slot {
            Slot::NoLimit | Slot::Unlimited => (false, false),
            Slot::Zero(limit) => (true, limit.shadow_mode),
            Slot::Bucket(index) => (
                self.bucket_over(*index, reply),
                self.buckets
                    .get(*index)
                    .is_some_and(|bucket| bucket.limit.shadow_mode),
            ),
        }
    }

    /// Whether the request has quota descriptors and every one is reported OVER_LIMIT, so quota refuses it.
    fn every_quota_over(&self, reply: Option<&AcquiredEach>) -> bool {
        let mut quotas = self
            .slots
            .iter()
            .zip(&self.quota)
            .filter(|(_, &quota)| quota)
            .peekable();
        quotas.peek().is_some()
            && quotas.all(|(slot, _)| {
                let (over, shadow) = self.slot_over(slot, reply);
                over && !shadow
            })
    }

    /// The response for `reply` (`None` when the plan had no bucket and nothing was called).
    pub fn respond(&self, options: &Options, reply: Option<&AcquiredEach>) -> Verdict {
        let mut statuses = Vec::with_capacity(self.slots.len());
        let mut over_limit = self.every_quota_over(reply);
        let mut shadow_hits = 0;
        for (slot, &quota) in self.slots.iter().zip(&self.quota) {
            let status = match slot {
                Slot::NoLimit => DescriptorStatus {
                    code: Code::Ok.into(),
                    ..DescriptorStatus::default()
                },
                Slot::Unlimited => DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                Slot::Zero(limit) => {
                    over_limit |= !limit.shadow_mode && !quota;
                    shadow_hits += usize::from(limit.shadow_mode || options.global_shadow);
                    DescriptorStatus {
                        code: if limit.shadow_mode {
                            Code::Ok
                        } else {
                            Code::OverLimit
                        }
                        .into(),
                        current_limit: current_limit(limit),
                        ..DescriptorStatus::default()
                    }
                }
                Slot::Bucket(index) => {
                    let index = *index;
                    let bucket = self.buckets.get(index);
                    let result = reply.and_then(|reply| reply.buckets.get(index));
                    // The limit's own shadow_mode answers OK; the global one keeps OVER_LIMIT here and only
                    // turns the overall code OK (below), as envoyproxy/ratelimit does. A quota descriptor over
                    // its limit refuses only with every other quota descriptor (above).
                    let (over, limit_shadow) = self.slot_over(slot, reply);
                    over_limit |= over && !limit_shadow && !quota;
                    shadow_hits += usize::from(over && (limit_shadow || options.global_shadow));
                    DescriptorStatus {
                        code: if over && !limit_shadow {
                            Code::OverLimit
                        } else {
                            Code::Ok
                        }
                        .into(),
                        current_limit: bucket.and_then(|bucket| current_limit(&bucket.limit)),
                        limit_remaining: result.map_or(0, |result| {
                            u32::try_from(result.remaining.max(0)).unwrap_or(u32::MAX)
                        }),
                        duration_until_reset: result
                            .map(|result| duration_ms(result.reset_after_ms)),
                        ..DescriptorStatus::default()
                    }
                }
            };
            statuses.push(status);
        }
        // A refusal the replies do not explain (no bucket reported as not fitting) still refuses.
        if let Some(reply) = reply {
            if !reply.allowed
                && !over_limit
                && !self.buckets.iter().any(|bucket| bucket.charged_zero)
            {
                over_limit = true;
            }
        }
        let over_limit = over_limit && !options.global_shadow;
        let response_headers_to_add = self.headers(options, reply, over_limit);
        Verdict {
            over_limit,
            shadow_hits,
            response: RateLimitResponse {
                overall_code: if over_limit {
                    Code::OverLimit
                } else {
                    Code::Ok
                }
                .into(),
                statuses,
                response_headers_to_add,
                ..RateLimitResponse::default()
            },
        }
    }
}

/// What the service answers, and what the metrics count.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub over_limit: bool,
    /// Descriptors over their limit in shadow mode (let through).
    pub shadow_hits: usize,
    pub response: RateLimitResponse,
}

fn current_limit(limit: &Limit) -> Option<RateLimit> {
    match limit.policy {
        Policy::Bucket {
            requests_per_unit,
            unit,
            ..
        } => Some(RateLimit {
            name: limit.name.clone(),
            requests_per_unit,
            unit: unit.proto_value(),
        }),
        Policy::Unlimited => None,
    }
}

fn duration_ms(ms: i64) -> Duration {
    let ms = ms.max(0);
    Duration {
        seconds: ms / 1000,
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}
