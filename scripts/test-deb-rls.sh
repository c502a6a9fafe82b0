#!/usr/bin/env bash
# Installs dist/tb-rls_<version>_amd64.deb on this machine with dpkg (as root, or with sudo -n), checks its files and
# its system user, starts the service by hand as that user (as the docs say to where systemd does not run) with the
# package's own configuration, against a redis-server with the module ($TB_MODULE; $REDIS_SERVER, and $REDIS_CLI to
# see it answer, default Debian's) on a free loopback port, makes
# gRPC ShouldRateLimit calls (scripts/rls_call.py) until one is over the limit, then removes the package (`dpkg -r`,
# then `dpkg --purge`) and checks that nothing of it is left, the user included. An earlier install of tb-rls is
# purged first: run it on a machine whose tb-rls package you can lose. tests/release.rs runs it under a lock.
#
#   TB_MODULE=target/release/libredis_tb.so bash scripts/test-deb-rls.sh dist/tb-rls_0.5.0_amd64.deb
set -euo pipefail
cd "$(dirname "$0")/.."

deb="$(realpath "$1")"
server="${REDIS_SERVER:-/usr/bin/redis-server}"
module="$(realpath "${TB_MODULE:-target/release/libredis_tb.so}")"
files=(/usr/bin/tb-rls /etc/tb-rls/ratelimit.yaml /etc/default/tb-rls /lib/systemd/system/tb-rls.service
  /usr/share/doc/tb-rls/copyright)

me=test-deb-rls
# shellcheck source=scripts/deb-common.sh
. scripts/deb-common.sh
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

workdir="$(mktemp -d)"
chmod 0755 "$workdir"
pids=()
ours=no
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
  if [ "$ours" = yes ] && dpkg-query -W tb-rls >/dev/null 2>&1; then
    $sudo dpkg --purge tb-rls >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

if dpkg-query -W tb-rls >/dev/null 2>&1; then
  echo "test-deb-rls: purging an earlier tb-rls package first"
  dpkg_retry --purge tb-rls >/dev/null
fi
! getent passwd tb-rls >/dev/null || fail "a tb-rls user exists before the install"

echo "== dpkg -i $(basename "$deb")"
ours=yes
dpkg_retry -i "$deb"
[ "$(dpkg-query -W -f='${db:Status-Abbrev}' tb-rls | tr -d ' ')" = ii ] || fail "tb-rls is not installed"
for file in "${files[@]}"; do [ -f "$file" ] || fail "$file is missing"; done
[ -x /usr/bin/tb-rls ] || fail "/usr/bin/tb-rls is not executable"
dpkg-query --showformat='${Conffiles}\n' -W tb-rls | grep -q /etc/tb-rls/ratelimit.yaml \
  || fail "/etc/tb-rls/ratelimit.yaml is not a conffile"
getent passwd tb-rls | grep -q ':/usr/sbin/nologin$' || fail "no tb-rls system user with no login shell"
[ "$(id -u tb-rls)" -lt 1000 ] || fail "tb-rls is not a system user (uid $(id -u tb-rls))"
/usr/bin/tb-rls --version | grep -q "$(dpkg-query -W -f='${Version}' tb-rls)" || fail "tb-rls --version"

redis_port="$(free_port)"
"$server" --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$workdir" \
  --loadmodule "$module" --logfile "$workdir/redis.log" &
pids+=($!)
wait_for_server "$redis_port" "$!" "$workdir/redis.log"
grpc_port="$(free_port)"
# By hand, as the docs say where systemd does not run: the service's user, the package's configuration.
echo "== tb-rls as the tb-rls user, --config /etc/tb-rls, gRPC on port $grpc_port"
# The README's command (sudo -u tb-rls sh -c '...'), with the ports of this run in the environment.
REDIS_URL="127.0.0.1:$redis_port" GRPC_PORT="$grpc_port" PROMETHEUS_ADDR=off \
  setpriv --reuid=tb-rls --regid=tb-rls --init-groups \
  sh -c 'set -a; . /etc/default/tb-rls; exec tb-rls --config /etc/tb-rls' > "$workdir/tb-rls.log" 2>&1 &
pids+=($!)
service_pid=$!
answer=""
for _ in $(seq 100); do
  kill -0 "$service_pid" 2>/dev/null || { cat "$workdir/tb-rls.log" >&2; fail "tb-rls exited at start"; }
  answer="$(python3 scripts/rls_call.py --port "$grpc_port" --domain edge user=deb-test 2>/dev/null || true)"
  [ "$answer" = OK ] && break
  sleep 0.1
done
[ "$answer" = OK ] || { cat "$workdir/tb-rls.log" >&2; fail "no OK from ShouldRateLimit (got '$answer')"; }
echo "ok: ShouldRateLimit answered OK"
[ "$(ps -o user= -p "$service_pid")" = tb-rls ] || fail "the service does not run as tb-rls"
[ "$(readlink "/proc/$service_pid/exe")" = /usr/bin/tb-rls ] || fail "the process is not /usr/bin/tb-rls"
# The example gives each user a burst of 20: 25 tokens at once is over it.
answer="$(python3 scripts/rls_call.py --port "$grpc_port" --domain edge --hits 25 user=deb-test)"
[ "$answer" = OVER_LIMIT ] || fail "25 hits at once: got '$answer', expected OVER_LIMIT"
echo "ok: ShouldRateLimit answered OVER_LIMIT beyond the burst"
kill "$service_pid"
wait "$service_pid" 2>/dev/null || true

echo "== dpkg -r tb-rls"
dpkg_retry -r tb-rls >/dev/null
[ ! -e /usr/bin/tb-rls ] || fail "/usr/bin/tb-rls is left after dpkg -r"
echo "== dpkg --purge tb-rls"
dpkg_retry --purge tb-rls >/dev/null
! dpkg-query -W tb-rls >/dev/null 2>&1 || [ "$(dpkg-query -W -f='${db:Status-Abbrev}' tb-rls | tr -d ' ')" = un ] \
  || fail "dpkg still knows tb-rls"
for path in "${files[@]}" /etc/tb-rls /usr/share/doc/tb-rls; do
  [ ! -e "$path" ] || fail "$path is left after dpkg --purge"
done
! getent passwd tb-rls >/dev/null || fail "the tb-rls user is left after dpkg --purge"
! getent group tb-rls >/dev/null || fail "the tb-rls group is left after dpkg --purge"
echo "test-deb-rls: ok: installed, served as the tb-rls user, removed and purged"
