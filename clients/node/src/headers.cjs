"use strict";
// HTTP headers from a decision. Per bucket of the call, one item in each of the IETF draft's two fields
// (draft-ietf-httpapi-ratelimit-headers):
//   RateLimit-Policy: "<name>";q=<burst>;w=<ceil(burst / rate)>     the quota and the seconds it takes to refill
//   RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>
// and the older single-limit fields from the limiting bucket (the one that refused, or the one with the fewest
// tokens left): RateLimit-Limit (its burst), RateLimit-Remaining, RateLimit-Reset (seconds until full).
// Retry-After (whole seconds, rounded up, the limiting bucket's wait) only on a refusal that waiting can cure: a cost
// above a bucket's burst never succeeds, so it has none. One mapping with the Python package and tb-rls:
// docs/headers.md, with the cases in fixtures/headers.json.
//
// Every number is an integer from 0 to MAX_INTEGER, the largest RFC 8941 sf-integer (15 digits): a burst of 1e21
// would print as `1e+21`, a burst / rate that overflows as `Infinity`, the module's saturated remaining with 19
// digits; each goes out as MAX_INTEGER instead. Names are checked when the limits are (limit.cjs), and again by
// rateLimitHeaders, which takes them from its caller.

const { checkLimitName } = require("./limit.cjs");

const FORMATS = ["both", "draft", "legacy", "none"];
const MAX_INTEGER = 999_999_999_999_999;

/** An RFC 8941 sf-string: the policy name (0x20-0x7E only, limit.cjs) in quotes, with `"` and `\` escaped. */
function sfString(text) {
  const string = String(text);
  if (!string.includes('"') && !string.includes("\\")) return `"${string}"`;
  return `"${string.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

/** `value` rounded by `round`, within 0..MAX_INTEGER (Infinity as MAX_INTEGER, NaN as 0). */
function integer(value, round) {
  const number = Number(value);
  if (!(number > 0)) return 0;
  if (number >= MAX_INTEGER) return MAX_INTEGER;
  return Math.min(MAX_INTEGER, round(number));
}

function seconds(ms) {
  return integer(Number(ms) / 1000, Math.ceil);
}

function count(tokens) {
  return integer(tokens, Math.floor);
}

/** The seconds a bucket takes to fill from empty, at least 1 (burst / rate may round to 0 or overflow). */
function fillSeconds(bucket) {
  return Math.max(1, integer(bucket.burst / bucket.rate, Math.ceil));
}

/**
 * The headers for `decision`: { allowed, limitingIndex, buckets: [{ name, rate, burst, remaining, retryAfterMs,
 * resetAfterMs }] }. `standard`: "both" (default), "draft", "legacy" or "none" (the Python package's names).
 */
function rateLimitHeaders(decision, standard = "both") {
  if (!FORMATS.includes(standard)) {
    throw new TypeError(`standard must be one of ${FORMATS.join(", ")}, got ${JSON.stringify(standard)}`);
  }
  decision.buckets.forEach((bucket, index) => checkLimitName(bucket.name, `decision.buckets[${index}].name`));
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
    let policy = "";
    let state = "";
    for (let index = 0; index < buckets.length; index++) {
      const b = buckets[index];
      const name = sfString(b.name);
      const separator = index === 0 ? "" : ", ";
      policy += `${separator}${name};q=${count(b.burst)};w=${fillSeconds(b)}`;
      state += `${separator}${name};r=${count(b.remaining)};t=${seconds(b.resetAfterMs)}`;
    }
    headers["RateLimit-Policy"] = policy;
    headers["RateLimit"] = state;
  }
  if (standard === "both" || standard === "legacy") {
    const limiting = buckets[decision.limitingIndex] ?? buckets[0];
    headers["RateLimit-Limit"] = String(count(limiting.burst));
    headers["RateLimit-Remaining"] = String(count(limiting.remaining));
    headers["RateLimit-Reset"] = String(seconds(limiting.resetAfterMs));
  }
  const retryAfterMs = waitMs(decision);
  if (!decision.allowed && retryAfterMs >= 0) headers["Retry-After"] = String(seconds(retryAfterMs));
  return headers;
}

/**
 * How long until a refused call would succeed: the limiting bucket's wait (the bucket the reply names, which the
 * single-limit fields describe; the module names the one that cannot pay, the longest wait); -1 for never.
 */
function waitMs(decision) {
  if (decision.allowed) return 0;
  const limiting = decision.buckets[decision.limitingIndex] ?? decision.buckets[0];
  return limiting === undefined ? 0 : limiting.retryAfterMs;
}

module.exports = { rateLimitHeaders, headersFor, waitMs, FORMATS, MAX_INTEGER };
