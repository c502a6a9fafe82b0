//! Answering: what the layer puts on a response. The RateLimit header fields of an allowed request (docs/headers.md,
//! made by [`crate::headers::rate_limit_headers`]), the refusal (the `on_refusal` hook's response, or the default:
//! the status code option's status with a small JSON body), fail mode closed's `503`, and the body type that
//! carries either the inner service's body or the layer's own bytes without boxing the former.
#![forbid(unsafe_code)]

use std::fmt;
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

/// The text of 0 to 99, the usual remaining tokens and seconds: their header values point here rather than
/// each allocating its digits.
const SMALL_NUMBERS: [&str; 100] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47", "48",
    "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60", "61", "62", "63", "64",
    "65", "66", "67", "68", "69", "70", "71", "72", "73", "74", "75", "76", "77", "78", "79", "80",
    "81", "82", "83", "84", "85", "86", "87", "88", "89", "90", "91", "92", "93", "94", "95", "96",
    "97", "98", "99",
];

/// An integer's header value: one allocation of its digits' size (`HeaderValue::from` of an integer takes two).
fn number(value: i64) -> HeaderValue {
    if let Some(text) = usize::try_from(value)
        .ok()
        .and_then(|index| SMALL_NUMBERS.get(index))
    {
        return HeaderValue::from_static(text);
    }
    match HeaderValue::from_bytes(itoa::Buffer::new().format(value).as_bytes()) {
        Ok(number) => number,
        Err(_) => HeaderValue::from(value),
    }
}

/// A header value's text written on the stack first, so that the value takes one allocation of its exact size
/// (written into a `String`, it takes that and another for the count the bytes share).
struct OnStack {
    bytes: [u8; 96],
    len: usize,
}

impl OnStack {
    fn new() -> OnStack {
        OnStack {
            bytes: [0; 96],
            len: 0,
        }
    }

    fn value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(self.bytes.get(..self.len)?).ok()
    }
}

impl fmt::Write for OnStack {
    /// Fails when the text does not fit: the caller writes it into a `String` then.
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let end = self.len.checked_add(text.len()).ok_or(fmt::Error)?;
        let into = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        into.copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The `RateLimit` value of `reply`'s buckets, named by `names`.
fn current_value<'a, I>(names: I, reply: &AcquiredEach) -> Option<HeaderValue>
where
    I: Iterator<Item = &'a str> + Clone,
{
    let mut text = OnStack::new();
    if headers::write_current_field(&mut text, names.clone(), reply).is_ok() {
        return text.value();
    }
    HeaderValue::try_from(headers::current_field(names, reply)).ok()
}

/// The header values that stay the same for every decision over the layer's whole list of limits: made once,
/// when the layer is built, by the same functions as every other value.
pub(crate) struct Fixed {
    /// `RateLimit-Policy`.
    policy: Option<HeaderValue>,
    /// Each limit's `RateLimit-Limit`.
    quotas: Vec<HeaderValue>,
}

impl Fixed {
    pub(crate) fn of(limits: &[Limit]) -> Fixed {
        let policies: Vec<Policy<'_>> = limits.iter().map(Limit::policy).collect();
        Fixed {
            policy: HeaderValue::try_from(headers::policy_field(&policies)).ok(),
            quotas: limits
                .iter()
                .map(|limit| HeaderValue::from(headers::quota(limit.burst())))
                .collect(),
        }
    }
}

/// The header fields of a response, in the order of docs/headers.md: the fields
/// [`headers::rate_limit_headers`] gives, each made by its function there (a unit test holds the two equal).
#[derive(Default)]
pub(crate) struct Fields(Vec<(HeaderName, HeaderValue)>);

impl Fields {
    /// The fields of a decision over the enforced `limits`; `fixed` holds their unchanging values when they are
    /// the layer's whole list.
    pub(crate) fn of<'a, I>(
        standard: Standard,
        limits: I,
        reply: &AcquiredEach,
        fixed: Option<&Fixed>,
    ) -> Fields
    where
        I: Iterator<Item = &'a Limit> + Clone,
    {
        let count = limits.clone().count();
        let mut fields = Vec::with_capacity(6);
        if count == 0 {
            return Fields(fields);
        }
        if headers::sends_draft(standard) {
            let policy = match fixed.and_then(|fixed| fixed.policy.clone()) {
                Some(policy) => Some(policy),
                None => {
                    let policies: Vec<Policy<'_>> = limits.clone().map(Limit::policy).collect();
                    HeaderValue::try_from(headers::policy_field(&policies)).ok()
                }
            };
            let current = current_value(limits.clone().map(Limit::name), reply);
            // Every value is printable ASCII (an sf-string or digits), so each converts.
            if let (Some(policy), Some(current)) = (policy, current) {
                fields.push((RATELIMIT_POLICY, policy));
                fields.push((RATELIMIT, current));
            }
        }
        if headers::sends_legacy(standard) {
            let index = headers::legacy_index(count, reply);
            if let (Some(limit), Some(bucket)) =
                (limits.clone().nth(index), reply.buckets.get(index))
            {
                let quota = match fixed.and_then(|fixed| fixed.quotas.get(index)) {
                    Some(quota) => quota.clone(),
                    None => HeaderValue::from(headers::quota(limit.burst())),
                };
                fields.push((RATELIMIT_LIMIT, quota));
                fields.push((RATELIMIT_REMAINING, number(headers::remaining(bucket))));
                fields.push((RATELIMIT_RESET, number(headers::reset_seconds(bucket))));
            }
        }
        if let Some(seconds) = headers::retry_after_seconds(reply) {
            fields.push((RETRY_AFTER, number(seconds)));
        }
        Fields(fields)
    }

