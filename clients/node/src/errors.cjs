"use strict";
// The errors the package throws. A server's refusal keeps its wire text (`ERR rate must be a positive number`)
// and gains the command and key it answered, so a log line names the call without a stack trace.

/** The server refused a call: `code` is the reply's prefix (`ERR`, `WRONGTYPE`, `NOPERM`, `MOVED`, ...). */
class TbReplyError extends Error {
  constructor(command, key, cause) {
    const text = String(cause?.message ?? cause);
    super(`${command} ${JSON.stringify(key)}: ${text}`, { cause });
    this.name = "TbReplyError";
    this.command = command;
    this.key = key;
    this.code = text.split(" ", 1)[0];
  }
}

/** An argument the package refuses before anything is sent: it names the argument and what it got. */
class TbArgumentError extends TypeError {
  constructor(message) {
    super(message);
    this.name = "TbArgumentError";
  }
}

/** A server reply of an unexpected shape: a different module version, or a key the script cannot serve. */
class TbProtocolError extends Error {
  constructor(command, reply) {
    super(`${command}: unexpected reply ${JSON.stringify(reply)}`);
    this.name = "TbProtocolError";
    this.command = command;
  }
}

/** True for an error reply from the server (as opposed to a closed connection or a timeout). */
function isReplyError(error) {
  if (error === null || typeof error !== "object") return false;
  // ioredis: ReplyError; node-redis: ErrorReply and its subclasses (SimpleError, BlobError, ...).
  for (let proto = Object.getPrototypeOf(error); proto !== null; proto = Object.getPrototypeOf(proto)) {
    const name = proto.constructor?.name;
    if (name === "ReplyError" || name === "ErrorReply") return true;
  }
  return false;
}

/**
 * A limiter call that got no answer in time (the middleware's `timeoutMs`), or that was not sent because the
 * connection was down or not yet known to answer again (docs/clients.md, "Deadlines").
 */
class TbUnavailableError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "TbUnavailableError";
  }
}

// The failure table of docs/clients.md, for replies: the first word of the server's error text (or the whole
// text, for the ERR rows that are not configuration errors) to its row, its class (the row's short name, the label
// of redis_tb_redis_failures_total) and action. fixtures/failures.json holds
// examples of each row; the Python package classifies them the same way.
//   fail-mode        Redis cannot serve now: the middleware's fail mode, a warning once per fault episode
//   error-fail-mode  a configuration error: logged as an error (at most once a minute), then the fail mode
//   reload-retry     the script or library is missing: the client loads it and retries once
//   script-retry     the module is gone: the client moves to the script and retries once
const REPLY_ROWS = [
  [/^ERR max number of clients reached/, "too many clients", "max_clients", "fail-mode"],
  [/^CLUSTERDOWN\b/, "CLUSTERDOWN", "clusterdown", "fail-mode"],
  [/^MASTERDOWN\b/, "MASTERDOWN", "masterdown", "fail-mode"],
  [/^LOADING\b/, "LOADING", "loading", "fail-mode"],
  [/^BUSY\b/, "BUSY", "busy", "fail-mode"],
  [/^READONLY\b/, "READONLY", "readonly", "fail-mode"],
  [/^OOM\b/, "OOM", "oom", "fail-mode"],
  [/^NOREPLICAS\b/, "NOREPLICAS", "noreplicas", "fail-mode"],
  [/^MISCONF\b/, "MISCONF", "misconf", "fail-mode"],
  [/^(MOVED|ASK) /, "MOVED/ASK that do not settle", "moved", "fail-mode"],
  [/^TRYAGAIN\b/, "TRYAGAIN", "tryagain", "fail-mode"],
  [/^CROSSSLOT\b/, "CROSSSLOT", "crossslot", "error-fail-mode"],
  [/^NOSCRIPT\b/, "NOSCRIPT", "noscript", "reload-retry"],
  [/^ERR Function not found/, "function missing", "function_missing", "reload-retry"],
  [{ test: isUnknownCommandText }, "unknown command", "unknown_command", "script-retry"],
  [/^NOAUTH\b/, "NOAUTH", "noauth", "error-fail-mode"],
  [/^WRONGPASS\b/, "WRONGPASS", "wrongpass", "error-fail-mode"],
  [/^NOPERM\b/, "NOPERM", "noperm", "error-fail-mode"],
  [/^WRONGTYPE\b/, "WRONGTYPE", "wrongtype", "error-fail-mode"],
];

