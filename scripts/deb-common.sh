# Sourced by scripts/test-deb.sh and scripts/test-deb-rls.sh (set `me` to the script's name first): root or
# passwordless sudo for dpkg, fail(), and dpkg_retry, which waits while apt or another dpkg holds dpkg's lock (a
# minute at most).
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo -n true 2>/dev/null || { echo "$me: needs root or passwordless sudo to run dpkg" >&2; exit 1; }
  sudo="sudo -n"
fi

fail() {
  echo "$me: FAILED: $*" >&2
  exit 1
}

dpkg_retry() {
  local tries=0 out
  while ! out="$($sudo dpkg "$@" 2>&1)"; do
    if ! grep -q 'lock' <<<"$out" || [ "$tries" -ge 60 ]; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    tries=$((tries + 1))
    sleep 1
  done
  printf '%s\n' "$out"
}
