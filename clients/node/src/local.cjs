"use strict";
// The in-memory token buckets of `fail: "local"` and their rule (docs/clients.md, "When Redis fails";
// fixtures/local.json holds it as call sequences): one process admits at most burst + rate * t per key over any
// interval t, however Redis fails or flaps.
//   - A fault is per call: a call that fails is decided by its own keys' buckets; an answer for another key never
//     clears or refills them.
//   - Each Redis answer within its call's deadline is remembered: the key's bucket then holds burst - rate *
//     reset_after_ms / 1000 tokens as of the moment it arrived (negative in debt), and a later failure refills
//     from there. A key never answered for starts full.
//   - When Redis answers again, its bucket is brought down to the in-memory one, and no lower: what the buckets
//     admit is owed to Redis, and every call for a key that is owed anything, or whose charge-back is in flight,
//     first sends TB.LOWER key rate burst <the in-memory bucket's tokens now>, and is sent itself once Redis has
//     answered it. Written together, the two could reach the key's node in either order: a Cluster client routes
//     each command on its own (after a failover, one may follow a MOVED redirection the other does not meet), and a
//     call run before its charge-back is answered from the bucket the fault left, which may hold more than this
//     process's history allows (a replica that took over without the primary's last writes). A minimum is
//     idempotent, so calls in parallel each send their own and nothing is charged twice. Each charge-back takes what
//     is owed as its own share: accepted, the share is in Redis; failed like a fault (no reply, or an error of a
//     fail-mode row of the failure table), it is owed again and the call is decided here, without being sent;
//     refused by a configuration error, it is dropped and logged, and the call goes on to Redis.
//   - At most `capacity` keys: a new key takes the place of one of the 16 least recently used keys that is full
//     again and owes nothing; where none is, it shares the overflow bucket of its limit (never charged back).
// The arithmetic is the module's, in floating point on a monotonic clock; decisions have the shape of a
// TB.ACQUIREEACH reply, so headers come out as usual.

const { TbArgumentError, TbReplyError, classifyFailure, isReplyError } = require("./errors.cjs");
const { checkCapacity } = require("./options.cjs");

const CAPACITY = 10_000;
/** How many of the least recently used keys a new key may take the place of. */
const EVICTION_WINDOW = 16;

/** The lowest floor a charge-back sends, in seconds of refill: TB.LOWER's bound on debt (a day). */
const MAX_DEBT_SECONDS = 86_400;

/** The longest wait reported, in milliseconds: the module's (an i64), as a double reads it (2^63). */
const MAX_WAIT_MS = 2 ** 63 - 1;

/**
 * Milliseconds, rounded up, with the float noise of a division that should be whole (3.5000000001) dropped, and
 * saturated at the module's longest wait (a refill a double cannot count: rate 1e-300).
 */
function ceilMs(ms) {
  return Math.min(MAX_WAIT_MS, Math.ceil(ms - 1e-6));
}

/**
 * What becomes of the share of a charge-back that settled with `error` (undefined: accepted): "accepted" (the
 * share is in Redis's bucket now), "owed" (a fault: no reply, or an error whose row of the failure table takes the
 * fail mode; sent again with the key's next call) or "dropped" (a configuration error, which sending it again
 * would meet again). An argument refused before anything was sent stays owed.
 */
function chargeBackOutcome(error) {
  if (error === undefined) return "accepted";
  if (error instanceof TbArgumentError) return "owed";
  // Only the server's own refusal drops a charge-back: after an error of the client's (a connection closed under
  // it, a bug), Redis may or may not have taken it, and bringing it down again later is harmless (a minimum).
  if (!(error instanceof TbReplyError || isReplyError(error))) return "owed";
  return classifyFailure(error).action === "fail-mode" ? "owed" : "dropped";
}

function warnRefused(error, share) {
  const message = `redis-tb: Redis refused a charge-back (${error?.message ?? error}); the ${share} admitted in memory it covered are dropped`;
  process.emitWarning(message, { code: "REDIS_TB_LOCAL" });
}

