#!/usr/bin/env bash
# Install what the tests need and run every test: unit, property, engine
# integration, FUSE end-to-end (real mounts), and short fuzz runs.
#   scripts/test.sh [--no-fuzz]
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ=1
[ "${1:-}" = "--no-fuzz" ] && FUZZ=0

need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v bsdtar >/dev/null || need+=(libarchive-tools)
command -v rsync >/dev/null || need+=(rsync)
command -v python3 >/dev/null || need+=(python3)
command -v cc >/dev/null || need+=(gcc)   # the C ABI test compiles against cairn.h
command -v tar >/dev/null || need+=(tar)
command -v attr >/dev/null 2>&1 || command -v getfattr >/dev/null || need+=(attr)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi
[ -e /dev/fuse ] || { echo "test.sh: /dev/fuse is missing: the end-to-end tests need FUSE" >&2; exit 1; }

start=$(date +%s)
# Release build: the end-to-end tests move hundreds of MiB through the mount.
cargo build --release --workspace
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --release --workspace 2>&1 | tee "$log"
if [ $FUZZ = 1 ]; then
  scripts/fuzz.sh 20
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start ))s"
# One closing line over every cargo test target (the last target's own
# summary is a doc-test run that may well count zero).
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
