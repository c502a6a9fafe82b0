"use strict";
// The Lua fallback: the repository's one script, `lua/tb.lua` (never a copy kept by hand). A packed tarball
// carries it as `lua/tb.lua` inside the package (`npm pack` copies it in its prepack step and removes it after);
// an install from the repository path (`npm install ./clients/node`, a link) reads it from the repository root.
// Its header documents the calling convention: KEYS are the buckets, ARGV[1] the command it emulates, then that
// command's arguments without its keys.

const crypto = require("node:crypto");
const fs = require("node:fs");
const path = require("node:path");

const packageRoot = path.resolve(__dirname, "..");

/** Where the script is looked for, first match wins. */
function candidates() {
  const list = [path.join(packageRoot, "lua", "tb.lua")];
  // Only inside this repository's own layout (clients/node), never a guess elsewhere in the user's tree.
  if (path.basename(packageRoot) === "node" && path.basename(path.dirname(packageRoot)) === "clients") {
    list.push(path.join(packageRoot, "..", "..", "lua", "tb.lua"));
  }
  return list;
}

// For each command: which of its arguments (0-based, the command name left out) are keys, as a function of the
// argument count.
const KEY_POSITIONS = {
  "TB.ACQUIRE": () => [0],
  "TB.ACQUIREALL": (n) => range(1, n, 3),
  "TB.ACQUIREEACH": (n) => range(0, n, 4),
  "TB.ACQUIREATMOST": () => [0],
  "TB.RESERVE": () => [0],
  "TB.REFUND": () => [0],
  "TB.CHARGE": () => [0],
  "TB.BLOCK": () => [0],
};

function range(start, end, step) {
  const out = [];
  for (let i = start; i < end; i += step) out.push(i);
  return out;
}

let cached;

function load() {
  if (cached === undefined) {
    const tried = candidates();
    const file = tried.find((candidate) => fs.existsSync(candidate));
    if (file === undefined) {
      throw new Error(`redis-tb: the Lua script is missing (looked for ${tried.join(", ")})`);
    }
    const text = fs.readFileSync(file, "utf8");
    cached = { file, text, sha1: crypto.createHash("sha1").update(text).digest("hex") };
  }
  return cached;
}

module.exports = {
  /** The commands the script emulates. */
  commands: () => Object.keys(KEY_POSITIONS),
  supports: (command) => Object.hasOwn(KEY_POSITIONS, command),
  /** The script's text, its SHA1 (EVALSHA's name for it) and the file it came from. */
  source: () => load().text,
  sha1: () => load().sha1,
  file: () => load().file,
  /** A module call's arguments (keys in place, command name left out) as EVALSHA's KEYS and ARGV. */
  arguments(command, args) {
    const positions = new Set(KEY_POSITIONS[command](args.length));
    const keys = [];
    const argv = [command];
    args.forEach((arg, index) => (positions.has(index) ? keys : argv).push(arg));
    return { keys, argv };
  },
};
