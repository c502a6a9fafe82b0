#!/usr/bin/env bash
# Builds the release artifacts into dist/, from target/release/ (`make build` first):
#   dist   dist/redis-tb-<version>-x86_64-linux-gnu.tar.gz: the stripped module, lua/tb.lua (the script fallback)
#            and lua/tb-functions.lua (the same as a function library, for FUNCTION LOAD),
#            LICENSE, README.md, CHANGELOG.md, redis.conf.example, docs/ and SHA256SUMS, in one top-level folder
#          dist/tb-rls-<version>-x86_64-linux-gnu.tar.gz: the stripped tb-rls binary, example configurations (the
#            service's and Envoy's), a systemd unit and its settings file, LICENSE, README.md, gateway.md,
#            SHA256SUMS
#          dist/redis_tb-<version>.tar.gz and dist/redis_tb-<version>-py3-none-any.whl: the Python package (sdist,
#            and the wheel built from it), checked with twine
#          dist/redis-tb-<version>.tgz: the npm package (npm pack)
#          dist/redis-tb-client-<version>.crate and dist/redis-tb-core-<version>.crate: the Rust crate and the
#            token-bucket arithmetic it depends on (one cargo package run, which builds each packed crate alone to
#            verify it, the client against the packed core)
#   deb    dist/redis-tb_<version>_amd64.deb: the module in /usr/lib/redis/modules/redis-tb.so and the snippet
#            /etc/redis/modules.d/redis-tb.conf that loads it
#          dist/tb-rls_<version>_amd64.deb: /usr/bin/tb-rls, a tb-rls system user, /etc/tb-rls/ratelimit.yaml and
#            /etc/default/tb-rls (conffiles), the systemd unit tb-rls.service
#          (both built with dpkg-deb from a staged tree)
# Either ends by writing dist/SHA256SUMS over every artifact of this version in dist/. The binaries' newest glibc
# symbol version is printed and one newer than GLIBC_MAX (default 2.36, Debian bookworm's, which the official Redis
# images are built on) is refused, and so is a version whose CHANGELOG heading is missing or says unreleased. Same
# sources, same bytes: file dates come from the last commit.
set -euo pipefail
cd "$(dirname "$0")/.."

what="${1:-dist}"
module="target/release/libredis_tb.so"
service="target/release/tb-rls"
python="${PYTHON:-$PWD/.venv/bin/python}"
glibc_max="${GLIBC_MAX:-2.36}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
[ -n "$version" ] || { echo "dist: no version in Cargo.toml" >&2; exit 1; }
# A release ships its CHANGELOG: the version's heading must be there, dated, not "(unreleased)".
heading="$(awk -v start="## $version " 'index($0, start) == 1 { print; exit }' CHANGELOG.md)"
case "$heading" in
"") echo "dist: CHANGELOG.md has no heading for $version (## $version (<date>))" >&2; exit 1 ;;
*[Uu]nreleased*) echo "dist: CHANGELOG.md says $version is unreleased ($heading): date its heading first" >&2; exit 1 ;;
esac
for binary in "$module" "$service"; do
  [ -f "$binary" ] || { echo "dist: $binary is missing: run make build" >&2; exit 1; }
done
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
mkdir -p dist

# Prints the newest GLIBC_x.y among the symbol versions $1 imports, and fails when it is newer than $glibc_max.
glibc_of() {
  local needed
  needed="$(objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)"
  echo "dist: $1 needs glibc $needed or newer (limit: $glibc_max)" >&2
  if [ "$(printf '%s\n%s\n' "$needed" "$glibc_max" | sort -V | tail -n 1)" != "$glibc_max" ]; then
    echo "dist: glibc $needed is newer than $glibc_max: $1 would not run on Debian bookworm" >&2
    exit 1
  fi
  echo "$needed"
}
glibc_module="$(glibc_of "$module")"
glibc_service="$(glibc_of "$service")"

# Stripped copies of the binaries, for every artifact: no symbol table or debug info, only what the loader needs.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
strip --strip-unneeded -o "$stage/libredis_tb.so" "$module"
strip --strip-unneeded -o "$stage/tb-rls" "$service"
touch -d "@$SOURCE_DATE_EPOCH" "$stage/libredis_tb.so" "$stage/tb-rls"

# The systemd unit names /usr/bin/tb-rls (the .deb's); the tarball's is for a binary copied to /usr/local/bin.
unit=packaging/tb-rls/tb-rls.service

# dist/<name>.tar.gz from the folder $stage/<name>, with a SHA256SUMS of its files inside; renamed into place, so
# that a concurrent run never reads half a file.
tarball() {
  local name="$1" root="$stage/$1"
  (cd "$root" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$stage" -cf - "$name" | gzip -n -9 > "$stage/$name.tar.gz"
  mv -f "$stage/$name.tar.gz" "dist/$name.tar.gz"
  echo "dist: dist/$name.tar.gz ($(du -k "dist/$name.tar.gz" | cut -f1) KiB)"
}

# A .deb from the staged tree $2 (with DEBIAN/control written), renamed into place as dist/$1.
deb_build() {
  local file="$1" root="$2"
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum \
    > DEBIAN/md5sums)
  find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  dpkg-deb --root-owner-group -Zxz --build "$root" "$stage/package.deb" >/dev/null
  mv -f "$stage/package.deb" "dist/$file"
  echo "dist: dist/$file ($(du -k "dist/$file" | cut -f1) KiB)"
  dpkg-deb --contents "dist/$file" | awk '{print "  " $1, $6}'
}