// Errors that are not replies, by the texts ioredis, node-redis and this package give them.
const CONDITION_ROWS = [
  [/no reply from Redis within|timed? ?out|ETIMEDOUT/i, "timeout", "timeout"],
  [/cluster|startup nodes|slots cache|slot .*not covered/i, "cluster unreachable", "cluster_unreachable"],
  [/ECONNREFUSED|connection refused/i, "connection refused", "connection"],
  [/connection is closed|connection to Redis (is not ready|closed)|client is (closed|offline)|socket closed|stream isn't writeable|max retries per request|ECONNRESET|EPIPE/i, "connection reset", "connection"],
];

/** Every class of the failure table, in its order (docs/clients.md; fixtures/failures.json's `class`). */
const FAILURE_CLASSES = Object.freeze([
  "connection", "timeout", "cluster_unreachable", ...new Set(REPLY_ROWS.map(([, , name]) => name)), "other",
]);

const OTHER = Object.freeze({ row: "other ERR", class: "other", action: "error-fail-mode" });

/**
 * The server does not know the command sent: no module, or no FCALL (Redis 6.2); the second text is redis-py's
 * for a cluster (fixtures/backends.json holds both packages' cases). A command unknown to a script's `redis.call`
 * is not this (client.cjs's `isTimeRefused`). What the client switches backends by and the failure table's row
 * alike.
 */
function isUnknownCommand(error) {
  return isUnknownCommandText(String(error?.message ?? error));
}

function isUnknownCommandText(text) {
  return /unknown command|doesn't exist in redis commands/i.test(text) && !/from (lua )?script/i.test(text);
}

/**
 * The row of docs/clients.md's failure table that `error` (what a limiter call rejected with) falls in, and what
 * to do about it: `{ row, class, action }`. A reply matching no row is "other ERR", a configuration error; an error that
 * is not a reply falls in the row of the condition its text or system error code names (a closed or reset
 * connection, a timeout, an unreachable cluster), and any other one (a bug, an unexpected exception) is a
 * configuration error too: it does not go away by itself.
 */
function classifyFailure(error) {
  const reply = replyText(error);
  if (reply !== undefined) {
    // A command refused inside the script comes back as the script's error: `ERR user_script:795: OOM ...`.
    const inner = reply.replace(/^ERR user_script:\d+: /, "");
    for (const [pattern, row, name, action] of REPLY_ROWS) if (pattern.test(inner)) return { row, class: name, action };
    return OTHER;
  }
  if (error instanceof TbProtocolError) return OTHER;
  // A call not sent because the connection is down falls in the row of what brought it down.
  if (error instanceof TbUnavailableError && error.cause !== undefined) return classifyFailure(error.cause);
  const text = String(error?.message ?? error);
  for (const [pattern, row, name] of CONDITION_ROWS) if (pattern.test(text)) return { row, class: name, action: "fail-mode" };
  // A system error of the socket (ENOTFOUND, EHOSTUNREACH, ...), or this package's own "not answering".
  if (/^E[A-Z]+$/.test(String(error?.code)) || error instanceof TbUnavailableError) {
    return { row: "connection reset", class: "connection", action: "fail-mode" };
  }
  return { row: "any other error", class: "other", action: "error-fail-mode" };
}

/** The server's error text of a reply error (a TbReplyError keeps it as its cause), else undefined. */
function replyText(error) {
  if (error instanceof TbReplyError) return replyText(error.cause) ?? String(error.cause?.message ?? error.cause);
  // ioredis reports the replies of a failed MULTI/cluster call inside; node-redis its ErrorReply directly.
  return isReplyError(error) ? String(error.message) : undefined;
}

module.exports = {
  TbReplyError, TbArgumentError, TbProtocolError, TbUnavailableError, isReplyError, isUnknownCommand, classifyFailure, FAILURE_CLASSES,
};
