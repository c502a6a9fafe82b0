#!/usr/bin/env bash
# Runs each argument as one test command (`cargo test ...`), showing its output as it comes, then prints one
# line summing every suite's `test result: ... X passed; Y failed` line over all of them:
#
#   scripts/test-total.sh "cargo test --all-targets --no-fail-fast" "cargo test --doc"
#   ...
#   92 passed, 0 failed
#
# Every command runs even if an earlier one failed. Exits non-zero if any command did (a failed test, or a build
# that never got to run its tests), so the total is never the only sign of a failure.
set -uo pipefail

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
for command in "$@"; do
  bash -c "$command" 2>&1 | tee -a "$log"
  code=${PIPESTATUS[0]}
  if [ "$code" -ne 0 ]; then
    echo "test-total: '$command' exited with status $code"
    status=1
  fi
done
awk '/^test result: / {
       for (i = 2; i <= NF; i++) {
         if ($i ~ /^passed;?$/) passed += $(i - 1)
         if ($i ~ /^failed;?$/) failed += $(i - 1)
       }
     }
     END { printf "%d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
