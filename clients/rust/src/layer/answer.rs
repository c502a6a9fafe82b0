//! Answering: what the layer puts on a response. The RateLimit header fields of an allowed request (docs/headers.md,
//! made by [`crate::headers::rate_limit_headers`]), the refusal (the `on_refusal` hook's response, or the default:
//! the status code option's status with a small JSON body), fail mode closed's `503`, and the body type that
//! carries either the inner service's body or the layer's own bytes without boxing the former.
#![forbid(unsafe_code)]

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{Response, StatusCode};
use http_body::{Frame, SizeHint};

use crate::headers::{self, Policy, Standard};
use crate::limit::Limit;
use crate::replies::AcquiredEach;

/// A refusal, as the `on_refusal` hook is given it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Refusal<'a> {
    /// The refused request's head.
    pub request: &'a Parts,
    /// The limit that refuses (the limiting bucket's: the longest wait).
    pub limit: &'a Limit,
    /// Its wait in ms; -1 when its cost exceeds its burst, so waiting never helps.
    pub retry_after_ms: i64,
    /// Every enforced limit of the request, in the order of `reply`'s buckets.
    pub limits: &'a [Limit],
    /// Redis's reply (or the local fail mode's, alike), one bucket per limit.
    pub reply: &'a AcquiredEach,
    /// The status code option (default 429).
    pub status: StatusCode,
}

impl Refusal<'_> {
    /// The default body: `{"error": "rate limit exceeded", "limit": <name>, "retry_after_ms": <ms>}`, the wait
    /// left out when waiting never helps.
    pub fn default_body(&self) -> serde_json::Value {
        let mut body = serde_json::Map::new();
        body.insert("error".to_owned(), "rate limit exceeded".into());
        body.insert("limit".to_owned(), self.limit.name().into());
        if self.retry_after_ms >= 0 {
            body.insert("retry_after_ms".to_owned(), self.retry_after_ms.into());
        }
        serde_json::Value::Object(body)
    }

    /// The default refusal: [`Refusal::status`] with [`Refusal::default_body`] as `application/json`.
    pub fn default_response(&self) -> Response<Bytes> {
        json_response(self.status, &self.default_body())
    }
}

/// A JSON response of `status`.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The `on_refusal` hook: the response to a refused request. The layer adds the RateLimit fields (and
/// `Retry-After`) to it.
pub type RefusalHook = Arc<dyn Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync>;

/// The refusal `hook` answers with (the default one without a hook); the default when the hook panics, logged:
/// a refusal is never a 500.
pub(crate) fn refusal_response(
    hook: Option<&RefusalHook>,
    refusal: &Refusal<'_>,
) -> Response<Bytes> {
    let Some(hook) = hook else {
        return refusal.default_response();
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| hook(refusal))) {
        Ok(response) => response,
        Err(_) => {
            tracing::error!(
                limit = %refusal.limit.name(),
                "redis-tb: the on_refusal hook panicked; the refusal is the default one"
            );
            refusal.default_response()
        }
    }
}

/// Fail mode closed: Redis could not be asked, so the request is refused.
pub(crate) fn unavailable() -> Response<Bytes> {
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &serde_json::json!({"error": "rate limiter unavailable"}),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The header fields of a response, in the order of docs/headers.md, as [`headers::rate_limit_headers`] gives
/// them.
#[derive(Default)]
pub(crate) struct Fields(Vec<(&'static str, String)>);

impl Fields {
    /// The fields of a decision over the enforced `limits`.
    pub(crate) fn of<'a>(
        standard: Standard,
        limits: impl Iterator<Item = &'a Limit>,
        reply: &AcquiredEach,
    ) -> Fields {
        let policies: Vec<Policy<'_>> = limits.map(Limit::policy).collect();
        Fields(headers::rate_limit_headers(&policies, reply, standard))
    }

    /// Appends the fields to `headers`.
    pub(crate) fn append_to(self, headers: &mut HeaderMap) {
        for (name, value) in self.0 {
            // Every value is printable ASCII (an sf-string or digits), so each converts.
            if let (Some(name), Ok(value)) = (header_name(name), HeaderValue::try_from(value)) {
                headers.append(name, value);
            }
        }
    }
}

/// The `HeaderName` of a field [`headers::rate_limit_headers`] names.
fn header_name(name: &str) -> Option<HeaderName> {
    match name {
        "RateLimit-Policy" => Some(RATELIMIT_POLICY),
        "RateLimit" => Some(RATELIMIT),
        "RateLimit-Limit" => Some(RATELIMIT_LIMIT),
        "RateLimit-Remaining" => Some(RATELIMIT_REMAINING),
        "RateLimit-Reset" => Some(RATELIMIT_RESET),
        "Retry-After" => Some(RETRY_AFTER),
        _ => None,
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

pin_project_lite::pin_project! {
    /// The body of the layer's responses: the inner service's body as it is, or the layer's own bytes (a
    /// refusal, fail mode closed's `503`).
    pub struct RateLimitBody<B> {
        #[pin]
        inner: Option<B>,
        own: Option<Bytes>,
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body.
    pub(crate) fn inner(body: B) -> RateLimitBody<B> {
        RateLimitBody {
            inner: Some(body),
            own: None,
        }
    }

    /// The layer's own bytes.
    pub(crate) fn own(bytes: Bytes) -> RateLimitBody<B> {
        RateLimitBody {
            inner: None,
            own: (!bytes.is_empty()).then_some(bytes),
        }
    }
}

impl<B> http_body::Body for RateLimitBody<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(inner) => inner.poll_frame(cx),
            None => Poll::Ready(this.own.take().map(|bytes| Ok(Frame::data(bytes)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(inner) => inner.is_end_stream(),
            None => self.own.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) => inner.size_hint(),
            None => SizeHint::with_exact(self.own.as_ref().map_or(0, |own| own.len() as u64)),
        }
    }
}
