//! Deciding: the [`RateLimit`] service. For each request, the buckets its limits take from (their keys from the
//! key extractors), then one call to Redis after the charge-backs the in-memory buckets owe, or the fail mode when
//! Redis fails; a refusal or the header fields of an allowed request from [`super::answer`].
#![forbid(unsafe_code)]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::answer::{refusal_response, unavailable, Fields, RateLimitBody, Refusal};
use super::{log_due, FailMode, RateLimit, Shared, ERROR_LOG_INTERVAL, SHADOW_LOG_INTERVAL};
use crate::cluster::key_slot;
use crate::command::BucketWithCost;
use crate::error::Error;
use crate::failure::Failure;
use crate::keys;
use crate::limit::{Identity, Limit};
use crate::local::{ChargeBack, ChargeOutcome, LocalBucket, LocalBuckets};
use crate::replies::{AcquiredEach, BucketResult};
use redis_tb_core::Params;

use super::lease::{Refilling, Step};

/// One limit that applies to a request, with its bucket key.
struct Planned<'a> {
    limit: &'a Limit,
    key: String,
}

impl Planned<'_> {
    fn bucket(&self) -> LocalBucket<'_> {
        LocalBucket {
            key: &self.key,
            limit: &self.limit.name,
            rate: self.limit.rate,
            burst: self.limit.burst,
            cost: self.limit.cost,
        }
    }
}

/// The enforced limits of a request, decided first, and its shadow limits, decided when they allow; each in the
/// order of the layer's limits.
#[derive(Default)]
struct Plans<'a> {
    enforced: Vec<Planned<'a>>,
    shadow: Vec<Planned<'a>>,
}

/// What to answer.
enum Verdict {
    /// Go on to the inner service, adding these fields.
    Pass(Fields),
    /// Answer this instead (a shadow plan's: an empty response); the names of the limits whose bucket did not
    /// fit (none for a fail mode's refusal).
    Refuse(Response<Bytes>, Vec<String>),
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Readiness of the inner service is awaited in the call, after Redis decided.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut inner = self.inner.clone();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let fields = match shared.plan(&parts) {
                None => {
                    shared.count_request("skipped", &[]);
                    Fields::default()
                }
                Some(plans) => match shared.limit(&plans, &parts).await {
                    Ok(fields) => fields,
                    Err(response) => return Ok(response.map(RateLimitBody::own)),
                },
            };
            let request = Request::from_parts(parts, body);
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let response = inner.call(request).await?;
            let mut response = response.map(RateLimitBody::inner);
            fields.append_to(response.headers_mut());
            Ok(response)
        })
    }
}

