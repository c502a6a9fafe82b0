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
use crate::replies::{AcquiredEach, BucketResult, PartialGrant};
use redis_tb_core::Params;

use super::lease::{Leases, Step};

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
            match self.decide(enforced, parts, true).await {
                Verdict::Pass(found) => fields = found,
                Verdict::Refuse(response, refused) => {
                    self.count_request("refused", &refused);
                    return Err(response);
                }
            }
        }
        if !shadow.is_empty() {
            if let Verdict::Refuse(_, refused) = self.decide(shadow, parts, false).await {
                self.count_request("shadow_refused", &refused);
                self.shadow_refused(shadow, refused);
                return Ok(fields);
            }
        }
        self.count_request("allowed", &[]);
        Ok(fields)
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

    /// The leases' clock: microseconds since the layer was built.
    fn now_us(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX)
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
        let asked = if plan.iter().any(|planned| planned.limit.lease) {
            // Boxed, as the charge-backs are: the usual call's future stays small (see `acquire`).
            Box::pin(self.ask_leased(plan, &buckets, parts)).await
        } else {
            self.ask(&buckets, parts).await
        };
        match asked {
            Ok(reply) => {
                self.count_decided(|| self.client.backend_in_use().as_str(), started);
                self.answered();
                if self.fail == FailMode::Local {
                    let now_ms = self.now_ms();
                    if let Ok(mut local) = self.local.lock() {
                        local.answered(&buckets, &reply.buckets, now_ms);
                    }
                }
                self.verdict(plan, &reply, enforced, parts)
            }
            Err(err) => {
                self.failed(&err);
                self.count_failed(err.failure().class);
                self.call_hook(&err, parts);
                let (source, verdict) = match self.fail {
                    FailMode::Open => ("open", Verdict::Pass(Fields::default())),
                    FailMode::Closed => ("closed", Verdict::Refuse(unavailable(), Vec::new())),
                    FailMode::Local => {
                        let now_ms = self.now_ms();
                        let reply = match self.local.lock() {
                            Ok(mut local) => Some(local.acquire_each(&buckets, now_ms)),
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
        }
    }

    /// The charge-backs, then the call: TB.ACQUIRE for one limit, TB.ACQUIREEACH for several; on a cluster, one
    /// call per slot of the buckets.
    async fn ask(
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

    /// A plan with leased limits: the others first, in one call after their charge-backs (as `ask`), then, when
    /// they allow, each leased limit from its lease. A leased limit that refuses gives back what the others took
    /// (TB.REFUND), as a refusal in another cluster slot does; what an earlier leased limit of the request spent
    /// is not given back to its lease, which under-admits by at most that cost.
    async fn ask_leased(
        &self,
        plan: &[Planned<'_>],
        buckets: &[LocalBucket<'_>],
        request: &Parts,
    ) -> Result<AcquiredEach, Error> {
        let (rest, chosen): (Vec<usize>, Vec<LocalBucket<'_>>) = plan
            .iter()
            .zip(buckets)
            .enumerate()
            .filter(|(_, (planned, _))| !planned.limit.lease)
            .map(|(index, (_, bucket))| (index, *bucket))
            .unzip();
        let mut results: Vec<Option<BucketResult>> = vec![None; plan.len()];
        let mut allowed = true;
        if !chosen.is_empty() {
            let reply = self.ask(&chosen, request).await?;
            allowed = reply.allowed;
            for (&index, result) in rest.iter().zip(reply.buckets) {
                if let Some(slot) = results.get_mut(index) {
                    *slot = Some(result);
                }
            }
        }
        let others_took = allowed && !chosen.is_empty();
        for ((planned, bucket), slot) in plan.iter().zip(buckets).zip(results.iter_mut()) {
            if !planned.limit.lease {
                continue;
            }
            let result = if allowed {
                self.leased(bucket, request).await?
            } else {
                let params = Params::new(bucket.rate, bucket.burst)
                    .map_err(|_| Error::InvalidArgument("rate or burst".to_owned()))?;
                self.leases
                    .peek(bucket.key, params, bucket.cost, self.now_us())
            };
            allowed &= result.fits;
            *slot = Some(result);
        }
        if others_took && !allowed {
            for bucket in &chosen {
                if let Err(err) = self
                    .client
                    .refund(bucket.key, bucket.rate, bucket.burst, bucket.cost)
                    .await
                {
                    tracing::warn!(
                        limit = %bucket.limit,
                        "redis-tb: could not give back the tokens of a refused request ({err})"
                    );
                }
            }
        }
        let results: Vec<BucketResult> = results.into_iter().flatten().collect();
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

    /// One request on a leased limit's bucket: from the lease, after waiting for the refill in flight if there
    /// is one, or by the refill this request sends. A refill that fails leaves the request to the leased tokens,
    /// then to the fail mode (the error).
    async fn leased(
        &self,
        bucket: &LocalBucket<'_>,
        request: &Parts,
    ) -> Result<BucketResult, Error> {
        let params = Params::new(bucket.rate, bucket.burst)
            .map_err(|_| Error::InvalidArgument("rate or burst".to_owned()))?;
        loop {
            match self
                .leases
                .admit(bucket.key, params, bucket.cost, self.now_us())
            {
                Step::Decided(result) => return Ok(result),
                // The sender lives while a refill is in flight: an error means it ended.
                Step::Wait(mut ended) => {
                    let _ = ended.changed().await;
                }
                Step::NoRoom => {
                    let reply = self.ask(std::slice::from_ref(bucket), request).await?;
                    return reply.buckets.into_iter().next().ok_or_else(|| {
                        Error::Protocol("a reply without the bucket asked for".to_owned())
                    });
                }
                Step::Call { max } => {
                    let mut refilling = Refilling {
                        leases: &self.leases,
                        key: bucket.key,
                        ended: false,
                    };
                    let grant = self.refill(bucket, max, request).await;
                    refilling.ended = true;
                    let now_us = self.now_us();
                    return match grant {
                        Ok(grant) => Ok(self.leases.answered(bucket.key, params, &grant, now_us)),
                        Err(err) => self
                            .leases
                            .failed(bucket.key, Some(bucket.cost), now_us)
                            .ok_or(err),
                    };
                }
            }
        }
    }

    /// A lease's refill: the key's charge-backs first (fail mode `local`), then `TB.ACQUIREATMOST`.
    async fn refill(
        &self,
        bucket: &LocalBucket<'_>,
        max: u64,
        request: &Parts,
    ) -> Result<PartialGrant, Error> {
        if self.fail == FailMode::Local {
            let pending = self.charges(std::slice::from_ref(bucket));
            if !pending.charges.is_empty() {
                Box::pin(self.charge_back(pending, request)).await?;
            }
        }
        self.client
            .acquire_at_most(bucket.key, bucket.rate, bucket.burst, max)
            .await
    }

    /// Buckets in several cluster slots: one call per slot (`parts`: the buckets' indexes by slot).
    async fn ask_per_slot(
        &self,
        buckets: &[LocalBucket<'_>],
        parts: &[Vec<usize>],
    ) -> Result<AcquiredEach, Error> {
        // Buckets in several cluster slots (limits with their own key function): one call per slot, and when one
        // refuses, what the others took goes back, so a refused request takes nothing.
        let mut replies = Vec::with_capacity(parts.len());
        for part in parts {
            let chosen: Vec<LocalBucket<'_>> = part
                .iter()
                .filter_map(|&index| buckets.get(index).copied())
                .collect();
            replies.push(self.acquire(&chosen).await?);
        }
        let allowed = replies.iter().all(|reply| reply.allowed);
        if !allowed {
            for (part, reply) in parts.iter().zip(&replies) {
                if !reply.allowed {
                    continue;
                }
                for bucket in part.iter().filter_map(|&index| buckets.get(index)) {
                    let refund = self
                        .client
                        .refund(bucket.key, bucket.rate, bucket.burst, bucket.cost)
                        .await;
                    if let Err(err) = refund {
                        // The request stays refused; the bucket keeps what it took.
                        tracing::warn!(
                            limit = %bucket.limit,
                            "redis-tb: could not give back the tokens of a refused request ({err})"
                        );
                    }
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

/// A lease's refill under way: dropped before it ended (the request went away mid-call), it ends as failed, so
/// the requests waiting on it are decided again.
struct Refilling<'a> {
    leases: &'a Leases,
    key: &'a str,
    ended: bool,
}

impl Drop for Refilling<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.leases.failed(self.key, None, 0);
        }
    }
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
