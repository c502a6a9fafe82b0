# Sourced by scripts/test-deb.sh and scripts/test-deb-rls.sh (set `me` to the script's name first): root or
# passwordless sudo for dpkg, fail(), dpkg_retry, which waits while apt or another dpkg holds dpkg's lock (a
# minute at most), and wait_for_server.
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo -n true 2>/dev/null || { echo "$me: needs root or passwordless sudo to run dpkg" >&2; exit 1; }
  sudo="sudo -n"
fi

fail() {
  echo "$me: FAILED: $*" >&2
  exit 1
}

dpkg_retry() {
  local tries=0 out
  while ! out="$($sudo dpkg "$@" 2>&1)"; do
    if ! grep -q 'lock' <<<"$out" || [ "$tries" -ge 60 ]; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    tries=$((tries + 1))
    sleep 1
  done
  printf '%s\n' "$out"
}

# wait_for_server PORT PID LOG: waits up to 10 s until the redis-server on loopback PORT answers PING and is process
# PID (not a server another test started on the port meanwhile); fails with its LOG if it exits or never does.
wait_for_server() {
  local port="$1" pid="$2" log="$3" cli="${REDIS_CLI:-/usr/bin/redis-cli}"
  for _ in $(seq 100); do
    if [ "$("$cli" -p "$port" PING 2>/dev/null)" = "PONG" ] \
      && "$cli" -p "$port" INFO server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid"; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "redis-server exited at start"; }
    sleep 0.1
  done
  cat "$log" >&2
  fail "redis-server on port $port never answered"
}
