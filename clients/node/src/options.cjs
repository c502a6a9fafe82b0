"use strict";
// The options' checks, each written once (docs/clients.md, "Options"; fixtures/options.json holds what each
// accepts and refuses, with the error text the Python and Rust packages share): every option a drop-in is given is
// one it implements, and the middleware's and drop-ins' values are refused at construction with an error naming the
// option and its rule, never met by a request.

const { inspect } = require("node:util");
const { TbArgumentError } = require("./errors.cjs");

/** A value as an error message shows it, whatever it is (a Symbol, an object without toString). */
function shown(value) {
  return inspect(value, { depth: 1, breakLength: Infinity });
}

/**
 * Throws a TbArgumentError for the first option of `options` that `known` does not list: with the reason from
 * `refused` when the library has that option and the drop-in cannot honour it, else as an unknown option.
 */
function checkOptions(owner, options, known, refused = {}) {
  for (const [name, value] of Object.entries(options)) {
    if (value === undefined || known.includes(name)) continue;
    if (Object.hasOwn(refused, name)) throw new TbArgumentError(`${owner} does not implement ${name}: ${refused[name]}`);
    throw new TbArgumentError(`${owner}: unknown option ${name} (it takes ${known.join(", ")})`);
  }
}

/** `localCapacity`, the keys the in-memory buckets keep (fail "local"), if it is a positive integer. */
function checkCapacity(capacity) {
  if (!Number.isSafeInteger(capacity) || capacity < 1) {
    throw new TbArgumentError(`localCapacity must be a positive integer (keys kept in memory), got ${shown(capacity)}`);
  }
  return capacity;
}

/**
 * `timeoutMs`, the deadline of each limiter call, if it is a positive finite number of milliseconds. There is no
 * setting without one: a limiter that waits as long as the Redis client does lets a stalled Redis stall the
 * requests. `owner` names a drop-in in the error (the middleware's has none).
 */
function checkTimeout(timeoutMs, owner) {
  if (typeof timeoutMs !== "number" || !(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
    throw new TbArgumentError(
      `${owner === undefined ? "" : `${owner}: `}timeoutMs must be a positive finite number of milliseconds, got ` +
        `${shown(timeoutMs)}: every limiter call has a deadline (without one, a stalled Redis would stall the requests)`,
    );
  }
  return timeoutMs;
}

/**
 * `prefix` if it is a string without a brace. The hash tag of every key is its identity's (every bucket of one
 * identity in one slot, and identities spread over the cluster): a brace in the prefix would change the slot a
 * bucket lands in (`{}` hashes the whole key, `{x}` puts every bucket in one slot).
 */
function checkPrefix(prefix) {
  if (typeof prefix !== "string" || prefix.includes("{") || prefix.includes("}")) {
    throw new TbArgumentError(`prefix must be a string without "{" or "}" (the hash tag of every key is its identity's), got ${shown(prefix)}`);
  }
  return prefix;
}

/** `statusCode`, the status of a refusal, if it is an HTTP error status: an integer from 400 to 599. */
function checkStatusCode(statusCode) {
  if (!Number.isInteger(statusCode) || statusCode < 400 || statusCode > 599) {
    throw new TbArgumentError(`statusCode must be an HTTP error status (400 to 599), got ${shown(statusCode)}`);
  }
  return statusCode;
}

/**
 * `body`, the refusal's JSON body, if it is a function (of the decision, returning the object) or a plain object
 * that JSON holds as an object (not an array, not a Map, nothing JSON.stringify throws on: a BigInt, a cycle).
 */
function checkBody(body) {
  if (typeof body === "function") return body;
  let json;
  if (body !== null && typeof body === "object" && [Object.prototype, null].includes(Object.getPrototypeOf(body))) {
    try {
      json = JSON.stringify(body);
    } catch {
      // refused below
    }
  }
  if (typeof json !== "string" || !json.startsWith("{")) {
    throw new TbArgumentError(`body must be a JSON object or a function returning one, got ${shown(body)}`);
  }
  return body;
}

module.exports = { checkOptions, checkCapacity, checkTimeout, checkPrefix, checkStatusCode, checkBody };
