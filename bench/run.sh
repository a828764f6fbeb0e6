#!/usr/bin/env bash
# Cairn's benchmark suite: builds release, runs every benchmark against a
# baseline measured in the same run, and writes BENCHMARKS.md at the repo root.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bench/run.sh [--quick] [--no-build] [--out FILE] [--keep-results DIR] [--scratch-parent DIR]

Builds target/release/{cairn,cairn-bench} and runs, interleaving baseline and
Cairn run by run:
  1. ingest    cairn-bench ingest: each stage (chunk, hash, compress, encrypt)
               alone and the engine's pipeline, in memory (target: pipeline
               >= 80% of the slowest stage on both cores)
  2. seq       dd 2 GiB in 1 MiB blocks, write (conv=fsync) and cold read,
               Cairn mount vs ext4 on the same disk; daemon peak RSS
               (target: write >= 70% of the ingest pipeline)
  3. meta      create, stat, unlink 20,000 empty files in one directory,
               Cairn vs ext4 (the scratch directory's, and a fresh
               loop-mounted ext4 image) (target: >= 5,000 creates/s)
  4. dedup     the same 256 MiB written twice; stored bytes after each copy
               (target: growth < 2%)
and writes the medians, ratios and targets to BENCHMARKS.md (overwritten).

Needs root (drop_caches, FUSE), fusermount3 and python3. Scratch space is a
temporary directory under /var/tmp (ext4 on the repo's disk), removed on exit
together with every mount and daemon the script started.

Options:
  --quick               smoke run: small sizes, one run each (< 2 minutes)
  --no-build            use the binaries already in target/release
  --out FILE            write the report here (default: REPO/BENCHMARKS.md)
  --keep-results DIR    also copy the raw results there (results.jsonl,
                        ingest.json); `bench/fsbench.py report` can rebuild
                        the report from them
  --scratch-parent DIR  where to create the scratch directory (default /var/tmp)
  -h, --help            this help
EOF
}

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")
QUICK=0
BUILD=1
OUT="$REPO/BENCHMARKS.md"
SCRATCH_PARENT=/var/tmp
KEEP=
need_arg() { [[ $# -ge 2 ]] || { echo "$1 needs an argument (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --no-build) BUILD=0 ;;
        --out) need_arg "$@"; OUT=$(realpath -m "$2"); shift ;;
        --scratch-parent) need_arg "$@"; SCRATCH_PARENT=$2; shift ;;
        --keep-results) need_arg "$@"; KEEP=$(realpath -m "$2"); shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ $QUICK == 1 ]]; then
    INGEST_MIB=128 INGEST_RUNS=1 SEQ_MIB=128 SEQ_RUNS=1 META_FILES=2000 META_RUNS=1 DEDUP_MIB=32 DEDUP_RUNS=1
else
    INGEST_MIB=1024 INGEST_RUNS=5 SEQ_MIB=2048 SEQ_RUNS=3 META_FILES=20000 META_RUNS=5 DEDUP_MIB=256 DEDUP_RUNS=3
fi

source "$BENCH_DIR/lib.sh"

[[ $(id -u) == 0 ]] || die "run as root (drop_caches, FUSE)"
for t in python3 fusermount3 mountpoint dd pgrep mkfs.ext4 truncate; do
    command -v "$t" >/dev/null || die "$t is not installed"
done

START_DATE=$(date '+%Y-%m-%d %H:%M %Z')
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
SECONDS=0

if [[ $BUILD == 1 ]]; then
    log "building release (cairn, cairn-bench)"
    (cd "$REPO" && cargo build --release -p cairn-cli -p cairn-bench)
fi
for b in cairn cairn-bench; do
    [[ -x $REPO/target/release/$b ]] || die "missing target/release/$b (build without --no-build)"
done
GIT_DESC="$(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(cd "$REPO" && git status --porcelain -- crates 2>/dev/null)" ]]; then GIT_DESC+=" with uncommitted changes in crates/"; fi

SCRATCH=$(mktemp -d "$SCRATCH_PARENT/cairn-bench.XXXXXX")
trap cleanup EXIT
trap 'exit 130' INT TERM
# Private copies: other builds in the shared target/ must not swap the
# binaries in the middle of a run.
mkdir "$SCRATCH/bin"
cp "$REPO/target/release/cairn" "$REPO/target/release/cairn-bench" "$SCRATCH/bin/"
CAIRN="$SCRATCH/bin/cairn"
BENCH="$SCRATCH/bin/cairn-bench"
SCRATCH_DESC=$(df --output=source,fstype,target "$SCRATCH" | tail -n 1 | tr -s ' ')
[[ $(df --output=fstype "$SCRATCH" | tail -n 1) != tmpfs ]] || die "$SCRATCH is on tmpfs; use --scratch-parent"
RESULTS="$SCRATCH/results.jsonl"
PASSFILE="$SCRATCH/passphrase"
EXT="$SCRATCH/ext4"
VOL="$SCRATCH/vol"
MNT="$SCRATCH/mnt"
SRC="$SCRATCH/src.bin"
: > "$RESULTS"
echo "cairn benchmark passphrase" > "$PASSFILE"
mkdir -p "$EXT" "$MNT"
log "scratch: $SCRATCH ($SCRATCH_DESC)"

