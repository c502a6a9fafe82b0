"use strict";
// The Lua fallback: the repository's one script, `lua/tb.lua` (never a copy kept by hand). A packed tarball
// carries it as `lua/tb.lua` inside the package (`npm pack` copies it in its prepack step and removes it after);
// an install from the repository path (`npm install ./clients/node`, a link) reads it from the repository root.
// Its header documents the calling convention: KEYS are the buckets, ARGV[1] the command it emulates, then that
// command's arguments without its keys. The Redis Functions library is built from the same text (a header naming
// the library, then the script), under a name carrying the package version (`tb_0_5_0`), so that two versions of
// the package can share a server.

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
  "TB.LOWER": () => [0],
  "TB.BLOCK": () => [0],
  "CL.THROTTLE": () => [0],
};

function range(start, end, step) {
  const out = [];
  for (let i = start; i < end; i += step) out.push(i);
  return out;
}

let cached;
let cachedName;

/** `tb_` and the package version, dots (and anything else a library name may not hold) as underscores. */
function libraryName() {
  cachedName ??= "tb_" + require("../package.json").version.replace(/[^0-9A-Za-z]/g, "_");
  return cachedName;
}

/** The library's name for FCALL: `tb_0_5_0_acquire` for TB.ACQUIRE, `tb_0_5_0_cl_throttle` for CL.THROTTLE. */
function functionName(command) {
  const suffix = command.startsWith("TB.") ? command.slice("TB.".length) : command.replace(".", "_");
  return `${libraryName()}_${suffix.toLowerCase()}`;
}

/** The first script argument that replaces the server's TIME with the caller's clock, where TIME is refused. */
function callerTime(callerUs) {
  return callerUs === undefined ? [] : [`@${callerUs}`];
}

/** A module call's arguments (keys in place, command name left out) split into the keys and the rest. */
function split(command, args) {
  const positions = new Set(KEY_POSITIONS[command](args.length));
  const keys = [];
  const rest = [];
  args.forEach((arg, index) => (positions.has(index) ? keys : rest).push(arg));
  return { keys, rest };
}

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
  /** The function library's name, its text for FUNCTION LOAD, and the function serving `command`. */
  libraryName,
  library: () => `#!lua name=${libraryName()}\nlocal TB_LIBRARY = '${libraryName()}'\n${load().text}`,
  functionName,
  /** A module call's arguments (keys in place, command name left out) as EVALSHA's KEYS and ARGV. */
  arguments(command, args) {
    const { keys, rest } = split(command, args);
    return { keys, argv: [command, ...rest] };
  },
  /** A module call's arguments as EVALSHA's `numkeys key... [@callerUs] command arg...`. */
  evalArguments(command, args, callerUs) {
    const { keys, rest } = split(command, args);
    return [String(keys.length), ...keys, ...callerTime(callerUs), command, ...rest];
  },
  /** A module call's arguments as `FCALL <function> numkeys key... [@callerUs] arg...`. */
  fcallArguments(command, args, callerUs) {
    const { keys, rest } = split(command, args);
    return ["FCALL", functionName(command), String(keys.length), ...keys, ...callerTime(callerUs), ...rest];
  },
};
