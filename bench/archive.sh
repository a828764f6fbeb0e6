# Sections 9-11 of bench/run.sh: zero-copy tar archives (AvaTar, IEEE Access
# 2020, section IV: figure 3 and table 1) and archive mounts. Sourced by
# run.sh after lib.sh; uses its variables (CAIRN, PASSFILE, SCRATCH, EXT,
# VOL, MNT, PY, FSB, BENCH_DIR, QUICK) and helpers (record, cmd, log, die,
# drop_caches, new_volume, mount_volume, umount_volume, stored_bytes).
# Helpers in Python: bench/archive.py (it also renders these sections).
#
# A setup is FILES:MIB: FILES files of random bytes adding up to MIB MiB, in
# one directory `src`. Each timed operation starts uncached: the page cache is
# dropped before it, and a Cairn operation also gets a freshly mounted daemon
# (nothing of the volume in its memory either), as AvaTar's figure 3 is
# "uncached". Timing includes making the result durable: `sync -f` (syncfs)
# on ext4, `cairn stats` (which flushes and syncs the volume) on Cairn.

ARC=("${PY[@]}" "$BENCH_DIR/archive.py")

# cold_remount: a fresh daemon and no page cache (before each Cairn measurement)
cold_remount() {
    umount_volume "$MNT"
    mount_volume "$VOL" "$MNT"
    drop_caches
}

# arc_run WHAT FILES BYTES RUN METHOD PHASE ARGS...: archive.py run ARGS, recorded
arc_run() {
    local what=$1 files=$2 bytes=$3 run=$4 method=$5 phase=$6 r t=()
    shift 6
    # Section 9 times the command alone; section 10 wraps it to measure memory.
    [[ $what == arc ]] && t=(--timing-only)
    r=$("${ARC[@]}" run "${t[@]}" "$@")
    record kind="$what" files="$files" bytes="$bytes" run="$run" method="$method" phase="$phase" "$r"
    log "$SECTION $files files / $((bytes >> 20)) MiB run $run $method $phase: $(json_get "$r" total_seconds) s"
}

# archive_setup FILES MIB RUNS METHODS KIND: one setup of sections 9 and 10.
# METHODS: any of ext4 (GNU tar on ext4), cairn (cairn archive create/extract),
# tarfuse (GNU tar, default 10 KiB records, inside the mount), tarfuse1m
# (the same with 1 MiB records, -b 2048).
archive_setup() {
    local files=$1 mib=$2 runs=$3 methods=$4 what=$5 bytes=$(($2 << 20)) tree="$EXT/src" run m need pid b stats cap
    need=$((7 * bytes + (8 << 30)))
    if (($(free_bytes "$SCRATCH") < need)); then
        record kind=note text="Section $SECTION: the setup $files files / $mib MiB was skipped: $(($(free_bytes "$SCRATCH") >> 30)) GiB free in $SCRATCH_PARENT, it needs $((need >> 30)) GiB."
        log "$SECTION: skipping $files files / $mib MiB (not enough free space)"
        return 0
    fi
    log "$SECTION: $files files, $mib MiB in all, $runs runs: $methods"
    rm -rf "$tree"
    "${ARC[@]}" gentree "$tree" "$files" "$mib" > /dev/null
    new_volume "$VOL"
    mount_volume "$VOL" "$MNT"
    cp -a "$tree" "$MNT/src"
    stored_bytes "$VOL" > /dev/null
    stats="$CAIRN stats --json --passphrase-file $PASSFILE $VOL"
    for run in $(seq "$runs"); do
        for m in $methods; do
            # GNU tar inside the mount moves the data through FUSE at tens of
            # MiB/s: at most ARCHIVE_FUSE_RUNS runs, ARCHIVE_FUSE_RUNS_BIG
            # from ARCHIVE_BIG_MIB on.
            if [[ $m == tarfuse* ]]; then
                cap=$ARCHIVE_FUSE_RUNS
                ((mib >= ARCHIVE_BIG_MIB)) && cap=$ARCHIVE_FUSE_RUNS_BIG
                ((run > cap)) && continue
            fi
            case $m in
            ext4)
                drop_caches
                arc_run "$what" "$files" "$bytes" "$run" ext4 archive --sync-fs "$EXT" -- tar cf "$EXT/a.tar" -C "$EXT" src
                mkdir "$EXT/x"
                drop_caches
                arc_run "$what" "$files" "$bytes" "$run" ext4 extract --sync-fs "$EXT" -- tar xf "$EXT/a.tar" -C "$EXT/x"
                if [[ $run == 1 ]]; then  # not timed
                    diff -r "$tree" "$EXT/x/src" > /dev/null || die "GNU tar on ext4: $EXT/x/src differs from $tree"
                fi
                rm -rf "$EXT/x" "$EXT/a.tar"
                ;;
            cairn)
                cold_remount
                arc_run "$what" "$files" "$bytes" "$run" cairn archive --rss-pid "${DAEMON[$MNT]}" --then "$stats" -- \
                    "$CAIRN" archive create "$MNT/a.tar" -C "$MNT" src
                cold_remount
                arc_run "$what" "$files" "$bytes" "$run" cairn extract --rss-pid "${DAEMON[$MNT]}" --then "$stats" -- \
                    "$CAIRN" archive extract "$MNT/a.tar" "$MNT/x"
                if [[ $run == 1 ]]; then  # not timed: GNU tar reads the archive and finds the source's data and attributes; the extracted tree is the source
                    tar -d -f "$MNT/a.tar" -C "$EXT" > "$SCRATCH/tar-d.out" 2>&1 || { cat "$SCRATCH/tar-d.out" >&2; die "tar -d: $MNT/a.tar differs from $tree"; }
                    diff -r "$tree" "$MNT/x/src" > /dev/null || die "cairn archive extract: $MNT/x/src differs from $tree"
                fi
                rm -rf "$MNT/x" "$MNT/a.tar"
                ;;
            tarfuse|tarfuse1m)
                b=(); [[ $m == tarfuse1m ]] && b=(-b 2048)
                cold_remount
                arc_run "$what" "$files" "$bytes" "$run" "$m" archive --rss-pid "${DAEMON[$MNT]}" --then "$stats" -- \
                    tar "${b[@]}" -cf "$MNT/g.tar" -C "$MNT" src
                mkdir "$MNT/gx"
                cold_remount
                arc_run "$what" "$files" "$bytes" "$run" "$m" extract --rss-pid "${DAEMON[$MNT]}" --then "$stats" -- \
                    tar "${b[@]}" -xf "$MNT/g.tar" -C "$MNT/gx"
                if [[ $run == 1 ]]; then
                    diff -r "$tree" "$MNT/gx/src" > /dev/null || die "GNU tar in the mount ($m): $MNT/gx/src differs from $tree"
                fi
                rm -rf "$MNT/gx" "$MNT/g.tar"
                ;;
            esac
        done
        # not timed: free the dead packs of this run's archives
        umount_volume "$MNT"
        "$CAIRN" gc --passphrase-file "$PASSFILE" "$VOL" > /dev/null
        mount_volume "$VOL" "$MNT"
    done
    umount_volume "$MNT"
    rm -rf "$VOL" "$tree"
}

