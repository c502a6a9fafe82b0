#!/usr/bin/env bash
# Builds the release artifacts from target/release/libredis_tb.so (`make build` first):
#   dist          dist/redis-tb-<version>-x86_64-linux-gnu.tar.gz: the stripped module, LICENSE, README.md,
#                 CHANGELOG.md, redis.conf.example, docs/ and SHA256SUMS, in one top-level folder
#   deb           dist/redis-tb_<version>_amd64.deb: the module in /usr/lib/redis/modules/redis-tb.so and the
#                 snippet /etc/redis/modules.d/redis-tb.conf that loads it (built with dpkg-deb from a staged tree)
# Both print the newest glibc symbol version the module needs and refuse one newer than GLIBC_MAX (default 2.36,
# Debian bookworm's, which the official Redis images are built on). Same sources, same bytes: file dates come from
# the last commit.
set -euo pipefail
cd "$(dirname "$0")/.."

what="${1:-dist}"
module="target/release/libredis_tb.so"
glibc_max="${GLIBC_MAX:-2.36}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
[ -n "$version" ] || { echo "dist: no version in Cargo.toml" >&2; exit 1; }
[ -f "$module" ] || { echo "dist: $module is missing: run make build" >&2; exit 1; }
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
mkdir -p dist

# The newest GLIBC_x.y among the symbol versions the module imports.
glibc_needed="$(objdump -T "$module" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)"
echo "dist: $module needs glibc $glibc_needed or newer (limit: $glibc_max)"
if [ "$(printf '%s\n%s\n' "$glibc_needed" "$glibc_max" | sort -V | tail -n 1)" != "$glibc_max" ]; then
  echo "dist: glibc $glibc_needed is newer than $glibc_max: the module would not load on Debian bookworm" >&2
  exit 1
fi

# A stripped copy of the module, for both artifacts: no symbol table or debug info, only what the loader needs.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
strip --strip-unneeded -o "$stage/libredis_tb.so" "$module"
touch -d "@$SOURCE_DATE_EPOCH" "$stage/libredis_tb.so"

case "$what" in
dist)
  name="redis-tb-$version-x86_64-linux-gnu"
  root="$stage/$name"
  mkdir -p "$root/docs"
  install -m 0755 "$stage/libredis_tb.so" "$root/libredis_tb.so"
  install -m 0644 LICENSE README.md CHANGELOG.md redis.conf.example "$root/"
  install -m 0644 docs/*.md "$root/docs/"
  (cd "$root" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
  tarball="dist/$name.tar.gz"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$stage" -cf - "$name" | gzip -n -9 > "$stage/$name.tar.gz"
  # Renamed into place, so that a concurrent run never reads half a file.
  mv -f "$stage/$name.tar.gz" "$tarball"
  echo "dist: $tarball ($(du -k "$tarball" | cut -f1) KiB)"
  sha256sum "$tarball"
  ;;
deb)
  root="$stage/deb"
  # Executable, unlike most shared libraries: Redis 7 refuses to load a module file without execute permission.
  install -D -m 0755 "$stage/libredis_tb.so" "$root/usr/lib/redis/modules/redis-tb.so"
  install -d -m 0755 "$root/etc/redis/modules.d"
  cat > "$root/etc/redis/modules.d/redis-tb.conf" <<'EOF'
# redis-tb: a native token-bucket rate limiter (TB.ACQUIRE and friends). Installed by the redis-tb package.
# Redis reads this file when /etc/redis/redis.conf includes it, e.g. with the line:
#   include /etc/redis/modules.d/*.conf
loadmodule /usr/lib/redis/modules/redis-tb.so
EOF
  chmod 0644 "$root/etc/redis/modules.d/redis-tb.conf"
  install -D -m 0644 LICENSE "$root/usr/share/doc/redis-tb/copyright"
  install -m 0644 README.md "$root/usr/share/doc/redis-tb/README.md"
  gzip -n -9 -c CHANGELOG.md > "$root/usr/share/doc/redis-tb/changelog.gz"
  install -d -m 0755 "$root/DEBIAN"
  echo "/etc/redis/modules.d/redis-tb.conf" > "$root/DEBIAN/conffiles"
  (cd "$root" && find usr etc -type f -print0 | LC_ALL=C sort -z | xargs -0 md5sum > DEBIAN/md5sums)
  cat > "$root/DEBIAN/control" <<EOF
Package: redis-tb
Version: $version
Architecture: amd64
Maintainer: the redis-tb authors <redis-tb@noreply.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= $glibc_needed), libgcc-s1
Enhances: redis-server
Section: database
Priority: optional
Description: native token-bucket rate limiter module for Redis
 TB.ACQUIRE key rate burst [cost] refills and takes from a token bucket in one
 atomic step, on the server's own clock; related TB.* commands cover several
 limits at once, pacing and refunds. Buckets are plain hashes, and replicas
 and AOF loaders need no module.
 .
 The module is installed in /usr/lib/redis/modules/. To load it, add
 "include /etc/redis/modules.d/*.conf" to /etc/redis/redis.conf once.
EOF
  find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  deb="dist/redis-tb_${version}_amd64.deb"
  dpkg-deb --root-owner-group -Zxz --build "$root" "$stage/package.deb" >/dev/null
  mv -f "$stage/package.deb" "$deb"
  echo "dist: $deb ($(du -k "$deb" | cut -f1) KiB)"
  dpkg-deb --contents "$deb" | awk '{print "  " $1, $6}'
  ;;
*)
  echo "usage: scripts/dist.sh dist|deb" >&2
  exit 2
  ;;
esac
