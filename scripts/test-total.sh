#!/usr/bin/env bash
# Runs each argument as one test command, showing its output as it comes, then prints one line summing every
# suite's own summary over all of them. It reads the summaries of the runners the project uses:
#   cargo test     `test result: ok. X passed; Y failed; ...`
#   pytest         `X passed, Y failed in 1.23s` (the closing line; -q or not)
#   node --test    `# pass X` / `# fail Y` (TAP) or `ℹ pass X` / `ℹ fail Y` (spec reporter)
#   promtool test rules    `Unit Testing:  <file>`, then `  SUCCESS` or `  FAILED:`: one test per file
#
#   scripts/test-total.sh "cargo test --all-targets --no-fail-fast" "cargo test --doc"
#   ...
#   92 passed, 0 failed
#
# Every command runs even if an earlier one failed. Exits non-zero if any command did (a failed test, or a build
# that never got to run its tests), so the total is never the only sign of a failure. Run without a terminal (CI),
# a command still running after TB_SUITE_TIMEOUT seconds (a whole number, default 1800; 0: no limit) is stopped, with
# everything it started, and counts as one failed test, so one hung suite cannot use up the whole run's time. From a
# terminal there is no limit: Ctrl-C stops the suite, which `timeout` would keep out of the terminal's reach.
set -uo pipefail

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
limit="${TB_SUITE_TIMEOUT:-1800}"
if ! [[ "$limit" =~ ^[0-9]+$ ]]; then
  echo "test-total: TB_SUITE_TIMEOUT must be a whole number of seconds (0: no limit), not '$limit'" >&2
  exit 2
fi
limited=()
if [ "$limit" -gt 0 ] && ! [ -t 0 ]; then
  limited=(timeout --kill-after=30 "$limit")
fi
status=0
for command in "$@"; do
  "${limited[@]}" bash -c "$command" 2>&1 | tee -a "$log"
  code=${PIPESTATUS[0]}
  if [ "${#limited[@]}" -gt 0 ] && [ "$code" -eq 124 ]; then
    echo "test-total: '$command' was stopped after ${limit}s" | tee -a "$log"
    status=1
  elif [ "$code" -eq 137 ]; then
    echo "test-total: '$command' was killed (SIGKILL: its time limit, or the out-of-memory killer)" | tee -a "$log"
    status=1
  elif [ "$code" -ne 0 ]; then
    echo "test-total: '$command' exited with status $code"
    status=1
  fi
done
awk '/^test result: / {
       for (i = 2; i <= NF; i++) {
         if ($i ~ /^passed;?$/) passed += $(i - 1)
         if ($i ~ /^failed;?$/) failed += $(i - 1)
       }
       next
     }
     # pytest closing line, with or without the ==== frame: "3 passed, 1 failed, 2 skipped in 0.52s".
     /(^|[= ])[0-9]+ (passed|failed|errors?)[,a-z0-9 ]* in [0-9.]+s/ {
       line = $0
       gsub(/=/, "", line)
       n = split(line, words, /[ ,]+/)
       for (i = 2; i <= n; i++) {
         if (words[i] == "passed") passed += words[i - 1]
         if (words[i] == "failed" || words[i] ~ /^errors?$/) failed += words[i - 1]
       }
       next
     }
     # node --test: TAP or spec reporter totals.
     /^(# |ℹ )pass [0-9]+$/ { passed += $NF; next }
     /^(# |ℹ )fail [0-9]+$/ { failed += $NF; next }
     # promtool test rules: the line after each file'"'"'s "Unit Testing:" line.
     /^Unit Testing: / { rules = 1; next }
     rules && /^  SUCCESS$/ { passed += 1; rules = 0; next }
     rules && /^  FAILED:$/ { failed += 1; rules = 0; next }
     # A command stopped at its time limit (TB_SUITE_TIMEOUT) or killed counts as one failed test.
     /^test-total: .* was (stopped after [0-9]+s|killed \(SIGKILL: .*\))$/ { failed += 1; next }
     END { printf "%d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