    /// Appends the fields to `headers`.
    pub(crate) fn append_to(self, headers: &mut HeaderMap) {
        if self.0.is_empty() {
            return;
        }
        headers.reserve(self.0.len());
        for (name, value) in self.0 {
            headers.append(name, value);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replies::BucketResult;
    use tb_test_support::{fixture, fixture_number};

    #[test]
    fn small_numbers_are_written_as_large_ones_are() {
        for value in [i64::MIN, -1, 0, 1, 9, 10, 99, 100, 12345, i64::MAX] {
            assert_eq!(number(value), HeaderValue::from(value), "{value}");
        }
    }

    /// A `RateLimit` value too long for the stack is written into a `String`, the same text.
    #[test]
    fn a_long_rate_limit_value_is_written_whole() {
        let reply = AcquiredEach {
            allowed: true,
            limiting_index: 0,
            buckets: vec![BucketResult {
                fits: true,
                remaining: i64::MAX,
                retry_after_ms: 0,
                reset_after_ms: 1500,
            }],
        };
        // 24 bytes besides a plain name (`r` at most 15 digits): 72 fills the 96 on the stack, 73 takes the `String`.
        for (plain, size) in [(72, 96), (73, 97)] {
            let name = "n".repeat(plain);
            assert_eq!(headers::current_field([name.as_str()], &reply).len(), size);
        }
        for name in [
            "api",
            "n".repeat(72).as_str(),
            "n".repeat(73).as_str(),
            "\"quoted\" \u{e9}".repeat(20).as_str(),
        ] {
            let expected = headers::current_field([name], &reply);
            let value = current_value([name].into_iter(), &reply).expect("a value");
            assert_eq!(value.to_str().expect("text"), expected, "{name}");
        }
    }

    /// The layer's fields are [`headers::rate_limit_headers`]'s, for every case of fixtures/headers.json whose
    /// limits a [`Limit`] can hold, with the unchanging values made apart or not.
    #[test]
    fn the_layer_s_fields_are_the_shared_mapping_s() {
        let fixture = fixture("headers.json");
        let mut checked = 0;
        for case in fixture["cases"].as_array().expect("cases") {
            let buckets = case["buckets"].as_array().expect("buckets");
            let limits: Option<Vec<Limit>> = buckets
                .iter()
                .map(|bucket| {
                    let name = bucket["name"].as_str()?;
                    Limit::new(
                        name,
                        fixture_number(&bucket["rate"]),
                        fixture_number(&bucket["burst"]),
                    )
                    .ok()
                })
                .collect();
            let Some(limits) = limits else {
                continue;
            };
            let reply = AcquiredEach {
                allowed: case["allowed"].as_bool().expect("allowed"),
                limiting_index: case["limiting_index"].as_u64().expect("index") as usize,
                buckets: buckets
                    .iter()
                    .map(|bucket| BucketResult {
                        fits: bucket["fits"].as_bool().expect("fits"),
                        remaining: bucket["remaining"].as_i64().expect("remaining"),
                        retry_after_ms: bucket["retry_after_ms"].as_i64().expect("retry"),
                        reset_after_ms: bucket["reset_after_ms"].as_i64().expect("reset"),
                    })
                    .collect(),
            };
            let standard: Standard = case["standard"]
                .as_str()
                .and_then(|name| name.parse().ok())
                .expect("a standard");
            let policies: Vec<Policy<'_>> = limits.iter().map(Limit::policy).collect();
            let expected: Vec<(String, String)> =
                headers::rate_limit_headers(&policies, &reply, standard)
                    .into_iter()
                    .map(|(name, value)| (name.to_ascii_lowercase(), value))
                    .collect();
            let fixed = Fixed::of(&limits);
            for fixed in [None, Some(&fixed)] {
                let mut map = HeaderMap::new();
                Fields::of(standard, limits.iter(), &reply, fixed).append_to(&mut map);
                let found: Vec<(String, String)> = map
                    .iter()
                    .map(|(name, value)| {
                        (name.to_string(), value.to_str().expect("text").to_owned())
                    })
                    .collect();
                assert_eq!(found, expected, "{}", case["about"]);
            }
            checked += 1;
        }
        assert!(checked >= 5, "{checked} cases");
    }
}
