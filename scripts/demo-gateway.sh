#!/usr/bin/env bash
# `make demo-gateway`: the whole gateway on this machine, in the foreground: redis-server with the module, tb-rls
# with gateway/tests/envoy/ratelimit.yaml, Envoy with gateway/tests/envoy/envoy.yaml (its ports replaced by the
# ones below), and a tiny upstream (gateway/tests/envoy/upstream.py, which answers "ok" to everything). It prints
# the curl lines to try, then waits; Ctrl-C (or stopping make) stops all four, and so does any of them exiting.
#
# Ports (loopback only), each overridable: DEMO_PORT (Envoy, 10000), DEMO_UPSTREAM_PORT (8080), DEMO_RLS_PORT
# (tb-rls's gRPC, 8081), DEMO_ADMIN_PORT (Envoy's admin, 9901), DEMO_REDIS_PORT (6390, not 6379: `make run` may be
# there), DEMO_METRICS_PORT (tb-rls's Prometheus metrics, 9090). Binaries: REDIS_SERVER, TB_MODULE, TB_RLS,
# TB_ENVOY (the Makefile sets them).
set -euo pipefail
cd "$(dirname "$0")/.."

envoy_port="${DEMO_PORT:-10000}"
upstream_port="${DEMO_UPSTREAM_PORT:-8080}"
rls_port="${DEMO_RLS_PORT:-8081}"
admin_port="${DEMO_ADMIN_PORT:-9901}"
redis_port="${DEMO_REDIS_PORT:-6390}"
metrics_port="${DEMO_METRICS_PORT:-9090}"
redis_server="${REDIS_SERVER:-/usr/bin/redis-server}"
module="${TB_MODULE:-$PWD/target/release/libredis_tb.so}"
rls="${TB_RLS:-$PWD/target/release/tb-rls}"
envoy="${TB_ENVOY:?TB_ENVOY: the envoy binary (make demo-gateway finds it in .venv)}"

dir="$(mktemp -d)"
pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
  echo "demo-gateway: stopped Envoy, tb-rls, the upstream and Redis"
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

# Each one stops with this script even when it is killed with SIGKILL (setpriv's parent-death signal).
pdeathsig=()
[ -x /usr/bin/setpriv ] && pdeathsig=(/usr/bin/setpriv --pdeathsig TERM)
start() { # name, log file, command...
  local name="$1" log="$2"
  shift 2
  "${pdeathsig[@]}" "$@" > "$log" 2>&1 &
  pids+=($!)
  echo "demo-gateway: $name (pid $!): $*" | sed -e "s|$dir|\$tmp|g" -e "s|$PWD/||g"
}
# Polls a command for up to 60 s while the process it checks runs.
ready() { # name, log, pid, command...
  local name="$1" log="$2" pid="$3"
  shift 3
  for _ in $(seq 600); do
    "$@" >/dev/null 2>&1 && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "demo-gateway: $name exited at start:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "demo-gateway: $name did not become ready within 60 s:" >&2
  tail -n 20 "$log" >&2
  exit 1
}

start redis "$dir/redis.log" "$redis_server" --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" --loadmodule "$module"
ready redis "$dir/redis.log" "${pids[-1]}" /usr/bin/redis-cli -p "$redis_port" TB.ACQUIRE demo:ready 1 1
start tb-rls "$dir/tb-rls.log" "$rls" --config gateway/tests/envoy/ratelimit.yaml \
  --redis-url "127.0.0.1:$redis_port" --grpc-port "$rls_port" --prometheus-addr "127.0.0.1:$metrics_port" \
  --response-headers draft
ready tb-rls "$dir/tb-rls.log" "${pids[-1]}" curl -sf "http://127.0.0.1:$metrics_port/metrics"
start upstream "$dir/upstream.log" python3 gateway/tests/envoy/upstream.py "$upstream_port"
ready upstream "$dir/upstream.log" "${pids[-1]}" curl -sf "http://127.0.0.1:$upstream_port/__counts"
sed -e "s/port_value: 10000/port_value: $envoy_port/" -e "s/port_value: 8080/port_value: $upstream_port/" \
  -e "s/port_value: 8081/port_value: $rls_port/" -e "s/port_value: 9901/port_value: $admin_port/" \
  gateway/tests/envoy/envoy.yaml > "$dir/envoy.yaml"
start envoy "$dir/envoy.log" "$envoy" -c "$dir/envoy.yaml" --disable-hot-restart --concurrency 1 -l warn
ready envoy "$dir/envoy.log" "${pids[-1]}" curl -sf "http://127.0.0.1:$admin_port/ready"

url="http://127.0.0.1:$envoy_port"
cat <<EOF2

demo-gateway: ready. Envoy on $url asks tb-rls before every request (limits: gateway/tests/envoy/ratelimit.yaml,
each x-user 10 requests a second with bursts of 20, everyone together 25 a second); try from another terminal:

  curl -si -H 'x-user: ann' $url/
      200 from the upstream, with the RateLimit-Policy, RateLimit and X-RateLimit-* headers
  curl -s -o /dev/null -w '%{http_code} ' -H 'x-user: ann' '$url/export?n=[1-6]'; echo; curl -si -H 'x-user: ann' $url/export
      /export takes 5 tokens of an export budget of 20 (10 a second): four 200s, then 429s, then a 429's headers

tb-rls's metrics: curl -s http://127.0.0.1:$metrics_port/metrics. Ctrl-C stops all four.
EOF2

# Until Ctrl-C, or until one of the four exits.
set +e
wait -n "${pids[@]}"
status=$?
echo "demo-gateway: a process exited (status $status); stopping the others" >&2
exit 1
