#!/usr/bin/env bash
# Rewrite soak (issue 55): an fsx-like workload on one file of at most
# 256 KiB (random writes, truncates, punched holes, clones within the file
# by copy_file_range, reads checked against a model, an fsync every few
# operations) through a real mount, for N minutes, on a volume in a
# directory, in a bucket (moto) and shared (metadata in PostgreSQL, packs in
# moto). Every minute it records, per volume: live bytes, stored bytes,
# dead bytes and the cleaner's bound (`cairn stats --json` through the
# mount), packs, metadata size (SQLite database + WAL, or the schema's
# relations in PostgreSQL), the daemon's RSS, and the workload's operations
# in that minute. Not part of the README's test command.
#
# Targets (issue 55): stored <= 2 x live + 256 MiB; packs <= 1,000 +
# live / 4 MiB; RSS <= 256 MB + the configured cache budgets (--cache-size,
# 256 MiB by default); all flat over the last 10 minutes. The script prints
# the table, then a line per target and volume with PASS or FAIL, and exits
# non-zero if any failed.
#
#   scripts/soak-rewrite.sh [--minutes 30] [--kinds local,bucket,shared]
#                           [--parallel] [--cairn target/release/cairn]
#                           [--out DIR] [--cleaner on|off]
#                           [-- EXTRA MOUNT ARGS]
#
# --kinds takes any of local (a directory), bucket (moto) and shared
# (PostgreSQL + moto), one after the other; --parallel runs them at once
# (one moto and one PostgreSQL for all; the operation rates then share the
# machine's cores). --cleaner off mounts with --gc-interval 0.
#
# Needs: python3; for bucket and shared moto_server (pip install
# 'moto[server]') and curl; for shared PostgreSQL's server binaries
# (apt-get install postgresql) and psql. Runs as root (FUSE, initdb via
# runuser). Everything it starts is stopped by PID at exit.
set -euo pipefail

MINUTES=30
KINDS=local,bucket,shared
HERE=$(cd "$(dirname "$0")/.." && pwd)
CAIRN=$HERE/target/release/cairn
OUT=
CLEANER=on
PARALLEL=0
EXTRA=()
while (($#)); do
    case $1 in
        --minutes) MINUTES=$2; shift 2 ;;
        --kinds) KINDS=$2; shift 2 ;;
        --cairn) CAIRN=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --cleaner) CLEANER=$2; shift 2 ;;
        --parallel) PARALLEL=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "usage: $0 [--minutes N] [--kinds local,bucket,shared] [--cairn BIN] [--out DIR] [--cleaner on|off] [--parallel] [-- MOUNT ARGS]" >&2; exit 2 ;;
    esac