# dist/SHA256SUMS over this version's artifacts that are there (make dist and make deb each rewrite it).
sums() {
  (cd dist && find . -maxdepth 1 -type f \( -name "*[-_]$version[-_.]*" \) ! -name SHA256SUMS -printf '%P\n' \
    | LC_ALL=C sort | xargs sha256sum > "$stage/SHA256SUMS")
  mv -f "$stage/SHA256SUMS" dist/SHA256SUMS
  echo "dist: dist/SHA256SUMS"
  sed 's/^/  /' dist/SHA256SUMS
}

# The function library (Redis 7.0+, Valkey) generated from lua/tb.lua as its header says: two lines, then the file.
functions() {
  local lib="tb_${version//./_}"
  printf '#!lua name=%s\nlocal TB_LIBRARY = '"'"'%s'"'"'\n' "$lib" "$lib"
  cat lua/tb.lua
}

module_tarball() {
  local name="redis-tb-$version-x86_64-linux-gnu" root
  root="$stage/$name"
  mkdir -p "$root/docs" "$root/lua"
  install -m 0755 "$stage/libredis_tb.so" "$root/libredis_tb.so"
  install -m 0644 LICENSE README.md CHANGELOG.md redis.conf.example "$root/"
  install -m 0644 docs/*.md "$root/docs/"
  install -m 0644 lua/tb.lua "$root/lua/tb.lua"
  functions > "$root/lua/tb-functions.lua"
  chmod 0644 "$root/lua/tb-functions.lua"
  tarball "$name"
}

service_tarball() {
  local name="tb-rls-$version-x86_64-linux-gnu" root
  root="$stage/$name"
  mkdir -p "$root/examples"
  install -m 0755 "$stage/tb-rls" "$root/tb-rls"
  install -m 0644 LICENSE "$root/"
  install -m 0644 packaging/tb-rls/README.md "$root/README.md"
  install -m 0644 docs/gateway.md "$root/gateway.md"
  install -m 0644 gateway/tests/envoy/ratelimit.yaml gateway/tests/envoy/envoy.yaml "$root/examples/"
  install -m 0644 packaging/tb-rls/tb-rls.default "$root/examples/tb-rls.default"
  sed 's|/usr/bin/tb-rls|/usr/local/bin/tb-rls|' "$unit" > "$root/examples/tb-rls.service"
  chmod 0644 "$root/examples/tb-rls.service"
  find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  tarball "$name"
}

# The sdist, then the wheel built from the unpacked sdist (what `pip install <sdist>` does), without build isolation:
# hatchling comes from .venv (make dist-venv), so no network is needed.
python_package() {
  local out="$stage/python"
  "$python" -m build --no-isolation --outdir "$out" clients/python >/dev/null
  "$python" -m twine check --strict "$out"/* | sed 's/^/  /'
  for file in "$out"/*; do
    mv -f "$file" "dist/$(basename "$file")"
    echo "dist: dist/$(basename "$file") ($(du -k "dist/$(basename "$file")" | cut -f1) KiB)"
  done
}

# npm pack runs the package's prepack script (which copies lua/tb.lua and LICENSE in) and postpack (which removes
# them).
npm_package() {
  local out="$stage/npm" file
  mkdir -p "$out"
  file="$(cd clients/node && npm pack --silent --pack-destination "$out" | tail -n 1)"
  mv -f "$out/$file" "dist/$file"
  echo "dist: dist/$file ($(du -k "dist/$file" | cut -f1) KiB)"
}

# cargo package packs the working tree as it is (--allow-dirty, like the other artifacts), with lua/tb.lua and the
# licences stored as files, then builds each unpacked crate by itself (fetching from crates.io what the cache lacks,
# as make build does). The client depends on redis-tb-core, which crates.io does not have before a release: packed
# in the same run, the client is verified against the packed core.
crate_package() {
  local manifest version_crate file
  for manifest in clients/rust/Cargo.toml core/Cargo.toml; do
    version_crate="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$manifest" | head -n 1)"
    [ "$version_crate" = "$version" ] || {
      echo "dist: $manifest says $version_crate, the release is $version" >&2
      exit 1
    }
  done
  # cargo unpacks the packed core into $CARGO_HOME/registry/src/<hash of target/package/tmp-registry>/ and reuses a
  # directory already there, so a second run from the same checkout path (a release rebuilt after a change, without
  # a version bump) would verify the client against the first run's core. Only these crates' unpacked copies go: cargo
  # unpacks them again from the .crate it has just written.
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-tb-core-"$version" \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-tb-client-"$version"
  # Likewise the client's verification build takes a registry crate for immutable and reuses the core it compiled
  # in target/debug on a run before: the core's build goes too (it is small), so it is compiled from this core.
  rm -rf target/debug/deps/libredis_tb_core-* target/debug/deps/redis_tb_core-* target/debug/.fingerprint/redis-tb-core-*
  cargo package -p redis-tb-core -p redis-tb-client --allow-dirty --quiet
  for file in "redis-tb-core-$version.crate" "redis-tb-client-$version.crate"; do
    cp "target/package/$file" "$stage/$file"
    mv -f "$stage/$file" "dist/$file"
    echo "dist: dist/$file ($(du -k "dist/$file" | cut -f1) KiB)"
  done
}

module_deb() {
  local root="$stage/deb-module"
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
  install -D -m 0644 lua/tb.lua "$root/usr/share/redis-tb/tb.lua"
  functions > "$root/usr/share/redis-tb/tb-functions.lua"
  chmod 0644 "$root/usr/share/redis-tb/tb-functions.lua"
  gzip -n -9 -c CHANGELOG.md > "$root/usr/share/doc/redis-tb/changelog.gz"
  install -d -m 0755 "$root/DEBIAN"
  echo "/etc/redis/modules.d/redis-tb.conf" > "$root/DEBIAN/conffiles"
  cat > "$root/DEBIAN/control" <<EOF
Package: redis-tb
Version: $version
Architecture: amd64
Maintainer: the redis-tb authors <redis-tb@noreply.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= $glibc_module), libgcc-s1
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
 /usr/share/redis-tb/tb.lua is the same commands as a Lua script, and
 tb-functions.lua as a function library, for servers that cannot load modules.
EOF
  deb_build "redis-tb_${version}_amd64.deb" "$root"
}

service_deb() {
  local root="$stage/deb-service"
  install -D -m 0755 "$stage/tb-rls" "$root/usr/bin/tb-rls"
  install -D -m 0644 gateway/tests/envoy/ratelimit.yaml "$root/etc/tb-rls/ratelimit.yaml"
  install -D -m 0644 packaging/tb-rls/tb-rls.default "$root/etc/default/tb-rls"
  install -D -m 0644 "$unit" "$root/lib/systemd/system/tb-rls.service"
  install -D -m 0644 LICENSE "$root/usr/share/doc/tb-rls/copyright"
  install -m 0644 packaging/tb-rls/README.md "$root/usr/share/doc/tb-rls/README.md"
  install -m 0644 docs/gateway.md "$root/usr/share/doc/tb-rls/gateway.md"
  install -D -m 0644 gateway/tests/envoy/envoy.yaml "$root/usr/share/doc/tb-rls/examples/envoy.yaml"
  gzip -n -9 -c CHANGELOG.md > "$root/usr/share/doc/tb-rls/changelog.gz"
  install -d -m 0755 "$root/DEBIAN"
  printf '%s\n' /etc/tb-rls/ratelimit.yaml /etc/default/tb-rls > "$root/DEBIAN/conffiles"
  # The service runs as the tb-rls system user, which owns no files: created on install, removed on purge. With
  # systemd running, the service is enabled and started (then restarted on upgrade), as Debian's services are.
  cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  if ! getent passwd tb-rls >/dev/null; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
      --comment "tb-rls rate limit service" tb-rls
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    systemctl enable tb-rls.service >/dev/null || true
    systemctl restart tb-rls.service >/dev/null || true
  fi
fi
EOF
  cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl stop tb-rls.service >/dev/null || true
  systemctl disable tb-rls.service >/dev/null || true
fi
EOF
  cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null || true
fi
if [ "$1" = purge ] && getent passwd tb-rls >/dev/null; then
  userdel tb-rls >/dev/null || true
  if getent group tb-rls >/dev/null; then groupdel tb-rls >/dev/null || true; fi
fi
EOF
  chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
  cat > "$root/DEBIAN/control" <<EOF
Package: tb-rls
Version: $version
Architecture: amd64
Maintainer: the redis-tb authors <redis-tb@noreply.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= $glibc_service), libgcc-s1, passwd
Recommends: redis-tb
Section: net
Priority: optional
Description: Envoy rate limit service backed by the redis-tb module
 tb-rls answers Envoy's global rate limit calls (RateLimitService over gRPC,
 as Istio and Envoy Gateway use) from redis-tb token buckets, with one
 TB.ACQUIREEACH per request. It reads envoyproxy/ratelimit's configuration
 files, plus an optional burst per limit.
 .
 The limits are in /etc/tb-rls/, the settings (Redis address, ports) in
 /etc/default/tb-rls; the service runs as the tb-rls user. Redis needs the
 redis-tb module loaded.
EOF
  deb_build "tb-rls_${version}_amd64.deb" "$root"
}

case "$what" in
dist)
  module_tarball
  service_tarball
  python_package
  npm_package
  crate_package
  sums
  ;;
deb)
  module_deb
  service_deb
  sums
  ;;
*)
  echo "usage: scripts/dist.sh dist|deb" >&2
  exit 2
  ;;
esac
