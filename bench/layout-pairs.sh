#!/usr/bin/env bash
# Issue 51's "performance unchanged": two builds of cairn in interleaved pairs
# on the default local backend, the phases the issue names: creates (and the
# stats and unlinks of bench/shared.py meta), an untar of a part of the kernel
# tree, a sequential write until durable (fio, end_fsync), and a cold
# sequential read (unmount, drop the kernel's caches, mount, read). Each pair
# runs both builds, the order alternating (before first in odd pairs); each
# build gets a fresh volume. The write phase also counts the daemon's CPU
# seconds, which a busy machine disturbs less than wall time. Prints one
# JSON row per build and pair, then the median of the after/before ratios
# per phase (> 1: after is faster).
#
# Usage (as root): bench/layout-pairs.sh BEFORE_CAIRN AFTER_CAIRN
#   PAIRS (default 6), FILES (creates, default 4000), WRITE_MIB (default 1024).
# Tools: fio, tar, python3 (Debian: fio tar python3); /usr/src/linux-source-6.1.tar.xz
# (Debian: linux-source-6.1).
set -euo pipefail
PAIRS=${PAIRS:-6}; FILES=${FILES:-4000}; WRITE_MIB=${WRITE_MIB:-1024}
[[ $# -eq 2 ]] || { echo "usage: $0 BEFORE_CAIRN AFTER_CAIRN" >&2; exit 2; }
B=$(realpath "$1"); A=$(realpath "$2"); REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TXZ=/usr/src/linux-source-6.1.tar.xz
for t in fio tar python3 mountpoint; do command -v $t > /dev/null || { echo "$0 needs $t: apt-get install -y $t" >&2; exit 1; }; done
[[ -f $TXZ ]] || { echo "$0 needs $TXZ: apt-get install -y linux-source-6.1" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "$0 drops the kernel's caches: run it as root" >&2; exit 1; }
S=$(mktemp -d /var/tmp/layout-pairs.XXXXXX); chmod 711 "$S"
MNT=; BIN=
cleanup() { [[ -n $MNT ]] && mountpoint -q "$MNT" && "$BIN" umount "$MNT" > /dev/null 2>&1; rm -rf "$S"; }
trap cleanup EXIT

# The untar's input, once: fs/ and include/ of the kernel tree (about 12,000
# files, 170 MB), as an uncompressed tar so that xz is not what is timed.
echo "preparing the kernel subset tar..." >&2
tar -xJf "$TXZ" -C "$S" linux-source-6.1/fs linux-source-6.1/include
tar -cf "$S/sub.tar" -C "$S" linux-source-6.1; rm -rf "$S/linux-source-6.1"

mount_vol() { # BIN VOL MNT
    "$1" mount "$2" "$3"
    for _ in $(seq 200); do mountpoint -q "$3" && return; sleep 0.05; done
    echo "the mount at $3 did not come up" >&2; exit 1
}
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.4f}')" "$1" "$2"; }
# The daemon's CPU seconds (user + system, all threads): a figure a busy
# machine disturbs much less than wall time.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / t}' "/proc/$1/stat"; }
fio_rate() { python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.1f" % (j[sys.argv[1]]["bw_bytes"] / 2**20))' "$1"; }

ROWS=$S/rows.jsonl
for run in $(seq "$PAIRS"); do
    order="before after"; ((run % 2 == 0)) && order="after before"
    for build in $order; do
        BIN=$A; [[ $build == before ]] && BIN=$B
        VOL=$S/vol-$build$run; MNT=$S/mnt-$build$run; mkdir -p "$MNT"
        "$BIN" init "$VOL" > /dev/null
        mount_vol "$BIN" "$VOL" "$MNT"
        PID=$(pgrep -f -- "$BIN mount $VOL" | head -1)
        [[ -n $PID ]] || { echo "no cairn daemon found for $VOL" >&2; exit 1; }
        load=$(cut -d' ' -f1 /proc/loadavg)
        meta=$(python3 -S "$REPO/bench/shared.py" meta "$FILES" "$MNT/meta")
        sync; echo 3 > /proc/sys/vm/drop_caches
        t0=$(now); tar -xf "$S/sub.tar" -C "$MNT"; t1=$(now)
        untar=$(secs "$t0" "$t1")
        c0=$(cpu_s "$PID")
        w=$(fio --name=w --filename="$MNT/seq" --rw=write --bs=1M --size=${WRITE_MIB}M --refill_buffers --end_fsync=1 --output-format=json | fio_rate write)
        wcpu=$(python3 -c "print(round($(cpu_s "$PID") - $c0, 2))")
        "$BIN" umount "$MNT" > /dev/null
        sync; echo 3 > /proc/sys/vm/drop_caches
        mount_vol "$BIN" "$VOL" "$MNT"
        r=$(fio --name=r --filename="$MNT/seq" --rw=read --bs=1M --size=${WRITE_MIB}M --output-format=json | fio_rate read)
        "$BIN" umount "$MNT" > /dev/null; MNT=
        rm -rf "$VOL"
        echo "{\"build\": \"$build\", \"pair\": $run, \"load\": $load, \"meta\": $meta, \"untar_s\": $untar, \"write_mib_s\": $w, \"write_cpu_s\": $wcpu, \"cold_read_mib_s\": $r}" | tee -a "$ROWS"
    done
done

python3 - "$ROWS" "$WRITE_MIB" <<'EOF'
import json, statistics, sys
WRITE_MIB = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["build"], r["pair"]): r for r in rows}
pairs = sorted({r["pair"] for r in rows})
# Each figure as "higher is better".
figs = {
    "creates/s": lambda r: r["meta"]["create_per_s"],
    "stats/s": lambda r: r["meta"]["stat_per_s"],
    "unlinks/s": lambda r: r["meta"]["unlink_per_s"],
    "untar (1/s)": lambda r: 1 / r["untar_s"],
    "seq write MiB/s": lambda r: r["write_mib_s"],
    "cold read MiB/s": lambda r: r["cold_read_mib_s"],
    "seq write MiB per daemon CPU-s": lambda r: WRITE_MIB / r["write_cpu_s"],
}
print("| figure | before (median) | after (median) | after/before per pair | median ratio |")
print("|---|---|---|---|---|")
for name, f in figs.items():
    b = [f(by[("before", p)]) for p in pairs]
    a = [f(by[("after", p)]) for p in pairs]
    ratios = [x / y for x, y in zip(a, b)]
    print(f"| {name} | {statistics.median(b):,.1f} | {statistics.median(a):,.1f} | {' '.join(f'{x:.2f}' for x in ratios)} | **{statistics.median(ratios):.3f}** |")
EOF
