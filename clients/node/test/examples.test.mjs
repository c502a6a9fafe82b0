// The examples under examples/ run against a spawned server, and each one's snippet (between its marker lines) is
// a ```js block of docs/node.md, so no snippet shown to users is untested. tests/readme.rs checks the README's.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import { REPOSITORY, Server } from "./harness.mjs";

const EXAMPLES = path.join(REPOSITORY, "clients", "node", "examples");
const DOCS = path.join(REPOSITORY, "docs", "node.md");

/** The lines strictly between the `snippet: start` and `snippet: end` markers, as tests/readme.rs reads them. */
export function snippet(file) {
  const lines = fs.readFileSync(file, "utf8").split("\n");
  const start = lines.findIndex((line) => line.includes("snippet: start"));
  const end = lines.findIndex((line) => line.includes("snippet: end"));
  assert.ok(start >= 0 && end > start, `${file} has snippet markers`);
  return `${lines.slice(start + 1, end).join("\n")}\n`;
}

function jsBlocks(markdown) {
  const blocks = [];
  let current;
  for (const line of markdown.split("\n")) {
    if (current === undefined && line === "```js") current = "";
    else if (current !== undefined && line === "```") {
      blocks.push(current);
      current = undefined;
    } else if (current !== undefined) current += `${line}\n`;
  }
  return blocks;
}

const files = fs.readdirSync(EXAMPLES).filter((name) => name.endsWith(".mjs")).sort();

describe("examples", () => {
  let server;
  before(async () => {
    server = await Server.start();
  });
  after(async () => {
    await server?.stop();
  });

  for (const name of files) {
    test(`${name} runs against a server with the module`, async () => {
      const { stdout } = await promisify(execFile)(process.execPath, [path.join(EXAMPLES, name)], {
        env: { ...process.env, REDIS_URL: server.url },
        timeout: 30_000,
      });
      assert.ok(stdout.length > 0, "it printed what it did");
    });

    test(`${name}'s snippet is a js block of docs/node.md`, () => {
      assert.ok(jsBlocks(fs.readFileSync(DOCS, "utf8")).includes(snippet(path.join(EXAMPLES, name))), `docs/node.md shows ${name}`);
    });
  }
});
