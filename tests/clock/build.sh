#!/usr/bin/env bash
# Builds the clock shim (tests/clock/shim.c) with the machine's gcc and prints the LD_PRELOAD value that puts a
# server under the controlled clock: the shim first, then Debian's libfaketime (scripts/deps.sh installs it).
#
#   tests/clock/build.sh [OUTPUT]     OUTPUT defaults to target/tbclock/libtbclock.so under the repository
#
# Rebuilds only when the shim is missing or older than shim.c. Safe to run from parallel tests: it builds into a
# temporary file and renames it into place. Exits non-zero (with a message on stderr) without gcc or libfaketime.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../target/tbclock/libtbclock.so}"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"

faketime="${TB_LIBFAKETIME:-}"
if [ -z "$faketime" ]; then
  faketime="$(compgen -G "/usr/lib/*/faketime/libfaketime.so.1" | head -n 1 || true)"
fi
if [ -z "$faketime" ] || [ ! -f "$faketime" ]; then
  echo "libfaketime.so.1 not found: install the Debian package libfaketime (scripts/deps.sh does)" >&2
  exit 1
fi

if [ ! -f "$out" ] || [ "$here/shim.c" -nt "$out" ]; then
  tmp="$out.$$.tmp"
  gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "$tmp" "$here/shim.c" -ldl
  mv -f "$tmp" "$out"
fi
echo "$out:$faketime"
