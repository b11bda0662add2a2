#!/usr/bin/env bash
# Builds CRIU at a pinned version into a cache dir and prints the binary's
# path. Idempotent: a cached build (DONE marker, binary that still runs) is
# reused in milliseconds.
#   CRIU_VERSION  upstream version (default: pinned below)
#   CRIU_CACHE    cache root (default /var/cache/space/criu)
# Why not Debian's package: bookworm ships CRIU 3.17, whose `criu check`
# fails on current kernels ("vdso: Unexpected rt vDSO area bounds"). Debian
# trixie carries 4.1.1; its source is fetched through apt (a deb-src line in
# its own sources file, so apt verifies the archive's signature and hashes)
# and built against bookworm's development packages, without docs.
# scripts/criu-patches/*.patch are applied to the source first (each says
# why); the DONE marker records the build (version + patch level), so a new
# patch rebuilds.
# The namespace driver finds the binary with `space server --criu PATH`, the
# SPACE_CRIU environment variable, or on PATH.
set -euo pipefail
CRIU_VERSION=${CRIU_VERSION:-4.1.1}
CRIU_CACHE=${CRIU_CACHE:-/var/cache/space/criu}
dir=$CRIU_CACHE/$CRIU_VERSION
bin=$dir/criu
patches=$(cd "$(dirname "$0")" && pwd)/criu-patches
build="$CRIU_VERSION+space5"
if [ "$(cat "$dir/DONE" 2>/dev/null)" = "$build" ] && [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "Version: $CRIU_VERSION"; then
  echo "$bin"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
build_deps=(gcc make patch pkg-config python3 xz-utils libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev
  protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libaio-dev libgnutls28-dev
  libnftables-dev libbsd-dev iproute2 iptables)
missing=()
for p in "${build_deps[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
src_list=/etc/apt/sources.list.d/space-criu-src.list
updated=0
if [ ! -f "$src_list" ]; then
  echo "deb-src http://deb.debian.org/debian trixie main" > "$src_list"
  apt-get update -qq >&2
  updated=1
fi
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$updated" = 1 ] || apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  # The Debian revision is whatever trixie carries for this upstream version.
  srcver() { apt-cache showsrc criu 2>/dev/null | awk '/^Version:/ {print $2}' | grep "^$CRIU_VERSION-" | sort -V | tail -1; }
  debver=$(srcver || true)
  if [ -z "$debver" ] && [ "$updated" = 0 ]; then # lists older than our sources file
    apt-get update -qq >&2
    debver=$(srcver || true)
  fi
  [ -n "$debver" ] || { echo "criu.sh: trixie has no source for criu $CRIU_VERSION" >&2; exit 1; }
  # --tar-only: the upstream tarball is all the build needs (and all some
  # mirrors carry); apt checks it against the signed Sources index.
  apt-get source --download-only --tar-only "criu=$debver" >&2
  tar -xf "criu_$CRIU_VERSION.orig.tar.xz"
  cd "criu-$CRIU_VERSION"
  for p in "$patches"/*.patch; do
    [ -e "$p" ] || continue
    patch -p1 --forward --quiet < "$p" >&2
  done
  # Only the binary: no docs (asciidoc), no Python library, no plugins.
  make -j"$(nproc)" criu >&2
)
mkdir -p "$dir"
install -m 0755 "$work/criu-$CRIU_VERSION/criu/criu" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
"$bin" --version | grep -q "Version: $CRIU_VERSION"
# criu check needs root and a kernel with the features CRIU relies on; a
# failed check is reported, not fatal: the binary is still what doctor and
# the driver probe (and they say why CRIU is refused).
if ! "$bin" check >&2; then
  echo "criu.sh: warning: '$bin check' failed on this kernel" >&2
fi
echo "$build" > "$dir/DONE"
echo "$bin"