# --- 1. ingest --------------------------------------------------------------
log "1. ingest: $INGEST_MIB MiB, $INGEST_RUNS runs"
cmd ingest "target/release/cairn-bench ingest --mib $INGEST_MIB --runs $INGEST_RUNS"
"$BENCH" ingest --mib "$INGEST_MIB" --runs "$INGEST_RUNS" > "$SCRATCH/ingest.json"

# --- 2. sequential write and cold read ----------------------------------------
log "2. seq: generating $SEQ_MIB MiB of incompressible data"
python3 "$BENCH_DIR/fsbench.py" gen "$SRC" "$SEQ_MIB"
SEQ_BYTES=$((SEQ_MIB << 20))
cmd seq "python3 bench/fsbench.py gen $SRC $SEQ_MIB"
cmd seq "# ext4"
cmd seq "cat $SRC > /dev/null; sync"
cmd seq "dd if=$SRC of=$EXT/seq.bin bs=1M conv=fsync"
cmd seq "sync; echo 3 > /proc/sys/vm/drop_caches"
cmd seq "dd if=$EXT/seq.bin of=/dev/null bs=1M"
cmd seq "# Cairn"
cmd seq "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE"
cmd seq "cat $SRC > /dev/null; sync"
cmd seq "dd if=$SRC of=$MNT/seq.bin bs=1M conv=fsync"
cmd seq "grep VmHWM /proc/\$(pgrep -f 'cairn mount $VOL $MNT')/status; cairn umount $MNT"
cmd seq "cairn mount $VOL $MNT --passphrase-file $PASSFILE; sync; echo 3 > /proc/sys/vm/drop_caches"
cmd seq "dd if=$MNT/seq.bin of=/dev/null bs=1M"
for run in $(seq "$SEQ_RUNS"); do
    log "2. seq run $run/$SEQ_RUNS: ext4"
    cat "$SRC" > /dev/null; sync
    t0=$(now); dd if="$SRC" of="$EXT/seq.bin" bs=1M conv=fsync status=none; t1=$(now)
    record kind=seq fs=ext4 phase=write run="$run" bytes="$SEQ_BYTES" seconds="$(elapsed "$t0" "$t1")"
    drop_caches
    t0=$(now); dd if="$EXT/seq.bin" of=/dev/null bs=1M status=none; t1=$(now)
    record kind=seq fs=ext4 phase=read run="$run" bytes="$SEQ_BYTES" seconds="$(elapsed "$t0" "$t1")"
    rm -f "$EXT/seq.bin"; sync

    log "2. seq run $run/$SEQ_RUNS: Cairn"
    new_volume "$VOL"
    mount_volume "$VOL" "$MNT"
    pid=${DAEMON[$MNT]}
    cat "$SRC" > /dev/null; sync
    t0=$(now); dd if="$SRC" of="$MNT/seq.bin" bs=1M conv=fsync status=none; t1=$(now)
    record kind=rss phase=write run="$run" kib="$(peak_rss_kib "$pid")"
    umount_volume "$MNT"; t2=$UMOUNTED_AT
    record kind=seq fs=cairn phase=write run="$run" bytes="$SEQ_BYTES" seconds="$(elapsed "$t0" "$t1")"
    record kind=seq fs=cairn phase=write_flushed run="$run" bytes="$SEQ_BYTES" seconds="$(elapsed "$t0" "$t2")"
    mount_volume "$VOL" "$MNT"
    pid=${DAEMON[$MNT]}
    drop_caches
    t0=$(now); dd if="$MNT/seq.bin" of=/dev/null bs=1M status=none; t1=$(now)
    record kind=seq fs=cairn phase=read run="$run" bytes="$SEQ_BYTES" seconds="$(elapsed "$t0" "$t1")"
    record kind=rss phase=read run="$run" kib="$(peak_rss_kib "$pid")"
    if [[ $run == 1 ]]; then  # not timed: what comes back is what went in
        cmp "$SRC" "$MNT/seq.bin" || die "Cairn returned different data for seq.bin"
    fi
    umount_volume "$MNT"
    rm -rf "$VOL"
done