done
[[ -x $CAIRN ]] || { echo "no cairn binary at $CAIRN (cargo build --release -p cairn-cli)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/soak-rewrite.XXXXXX)}
mkdir -p "$OUT"
chmod 711 "$OUT"
log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

PIDS=() MNTS=()
cleanup() {
    local m p
    for m in "${MNTS[@]}"; do
        mountpoint -q "$m" && { "$CAIRN" umount "$m" >/dev/null 2>&1 || fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }
    done
    for p in "${PIDS[@]}"; do
        kill -INT "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- servers -------------------------------------------------------------------
MOTO_EP= PG_PORT= PG_BIN=
start_moto() {
    [[ -n $MOTO_EP ]] && return
    command -v moto_server >/dev/null || die "bucket and shared volumes need moto_server: pip install 'moto[server]'"
    local port i
    port=$(free_port)
    moto_server -H 127.0.0.1 -p "$port" > "$OUT/moto.log" 2>&1 &
    PIDS+=("$!")
    MOTO_EP=http://127.0.0.1:$port
    for i in $(seq 100); do curl -s -o /dev/null "$MOTO_EP/" && break; sleep 0.1; done
    curl -s -o /dev/null "$MOTO_EP/" || die "moto_server does not answer"
    export AWS_ACCESS_KEY_ID=soak AWS_SECRET_ACCESS_KEY=soak AWS_REGION=us-east-1
}
psql_su() { psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "${2:-postgres}" -c "$1"; }
start_pg() {
    [[ -n $PG_PORT ]] && return
    local d i
    for d in /usr/lib/postgresql/*/bin; do [[ -x $d/initdb ]] && PG_BIN=$d; done
    [[ -n $PG_BIN ]] || die "the shared volume needs PostgreSQL: apt-get install postgresql"
    mkdir -p "$OUT/pg/sock"
    chown -R postgres:postgres "$OUT/pg"
    (cd "$OUT/pg" && runuser -u postgres -- "$PG_BIN/initdb" -D "$OUT/pg/data" -A trust -U postgres -E UTF8 --locale=C --no-sync) > "$OUT/pg-initdb.log" 2>&1 || die "initdb failed ($OUT/pg-initdb.log)"
    PG_PORT=$(free_port)
    (cd "$OUT/pg" && exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$PG_BIN/postgres" -D "$OUT/pg/data" \
        -c listen_addresses=127.0.0.1 -p "$PG_PORT" -c "unix_socket_directories=$OUT/pg/sock") > "$OUT/pg.log" 2>&1 &
    PIDS+=("$!")
    for i in $(seq 300); do psql_su 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
    psql_su 'SELECT 1' >/dev/null || die "postgres does not answer ($OUT/pg.log)"
    psql_su 'CREATE DATABASE soak'
}

# --- the workload: fsx-like, on one file --------------------------------------
WORKLOAD=$OUT/fsxlike.py
cat > "$WORKLOAD" <<'EOF'
# fsx-like: random operations on one file of at most MAX bytes, every read
# checked against a model of the file; an fsync every FSYNC operations.
# Prints the operation count to COUNT every second. Stops at DEADLINE.
import ctypes, os, random, sys, time
path, count_file, deadline = sys.argv[1], sys.argv[2], float(sys.argv[3])
MAX, FSYNC = 256 << 10, 8
libc = ctypes.CDLL("libc.so.6", use_errno=True)
PUNCH, KEEP = 0x02, 0x01
rng = random.Random(55)
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
model = bytearray()
ops, last = 0, time.time()
def check(off, n):
    got = os.pread(fd, n, off)
    want = bytes(model[off:off + n])
    if got != want:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        sys.exit(f"MISMATCH after {ops} ops: read {n} at {off}: first difference at +{i} (got {len(got)} bytes, want {len(want)})")
while time.time() < deadline:
    op = rng.random()
    size = len(model)
    if op < 0.40:  # write
        off = rng.randrange(0, MAX - 1)
        n = min(rng.randrange(1, 64 << 10), MAX - off)
        data = os.urandom(n)
        os.pwrite(fd, data, off)
        if off > size:
            model.extend(b"\0" * (off - size))
        model[off:off + n] = data
    elif op < 0.70:  # read
        if size:
            off = rng.randrange(0, size)
            check(off, min(rng.randrange(1, 64 << 10), size - off))
    elif op < 0.80:  # truncate
        n = rng.randrange(0, MAX)
        os.ftruncate(fd, n)
        if n < size:
            del model[n:]
        else:
            model.extend(b"\0" * (n - size))
    elif op < 0.90:  # punch a hole
        if size > 1:
            off = rng.randrange(0, size - 1)
            n = min(rng.randrange(1, 64 << 10), size - off)
            if libc.fallocate(fd, PUNCH | KEEP, ctypes.c_long(off), ctypes.c_long(n)) != 0:
                sys.exit(f"fallocate: {os.strerror(ctypes.get_errno())}")
            model[off:off + n] = b"\0" * n
    else:  # clone a range within the file (copy_file_range), not overlapping
        if size > 8192:
            n = rng.randrange(1, min(64 << 10, size // 2))
            src = rng.randrange(0, size - n)
            dst = rng.randrange(0, MAX - n)
            if src + n <= dst or dst + n <= src:
                done = os.copy_file_range(fd, fd, n, src, dst)
                data = bytes(model[src:src + done])
                if dst > len(model):
                    model.extend(b"\0" * (dst - len(model)))
                model[dst:dst + done] = data
    ops += 1
    if ops % FSYNC == 0:
        os.fsync(fd)
    if time.time() - last >= 1:
        last = time.time()
        with open(count_file + ".tmp", "w") as f:
            f.write(str(ops))
        os.replace(count_file + ".tmp", count_file)
check(0, len(model))
os.close(fd)
with open(count_file, "w") as f:
    f.write(str(ops))
print(ops)
EOF

# --- one volume --------------------------------------------------------------
# soak KIND: init, mount -f in the background, run the workload, sample
# every minute into $OUT/KIND.tsv, unmount, fsck.
soak() {
    local kind=$1
    local dir=$OUT/$kind/vol mnt=$OUT/$kind/mnt vol meta_args=() init_args=() pid wpid t0 i
    rm -rf "$OUT/$kind"
    mkdir -p "$dir" "$mnt"
    case $kind in
        local) vol=$dir ;;
        bucket) start_moto; curl -s -X PUT "$MOTO_EP/soak-bucket" >/dev/null; vol=s3://soak-bucket/v; init_args=(--endpoint "$MOTO_EP" --cache-dir "$dir") ;;
        shared) start_moto; start_pg; curl -s -X PUT "$MOTO_EP/soak-shared" >/dev/null; vol=s3://soak-shared/v; init_args=(--endpoint "$MOTO_EP" --cache-dir "$dir"); meta_args=(--meta "postgres://postgres@127.0.0.1:$PG_PORT/soak") ;;
        *) die "unknown kind $kind" ;;
    esac
    if [[ $kind == local ]]; then
        rmdir "$dir"
        "$CAIRN" init "$dir" >/dev/null
    else
        "$CAIRN" init "$vol" "${init_args[@]}" "${meta_args[@]}" >/dev/null
    fi
    local mount_args=(-f)
    [[ $kind != local ]] && mount_args+=(--cache-dir "$dir")
    [[ $CLEANER == off ]] && mount_args+=(--gc-interval 0)
    "$CAIRN" mount "$vol" "$mnt" "${mount_args[@]}" "${meta_args[@]}" "${EXTRA[@]}" > "$OUT/$kind/mount.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    MNTS+=("$mnt")
    for i in $(seq 200); do mountpoint -q "$mnt" && break; sleep 0.1; done
    mountpoint -q "$mnt" || die "$kind: not mounted (see $OUT/$kind/mount.log)"
    local deadline
    deadline=$(python3 -c "import time; print(time.time() + $MINUTES * 60)")
    python3 "$WORKLOAD" "$mnt/file" "$OUT/$kind/ops" "$deadline" > "$OUT/$kind/workload.log" 2>&1 &
    wpid=$!
    log "$kind: mounted (daemon $pid), workload running for $MINUTES minutes"
    printf 'minute\tops\tlive_bytes\tstored_bytes\tdead_bytes\tdead_bound\tpacks\tsmall_packs\tmeta_bytes\trss_bytes\n' > "$OUT/$kind.tsv"
    local prev=0 m=0
    t0=$(date +%s)
    while kill -0 "$wpid" 2>/dev/null; do
        m=$((m + 1))
        while (($(date +%s) < t0 + 60 * m)) && kill -0 "$wpid" 2>/dev/null; do sleep 1; done
        kill -0 "$wpid" 2>/dev/null || break
        sample "$kind" "$m" "$mnt" "$dir" "$pid" "$prev" >> "$OUT/$kind.tsv"
        prev=$(cat "$OUT/$kind/ops" 2>/dev/null || echo 0)
    done
    wait "$wpid" || die "$kind: the workload failed: $(tail -n 3 "$OUT/$kind/workload.log")"
    # The daemon's CPU seconds (user + system) while the workload ran: with
    # the cleaner off and on, what the cleaner costs per operation in CPU,
    # a figure a loaded machine disturbs less than the operation rate
    # (bench/cleaner-cost.sh).
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f\n", ($14 + $15) / hz }' "/proc/$pid/stat" > "$OUT/$kind/daemon_cpu"
    "$CAIRN" umount "$mnt" >/dev/null || die "$kind: umount failed"
    wait "$pid" 2>/dev/null || true
    local fsck_args=()
    [[ $kind != local ]] && fsck_args=(--cache-dir "$dir")
    "$CAIRN" fsck "$vol" "${fsck_args[@]}" "${meta_args[@]}" > "$OUT/$kind/fsck.log" 2>&1 || die "$kind: fsck failed: $(tail -n 5 "$OUT/$kind/fsck.log")"
    log "$kind: done, fsck clean"
}

# sample KIND MINUTE MNT DIR PID PREV_OPS: one row of the table.
sample() {
    local kind=$1 m=$2 mnt=$3 dir=$4 pid=$5 prev=$6 stats ops meta rss
    stats=$("$CAIRN" stats "$mnt" --json)
    ops=$(cat "$OUT/$kind/ops" 2>/dev/null || echo 0)
    if [[ $kind == shared ]]; then
        meta=$(psql_su "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)),0) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname LIKE 'cairn_%' AND c.relkind IN ('r','m')" soak)
    else
        meta=$(( $(stat -c %s "$dir/meta.sqlite") + $(stat -c %s "$dir/meta.sqlite-wal" 2>/dev/null || echo 0) ))
    fi
    rss=$(( $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status") * 1024 ))
    python3 - "$m" "$((ops - prev))" "$meta" "$rss" "$stats" <<'EOF'
import json, sys
m, ops, meta, rss, s = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
print("\t".join(str(x) for x in [m, ops, s["live_stored_bytes"], s["stored_bytes"], s["dead_bytes"], s.get("dead_bound", ""), s["packs"], s.get("small_packs", ""), meta, rss]))
EOF
}

# The memory cache of decoded chunks the mounts run with (--cache-size, or
# the default: a sixteenth of the RAM, 256 MiB to 1 GiB), for the RSS target.
CACHE_BYTES=$(python3 - "${EXTRA[@]}" <<'EOF'
import os, sys
a = sys.argv[1:]
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
for i, x in enumerate(a):
    v = x.split("=", 1)[1] if x.startswith("--cache-size=") else (a[i + 1] if x == "--cache-size" and i + 1 < len(a) else None)
    if v:
        print(int(float(v[:-1]) * units[v[-1].upper()]) if v[-1].upper() in units else int(v))
        sys.exit()
ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGESIZE")
print(min(max(ram // 16, 256 << 20), 1 << 30))
EOF
)
IFS=, read -r -a KIND_LIST <<< "$KINDS"
if ((PARALLEL)); then
    # The servers first, shared by every kind; then each kind in a
    # subshell of its own, which unmounts and stops what it started.
    for k in "${KIND_LIST[@]}"; do
        case $k in
            bucket) start_moto ;;
            shared) start_moto; start_pg ;;
        esac
    done
    KPIDS=()
    for k in "${KIND_LIST[@]}"; do
        ( PIDS=() MNTS=(); trap cleanup EXIT; soak "$k" ) &
        KPIDS+=("$!")
    done
    failed=0
    for p in "${KPIDS[@]}"; do
        wait "$p" || failed=1
    done
    ((failed == 0)) || die "a soak failed (see above)"
else
    for k in "${KIND_LIST[@]}"; do
        soak "$k"
    done
fi

# --- the table and the targets --------------------------------------------------
python3 - "$OUT" "$CLEANER" "$CACHE_BYTES" "${KIND_LIST[@]}" <<'EOF'
import sys
out, cleaner, cache, kinds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
MiB = 1 << 20
def h(b):
    b = float(b)
    for u in ["B", "KiB", "MiB", "GiB"]:
        if b < 1024 or u == "GiB":
            return f"{b:.1f} {u}" if u != "B" else f"{int(b)} B"
        b /= 1024
ok = True
for k in kinds:
    rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/{k}.tsv")][1:]
    total = open(f"{out}/{k}/ops").read().strip()
    print(f"\n{k} (cleaner {cleaner}): {int(total):,} operations in all\n")
    print("| min | ops/min | live | stored | dead | dead bound | packs | small | metadata | RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m, ops, live, stored, dead, bound, packs, small, meta, rss = r
        print(f"| {m} | {int(ops):,} | {h(live)} | {h(stored)} | {h(dead)} | {h(bound) if bound else '-'} | {int(packs):,} | {small} | {h(meta)} | {int(rss) / 1e6:.0f} MB |")
    if not rows:
        continue
    last = rows[-10:]
    def flat(col):
        # flat: no upward trend over the last ten samples: the mean of
        # their last five within 10% (or a slack: 16 MiB of bytes, 80 packs,
        # as the cleaner merges small packs once 64 are there) of the mean
        # of their first five
        v = [int(r[col]) for r in last]
        a, b = v[: len(v) // 2] or v, v[len(v) // 2 :]
        slack = 80 if col == 6 else 16 * MiB
        return sum(b) / len(b) <= 1.1 * sum(a) / len(a) + slack
    live, stored, packs, rss = (int(rows[-1][i]) for i in (2, 3, 6, 9))
    checks = [
        ("stored <= 2 x live + 256 MiB", stored <= 2 * live + 256 * MiB),
        ("packs <= 1,000 + live / 4 MiB", packs <= 1000 + live // (4 * MiB)),
        (f"RSS <= 256 MB + {cache // MiB} MiB cache", rss <= 256e6 + cache),
        ("stored flat over the last 10 minutes", flat(3)),
        ("packs flat over the last 10 minutes", flat(6)),
        ("RSS flat over the last 10 minutes", flat(9)),
    ]
    for what, good in checks:
        ok &= good
        print(f"{k}: {what}: {'PASS' if good else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
