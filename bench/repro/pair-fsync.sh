#!/usr/bin/env bash
# Durability-heavy run: 1,000 files of 64 KiB each written and fsync'd (the
# dd conv=fsync pattern), then 512 MiB written with one fsync at the end.
#   bench/repro/pair-fsync.sh CAIRN_BINARY [--encrypt]   (JSON line to $OUT or stdout)
# Used to price the durability fix (issue 17) and the sealed journal: run it
# for two builds in turn, e.g. with hyperfine or farm-bench, see docs/design.md.
set -euo pipefail
BIN=$1; ENC=${2:-}; W=$(mktemp -d /var/tmp/cairn-pair.XXXX)
PASS=()
if [ "$ENC" = --encrypt ]; then
  echo "pair passphrase" > "$W/pass"; PASS=(--passphrase-file "$W/pass")
  "$BIN" init "$W/vol" --encrypt "${PASS[@]}" >/dev/null
else
  "$BIN" init "$W/vol" >/dev/null
fi
mkdir "$W/mnt"; "$BIN" mount "$W/vol" "$W/mnt" "${PASS[@]}" >/dev/null
python3 - "$W/mnt" >> "${OUT:-/dev/stdout}" <<'PY'
import os, sys, time, json
d = sys.argv[1]
buf = os.urandom(64 << 10)
t = time.perf_counter()
for i in range(1000):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, buf[i % 7:] + buf[:i % 7]); os.fsync(fd); os.close(fd)
small = time.perf_counter() - t
big = os.urandom(1 << 20)
t = time.perf_counter()
fd = os.open(f"{d}/big", os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(512):
    os.write(fd, big[i:] + big[:i])
os.fsync(fd); os.close(fd)
print(json.dumps({"small_fsync_s": small, "big_s": time.perf_counter() - t}))
PY
"$BIN" umount "$W/mnt" >/dev/null
rm -rf "$W"