# --- 3. metadata ---------------------------------------------------------------
log "3. meta: $META_FILES files, $META_RUNS runs"
# Second baseline: a fresh ext4 image on the same disk. The scratch
# directory's ext4 has no journal, and without one ext4 skips inodes deleted
# in the last 60-300 s when it allocates, so creates there slow down by up to
# 25x after anyone (an earlier run, other users of the disk) deleted many files.
EXTF="$SCRATCH/ext4-fresh"
truncate -s 2G "$SCRATCH/ext4-fresh.img"
mkfs.ext4 -q -F "$SCRATCH/ext4-fresh.img"
mkdir -p "$EXTF"
mount -o loop "$SCRATCH/ext4-fresh.img" "$EXTF"
LOOP_MOUNTS+=("$EXTF")
cmd meta "python3 bench/fsbench.py meta $EXT/meta.RUN $META_FILES"
cmd meta "truncate -s 2G $SCRATCH/ext4-fresh.img; mkfs.ext4 -q -F $SCRATCH/ext4-fresh.img; mount -o loop $SCRATCH/ext4-fresh.img $EXTF"
cmd meta "python3 bench/fsbench.py meta $EXTF/meta.RUN $META_FILES"
cmd meta "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE"
cmd meta "python3 bench/fsbench.py meta $MNT/meta.RUN $META_FILES"
new_volume "$VOL"
mount_volume "$VOL" "$MNT"
for run in $(seq "$META_RUNS"); do
    for fs in ext4 ext4fresh cairn; do
        case $fs in
            ext4) dir="$EXT/meta.$run" ;;
            ext4fresh) dir="$EXTF/meta.$run" ;;
            cairn) dir="$MNT/meta.$run" ;;
        esac
        sync
        r=$(python3 "$BENCH_DIR/fsbench.py" meta "$dir" "$META_FILES")
        log "3. meta run $run/$META_RUNS $fs: $r"
        record kind=meta fs="$fs" run="$run" $(python3 -c 'import json,sys; print(" ".join(f"{k}={v}" for k, v in json.loads(sys.argv[1]).items()))' "$r")
    done
done
umount_volume "$MNT"
rm -rf "$VOL"
umount "$EXTF"
rm -f "$SCRATCH/ext4-fresh.img"

# --- 4. dedup -------------------------------------------------------------------
log "4. dedup: $DEDUP_MIB MiB twice, $DEDUP_RUNS runs"
cmd dedup "cairn init --encrypt --passphrase-file $PASSFILE $VOL"
cmd dedup "cairn mount $VOL $MNT --passphrase-file $PASSFILE; dd if=$SRC of=$MNT/a.bin bs=1M count=$DEDUP_MIB conv=fsync; cairn umount $MNT"
cmd dedup "cairn stats --json --passphrase-file $PASSFILE $VOL"
cmd dedup "cairn mount $VOL $MNT --passphrase-file $PASSFILE; dd if=$SRC of=$MNT/b.bin bs=1M count=$DEDUP_MIB conv=fsync; cairn umount $MNT"
cmd dedup "cairn stats --json --passphrase-file $PASSFILE $VOL"
stats_fields() { # DIR: data_bytes=.. stored_bytes=.. dedup_ratio=..
    "$CAIRN" stats --json --passphrase-file "$PASSFILE" "$1" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(f"{k}={d[k]}" for k in ("data_bytes", "stored_bytes", "dedup_ratio", "unique_bytes", "chunks", "packs")))'
}
for run in $(seq "$DEDUP_RUNS"); do
    new_volume "$VOL"
    for copy in 1 2; do
        name=$([[ $copy == 1 ]] && echo a.bin || echo b.bin)
        mount_volume "$VOL" "$MNT"
        dd if="$SRC" of="$MNT/$name" bs=1M count="$DEDUP_MIB" conv=fsync status=none
        umount_volume "$MNT"
        f=$(stats_fields "$VOL")
        log "4. dedup run $run/$DEDUP_RUNS copy $copy: $f"
        record kind=dedup run="$run" copy="$copy" bytes=$((DEDUP_MIB << 20)) $f
    done
    rm -rf "$VOL"
done

# --- report ---------------------------------------------------------------------
TOTAL="$((SECONDS / 60))m $((SECONDS % 60))s"
log "writing $OUT (run took $TOTAL)"
q=(); [[ $QUICK == 1 ]] && q=(--quick)
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
python3 "$BENCH_DIR/fsbench.py" report --results "$RESULTS" --ingest "$SCRATCH/ingest.json" --out "$OUT" \
    --date "$START_DATE" --total "$TOTAL" --scratch-desc "$SCRATCH_DESC" --load "$LOAD (start), $LOAD_END (end)" \
    --git "$GIT_DESC" "${q[@]}"
if [[ -n $KEEP ]]; then
    mkdir -p "$KEEP"
    cp "$RESULTS" "$SCRATCH/ingest.json" "$KEEP/"
    log "raw results in $KEEP"
fi
log "done: $OUT"