class LocalBuckets {
  /**
   * @param options.capacity how many keys are kept (default 10,000); beyond, a limit's keys share its overflow bucket
   * @param options.now      the monotonic clock, in milliseconds (default performance.now)
   * @param options.refused  (error, share) => void: hears of each charge-back refused by a configuration error, and
   *                         of the share it covered, dropped (the middleware logs it as it logs configuration
   *                         errors; default: process.emitWarning)
   */
  constructor({ capacity = CAPACITY, now = () => performance.now(), refused = warnRefused } = {}) {
    this.capacity = checkCapacity(capacity);
    this.now = now;
    this.refused = refused;
    /**
     * Redis key -> { rate, burst, tokens, atMs, owed, charging, inFlight, admitted, confirmed }: tokens <= burst as
     * of atMs (negative in debt); owed, the costs admitted here and covered by no charge-back sent yet; charging,
     * those covered by the inFlight charge-backs not yet settled (exactly 0 when none is); admitted, every cost
     * admitted here, summed; confirmed, how much of it Redis has seen: the largest `admitted` a charge-back taken by
     * Redis was made at. The key is diverged while owed or charging is above 0. The Map's order is the order of
     * last use (least recent first).
     */
    this.entries = new Map();
    /** How many entries are diverged: while none is, no call looks its key up to know (see `diverged`). */
    this.divergedKeys = 0;
    /** The key last in `entries`' order, the most recently used (undefined: none, or it was evicted). */
    this.newest = undefined;
    /** A limit (name, rate, burst) -> its overflow bucket { rate, burst, tokens, atMs }, starting full. */
    this.overflow = new Map();
  }

  /**
   * One limiter call under the rule: `run(work)` runs `work(tb)` on Redis under the call's deadline and resolves
   * with its result (the middleware's lane); in it, the charge-backs of the call's diverged keys (tb.lower), then,
   * once Redis has answered every one, `call(tb)`, which resolves with a decision in TB.ACQUIREEACH's shape (one
   * more round trip, only for a key that owes Redis). Resolves with { decision } when Redis answered, or with
   * { decision, error } decided here when the call or a charge-back failed like a fault (the call is then not
   * sent). A TbArgumentError rejects. `buckets`: [{ key, rate, burst, cost, name? }], `name` the limit's.
   */
  async decide(buckets, run, call, refused = this.refused) {
    // Set once the call is decided here: an answer that arrives after that is not remembered (see observe).
    let decidedHere = false;
    try {
      const decision = await run(async (tb) => {
        const lower = (bucket, tokens) => tb.lower(bucket.key, bucket.rate, bucket.burst, tokens);
        const charges = this.chargeBacks(buckets, lower, this.now(), refused);
        // No key owes anything (the usual case): the call alone, without the promises that wait for charge-backs.
        if (charges.length === 0) {
          const value = await call(tb);
          if (!decidedHere) this.observe(buckets, value);
          return value;
        }
        // A charge-back that met a fault leaves the call to the in-memory buckets: that key's fault goes on.
        const fault = (await Promise.all(charges)).find((charge) => charge.outcome === "owed");
        if (fault !== undefined) throw fault.error;
        // Past the deadline, the call was decided here: it is not sent, so that it is never charged later.
        if (decidedHere) return undefined;
        const value = await call(tb);
        if (!decidedHere) this.observe(buckets, value);
        return value;
      });
      return { decision };
    } catch (error) {
      if (error instanceof TbArgumentError) throw error;
      decidedHere = true;
      return { decision: this.acquire(buckets), error };
    }
  }

  /**
   * Sends a charge-back through `lower(bucket, tokens)` for each diverged key of `buckets` (once per key), `tokens`
   * its in-memory bucket now (at least a day of refill in debt, TB.LOWER's bound). Each takes what the key owes as
   * its share (0 when another charge-back in flight already covers it all), and its outcome settles the share
   * (chargeBackOutcome). Returns a promise per charge-back, resolving (never rejecting) with { outcome, error }.
   */
  chargeBacks(buckets, lower, nowMs = this.now(), refused = this.refused) {
    const charges = [];
    const seen = new Set();
    for (const bucket of buckets) {
      if (seen.has(bucket.key)) continue;
      seen.add(bucket.key);
      if (!this.diverged(bucket.key)) continue;
      const entry = this.entries.get(bucket.key);
      const tokens = Math.max(refilled(entry, nowMs), -entry.rate * MAX_DEBT_SECONDS);
      const share = entry.owed;
      // The floor covers everything admitted so far: once Redis takes it, Redis has seen that much.
      const through = entry.admitted;
      // Still diverged: what it owed is now being charged.
      entry.owed = 0;
      entry.charging += share;
      entry.inFlight += 1;
      charges.push(
        settle(() => lower(bucket, tokens)).then(({ error }) => this._settled(entry, share, through, error, refused)),
      );
    }
    return charges;
  }

