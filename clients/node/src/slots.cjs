"use strict";
// Several limits of one request in one decision on a Redis Cluster. TB.ACQUIREEACH takes every bucket's cost or
// none, but one call reaches the keys of one slot only, and a request whose limits have several identities (per
// user and per tenant: two hash tags) has buckets in several slots: one call for all of them is CROSSSLOT. So on a
// Cluster such buckets go in one call per slot, one after the other; when a part is refused, what the allowed
// parts took is given back (TB.REFUND of each bucket's cost), so that the request takes nothing, as one call would
// have. The parts' reports make one TB.ACQUIREEACH reply, buckets in their order. The Python package's middleware
// splits them by slot in the same way (its Plan.parts and Plan.refunds).
//
// Between the parts, another request may see tokens a later-refused request held for a moment: a refusal it would
// not have met with one call. That is the price of limits in two slots; nothing is ever admitted beyond a limit.

const { keySlot } = require("./connection.cjs");
const { limiting } = require("./local.cjs");

/** TB.ACQUIREEACH for `buckets` through the TbClient `tb`, one call per slot where `tb` is over a Cluster. */
async function acquireEachBySlot(tb, buckets) {
  if (!tb._connection.cluster) return tb.acquireEach(buckets);
  const parts = new Map();
  buckets.forEach((bucket, index) => {
    const slot = keySlot(bucket.key);
    if (!parts.has(slot)) parts.set(slot, []);
    parts.get(slot).push(index);
  });
  if (parts.size === 1) return tb.acquireEach(buckets);
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
  if (!allowed) {
    for (const index of taken) {
      const { key, rate, burst, cost = 1 } = buckets[index];
      await tb.refund(key, rate, burst, cost);
    }
  }
  return { allowed, limitingIndex: limiting(reports), buckets: reports };
}

module.exports = { acquireEachBySlot };
