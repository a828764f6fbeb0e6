#!/usr/bin/env bash
# Build Cairn and mount a volume on the default local backend.
#   scripts/run.sh [VOLUME_DIR] [MOUNTPOINT]     (defaults: ./cairn-volume ./mnt)
# Creates the volume on first use. Unmount with: target/release/cairn umount MOUNTPOINT
set -euo pipefail
cd "$(dirname "$0")/.."
VOL=${1:-./cairn-volume}
MNT=${2:-./mnt}
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
# SQLite's session extension (metadata deltas of cloud volumes) is built
# with bindgen, which loads libclang.
# libclang.so itself: libclang-cpp.so (another package) does not count.
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"; else sudo apt-get install -y "${need[@]}"; fi
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
cargo build --release -p cairn-cli
CAIRN=target/release/cairn
[ -e "$VOL/volume.json" ] || "$CAIRN" init "$VOL"
mkdir -p "$MNT"
"$CAIRN" mount "$VOL" "$MNT"
echo "Cairn volume $VOL is mounted at $MNT"
echo "  space use:  $CAIRN stats $VOL"
echo "  unmount:    $CAIRN umount $MNT"
