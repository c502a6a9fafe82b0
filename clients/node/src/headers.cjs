"use strict";
// HTTP headers from a decision. Per bucket of the call, one item in each of the IETF draft's two fields
// (draft-ietf-httpapi-ratelimit-headers):
//   RateLimit-Policy: "<name>";q=<burst>;w=<ceil(burst / rate)>     the quota and the seconds it takes to refill
//   RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>
// and the older single-limit fields from the limiting bucket (the one that refused, or the one with the fewest
// tokens left): RateLimit-Limit (its burst), RateLimit-Remaining, RateLimit-Reset (seconds until full).
// Retry-After (whole seconds, rounded up) only on a refusal that waiting can cure: a cost above a bucket's burst
// never succeeds, so it has none.

const FORMATS = ["both", "draft", "legacy", "none"];

/** An RFC 8941 sf-string: the policy name in quotes, with `"` and `\` escaped. */
function sfString(text) {
  return `"${String(text).replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

function seconds(ms) {
  return Math.ceil(ms / 1000);
}

/**
 * The headers for `decision`: { allowed, limitingIndex, buckets: [{ name, rate, burst, remaining, retryAfterMs,
 * resetAfterMs }] }. `standard`: "both" (default), "draft", "legacy" or "none" (the Python package's names).
 */
function rateLimitHeaders(decision, standard = "both") {
  if (!FORMATS.includes(standard)) {
    throw new TypeError(`standard must be one of ${FORMATS.join(", ")}, got ${JSON.stringify(standard)}`);
  }
  return headersFor(decision, standard);
}

/**
 * rateLimitHeaders without checking `standard`: for callers that checked it once already (createHttpLimiter, at
 * construction), so that a request does not check it again.
 */
function headersFor(decision, standard) {
  const headers = {};
  const { buckets } = decision;
  if (standard === "both" || standard === "draft") {
    headers["RateLimit-Policy"] = buckets
      .map((b) => `${sfString(b.name)};q=${Math.floor(b.burst)};w=${Math.ceil(b.burst / b.rate)}`)
      .join(", ");
    headers["RateLimit"] = buckets
      .map((b) => `${sfString(b.name)};r=${Math.max(0, b.remaining)};t=${seconds(b.resetAfterMs)}`)
      .join(", ");
  }
  if (standard === "both" || standard === "legacy") {
    const limiting = buckets[decision.limitingIndex] ?? buckets[0];
    headers["RateLimit-Limit"] = String(Math.floor(limiting.burst));
    headers["RateLimit-Remaining"] = String(Math.max(0, limiting.remaining));
    headers["RateLimit-Reset"] = String(seconds(limiting.resetAfterMs));
  }
  const retryAfterMs = waitMs(decision);
  if (!decision.allowed && retryAfterMs >= 0) headers["Retry-After"] = String(seconds(retryAfterMs));
  return headers;
}

/** How long until a refused call would succeed: the longest wait of the buckets that could not pay; -1 for never. */
function waitMs(decision) {
  if (decision.allowed) return 0;
  let longest = 0;
  for (const bucket of decision.buckets) {
    if (bucket.fits === true) continue;
    if (bucket.retryAfterMs < 0) return -1;
    longest = Math.max(longest, bucket.retryAfterMs);
  }
  return longest;
}

module.exports = { rateLimitHeaders, headersFor, waitMs, FORMATS };