archive_cmds() { # SECTION METHODS
    local s=$1 m
    cmd "$s" "python3 bench/archive.py gentree $EXT/src FILES MIB    # FILES random files adding up to MIB MiB, on ext4"
    cmd "$s" "cairn init --encrypt --passphrase-file $PASSFILE $VOL; cairn mount $VOL $MNT --passphrase-file $PASSFILE; cp -a $EXT/src $MNT/src"
    cmd "$s" "# before every timed command: sync; echo 3 > /proc/sys/vm/drop_caches (and for Cairn, before that: cairn umount $MNT; cairn mount ...)"
    local t=""; [[ $s == archive ]] && t=" --timing-only"
    cmd "$s" "# every command is run by: python3 bench/archive.py run$t [--rss-pid DAEMON] --sync-fs DIR | --then 'cairn stats --json $VOL' -- COMMAND"
    for m in $2; do
        case $m in
        ext4)
            cmd "$s" "# (i) GNU tar on ext4, timed until syncfs returns"
            cmd "$s" "tar cf $EXT/a.tar -C $EXT src; sync -f $EXT"
            cmd "$s" "mkdir $EXT/x; tar xf $EXT/a.tar -C $EXT/x; sync -f $EXT" ;;
        cairn)
            cmd "$s" "# (ii) Cairn zero-copy, timed until cairn stats (flush + sync of the volume) returns"
            cmd "$s" "cairn archive create $MNT/a.tar -C $MNT src; cairn stats --json $VOL"
            cmd "$s" "cairn archive extract $MNT/a.tar $MNT/x; cairn stats --json $VOL" ;;
        tarfuse)
            cmd "$s" "# (iii) GNU tar inside the mount (source and archive in the volume), timed until cairn stats returns"
            cmd "$s" "tar cf $MNT/g.tar -C $MNT src; cairn stats --json $VOL"
            cmd "$s" "mkdir $MNT/gx; tar xf $MNT/g.tar -C $MNT/gx; cairn stats --json $VOL" ;;
        tarfuse1m)
            cmd "$s" "# (iv) the same with 1 MiB records instead of tar's default 10 KiB"
            cmd "$s" "tar -b 2048 -cf $MNT/g.tar -C $MNT src; cairn stats --json $VOL"
            cmd "$s" "mkdir $MNT/gx; tar -b 2048 -xf $MNT/g.tar -C $MNT/gx; cairn stats --json $VOL" ;;
        esac
    done
    cmd "$s" "# run 1 only, not timed: diff -r $EXT/src against each extracted tree; tar -d -f $MNT/a.tar -C $EXT"
    cmd "$s" "# after each run, not timed: cairn umount $MNT; cairn gc $VOL; cairn mount ..."
}

