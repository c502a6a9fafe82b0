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

module.exports = { TbReplyError, TbArgumentError, TbProtocolError, isReplyError };
