// A controlled server clock for the tests: the repository's tool (tests/clock/: libfaketime behind a preload
// shim). The server's wall clock (TIME, expiry, the module's clock) stands at the written microsecond until the
// test moves it. Microseconds are BigInts.
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";

import { REPOSITORY } from "./harness.mjs";

export const CLOCK_2030_US = 1_893_456_000_000_000n;

/** LD_PRELOAD for a controlled clock, or undefined where the tool cannot be built (no gcc or libfaketime). */
export async function clockPreload() {
  const build = process.env.TB_CLOCK_BUILD || path.join(REPOSITORY, "tests", "clock", "build.sh");
  if (!fs.existsSync(build)) return undefined;
  try {
    const { stdout } = await promisify(execFile)("bash", [build]);
    return stdout.trim();
  } catch {
    return undefined;
  }
}

export class Clock {
  constructor(unixUs) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "redis-tb-clock-"));
    this.path = path.join(this.dir, "faketime");
    this.setUs(unixUs);
  }

  /** Moves the clock, atomically (a renamed file). libfaketime reads the fraction through a double and truncates:
   * a tenth of a nanosecond past the microsecond makes both µs readers (TIME) and ns readers (the module's
   * CL.THROTTLE) read back that microsecond exactly. */
  setUs(unixUs) {
    const iso = new Date(Number(unixUs / 1000n)).toISOString();
    const text = `${iso.slice(0, 10)} ${iso.slice(11, 19)}.${String(unixUs % 1_000_000n).padStart(6, "0")}0001\n`;
    fs.writeFileSync(`${this.path}.tmp`, text);
    fs.renameSync(`${this.path}.tmp`, this.path);
  }

  env(preload) {
    return {
      LD_PRELOAD: preload,
      FAKETIME_TIMESTAMP_FILE: this.path,
      FAKETIME_NO_CACHE: "1",
      FAKETIME_DONT_FAKE_MONOTONIC: "1",
      TZ: "UTC",
    };
  }

  remove() {
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