  /**
   * A charge-back of `share`, made when the key had admitted `through`, settled with `error` (undefined: accepted):
   * the share leaves `charging`; `refused` hears of one dropped for a configuration error.
   */
  _settled(entry, share, through, error, refused) {
    // Taken before the change: a charge-back of share 0 (another in flight covered all) can settle on a key that
    // owes nothing any more.
    const was = isDiverged(entry);
    const outcome = chargeBackOutcome(error);
    if (outcome === "accepted") entry.confirmed = Math.max(entry.confirmed, through);
    entry.inFlight -= 1;
    // Exactly 0 once none is in flight, so that float residue (0.1 + 0.2 - 0.1 - 0.2) never keeps a key diverged.
    entry.charging = entry.inFlight === 0 ? 0 : Math.max(0, entry.charging - share);
    if (outcome === "owed") entry.owed += share;
    this._recount(entry, was);
    if (outcome === "dropped") refused(error, share);
    return { outcome, error };
  }

  /**
   * Remembers Redis's answer for `buckets` (`decision.buckets[i].resetAfterMs`): each key's bucket holds
   * burst - rate * resetAfterMs / 1000 tokens now, less what it still owes Redis. A new key that finds no place
   * is not remembered. Only for a call still waiting on its answer: once a call was decided in memory (its
   * deadline passed), its answer is not remembered when it comes, as the other packages cancel such a call. It
   * knows nothing the in-memory bucket does not count, and it may come from a replica that took over without the
   * primary's last writes, or the charge-backs it acknowledged.
   */
  observe(buckets, decision, nowMs = this.now()) {
    for (let index = 0; index < buckets.length; index++) {
      this.observeOne(buckets[index], decision?.buckets?.[index]?.resetAfterMs, nowMs, buckets);
    }
  }

  /** `observe` for one bucket and its reply's `resetAfterMs`; `call`: the call's buckets (default, this one). */
  observeOne(bucket, resetAfterMs, nowMs = this.now(), call = undefined) {
    if (!Number.isFinite(resetAfterMs)) return;
    const entry = this._place(bucket, nowMs, call);
    if (entry === undefined) return;
    // What Redis has not seen is not in the answer. A floor Redis took covers the shares of earlier charge-backs
    // still out (their outcome can be known later): those are in the answer already, not taken twice.
    const unseen = Math.min(entry.owed + entry.charging, entry.admitted - entry.confirmed);
    entry.tokens = bucket.burst - (bucket.rate * resetAfterMs) / 1000 - unseen;
    entry.atMs = nowMs;
  }

  /** Whether the key `key` is diverged: it owes Redis a charge-back, or one is in flight (see `chargeBacks`). */
  diverged(key) {
    if (this.divergedKeys === 0) return false;
    const entry = this.entries.get(key);
    return entry !== undefined && isDiverged(entry);
  }

  /**
   * Decides a call in memory: takes each bucket's cost from every bucket, or nothing from any; what a key's own
   * bucket admits is owed to Redis. Returns { allowed, limitingIndex, buckets: [{ fits, remaining, retryAfterMs,
   * resetAfterMs }] }.
   */
  acquire(buckets, nowMs = this.now()) {
    const slots = buckets.map((bucket) => this._place(bucket, nowMs, buckets) ?? this._overflowOf(bucket, nowMs));
    const needs = new Map();
    buckets.forEach((bucket, index) => {
      const slot = slots[index];
      if (!needs.has(slot)) {
        slot.tokens = refilled(slot, nowMs);
        slot.atMs = nowMs;
      }
      needs.set(slot, (needs.get(slot) ?? 0) + bucket.cost);
    });
    const fits = slots.map((slot) => needs.get(slot) <= slot.tokens);
    const allowed = fits.every(Boolean);
    if (allowed) {
      for (const [slot, need] of needs) {
        slot.tokens -= need;
        if (slot.owed !== undefined) {
          const was = isDiverged(slot);
          slot.owed += need;
          this._recount(slot, was);
          slot.admitted += need;
        }
      }
    }
    const reports = buckets.map((bucket, index) => {
      const left = slots[index].tokens;
      let retryAfterMs = 0;
      if (!fits[index]) retryAfterMs = bucket.cost > bucket.burst ? -1 : ceilMs(((needs.get(slots[index]) - left) / bucket.rate) * 1000);
      const resetAfterMs = Math.max(0, ceilMs(((bucket.burst - left) / bucket.rate) * 1000));
      return { fits: fits[index], remaining: Math.max(0, Math.floor(left)), retryAfterMs, resetAfterMs };
    });
    return { allowed, limitingIndex: limiting(reports), buckets: reports };
  }

