#!/usr/bin/env bash
# The Rust layer's own work per request in instructions, beside tower_governor's: clients/rust/benches/layer.rs's
# four cases (no layer, tower_governor, the redis-tb layer with its Redis call, the bare call), each run for
# REQUESTS requests under valgrind's callgrind, counting only inside the bench's `counted` (the requests, after
# as many uncounted). Instructions do not move with the machine's load as times do; they leave out waiting
# (Redis's own work, the kernel's) and weigh every instruction alike.
#   own instructions: tower_governor = governor - none; redis-tb layer = redis_tb - none - bare_acquire;
#   a leased limit = redis_tb_leased - none (its Redis calls, one per lease, included)
# Needs $REDIS_SERVER and $TB_MODULE as the bench does, and valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
requests="${REQUESTS:-2000}"
bench="$(cargo bench -p redis-tb-client --bench layer --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "layer" and m.get("executable"):
        print(m["executable"])')"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
declare -A per
for case in none tower_governor redis_tb bare_acquire redis_tb_leased; do
  LAYER_BENCH_ONLY="$case:$requests" valgrind --tool=callgrind --toggle-collect='*counted*' \
    --callgrind-out-file="$out/$case.out" "$bench" --bench >/dev/null 2>"$out/$case.log"
  total="$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/$case.log")"
  per[$case]=$((total / requests))
  printf '%15s %8d instructions per request\n' "$case" "${per[$case]}"
done
governor=$((per[tower_governor] - per[none]))
layer=$((per[redis_tb] - per[none] - per[bare_acquire]))
leased=$((per[redis_tb_leased] - per[none]))
echo "own instructions per request: tower_governor $governor, redis-tb layer $layer;" \
  "ratio redis-tb / tower_governor = $(python3 -c "print(f'{$layer / $governor:.2f}')")"
echo "a leased limit, its Redis calls included: $leased;" \
  "ratio to tower_governor = $(python3 -c "print(f'{$leased / $governor:.2f}')")"