impl Shared {
    /// The limits for a request and their keys, enforced and shadow apart; `None` when every limit skips it.
    fn plan(&self, parts: &Parts) -> Option<Plans<'_>> {
        let mut plans = Plans::default();
        for limit in &self.limits {
            let key = match limit.key.as_ref().unwrap_or(&self.key).extract(parts) {
                Identity::Skip => continue,
                Identity::Ip(address) => {
                    keys::peer_key(&self.prefix, address, self.ipv6_subnet, &limit.name)
                }
                Identity::Key(text) if !text.is_empty() => {
                    keys::bucket_key(&self.prefix, Some(&text), &limit.name)
                }
                Identity::Key(_) | Identity::Anonymous => self.anonymous_key(limit),
            };
            let plan = if self.shadow || limit.shadow {
                &mut plans.shadow
            } else {
                &mut plans.enforced
            };
            plan.push(Planned { limit, key });
        }
        let applies = !(plans.enforced.is_empty() && plans.shadow.is_empty());
        applies.then_some(plans)
    }

    /// The key of `limit`'s bucket for requests without an identity, warned about once.
    fn anonymous_key(&self, limit: &Limit) -> String {
        self.warn_anonymous(limit);
        keys::bucket_key(&self.prefix, None, &limit.name)
    }

    /// The enforced limits, all or nothing; when they allow, the shadow limits, all or nothing among themselves,
    /// whose refusal is logged and serves the request. The fields (of the enforced limits only), or the refusal.
    async fn limit(&self, plans: &Plans<'_>, parts: &Parts) -> Result<Fields, Response<Bytes>> {
        let mut fields = Fields::default();
        let (enforced, shadow) = (plans.enforced.as_slice(), plans.shadow.as_slice());
        if !enforced.is_empty() {
            match self.plan_verdict(enforced, parts, true).await {
                Verdict::Pass(found) => fields = found,
                Verdict::Refuse(response, refused) => {
                    self.count_request("refused", &refused);
                    return Err(response);
                }
            }
        }
        if !shadow.is_empty() {
            if let Verdict::Refuse(_, refused) = self.plan_verdict(shadow, parts, false).await {
                self.count_request("shadow_refused", &refused);
                self.shadow_refused(shadow, refused);
                return Ok(fields);
            }
        }
        self.count_request("allowed", &[]);
        Ok(fields)
    }

    /// The verdict on one plan (`enforced` or shadow): from the tokens held when it is one leased limit that
    /// needs no call, else by `decide_leased` or, without a leased limit, `decide`.
    async fn plan_verdict(&self, plan: &[Planned<'_>], parts: &Parts, enforced: bool) -> Verdict {
        if !any_leased(plan) {
            return self.decide(plan, parts, enforced).await;
        }
        match self.decide_held(plan, parts, enforced) {
            Some(verdict) => verdict,
            // Boxed, as the charge-backs are: the usual call's future stays small (see `acquire`).
            None => Box::pin(self.decide_leased(plan, parts, enforced)).await,
        }
    }

    /// Shadow limits refused a request that is served: logged at most once a second per limit. A fail mode's
    /// refusal names no bucket: every shadow limit of the call would have refused.
    fn shadow_refused(&self, plan: &[Planned<'_>], mut refused: Vec<String>) {
        if refused.is_empty() {
            refused = plan
                .iter()
                .map(|planned| planned.limit.name.clone())
                .collect();
        }
        let now = Instant::now();
        for name in refused {
            if self.shadow_log_due(&name, now) {
                tracing::warn!(
                    limit = %name,
                    "redis-tb: shadow limit {name:?} would have refused a request; it was served (logged at most \
                     once a second per limit)"
                );
            }
        }
    }

    fn warn_anonymous(&self, limit: &Limit) {
        if !self.anonymous_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit = %limit.name,
                "redis-tb: the key function found no identity for a request: such requests share the anonymous \
                 bucket. Serve with `into_make_service_with_connect_info::<SocketAddr>()` for the peer address, \
                 or give the layer a key function that finds the client (logged once per process)"
            );
        }
    }

    fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1000.0
    }

    /// Whether a refusal of shadow limit `name` at `now` is logged: the first, then one a second at most.
    fn shadow_log_due(&self, name: &str, now: Instant) -> bool {
        let Ok(mut log) = self.log.lock() else {
            return false;
        };
        log_due(&mut log.shadow_logged_at, name, now, SHADOW_LOG_INTERVAL)
    }

    /// Asks Redis (after the charge-backs the local buckets owe), or the fail mode when that fails. `enforced`:
    /// the verdict is the response's (headers, body); else only whether it allows and which limits refused.
    async fn decide(&self, plan: &[Planned<'_>], parts: &Parts, enforced: bool) -> Verdict {
        let started = self.call_started();
        let buckets: Vec<LocalBucket<'_>> = plan.iter().map(Planned::bucket).collect();
        match self.ask::<true>(&buckets, parts).await {
            Ok(reply) => {
                self.count_decided(|| self.client.backend_in_use().as_str(), started);
                self.answered();
                self.remember(&buckets, &reply.buckets);
                self.verdict(plan, &reply, enforced, parts)
            }
            Err(err) => self.fail_mode(
                plan,
                &buckets,
                &err,
                Decided {
                    parts,
                    enforced,
                    started,
                },
            ),
        }
    }

    /// A plan of one leased limit decided without a call, from the tokens the process holds or Redis's
    /// remembered refusal: most requests of a hot limit, with no future and nothing else to ask. `None` when the
    /// plan needs `decide_leased`.
    fn decide_held(&self, plan: &[Planned<'_>], parts: &Parts, enforced: bool) -> Option<Verdict> {
        let [planned] = plan else {
            return None;
        };
        let bucket = planned.bucket();
        let params = Params::new(bucket.rate, bucket.burst).ok()?;
        let started = self.call_started();
        let result = self.leases.held(bucket.key, params, bucket.cost)?;
        self.count_decided(|| "lease", started);
        let reply = AcquiredEach {
            allowed: result.fits,
            limiting_index: 0,
            buckets: vec![result],
        };
        Some(self.verdict(plan, &reply, enforced, parts))
    }

    /// `decide` for a plan with a leased limit: Redis's replies for the other limits and the leased limit's
    /// grants are remembered for the fail mode as they arrive (see `ask_leased`), and a call that Redis answers
    /// ends a fault there; a decision from the tokens held says nothing of Redis. Counted as the backend's when a
    /// call decided, else as the lease's.
    async fn decide_leased(&self, plan: &[Planned<'_>], parts: &Parts, enforced: bool) -> Verdict {
        let started = self.call_started();
        let buckets: Vec<LocalBucket<'_>> = plan.iter().map(Planned::bucket).collect();
        match self.ask_leased(plan, &buckets, parts).await {
            Ok((reply, called)) => {
                let source = || {
                    if called {
                        self.client.backend_in_use().as_str()
                    } else {
                        "lease"
                    }
                };
                self.count_decided(source, started);
                self.verdict(plan, &reply, enforced, parts)
            }
            Err(err) => self.fail_mode(
                plan,
                &buckets,
                &err,
                Decided {
                    parts,
                    enforced,
                    started,
                },
            ),
        }
    }

    /// A call for `buckets` failed with `err`: the fail mode's verdict, the failure logged, counted and given to
    /// the error hook.
    fn fail_mode(
        &self,
        plan: &[Planned<'_>],
        buckets: &[LocalBucket<'_>],
        err: &Error,
        how: Decided<'_>,
    ) -> Verdict {
        let Decided {
            parts,
            enforced,
            started,
        } = how;
        self.failed(err);
        self.count_failed(err.failure().class);
        self.call_hook(err, parts);
        let (source, verdict) = match self.fail {
            FailMode::Open => ("open", Verdict::Pass(Fields::default())),
            FailMode::Closed => ("closed", Verdict::Refuse(unavailable(), Vec::new())),
            FailMode::Local => {
                let now_ms = self.now_ms();
                let reply = match self.local.lock() {
                    Ok(mut local) => Some(local.acquire_each(buckets, now_ms)),
                    // A panic elsewhere poisoned the table: refuse rather than let everything through.
                    Err(_) => None,
                };
                let verdict = match reply {
                    Some(reply) => self.verdict(plan, &reply, enforced, parts),
                    None => Verdict::Refuse(unavailable(), Vec::new()),
                };
                ("local", verdict)
            }
        };
        // The call's duration ends with the fail mode's answer.
        self.count_decided(|| source, started);
        verdict
    }

    /// Redis answered for `buckets` with `results`: with fail mode `local`, each in-memory bucket continues from
    /// there.
    fn remember(&self, buckets: &[LocalBucket<'_>], results: &[BucketResult]) {
        if self.fail == FailMode::Local {
            let now_ms = self.now_ms();
            if let Ok(mut local) = self.local.lock() {
                local.answered(buckets, results, now_ms);
            }
        }
    }

    /// The charge-backs, then the call: TB.ACQUIRE for one limit, TB.ACQUIREEACH for several; on a cluster, one
    /// call per slot of the buckets. `USUAL`: called by `decide`, the path of every request without a leased
    /// limit; the leased paths call their own instance, so that the usual one keeps its one caller, into which
    /// the compiler folds it (about 300 instructions a request less than two callers of one instance).
    async fn ask<const USUAL: bool>(
        &self,
        buckets: &[LocalBucket<'_>],
        request: &Parts,
    ) -> Result<AcquiredEach, Error> {
        if self.fail == FailMode::Local {
            let pending = self.charges(buckets);
            if !pending.charges.is_empty() {
                // Boxed: charge-backs follow a fault only, and unboxed their future would make every call's as
                // large as theirs, moved at each await on the way down.
                Box::pin(self.charge_back(pending, request)).await?;
            }
        }
        let parts = if self.client.is_cluster() {
            slot_parts(buckets)
        } else {
            Vec::new()
        };
        if parts.len() < 2 {
            return self.acquire(buckets).await;
        }
        // Boxed, as the charge-backs are: the usual call's future stays small (see `acquire`).
        Box::pin(self.ask_per_slot(buckets, &parts)).await
    }

    /// A plan with a leased limit (a layer has at most one): the others first, in one call after their
    /// charge-backs (as `ask`), then, when they allow, the leased limit from its lease. When the leased limit
    /// refuses, or fails with nothing held to cover the request, what the others took goes back (TB.REFUND), as
    /// a refusal in another cluster slot does; the fail mode then decides every bucket of the request.
    async fn ask_leased(
        &self,
        plan: &[Planned<'_>],
        buckets: &[LocalBucket<'_>],
        request: &Parts,
    ) -> Result<(AcquiredEach, bool), Error> {
        if let ([planned], [bucket]) = (plan, buckets) {
            if planned.limit.lease {
                let (result, called) = self.leased(bucket, request).await?;
                let reply = AcquiredEach {
                    allowed: result.fits,
                    limiting_index: 0,
                    buckets: vec![result],
                };
                return Ok((reply, called));
            }
        }
        let (rest, chosen): (Vec<usize>, Vec<LocalBucket<'_>>) = plan
            .iter()
            .zip(buckets)
            .enumerate()
            .filter(|(_, (planned, _))| !planned.limit.lease)
            .map(|(index, (_, bucket))| (index, *bucket))
            .unzip();
        let mut results: Vec<Option<BucketResult>> = vec![None; plan.len()];
        let reply = self.ask::<false>(&chosen, request).await?;
        self.answered();
        self.remember(&chosen, &reply.buckets);
        let mut allowed = reply.allowed;
        for (&index, result) in rest.iter().zip(reply.buckets) {
            if let Some(slot) = results.get_mut(index) {
                *slot = Some(result);
            }
        }
        for ((planned, bucket), slot) in plan.iter().zip(buckets).zip(results.iter_mut()) {
            if !planned.limit.lease {
                continue;
            }
            let params = Params::new(bucket.rate, bucket.burst)
                .map_err(|_| Error::InvalidArgument("rate or burst".to_owned()))?;
            let result = if allowed {
                match self.leased(bucket, request).await {
                    Ok((result, _)) => result,
                    Err(err) => {
                        self.give_back(&chosen).await;
                        return Err(err);
                    }
                }
            } else {
                self.leases.peek(bucket.key, params, bucket.cost)
            };
            if allowed && !result.fits {
                self.give_back(&chosen).await;
            }
            allowed &= result.fits;
            *slot = Some(result);
        }
        let results: Vec<BucketResult> = results.into_iter().flatten().collect();
        if results.len() != plan.len() {
            return Err(Error::Protocol(
                "a reply held fewer buckets than the call".to_owned(),
            ));
        }
        let reply = AcquiredEach {
            allowed,
            limiting_index: redis_tb_core::limiting_index(
                allowed,
                results
                    .iter()
                    .map(|result| (result.remaining, result.retry_after_ms)),
            ),
            buckets: results,
        };
        // The other limits were asked of Redis.
        Ok((reply, true))
    }

    /// What `buckets` took for a request that is refused after all goes back (`TB.REFUND`).
    async fn give_back(&self, buckets: &[LocalBucket<'_>]) {
        for bucket in buckets {
            if let Err(err) = self
                .client
                .refund(bucket.key, bucket.rate, bucket.burst, bucket.cost)
                .await
            {
                // The request stays refused; the bucket keeps what it took.
                tracing::warn!(
                    limit = %bucket.limit,
                    "redis-tb: could not give back the tokens of a refused request ({err})"
                );
            }
        }
    }

    /// One request on a leased limit's bucket: from the lease; after waiting for the refills in flight, if there
    /// are; or by the refill this request sends. A request whose wait reached the client's timeout, whose refill
    /// failed without held tokens to cover it, or whose lease does not pay (the bucket nearly full), is decided by
    /// a call of its own, as a key without lease:
    /// waiting never turns into the fail mode, which only a call that fails reaches. With the decision: whether
    /// a Redis call made it.
    async fn leased(
        &self,
        bucket: &LocalBucket<'_>,
        request: &Parts,
    ) -> Result<(BucketResult, bool), Error> {
        let params = Params::new(bucket.rate, bucket.burst)
            .map_err(|_| Error::InvalidArgument("rate or burst".to_owned()))?;
        let deadline = tokio::time::Instant::now().checked_add(self.client.timeout());
        let mut waited = false;
        loop {
            match self.leases.admit(bucket.key, params, bucket.cost, waited) {
                Step::Decided(result) => return Ok((result, false)),
                Step::Wait(mut ended) => {
                    waited = true;
                    // The sender lives while the refill is in flight: an error means it ended.
                    let in_time = match deadline {
                        Some(deadline) => tokio::time::timeout_at(deadline, ended.changed())
                            .await
                            .is_ok(),
                        None => {
                            let _ = ended.changed().await;
                            true
                        }
                    };
                    if !in_time {
                        return self.own_call(bucket, request).await;
                    }
                    if ended.borrow().failed {
                        if let Some(result) =
                            self.leases.spend_held(bucket.key, params, bucket.cost)
                        {
                            return Ok((result, false));
                        }
                        return self.own_call(bucket, request).await;
                    }
                }
                Step::NoRoom | Step::Direct => return self.own_call(bucket, request).await,
                Step::Call { max } => {
                    return match self.refill(bucket, params, max, request).await {
                        Ok(result) => {
                            self.answered();
                            Ok((result, true))
                        }
                        Err(err) => match self.leases.spend_held(bucket.key, params, bucket.cost) {
                            Some(result) => {
                                // Decided by the tokens held: the failure is reported here, once.
                                self.failed(&err);
                                self.count_failed(err.failure().class);
                                self.call_hook(&err, request);
                                Ok((result, false))
                            }
                            None => Err(err),
                        },
                    };
                }
            }
        }
    }

    /// A leased limit's bucket decided by a call of its own (`TB.ACQUIRE` after its charge-backs), as a key
    /// without lease: Redis decides, from its bucket, which counts every lease's grants.
    async fn own_call(
        &self,
        bucket: &LocalBucket<'_>,
        request: &Parts,
    ) -> Result<(BucketResult, bool), Error> {
        let sent_us = self.leases.now_us();
        let reply = self
            .ask::<false>(std::slice::from_ref(bucket), request)
            .await?;
        self.answered();
        self.remember(std::slice::from_ref(bucket), &reply.buckets);
        let result =
            reply.buckets.into_iter().next().ok_or_else(|| {
                Error::Protocol("a reply without the bucket asked for".to_owned())
            })?;
        // Its refusal, and how far from full the bucket is: whether its lease pays again.
        self.leases.observed(bucket.key, sent_us, &result);
        Ok((result, true))
    }

    /// A lease's refill: the key's charge-backs first (fail mode `local`), then `TB.ACQUIREATMOST` on a task of
    /// its own, which gives the grant to the lease even when this request goes away meanwhile (its client
    /// disconnected): the tokens Redis took are never lost with it. Resolves with the request's decision.
    async fn refill(
        &self,
        bucket: &LocalBucket<'_>,
        params: Params,
        max: u64,
        request: &Parts,
    ) -> Result<BucketResult, Error> {
        let refilling = Refilling::new(Arc::clone(&self.leases), bucket.key);
        if self.fail == FailMode::Local {
            let pending = self.charges(std::slice::from_ref(bucket));
            if !pending.charges.is_empty() {
                if let Err(err) = Box::pin(self.charge_back(pending, request)).await {
                    refilling.failed();
                    return Err(err);
                }
            }
        }
        let client = self.client.clone();
        let local = (self.fail == FailMode::Local).then(|| Arc::clone(&self.local));
        let epoch = self.epoch;
        let (key, limit) = (bucket.key.to_owned(), bucket.limit.to_owned());
        let (rate, burst, cost) = (bucket.rate, bucket.burst, bucket.cost);
        let call = async move {
            match client.acquire_at_most(&key, rate, burst, max).await {
                Ok(grant) => {
                    if let Some(local) = local {
                        // Redis's bucket after the grant, which the fail mode continues from: the tokens the
                        // process holds are not in it, and are spent first when Redis fails.
                        let after = BucketResult {
                            fits: true,
                            remaining: grant.remaining,
                            retry_after_ms: grant.retry_after_ms,
                            reset_after_ms: grant.reset_after_ms,
                        };
                        let bucket = LocalBucket {
                            key: &key,
                            limit: &limit,
                            rate,
                            burst,
                            cost,
                        };
                        let now_ms = epoch.elapsed().as_secs_f64() * 1000.0;
                        if let Ok(mut local) = local.lock() {
                            local.answered(&[bucket], &[after], now_ms);
                        }
                    }
                    Ok(refilling.answered(params, &grant))
                }
                Err(err) => {
                    refilling.failed();
                    Err(err)
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime.spawn(call).await.unwrap_or_else(|_| {
                Err(Error::Protocol(
                    "the refill's task ended without a reply".to_owned(),
                ))
            }),
            Err(_) => call.await,
        }
    }

    /// Buckets in several cluster slots: one call per slot (`parts`: the buckets' indexes by slot).
    async fn ask_per_slot(
        &self,
        buckets: &[LocalBucket<'_>],
        parts: &[Vec<usize>],
    ) -> Result<AcquiredEach, Error> {
        // Buckets in several cluster slots (limits with their own key function): one call per slot, and when one
        // refuses, what the others took goes back, so a refused request takes nothing.
        let chosen: Vec<Vec<LocalBucket<'_>>> = parts
            .iter()
            .map(|part| {
                part.iter()
                    .filter_map(|&index| buckets.get(index).copied())
                    .collect()
            })
            .collect();
        let mut replies = Vec::with_capacity(parts.len());
        for part in &chosen {
            replies.push(self.acquire(part).await?);
        }
        let allowed = replies.iter().all(|reply| reply.allowed);
        if !allowed {
            for (part, reply) in chosen.iter().zip(&replies) {
                if reply.allowed {
                    self.give_back(part).await;
                }
            }
        }
        let mut results: Vec<Option<BucketResult>> = vec![None; buckets.len()];
        for (part, reply) in parts.iter().zip(replies) {
            for (&index, result) in part.iter().zip(reply.buckets) {
                if let Some(slot) = results.get_mut(index) {
                    *slot = Some(result);
                }
            }
        }
        let results: Vec<BucketResult> = results.into_iter().flatten().collect();
        if results.len() != buckets.len() {
            return Err(Error::Protocol(
                "a reply of one part held fewer buckets than the part".to_owned(),
            ));
        }
        Ok(AcquiredEach {
            allowed,
            limiting_index: redis_tb_core::limiting_index(
                allowed,
                results
                    .iter()
                    .map(|result| (result.remaining, result.retry_after_ms)),
            ),
            buckets: results,
        })
    }

    /// One call for `buckets` (one slot): TB.ACQUIRE for one, TB.ACQUIREEACH for several.
    async fn acquire(&self, buckets: &[LocalBucket<'_>]) -> Result<AcquiredEach, Error> {
        if let [bucket] = buckets {
            // Boxed apart from the layer's future: the two blocks (984 and 968 bytes) stay within what glibc's
            // per-thread cache serves (1,032 bytes), where one block of both (2,008) went to the general allocator
            // on every request, about 1,200 instructions more. Whatever the layer's future keeps across an await
            // counts against that room.
            let call = self
                .client
                .acquire(bucket.key, bucket.rate, bucket.burst, bucket.cost);
            let reply = Box::pin(call).await?;
            return Ok(AcquiredEach {
                allowed: reply.allowed,
                limiting_index: 0,
                buckets: vec![BucketResult {
                    fits: reply.allowed,
                    remaining: reply.remaining,
                    retry_after_ms: reply.retry_after_ms,
                    reset_after_ms: reply.reset_after_ms,
                }],
            });
        }
        let each: Vec<BucketWithCost<'_>> = buckets
            .iter()
            .map(|bucket| BucketWithCost {
                key: bucket.key,
                rate: bucket.rate,
                burst: bucket.burst,
                cost: bucket.cost,
            })
            .collect();
        // Boxed: unboxed, TB.ACQUIREEACH's future would make every call's as large as its own.
        Box::pin(self.client.acquire_each(&each)).await
    }

    /// The charge-backs to send before a call for `buckets`: none (and no clock read) in the usual call, where no
    /// key is diverged.
    // Folded into each caller: the usual one, `ask::<true>`, pays no call for a table that owes nothing.
    #[inline(always)]
    fn charges(&self, buckets: &[LocalBucket<'_>]) -> Pending<'_> {
        let charges = match self.local.lock() {
            Ok(mut local) if local.has_diverged() => local.charge_backs(buckets, self.now_ms()),
            _ => Vec::new(),
        };
        Pending {
            local: &self.local,
            charges,
            next: 0,
        }
    }

    /// Before a call for keys the in-memory buckets diverged on, one `TB.LOWER` each (`pending`), in call order,
    /// on the call's connection: Redis's bucket comes down to the in-memory one. A charge-back that fails like a
    /// fault fails the call (its share and those not sent are owed again, and the fail mode decides); one refused
    /// by a configuration error is dropped, reported, and the call goes on.
    async fn charge_back(&self, mut pending: Pending<'_>, request: &Parts) -> Result<(), Error> {
        while let Some(charge) = pending.charges.get(pending.next) {
            let result = self
                .client
                .lower(&charge.key, charge.rate, charge.burst, charge.tokens)
                .await;
            let outcome = match &result {
                Ok(_) => ChargeOutcome::Accepted,
                Err(err) => ChargeOutcome::of_error(err),
            };
            pending.end_next(outcome);
            match result {
                Err(err) if outcome == ChargeOutcome::Failed => return Err(err),
                Err(err) => self.charge_back_refused(&err, request),
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// A charge-back refused by a configuration error: counted and given to the error hook as a failed call, and
    /// logged at error level (at most once a minute per row); what it covered is dropped.
    fn charge_back_refused(&self, err: &Error, request: &Parts) {
        let failure = err.failure();
        self.count_failed(failure.class);
        self.call_hook(err, request);
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        let due = log_due(
            &mut log.charge_back_logged_at,
            &failure.row,
            Instant::now(),
            ERROR_LOG_INTERVAL,
        );
        if due {
            drop(log);
            tracing::error!(
                row = failure.row,
                "redis-tb: Redis refused a charge-back (TB.LOWER) of what the in-memory buckets admitted while it \
                 failed: {err}; what it covered is dropped and the request goes on to Redis. This does not pass by \
                 itself (the Redis user's permissions, a key of another type, or a bug)"
            );
        }
    }

    /// The on_error hook, if any, for a failed call; a panic in it is logged.
    fn call_hook(&self, err: &Error, request: &Parts) {
        if let Some(hook) = &self.on_error {
            let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
                hook(err, request, err.failure());
            }));
            if called.is_err() {
                tracing::error!("redis-tb: the on_error hook panicked");
            }
        }
    }

    /// The unchanging header values, when `plan` is the layer's whole list of limits (the usual request).
    fn fixed_for(&self, plan: &[Planned<'_>]) -> Option<&super::answer::Fixed> {
        (plan.len() == self.limits.len()).then_some(&self.fixed)
    }

    fn verdict(
        &self,
        plan: &[Planned<'_>],
        reply: &AcquiredEach,
        enforced: bool,
        request: &Parts,
    ) -> Verdict {
        if reply.allowed {
            if !enforced {
                return Verdict::Pass(Fields::default());
            }
            let limits = plan.iter().map(|planned| planned.limit);
            return Verdict::Pass(Fields::of(
                self.standard,
                limits,
                reply,
                self.fixed_for(plan),
            ));
        }
        let refused: Vec<String> = plan
            .iter()
            .zip(&reply.buckets)
            .filter(|(_, bucket)| !bucket.fits)
            .map(|(planned, _)| planned.limit.name.clone())
            .collect();
        if !enforced {
            return Verdict::Refuse(Response::new(Bytes::new()), refused);
        }
        let fields = Fields::of(
            self.standard,
            plan.iter().map(|planned| planned.limit),
            reply,
            self.fixed_for(plan),
        );
        // Every limit applies in the usual request: the layer's list is the request's.
        let listed: Vec<Limit>;
        let limits: &[Limit] = if plan.len() == self.limits.len() {
            &self.limits
        } else {
            listed = plan.iter().map(|planned| planned.limit.clone()).collect();
            &listed
        };
        let mut response = match plan.get(reply.limiting_index).or(plan.first()) {
            Some(planned) => refusal_response(
                self.refusal.as_ref(),
                &Refusal {
                    request,
                    limit: planned.limit,
                    retry_after_ms: reply.retry_after_ms(),
                    limits,
                    reply,
                    status: self.status,
                },
            ),
            None => super::answer::json_response(
                self.status,
                &serde_json::json!({"error": "rate limit exceeded"}),
            ),
        };
        fields.append_to(response.headers_mut());
        Verdict::Refuse(response, refused)
    }

    /// A request's outcome and the limits that refused it, counted when the layer has metrics.
    fn count_request(&self, _outcome: &'static str, _refused: &[String]) {
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.request(_outcome, _refused);
        }
    }

    /// When a limiter call begins, for its duration: read only when the layer has metrics.
    fn call_started(&self) -> Option<Instant> {
        #[cfg(feature = "prometheus")]
        if self.metrics.is_some() {
            return Some(Instant::now());
        }
        None
    }

    /// A limiter call begun at `_started` was decided by `_source`.
    fn count_decided(&self, _source: impl FnOnce() -> &'static str, _started: Option<Instant>) {
        #[cfg(feature = "prometheus")]
        if let (Some(metrics), Some(started)) = (&self.metrics, _started) {
            metrics.decided(_source(), started.elapsed());
        }
    }

    /// A limiter call failed, of the failure table's `_class`.
    fn count_failed(&self, _class: &'static str) {
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.failed(_class);
        }
    }

    /// A call answered: a fault under way ends.
    fn answered(&self) {
        // A load first: the usual call, with no fault under way, writes nothing shared.
        if self.in_fault.load(Ordering::Acquire) && self.in_fault.swap(false, Ordering::AcqRel) {
            tracing::info!("redis-tb: Redis answers again; limiter calls go to it");
        }
    }

    /// A call failed: logged as the failure table says (a warning once per fault; a configuration error at
    /// error level, at most once a minute per row).
    fn failed(&self, err: &Error) {
        let failure: Failure = err.failure();
        let starts = !self.in_fault.swap(true, Ordering::AcqRel);
        if failure.is_config_error() {
            let Ok(mut log) = self.log.lock() else {
                return;
            };
            let due = log_due(
                &mut log.error_logged_at,
                &failure.row,
                Instant::now(),
                ERROR_LOG_INTERVAL,
            );
            if due {
                drop(log);
                tracing::error!(
                    row = failure.row,
                    "redis-tb: limiter call refused: {err}; this does not pass by itself (the Redis user's \
                     password or permissions, a key of another type, or a bug); meanwhile fail={:?} answers",
                    self.fail
                );
            }
        } else if starts {
            tracing::warn!(
                row = failure.row,
                "redis-tb: Redis unavailable ({err}); fail={:?} answers until it answers again",
                self.fail
            );
        }
    }
}

/// The indexes of `buckets` grouped by cluster slot, each group in the order of its first bucket.
fn slot_parts(buckets: &[LocalBucket<'_>]) -> Vec<Vec<usize>> {
    let mut parts: Vec<(u16, Vec<usize>)> = Vec::new();
    for (index, bucket) in buckets.iter().enumerate() {
        let slot = key_slot(bucket.key);
        match parts.iter_mut().find(|(known, _)| *known == slot) {
            Some((_, part)) => part.push(index),
            None => parts.push((slot, vec![index])),
        }
    }
    parts.into_iter().map(|(_, part)| part).collect()
}

/// Whether any limit of `plan` is leased.
fn any_leased(plan: &[Planned<'_>]) -> bool {
    plan.iter().any(|planned| planned.limit.lease)
}

/// How a request's call was made, for [`Shared::fail_mode`].
struct Decided<'a> {
    parts: &'a Parts,
    enforced: bool,
    started: Option<Instant>,
}

/// The charge-backs of one call, from the first not yet ended. Each ends once: with its outcome, or, when the
/// call's future is dropped before (a client that went away, a timeout around the layer), as failed: its share is
/// owed again, never left in flight for good (where every answer would subtract it again).
struct Pending<'a> {
    local: &'a Mutex<LocalBuckets>,
    charges: Vec<ChargeBack>,
    /// `charges[next..]` have not ended.
    next: usize,
}

impl Pending<'_> {
    fn end_next(&mut self, outcome: ChargeOutcome) {
        if let (Some(charge), Ok(mut local)) = (self.charges.get(self.next), self.local.lock()) {
            local.charge_ended(charge, outcome);
        }
        self.next = self.next.saturating_add(1);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(rest) = self
            .charges
            .get(self.next..)
            .filter(|rest| !rest.is_empty())
        else {
            return;
        };
        if let Ok(mut local) = self.local.lock() {
            for charge in rest {
                local.charge_ended(charge, ChargeOutcome::Failed);
            }
        }
    }
}

// The layer's own errors are responses: what it adds to the inner service's error type is nothing.
#[cfg(feature = "axum")]
const _: fn() = || {
    fn infallible<T: Service<Request<axum::body::Body>, Error = std::convert::Infallible>>() {}
    infallible::<RateLimit<axum::routing::Route>>();
};
