#!/usr/bin/env bash
# Installs dist/redis-tb_<version>_amd64.deb on this machine with dpkg (as root, or with sudo -n), starts Debian's
# redis-server as the `redis` user with a configuration that includes the package's snippet, checks the command
# contract on a free loopback port, then removes the package (`dpkg -r`, then `dpkg --purge`) and checks that
# nothing of it is left. An earlier install of redis-tb is purged first: run it on a machine whose redis-tb package
# you can lose. tests/release.rs runs it under a lock, so concurrent test runs take turns.
#
#   bash scripts/test-deb.sh dist/redis-tb_0.5.0_amd64.deb
set -euo pipefail

deb="$(realpath "$1")"
server="${REDIS_SERVER:-/usr/bin/redis-server}"
cli="${REDIS_CLI:-/usr/bin/redis-cli}"
module=/usr/lib/redis/modules/redis-tb.so
snippet=/etc/redis/modules.d/redis-tb.conf

me=test-deb
# shellcheck source=scripts/deb-common.sh
. "$(dirname "$0")/deb-common.sh"

installed() {
  [ "$(dpkg-query -W -f='${db:Status-Abbrev}' redis-tb 2>/dev/null | tr -d ' ')" = "$1" ]
}

workdir="$(mktemp -d)"
pid=""
ours=no
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$workdir"
  # A failed run leaves no package behind either.
  if [ "$ours" = yes ] && dpkg-query -W redis-tb >/dev/null 2>&1; then
    $sudo dpkg --purge redis-tb >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

if dpkg-query -W redis-tb >/dev/null 2>&1; then
  echo "test-deb: purging an earlier redis-tb package first"
  dpkg_retry --purge redis-tb >/dev/null
fi
lib_existed=no
[ -d /usr/lib/redis ] && lib_existed=yes
etc_before="$(stat -c '%U:%G %a' /etc/redis 2>/dev/null || echo absent)"

echo "== dpkg -i $(basename "$deb")"
ours=yes
dpkg_retry -i "$deb"
installed ii || fail "redis-tb is not installed after dpkg -i"
[ -f "$module" ] && [ -x "$module" ] || fail "$module is missing or not executable (Redis requires it)"
[ -f "$snippet" ] || fail "$snippet is missing"
grep -qx "loadmodule $module" "$snippet" || fail "$snippet does not load $module"
[ "$etc_before" = absent ] || [ "$(stat -c '%U:%G %a' /etc/redis)" = "$etc_before" ] \
  || fail "installing changed /etc/redis's owner or mode (was $etc_before)"
dpkg-query -L redis-tb

# Debian's redis-server runs as the `redis` user with /etc/redis/redis.conf: start it that way, from a copy of that
# file with the include line docs/operating.md tells users to add, so that it proves the user can read the snippet and the
# module. The command line moves it to a free loopback port and a scratch directory, in the foreground.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
conf="$workdir/redis.conf"
if [ -r /etc/redis/redis.conf ]; then
  cp /etc/redis/redis.conf "$conf"
else
  : > "$conf"
fi
echo 'include /etc/redis/modules.d/*.conf' >> "$conf"
chmod 0755 "$workdir"
run_as=()
if id redis >/dev/null 2>&1 && [ -z "$sudo" ]; then
  chown -R redis:redis "$workdir"
  run_as=(setpriv --reuid=redis --regid=redis --init-groups)
fi
echo "== $server with Debian's redis.conf + include /etc/redis/modules.d/*.conf (port $port${run_as:+, as user redis})"
"${run_as[@]}" "$server" "$conf" --port "$port" --bind 127.0.0.1 --daemonize no --supervised no \
  --pidfile "$workdir/redis.pid" --logfile "$workdir/redis.log" --dir "$workdir" --save "" --appendonly no &
pid=$!
# setpriv becomes the server: its pid is the server's.
REDIS_CLI="$cli" wait_for_server "$port" "$pid" "$workdir/redis.log"

check() {
  local what="$1" expected="$2"
  shift 2
  local actual
  actual="$("$cli" -p "$port" "$@" 2>&1 | sed '/^$/d' | tr '\n' ' ' | sed 's/ $//')"
  if [ "$actual" != "$expected" ]; then
    fail "$what: $* replied '$actual', expected '$expected'"
  fi
  echo "ok: $what"
}
check "a fresh bucket" "1 19 0 100" TB.ACQUIRE deb:bucket 10 20
# The fourth field, reset_after_ms, depends on the moment: compare the first three.
actual="$("$cli" -p "$port" TB.ACQUIRE deb:bucket 10 20 25 | head -n 3 | tr '\n' ' ')"
[ "$actual" = "0 19 -1 " ] || fail "cost above burst: replied '$actual', expected '0 19 -1 ...'"
echo "ok: cost above burst"
check "an invalid rate" "ERR rate must be a positive number" TB.ACQUIRE deb:bucket ten 20
"$cli" -p "$port" MODULE LIST | grep -qx tb || fail "MODULE LIST does not show tb"
echo "ok: MODULE LIST shows tb"
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=""

echo "== dpkg -r redis-tb"
dpkg_retry -r redis-tb >/dev/null
[ ! -e "$module" ] || fail "$module is left after dpkg -r"
# The snippet is a conffile: dpkg -r keeps it (in case it was edited), --purge removes it.
installed rc || fail "redis-tb is not in the removed-config state after dpkg -r"
echo "== dpkg --purge redis-tb"
dpkg_retry --purge redis-tb >/dev/null
! dpkg-query -W redis-tb >/dev/null 2>&1 || installed un || installed pn || fail "dpkg still knows redis-tb"
for path in "$module" "$snippet" /etc/redis/modules.d /usr/lib/redis/modules /usr/share/doc/redis-tb; do
  [ ! -e "$path" ] || fail "$path is left after dpkg --purge"
done
if [ "$lib_existed" = no ] && [ -e /usr/lib/redis ]; then
  fail "/usr/lib/redis is left after dpkg --purge"
fi
[ "$(stat -c '%U:%G %a' /etc/redis 2>/dev/null || echo absent)" = "$etc_before" ] \
  || fail "/etc/redis's owner or mode changed (was $etc_before)"
echo "test-deb: ok: installed, loaded by $("$server" --version | cut -d' ' -f3) as the redis user, removed and purged"
