#!/usr/bin/env bash
# Instructions per call of a Lua script run with EVALSHA, inside the server's `call()` (as scripts/profile.sh
# counts a command): runs redis-server without the module under valgrind's callgrind, loads the script, sends
# CALLS pipelined EVALSHA calls with redis-benchmark on one key, and prints the average. Deterministic, unlike
# timings on a shared machine.
#
#   scripts/profile_lua.sh SCRIPT.lua [ARGV...]
#   scripts/profile_lua.sh lua/tb.lua TB.ACQUIRE 1000000 1e9 1          # the fallback, allowed, hot key
#   scripts/profile_lua.sh scripts/bench_bucket.lua 1000000 1e9 1       # the simple Lua bucket of make bench
#   FUNCTION=acquire scripts/profile_lua.sh lua/tb.lua 1000000 1e9 1    # the library generated from lua/tb.lua,
#                                                                       # FCALL tb_profile_acquire
# KEYS=N takes the first N arguments as keys (default 1: bench:lua).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
server="${REDIS_SERVER:-/usr/bin/redis-server}"
cli="${REDIS_CLI:-/usr/bin/redis-cli}"
benchmark="${REDIS_BENCHMARK:-/usr/bin/redis-benchmark}"
calls="${CALLS:-3000}"
script="$1"
shift

dir="$(mktemp -d /tmp/redis-tb-profile-lua.XXXXXX)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" --toggle-collect=call \
  "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize no \
  >"$dir/valgrind.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; [ -n "${KEEP:-}" ] && cp "$dir/callgrind.out" "$KEEP"; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  "$cli" -p "$port" PING >/dev/null 2>&1 && break
  sleep 0.2
done
keys=(1 bench:lua)
if [ -n "${KEYS:-}" ]; then keys=("$KEYS"); fi
if [ -n "${FUNCTION:-}" ]; then
  # The library as the packages generate it (lua/tb.lua's header), under a name of its own.
  "$cli" -p "$port" -x FUNCTION LOAD >/dev/null < <(printf "#!lua name=tb_profile\nlocal TB_LIBRARY = 'tb_profile'\n"; cat "$script")
  "$benchmark" -p "$port" -c 4 -P 16 -n "$calls" -q FCALL "tb_profile_$FUNCTION" "${keys[@]}" "$@" >/dev/null
  stat=fcall
else
  sha="$("$cli" -p "$port" SCRIPT LOAD "$(cat "$script")")"
  "$benchmark" -p "$port" -c 4 -P 16 -n "$calls" -q EVALSHA "$sha" "${keys[@]}" "$@" >/dev/null
  stat=evalsha
fi
done_calls="$("$cli" -p "$port" INFO commandstats | grep -o "cmdstat_$stat:calls=[0-9]*" | cut -d= -f2)"
kill "$pid"
wait "$pid" 2>/dev/null || true
# awk reads the whole report (grep -m1 would close the pipe early, and pipefail would end the script on SIGPIPE).
total="$(callgrind_annotate "$dir/callgrind.out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n {n = 1; gsub(",", "", $1); print $1}')"
echo "$(basename "$script")${FUNCTION:+ FCALL $FUNCTION} $*: $done_calls calls, $((total / done_calls)) instructions per call (the load included once)"
