"use strict";
// `npm pack` / `npm publish` steps: copy the repository's one Lua script (lua/tb.lua at the root) and its LICENSE
// into the package before packing, and remove the copies after, so the repository never holds a second one.
// test/package.test.mjs packs the package and checks that the tarball's script is byte for byte the root's; the
// release tests (tests/release.rs) check the tarball of `make dist`.
const fs = require("node:fs");
const path = require("node:path");

const pkg = path.join(__dirname, "..");
const root = path.join(pkg, "..", "..");
const copies = [
  [path.join(root, "lua", "tb.lua"), path.join(pkg, "lua", "tb.lua")],
  [path.join(root, "LICENSE"), path.join(pkg, "LICENSE")],
];
if (process.argv.includes("--remove")) {
  fs.rmSync(path.join(pkg, "lua"), { recursive: true, force: true });
  fs.rmSync(path.join(pkg, "LICENSE"), { force: true });
} else {
  for (const [from, to] of copies) {
    fs.mkdirSync(path.dirname(to), { recursive: true });
    fs.copyFileSync(from, to);
  }
}