# --- 9. archive: AvaTar figure 3 ----------------------------------------------------
section_archive() {
local s f m methods="ext4 cairn tarfuse tarfuse1m"
log "9. archive: setups $ARCHIVE_SETUPS (files:MiB), $ARCHIVE_RUNS runs"
archive_cmds archive "$methods"
for s in $ARCHIVE_SETUPS; do
    f=${s%:*} m=${s#*:}
    archive_setup "$f" "$m" "$ARCHIVE_RUNS" "$methods" arc
done
}

# --- 10. memory: AvaTar table 1 ----------------------------------------------------
section_memory() {
local s f m methods="ext4 cairn"
log "10. memory: setups $MEMORY_SETUPS (files:MiB), $MEMORY_RUNS runs"
archive_cmds memory "$methods"
cmd memory "# memory: GNU tar's peak RSS is /usr/bin/time -f %M; the daemon's extra is max(VmHWM after 'echo 5 > /proc/PID/clear_refs', VmRSS sampled every 10 ms) - VmRSS before; page cache growth is Cached of /proc/meminfo after - before"
for s in $MEMORY_SETUPS; do
    f=${s%:*} m=${s#*:}
    archive_setup "$f" "$m" "$MEMORY_RUNS" "$methods" mem
done
}

# --- 11. mount: cairn archive mount vs ratarmount ------------------------------------
ratarmount_bin() {
    local d
    d=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
    if [[ -x $d/ratarmount ]]; then echo "$d/ratarmount"; else command -v ratarmount || true; fi
}

wait_unmounted() { # MNT
    local i
    for i in $(seq 600); do mountpoint -q "$1" || return 0; sleep 0.05; done
    die "$1 still mounted 30 s after unmounting"
}

section_mount() {
local tree="$EXT/src" arch="$EXT/m.tar" tm="$SCRATCH/tarmnt" cache="$SCRATCH/cache" rat ver run tool state r
rat=$(ratarmount_bin)
log "11. mount: $MOUNT_FILES files, $MOUNT_MIB MiB; $MOUNT_RUNS runs; ratarmount: ${rat:-not installed}"
"${ARC[@]}" gentree "$tree" "$MOUNT_FILES" "$MOUNT_MIB" > /dev/null
tar cf "$arch" -C "$EXT" src
sync -f "$EXT"
mkdir -p "$tm"
MOUNTS+=("$tm")  # cleanup unmounts it if the run dies
ver=none
[[ -n $rat ]] && ver=$("$rat" --version 2>/dev/null | sed -n 1p)
record kind=mount_setup files="$MOUNT_FILES" bytes=$((MOUNT_MIB << 20)) archive_bytes="$(stat -c %s "$arch")" ratarmount="$ver"
[[ -n $rat ]] || record kind=note text="Section 11: ratarmount is not installed (pip install ratarmount); only cairn archive mount was measured."
cmd mount "python3 bench/archive.py gentree $tree $MOUNT_FILES $MOUNT_MIB; tar cf $arch -C $EXT src    # the archive, on ext4"
cmd mount "# first mount: index removed before; second mount: the index the first one left. Before each: sync; echo 3 > /proc/sys/vm/drop_caches"
cmd mount "# each timed by python3 bench/archive.py mount-list $tm -- MOUNTCOMMAND: the command, until $tm is a mountpoint, then ls -lR $tm > /dev/null"
cmd mount "rm -rf $cache; XDG_CACHE_HOME=$cache cairn archive mount $arch $tm    # first; cairn umount $tm"
cmd mount "XDG_CACHE_HOME=$cache cairn archive mount $arch $tm    # second; cairn umount $tm"
cmd mount "rm -f $arch.index.sqlite; ratarmount $arch $tm    # first (index written beside the archive); ratarmount -u $tm"
cmd mount "ratarmount $arch $tm    # second; ratarmount -u $tm"
for run in $(seq "$MOUNT_RUNS"); do
    for tool in cairn ratarmount; do
        [[ $tool == ratarmount && -z $rat ]] && continue
        for state in first second; do
            if [[ $state == first ]]; then rm -rf "$cache" "$arch.index.sqlite"; fi
            drop_caches
            if [[ $tool == cairn ]]; then
                r=$(XDG_CACHE_HOME="$cache" "${ARC[@]}" mount-list "$tm" -- "$CAIRN" archive mount "$arch" "$tm")
            else
                r=$("${ARC[@]}" mount-list "$tm" -- "$rat" "$arch" "$tm")
            fi
            record kind=mount tool="$tool" state="$state" run="$run" "$r"
            log "11. mount run $run/$MOUNT_RUNS $tool $state: mount $(json_get "$r" mount_seconds) s, ls -lR $(json_get "$r" list_seconds) s"
            if [[ $run == 1 && $state == first ]]; then  # not timed
                diff -r "$tree" "$tm/src" > /dev/null || die "$tool: $tm/src differs from $tree"
            fi
            if [[ $tool == cairn ]]; then "$CAIRN" umount "$tm" > /dev/null; else "$rat" -u "$tm" > /dev/null 2>&1 || fusermount3 -u "$tm"; fi
            wait_unmounted "$tm"
        done
    done
done
if [[ -n $rat ]]; then
    r=$("${ARC[@]}" run -- "$rat" --version)
    record kind=mount_startup tool=ratarmount "$r"
fi
rm -rf "$tree" "$arch" "$arch.index.sqlite" "$cache"
}
