// What the fail mode "local" bookkeeping costs per answered call: LocalBuckets.observeOne, which remembers Redis's
// answer for each key (docs/clients.md, "When Redis fails"), timed in a loop without Redis. Three shapes: one key
// (a limit keyed by one peer address), a hot key among 1,000 others (a shared limit beside per-client ones), and
// 1,000 keys in turn (a header key over many identities). Median of 7 runs of 1,000,000 calls each.
//   node bench/local.mjs
import { LocalBuckets } from "../src/local.cjs";

const RUNS = 7;
const CALLS = 1_000_000;
const limit = { name: "api", rate: 1e9, burst: 1e9, cost: 1 };

/** The median ns per call over RUNS runs of `calls` after one run of warm-up. */
function median(call) {
  const run = () => {
    const start = process.hrtime.bigint();
    for (let index = 0; index < CALLS; index++) call(index);
    return Number(process.hrtime.bigint() - start) / CALLS;
  };
  run();
  const times = Array.from({ length: RUNS }, run).sort((a, b) => a - b);
  return times[RUNS >> 1];
}

function table(others) {
  const local = new LocalBuckets({ capacity: 10_000 });
  for (let index = 0; index < others; index++) local.observeOne({ ...limit, key: `ratelimit:{u${index}}:api` }, 1);
  return local;
}

const hot = { ...limit, key: "ratelimit:{10.0.0.1}:api" };
const alone = table(0);
const among = table(1_000);
const rotating = table(1_000);
const keys = Array.from({ length: 1_000 }, (_, index) => ({ ...limit, key: `ratelimit:{u${index}}:api` }));
const rows = [
  ["one key", median(() => alone.observeOne(hot, 1, 0))],
  ["a hot key among 1,000 others", median(() => among.observeOne(hot, 1, 0))],
  ["1,000 keys in turn", median((index) => rotating.observeOne(keys[index % 1_000], 1, 0))],
];
console.log(`Node ${process.version}, LocalBuckets.observeOne, median of ${RUNS} runs of ${CALLS.toLocaleString("en")} calls`);
console.log("| keys | ns per call |\n|---|--:|");
for (const [shape, ns] of rows) console.log(`| ${shape} | ${ns.toFixed(1)} |`);
