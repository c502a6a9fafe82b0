// The package as users get it: `import` and `require` give one implementation with the same exports; `npm pack`
// carries the repository's Lua script byte for byte (and leaves no copy behind); `npm install <this directory>`
// works with nothing to build, from both module systems, and finds the script.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { test } from "node:test";

import * as esm from "../src/index.mjs";
import { REPOSITORY } from "./harness.mjs";

const run = promisify(execFile);
const PACKAGE = path.join(REPOSITORY, "clients", "node");
const ROOT_SCRIPT = path.join(REPOSITORY, "lua", "tb.lua");

test("import and require give the same objects", () => {
  const cjs = createRequire(import.meta.url)("../src/index.cjs");
  // Node 22.12+ adds "module.exports" to the namespace of an ES module that re-exports CommonJS.
  const names = Object.keys(esm).filter((name) => name !== "default" && name !== "module.exports").sort();
  assert.deepEqual(names, Object.keys(cjs).sort());
  for (const name of names) assert.equal(esm[name], cjs[name], name);
});

test("the script the package runs is the repository's lua/tb.lua", () => {
  assert.equal(esm.luaScript.file(), ROOT_SCRIPT);
  assert.equal(esm.luaScript.source(), fs.readFileSync(ROOT_SCRIPT, "utf8"));
});

test("npm pack ships the script byte for byte and removes its copy afterwards", async () => {
  const out = fs.mkdtempSync(path.join(os.tmpdir(), "redis-tb-pack-"));
  try {
    const { stdout } = await run("npm", ["pack", "--json", "--pack-destination", out], { cwd: PACKAGE });
    const [{ filename, files }] = JSON.parse(stdout);
    const shipped = files.map((file) => file.path);
    for (const expected of ["lua/tb.lua", "src/index.cjs", "src/index.mjs", "types/index.d.ts", "types/index.d.mts"]) {
      assert.ok(shipped.includes(expected), `the tarball has ${expected}`);
    }
    assert.ok(!shipped.some((file) => file.startsWith("test/") || file.startsWith("node_modules/")));
    await run("tar", ["-xzf", path.join(out, filename), "-C", out]);
    assert.ok(fs.readFileSync(path.join(out, "package", "lua", "tb.lua")).equals(fs.readFileSync(ROOT_SCRIPT)));
    assert.equal(fs.existsSync(path.join(PACKAGE, "lua")), false, "postpack removed the copy");
  } finally {
    fs.rmSync(out, { recursive: true, force: true });
  }
});

test("npm install <the package directory> works with nothing to build, for import and require", async () => {
  const project = fs.mkdtempSync(path.join(os.tmpdir(), "redis-tb-install-"));
  try {
    fs.writeFileSync(path.join(project, "package.json"), JSON.stringify({ name: "app", private: true }));
    await run("npm", ["install", "--offline", "--no-audit", "--no-fund", PACKAGE], { cwd: project });
    const probe = "console.log(typeof tb.TbClient, tb.luaScript.sha1().length)";
    const viaRequire = await run(process.execPath, ["-e", `const tb = require("redis-tb"); ${probe}`], { cwd: project });
    assert.equal(viaRequire.stdout.trim(), "function 40");
    const viaImport = await run(process.execPath, ["--input-type=module", "-e", `import * as tb from "redis-tb"; ${probe}`], { cwd: project });
    assert.equal(viaImport.stdout.trim(), "function 40");
  } finally {
    fs.rmSync(project, { recursive: true, force: true });
  }
});