  /**
   * `bucket`'s entry, made the most recently used; a new one (full) if there is room or a place to take from a key
   * of another call (`call`: this call's buckets, default `bucket` alone).
   */
  _place(bucket, nowMs, call = undefined) {
    let entry = this.entries.get(bucket.key);
    // The most recently used key is already last: a hot key is not moved out of its place and back on every call.
    // A key not in the table is never `newest`.
    const moves = bucket.key !== this.newest;
    if (entry !== undefined) {
      if (moves) this.entries.delete(bucket.key);
    } else {
      if (this.entries.size >= this.capacity && !this._evict(nowMs, call)) return undefined;
      entry = {
        rate: bucket.rate,
        burst: bucket.burst,
        tokens: bucket.burst,
        atMs: nowMs,
        owed: 0,
        charging: 0,
        inFlight: 0,
        admitted: 0,
        confirmed: 0,
      };
    }
    entry.rate = bucket.rate;
    entry.burst = bucket.burst;
    if (moves) {
      this.entries.set(bucket.key, entry);
      this.newest = bucket.key;
    }
    return entry;
  }

  /** `entry` changed from diverged (`was`) or not: `divergedKeys` follows. */
  _recount(entry, was) {
    const is = isDiverged(entry);
    if (is !== was) this.divergedKeys += is ? 1 : -1;
  }

  /**
   * Frees a place: the first of the least recently used keys that is full again, owes nothing, has no charge-back
   * out and is none of `call`'s keys (a key the same call placed keeps its place: it is about to be taken from).
   */
  _evict(nowMs, call) {
    let looked = 0;
    for (const [key, entry] of this.entries) {
      if (looked++ >= EVICTION_WINDOW) break;
      const free = !isDiverged(entry) && entry.inFlight === 0 && refilled(entry, nowMs) >= entry.burst;
      if (free && !call?.some((bucket) => bucket.key === key)) {
        this.entries.delete(key);
        if (key === this.newest) this.newest = undefined;
        return true;
      }
    }
    return false;
  }

  _overflowOf(bucket, nowMs) {
    const limit = `${bucket.name ?? ""}\u0000${bucket.rate}\u0000${bucket.burst}`;
    let slot = this.overflow.get(limit);
    if (slot === undefined) {
      slot = { rate: bucket.rate, burst: bucket.burst, tokens: bucket.burst, atMs: nowMs };
      this.overflow.set(limit, slot);
    }
    return slot;
  }
}

/** `{ value }` or `{ error }` of `work()`, a promise that never rejects (work's synchronous throw included). */
async function settle(work) {
  try {
    return { value: await work() };
  } catch (error) {
    return { error };
  }
}

/** Whether an entry owes Redis a charge-back, or has one in flight (see `chargeBacks`). */
function isDiverged(entry) {
  return entry.owed > 0 || entry.charging > 0;
}

/** The tokens of `slot` at `nowMs`, refilled at its rate up to its burst (a clock read earlier refills nothing). */
function refilled(slot, nowMs) {
  const elapsedMs = Math.max(0, nowMs - slot.atMs);
  return Math.min(slot.burst, slot.tokens + (elapsedMs / 1000) * slot.rate);
}

/** The bucket that decided: the refusing one with the longest wait, else the one with the fewest tokens left. */
function limiting(reports) {
  let best = 0;
  for (let index = 1; index < reports.length; index++) {
    const [a, b] = [reports[index], reports[best]];
    const better = a.fits === b.fits ? (a.fits ? a.remaining < b.remaining : wait(a) > wait(b)) : !a.fits;
    if (better) best = index;
  }
  return best;
}

function wait(report) {
  return report.retryAfterMs < 0 ? Infinity : report.retryAfterMs;
}

module.exports = { LocalBuckets, CAPACITY, chargeBackOutcome, limiting };
