#!/usr/bin/env bash
# Build the Debian package cairn_VERSION-1_ARCH.deb (cargo-deb; the
# configuration is [package.metadata.deb] in crates/cairn-cli/Cargo.toml):
# /usr/bin/cairn, the mount(8) helpers /sbin/mount.fuse.cairn,
# /sbin/umount.fuse.cairn and /sbin/mount.cairn (links to it), libcairn.so
# and cairn.h, man pages (generated from the clap definitions, plus
# cairn(7)), bash/zsh/fish completions, the fstab and systemd examples.
#   scripts/deb.sh [--no-build] [--output DIR|FILE]
# Default output: TARGET/debian/. --no-build packages the release build as
# it is (target/release/cairn and libcairn.so must exist).
# Install with: dpkg -i cairn_*.deb   (depends on fuse3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=1
OUT=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --output|-o) OUT=(--output "$2"); shift ;;
    *) echo "usage: scripts/deb.sh [--no-build] [--output DIR|FILE]" >&2; exit 2 ;;
  esac
  shift
done
command -v cargo-deb >/dev/null || { echo "deb.sh: cargo-deb is missing: cargo install cargo-deb --locked" >&2; exit 1; }
command -v gzip >/dev/null || { echo "deb.sh: gzip is missing" >&2; exit 1; }
TARGET=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$TARGET" ] || { echo "deb.sh: cargo metadata named no target directory" >&2; exit 1; }
if [ $BUILD = 1 ]; then
  cargo build --release -p cairn-cli -p cairn-client
fi
for f in cairn libcairn.so; do
  [ -e "$TARGET/release/$f" ] || { echo "deb.sh: $TARGET/release/$f is missing: cargo build --release -p cairn-cli -p cairn-client" >&2; exit 1; }
done
# What cargo-deb takes from target/release/deb-assets (see Cargo.toml).
A="$TARGET/release/deb-assets"
rm -rf "$A"
mkdir -p "$A/sbin"
"$TARGET/release/cairn" generate man "$A/man"
cp dist/man/cairn.7 "$A/man/"
gzip -9n "$A"/man/*
"$TARGET/release/cairn" generate completions "$A/completions"
# Absolute targets: /sbin may be a link to /usr/sbin (merged /usr), which
# would send a relative ../usr/bin/cairn astray.
for h in mount.fuse.cairn umount.fuse.cairn mount.cairn; do
  ln -s /usr/bin/cairn "$A/sbin/$h"
done
cargo deb -p cairn-cli --no-build --no-strip "${OUT[@]}"
