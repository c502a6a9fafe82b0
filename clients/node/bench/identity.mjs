// What the default key costs per request before the Redis call: ipIdentity (the peer address as the middleware's
// identity, docs/clients.md) for the three forms a server reports, and bucketKey for the result, timed in a loop.
// An IPv4 peer of a dual-stack server arrives as `::ffff:a.b.c.d`. Median of 7 runs of 1,000,000 calls each.
//   node bench/identity.mjs
import { bucketKey, ipIdentity } from "../src/identity.cjs";

const RUNS = 7;
const CALLS = 1_000_000;

/** The median ns per call over RUNS runs of CALLS after one run of warm-up; `call` returns a string. */
function median(call) {
  let length = 0;
  const run = () => {
    const start = process.hrtime.bigint();
    for (let index = 0; index < CALLS; index++) length += call().length;
    return Number(process.hrtime.bigint() - start) / CALLS;
  };
  run();
  const times = Array.from({ length: RUNS }, run).sort((a, b) => a - b);
  if (length === 0) throw new Error("no identity");
  return times[RUNS >> 1];
}

const options = { ipv6Subnet: 56 };
const rows = [
  ["ipIdentity, IPv4 (10.0.0.1)", median(() => ipIdentity("10.0.0.1", options))],
  ["ipIdentity, IPv4 on a dual-stack server (::ffff:10.0.0.1)", median(() => ipIdentity("::ffff:10.0.0.1", options))],
  ["ipIdentity, IPv6 (2001:db8:1:2ff::1)", median(() => ipIdentity("2001:db8:1:2ff::1", options))],
  ["bucketKey of an IPv4 identity", median(() => bucketKey("ratelimit:", "10.0.0.1", "api"))],
];
console.log(`Node ${process.version}, the default key's parts, median of ${RUNS} runs of ${CALLS.toLocaleString("en")} calls`);
console.log("| call | ns per call |\n|---|--:|");
for (const [call, ns] of rows) console.log(`| ${call} | ${ns.toFixed(1)} |`);
