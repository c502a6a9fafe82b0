"use strict";
// What a limit accepts: one rule shared with the Python package (docs/clients.md, "Limits"; fixtures/limits.json
// and the names of fixtures/headers.json hold the cases), checked when the middleware is built, with an error
// naming the limit and the field, so that no request ever meets a limit the headers or the server cannot take.
//   name   a non-empty string of the characters 0x20 to 0x7E: it names the bucket and goes into RateLimit-Policy as
//          an RFC 8941 sf-string, which holds nothing else (a non-Latin-1 character would make setHeader throw,
//          CR LF would split the field). Unique among the limits of one middleware.
//   rate, burst  finite numbers > 0; cost  a finite number >= 0 (0 peeks), as the server accepts them.
//   shadow true: the limit's buckets are charged but a request it refuses is served (docs/operating.md).

const { TbArgumentError } = require("./errors.cjs");

const NAME = /^[\x20-\x7e]+$/;

/** `name` if an sf-string can hold it, else a TbArgumentError saying so for `where` (`limits[0].name`). */
function checkLimitName(name, where) {
  if (typeof name !== "string" || !NAME.test(name)) {
    const shown = typeof name === "string" ? JSON.stringify(name) : String(name);
    throw new TbArgumentError(
      `${where} must be a non-empty string of the characters 0x20 to 0x7E (it goes into the RateLimit-Policy header), got ${shown}`,
    );
  }
  return name;
}

function checkNumber(limit, field, where, minimumExcluded) {
  const value = limit[field];
  const inRange = minimumExcluded ? value > 0 : value >= 0;
  if (typeof value !== "number" || !Number.isFinite(value) || !inRange) {
    throw new TbArgumentError(`${where}.${field} must be a finite number ${minimumExcluded ? ">" : ">="} 0, got ${typeof value === "number" ? value : typeof value}`);
  }
}

/** A `shadow` option: true or false (default false). */
function checkShadow(shadow, where) {
  if (shadow !== undefined && typeof shadow !== "boolean") {
    throw new TbArgumentError(`${where} must be true or false, got ${typeof shadow}`);
  }
  return shadow === true;
}

/**
 * The limits option checked: a limit { name, rate, burst, cost?, key? } or a non-empty array of them, as an array
 * of { name, rate, burst, cost, key, shadow }. A single limit without a name is named "default".
 */
function limitList(limits) {
  const list = Array.isArray(limits) ? limits : [limits];
  if (list.length === 0 || list.some((limit) => limit === null || typeof limit !== "object")) {
    throw new TbArgumentError("limits must be a limit { name, rate, burst } or a non-empty array of them");
  }
  const names = new Set();
  return list.map((limit, index) => {
    const where = `limits[${index}]`;
    const name = checkLimitName(limit.name === undefined && list.length === 1 ? "default" : limit.name, `${where}.name`);
    if (names.has(name)) throw new TbArgumentError(`${where}.name ${JSON.stringify(name)} is used twice (it names the bucket)`);
    names.add(name);
    checkNumber(limit, "rate", where, true);
    checkNumber(limit, "burst", where, true);
    if (limit.cost !== undefined) checkNumber(limit, "cost", where, false);
    if (limit.key !== undefined && typeof limit.key !== "function") {
      throw new TbArgumentError(`${where}.key must be a function of the request`);
    }
    const shadow = checkShadow(limit.shadow, `${where}.shadow`);
    return { name, rate: limit.rate, burst: limit.burst, cost: limit.cost, key: limit.key, shadow };
  });
}

module.exports = { checkLimitName, checkShadow, limitList };
