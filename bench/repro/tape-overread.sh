#!/bin/bash
# A tree of ~55 MiB written to a tape volume (emulated drive), then read
# back whole on a fresh cache directory; prints the drive session (bytes
# read, locates). docs/tape.md §8, "No over-reading".
#   INITARGS="--pack-size 8M" MOUNTARGS=--read-only ORDER=sort bench/repro/tape-overread.sh
set -e
B=${CAIRN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/cairn}
W=/tmp/ovr; rm -rf $W; mkdir -p $W/src $W/mnt
export CAIRN_TAPE_CLOCK=${CLOCK:-virtual}
python3 - <<'PY'
import os, random
r = random.Random(5)
root = "/tmp/ovr/src"
total = 0
i = 0
while total < 55 << 20:
    d = os.path.join(root, f"d{i % 17}")
    os.makedirs(d, exist_ok=True)
    n = int(r.lognormvariate(10, 1.6)) % (8 << 20) + 1
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(os.urandom(n))
    total += n; i += 1
print(i, "files", total, "bytes")
PY
$B init tape-emu:$W/tape --cache-dir $W/a ${INITARGS} >/dev/null
$B mount tape-emu:$W/tape $W/mnt --cache-dir $W/a
cp -a $W/src/. $W/mnt/
$B umount $W/mnt
$B mount tape-emu:$W/tape $W/mnt --cache-dir $W/b ${MOUNTARGS}
t0=$(date +%s.%N)
find $W/mnt -type f | ${ORDER:-sort} | xargs cat > /dev/null
t1=$(date +%s.%N)
$B umount $W/mnt
echo "read in $(echo "$t1 - $t0" | bc) s"
python3 -c "import json;s=json.load(open('$W/tape/last-session.json'));print(s['seconds'], s['stats'])"
