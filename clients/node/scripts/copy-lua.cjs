"use strict";
// `npm pack` / `npm publish` steps: copy the repository's one Lua script (lua/tb.lua at the root) into the package
// before packing, and remove the copy after, so the repository never holds a second one. test/package.test.mjs
// packs the package and checks that the tarball's script is byte for byte the root's.
const fs = require("node:fs");
const path = require("node:path");

const packaged = path.join(__dirname, "..", "lua", "tb.lua");
if (process.argv.includes("--remove")) {
  fs.rmSync(path.dirname(packaged), { recursive: true, force: true });
} else {
  fs.mkdirSync(path.dirname(packaged), { recursive: true });
  fs.copyFileSync(path.join(__dirname, "..", "..", "..", "lua", "tb.lua"), packaged);
}
