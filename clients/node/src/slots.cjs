"use strict";
// Several limits of one request in one decision on a Redis Cluster. TB.ACQUIREEACH takes every bucket's cost or
// none, but one call reaches the keys of one slot only, and a request whose limits have several identities (per
// user and per tenant: two hash tags) has buckets in several slots: one call for all of them is CROSSSLOT. So on a
// Cluster such buckets go in one call per slot, one after the other; when a part is refused, what the allowed
// parts took is given back (TB.REFUND of each bucket's cost, giveBack), so that the request takes nothing, as one
// call would have. The parts' reports make one TB.ACQUIREEACH reply, buckets in their order. The Python package's
// middleware splits them by slot in the same way (its Plan.parts and Plan.refunds).
//
// A refused request stays refused whatever happens to its refunds: each is a call of its own, under its own
// deadline, and one that fails (an error reply, a lost connection, the deadline) is reported and the others still
// sent; its bucket keeps what it took. The fail mode never answers such a request: Redis did.
//
// Between the parts, another request may see tokens a later-refused request held for a moment: a refusal it would
// not have met with one call. That is the price of limits in two slots; nothing is ever admitted beyond a limit.

const { keySlot } = require("./connection.cjs");
const { limiting } = require("./local.cjs");

/**
 * TB.ACQUIREEACH for `buckets` through the TbClient `tb`, one call per slot where `tb` is over a Cluster:
 * { reply, refunds }, `refunds` the buckets for giveBack when a part refused (what the allowed parts took), else [].
 */
async function acquireEachBySlot(tb, buckets) {
  if (!tb._connection.cluster) return { reply: await tb.acquireEach(buckets), refunds: [] };
  const parts = new Map();
  buckets.forEach((bucket, index) => {
    const slot = keySlot(bucket.key);
    if (!parts.has(slot)) parts.set(slot, []);
    parts.get(slot).push(index);
  });
  if (parts.size === 1) return { reply: await tb.acquireEach(buckets), refunds: [] };
  const reports = new Array(buckets.length);
  const taken = [];
  for (const indexes of parts.values()) {
    const reply = await tb.acquireEach(indexes.map((index) => buckets[index]));
    indexes.forEach((index, at) => {
      reports[index] = reply.buckets[at];
    });
    if (reply.allowed) taken.push(...indexes);
  }
  const allowed = taken.length === buckets.length;
  const reply = { allowed, limitingIndex: limiting(reports), buckets: reports };
  return { reply, refunds: allowed ? [] : taken.map((index) => buckets[index]) };
}

/**
 * Gives back what a refused request took from `refunds` (acquireEachBySlot's): TB.REFUND of each bucket's cost,
 * each through `run(send)` (a call of its own, under its own deadline). One that fails goes to `failed(error,
 * bucket)`, and the others are still sent.
 */
async function giveBack(run, refunds, failed) {
  for (const bucket of refunds) {
    const { key, rate, burst, cost = 1 } = bucket;
    try {
      await run((tb) => tb.refund(key, rate, burst, cost));
    } catch (error) {
      failed(error, bucket);
    }
  }
}

module.exports = { acquireEachBySlot, giveBack };
