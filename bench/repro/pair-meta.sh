#!/usr/bin/env bash
# One metadata run with the given cairn binary: fresh volume, mount,
# 10,000 creates/stats/unlinks (bench/fsbench.py meta), unmount.
#   bench/repro/pair-meta.sh CAIRN_BINARY   (JSON line to $OUT or stdout)
set -euo pipefail
BIN=$1; W=$(mktemp -d /var/tmp/cairn-pair.XXXX)
"$BIN" init "$W/vol" >/dev/null
mkdir "$W/mnt"; "$BIN" mount "$W/vol" "$W/mnt" >/dev/null
python3 "$(dirname "$0")/../fsbench.py" meta "$W/mnt/d" 10000 >> "${OUT:-/dev/stdout}"
"$BIN" umount "$W/mnt" >/dev/null
rm -rf "$W"
