# Section 15 of bench/run.sh: volumes on tape (issue 15; seed 002 HPTFS §VI,
# tables II, III, VI/VII, VIII). Sourced by run.sh after lib.sh; uses its
# variables (CAIRN, SCRATCH, MNT, RND, PY, BENCH_DIR, TP_*) and helpers
# (record, log, die, now, elapsed, need_rnd, umount_volume, peak_rss_kib).
# Helpers in Python: bench/tape.py (it also renders the section).
#
# Every tape is the emulated drive (`tape-emu:DIR`) with its default
# parameters (an LTO-9 scaled by 0.2: 80 MB/s native, 35.4 MB/s slowest
# matching speed, 3 s locates and backhitches; docs/tape.md B3), on the
# REAL clock: positioning and streaming take the time they model. Each
# measurement gets a fresh tape. Volumes are not encrypted (as HPTFS).
#
#  raw     the drive through the device API, no file system: `cairn tape dd
#          --to` of TP_RAW_MIB from the random file, and `--from` back to
#          /dev/null (the paper's dd to and from /dev/nst0). The reference
#          rate of every ratio.
#  II      n = 1..4 concurrent `dd` writers of TP_FILE_MIB each into a mount
#          (different random data each); time from the first write to the
#          end of `cairn umount` (every byte on tape, catalog written); the
#          drive's backhitches, streaming and idle time from the emulator's
#          session record; the daemon's peak RSS.
#  III     each of those tapes mounted on a fresh cache directory (a machine
#          with only the tape) and ONE file (w0) read with dd: rate from
#          open to last byte. Interleave n = the n files written at once.
#  VI/VII  a PostMark-like set: TP_PM_FILES files of TP_PM_MIN..TP_PM_MAX
#          KiB written with one writer (through the mount, then umount);
#          TP_PM_READS random whole files read back on a fresh cache
#          directory with the reads issued in batches of b concurrent
#          requests (b = 1 is FIFO: one at a time, in the random order).
#  tar     the conventional way: GNU tar of the n=4 files streamed to a
#          fresh tape with `cairn tape dd --to` (one stream, no file
#          system), and one member read back with `cairn tape dd --from |
#          tar -x` vs the mount's cold read of the same file.
# Table VIII (the CDP mirror's write rate) runs when `cairn mount` has
# --mirror.

TP=("${PY[@]}" "$BENCH_DIR/tape.py")

tape_check_tools() {
    local t
    for t in tar dd; do
        command -v "$t" >/dev/null || die "section tape needs $t"
    done
}

tp_url() { echo "tape-emu:$SCRATCH/tp-$1"; }

# tp_session NAME: the emulator's record of the drive's last session, as
# JSON (written when the drive closed).
tp_session() { "${TP[@]}" session "$SCRATCH/tp-$1"; }

tp_mount() { # NAME CACHE [more mount options]: mount the tape volume NAME with local directory CACHE
    local name=$1 cache=$2 i
    shift 2
    mkdir -p "$MNT"
    "$CAIRN" mount "$(tp_url "$name")" "$MNT" --cache-dir "$cache" "$@" || die "mounting tape $name"
    MOUNTS+=("$MNT")
    for i in $(seq 300); do mountpoint -q "$MNT" && break; sleep 0.1; done
    mountpoint -q "$MNT" || die "tape $name did not get mounted"
    DAEMON[$MNT]=$(pgrep -f -- "cairn mount $(tp_url "$name") $MNT( |\$)" | head -n 1)
}

# A read-write mount moves the tape to its append point once the drive
# has been idle 0.5 s after the mount's own reads (a 3 s locate on a fresh
# tape; docs/tape.md §2). The write tables start their clock after it, as
# the paper's dd runs against a drive already positioned; a write issued
# sooner waits for that locate.
TP_SETTLE=${TP_SETTLE:-4}
# A read-only mount moves the idle drive from the end of data (where the
# catalog is) to the first data (docs/tape.md §8): on a full 2 GB tape a
# locate of up to 25 s. Table III opens its file after it, as a restore
# started a while after the mount would.
TP_SETTLE_READ=${TP_SETTLE_READ:-30}
# Between two reads of table III, long enough for the drive to stop (it
# reads ahead until its 205 MiB buffer is full: 2.6 s at 80 MB/s), as
# HPTFS waited until "the tape drive has been fully stopped".
TP_READ_GAP=${TP_READ_GAP:-5}

tp_init() { # NAME CACHE: a fresh tape and volume
    rm -rf "$SCRATCH/tp-$1" "$2"
    "$CAIRN" init "$(tp_url "$1")" --cache-dir "$2" >/dev/null || die "cairn init $(tp_url "$1")"
}

section_tape() {
local run n i t0 t1 t2 s r pid rss name file_bytes mode b order
log "15. tape: emulated drive (default parameters, real clock); raw $TP_RAW_MIB MiB, writers of $TP_FILE_MIB MiB x 1..$TP_MAX_WRITERS, PostMark-like $TP_PM_FILES files, $TP_RUNS run(s)"
need_rnd $(( TP_RAW_MIB > TP_FILE_MIB * TP_MAX_WRITERS ? TP_RAW_MIB : TP_FILE_MIB * TP_MAX_WRITERS ))
file_bytes=$((TP_FILE_MIB << 20))
record kind=tape_setup raw_bytes=$((TP_RAW_MIB << 20)) file_bytes="$file_bytes" max_writers="$TP_MAX_WRITERS" runs="$TP_RUNS" read_gap="$TP_READ_GAP" \
    pm_files="$TP_PM_FILES" pm_min_kib="$TP_PM_MIN" pm_max_kib="$TP_PM_MAX" pm_reads="$TP_PM_READS" pm_batches="$TP_PM_BATCHES" \
    "$("${TP[@]}" params)"
cmd tape "cairn tape dd --create --to tape-emu:T < rnd.bin; cairn tape dd --from tape-emu:T > /dev/null   # raw drive rate"
cmd tape "cairn init tape-emu:T --cache-dir A; cairn mount tape-emu:T $MNT --cache-dir A"
cmd tape "sleep $TP_SETTLE   # the mount moves the tape to its append point"
cmd tape "for i in 0..n-1: dd if=rnd.bin of=$MNT/w\$i bs=1M count=$TP_FILE_MIB skip=\$((i*$TP_FILE_MIB))) &   # then: wait; cairn umount $MNT (timed to here)"
cmd tape "cairn mount tape-emu:T $MNT --cache-dir FRESH --read-only; cairn umount $MNT   # mounting a full tape on a machine with only it (timed to the mount)"
cmd tape "cairn mount tape-emu:T $MNT --cache-dir FRESH --read-only; sleep $TP_SETTLE_READ; for i in 0..n-1: python3 bench/tape.py read-file $MNT/w\$i; sleep $TP_READ_GAP   # table III: the files back one by one (1 MiB reads), each timed from its open"
cmd tape "python3 bench/tape.py pm-write $MNT $TP_PM_FILES $TP_PM_MIN $TP_PM_MAX SEED; cairn umount   # then per batch size b, on a fresh cache dir:"
cmd tape "python3 bench/tape.py pm-read $MNT $TP_PM_FILES $TP_PM_READS b SEED   # b concurrent whole-file reads at a time"
cmd tape "tar -cf - w0 w1 w2 w3 | cairn tape dd --create --to tape-emu:T2; cairn tape dd --from tape-emu:T2 | tar --occurrence=1 -xf - w0   # the conventional way"

for run in $(seq "$TP_RUNS"); do
    # --- raw rate through the device API
    name=raw-$run
    rm -rf "$SCRATCH/tp-$name"
    t0=$(now)
    head -c $((TP_RAW_MIB << 20)) "$RND" | "$CAIRN" tape dd --create --to "$(tp_url "$name")" 2>"$SCRATCH/tp-dd.err" || die "tape dd --to: $(cat "$SCRATCH/tp-dd.err")"
    t1=$(now)
    s=$(tp_session "$name")
    "$CAIRN" tape dd --from "$(tp_url "$name")" 2>"$SCRATCH/tp-dd.err" > /dev/null || die "tape dd --from: $(cat "$SCRATCH/tp-dd.err")"
    t2=$(now)
    record kind=tape_raw run="$run" bytes=$((TP_RAW_MIB << 20)) write_seconds="$(elapsed "$t0" "$t1")" read_seconds="$(elapsed "$t1" "$t2")" \
        "{\"write_session\": $s, \"read_session\": $(tp_session "$name")}"
    log "15. tape raw run $run: write $(elapsed "$t0" "$t1") s, read $(elapsed "$t1" "$t2") s for $TP_RAW_MIB MiB"
    rm -rf "$SCRATCH/tp-$name"

    # --- table II (n writers) and III (one file back)
    for n in $(seq "$TP_MAX_WRITERS"); do
        name=w$n-$run
        tp_init "$name" "$SCRATCH/tp-cache-a"
        tp_mount "$name" "$SCRATCH/tp-cache-a"
        pid=${DAEMON[$MNT]}
        sleep "$TP_SETTLE"
        # The daemon's peak until it exits: most of the flush is in the
        # unmount, after the writers are done.
        rm -f "$SCRATCH/tp-rss"
        watch_peak_rss "$pid" "$SCRATCH/tp-rss" &
        watcher=$!
        t0=$(now)
        writers=()
        for i in $(seq 0 $((n - 1))); do
            dd if="$RND" of="$MNT/w$i" bs=1M count="$TP_FILE_MIB" skip=$((i * TP_FILE_MIB)) status=none &
            writers+=($!)
        done
        wait "${writers[@]}"
        t1=$(now)
        umount_volume "$MNT"
        t2=$(now)
        wait "$watcher"
        rss=$(cat "$SCRATCH/tp-rss")
        s=$(tp_session "$name")
        record kind=tape_write run="$run" writers="$n" bytes=$((n * file_bytes)) dd_seconds="$(elapsed "$t0" "$t1")" \
            seconds="$(elapsed "$t0" "$t2")" peak_rss_kib="$rss" "{\"session\": $s}"
        log "15. tape II run $run, $n writer(s): dd $(elapsed "$t0" "$t1") s, on tape $(elapsed "$t0" "$t2") s"
        rm -rf "$SCRATCH/tp-cache-a" "$SCRATCH/tp-cache-b"
        # Mounting the tape on a machine that has only it: the mount alone
        # (fresh cache directory, unmounted at once), then table III on a
        # read-only mount (a restore), whose idle drive waits at the first
        # data; the read is timed from the open.
        t0=$(now)
        tp_mount "$name" "$SCRATCH/tp-cache-m" --read-only
        t1=$(now)
        umount_volume "$MNT"
        record kind=tape_mount run="$run" writers="$n" bytes=$((n * file_bytes)) seconds="$(elapsed "$t0" "$t1")" "{\"session\": $(tp_session "$name")}"
        log "15. tape mount run $run, $n writer(s): $(elapsed "$t0" "$t1") s"
        rm -rf "$SCRATCH/tp-cache-m"
        tp_mount "$name" "$SCRATCH/tp-cache-b" --read-only
        sleep "$TP_SETTLE_READ"
        # As HPTFS measured table III: the files read one by one, the drive
        # stopped between two reads, each timed from its open; w0 first.
        order=$("${TP[@]}" tape-order "$CAIRN" $(seq -f "$MNT/w%g" 0 $((n - 1)))) || die "tape order of the w files"
        for i in $(seq 0 $((n - 1))); do
            [[ $i == 0 ]] || sleep "$TP_READ_GAP"
            r=$("${TP[@]}" read-file "$MNT/w$i") || die "reading w$i"
            cmp -n "$file_bytes" <(tail -c +$((i * file_bytes + 1)) "$RND") "$MNT/w$i" > /dev/null || die "tape: w$i read back differs"
            record kind=tape_read run="$run" interleave="$n" file="$i" "$r" "{\"tape_order\": $order}"
            log "15. tape III run $run, interleave $n, w$i: $r"
        done
        umount_volume "$MNT"
        record kind=tape_read_session run="$run" interleave="$n" "{\"session\": $(tp_session "$name"), \"tape_order\": $order}"
        log "15. tape III run $run, interleave $n: tape order $order"
        rm -rf "$SCRATCH/tp-cache-b"
        if [[ $n != "$TP_MAX_WRITERS" ]]; then rm -rf "$SCRATCH/tp-$name"; fi
    done

    # --- the conventional way: tar to the raw drive, one member back
    name=tar-$run
    rm -rf "$SCRATCH/tp-$name" "$SCRATCH/tp-files"
    mkdir -p "$SCRATCH/tp-files"
    for i in $(seq 0 $((TP_MAX_WRITERS - 1))); do
        dd if="$RND" of="$SCRATCH/tp-files/w$i" bs=1M count="$TP_FILE_MIB" skip=$((i * TP_FILE_MIB)) status=none
    done
    sync
    t0=$(now)
    (cd "$SCRATCH/tp-files" && tar -cf - $(seq -f 'w%g' 0 $((TP_MAX_WRITERS - 1)))) | "$CAIRN" tape dd --create --to "$(tp_url "$name")" 2>/dev/null || die "tar | tape dd"
    t1=$(now)
    rm -rf "$SCRATCH/tp-files"; mkdir -p "$SCRATCH/tp-files"
    # w0 is the archive's first member and tar stops after it (its best
    # case); tape dd then ends on the closed pipe.
    { "$CAIRN" tape dd --from "$(tp_url "$name")" 2>/dev/null || true; } | tar -C "$SCRATCH/tp-files" --occurrence=1 -xf - w0 || die "tape dd | tar -x"
    t2=$(now)
    cmp -n "$file_bytes" "$RND" "$SCRATCH/tp-files/w0" > /dev/null || die "tape: tar's w0 differs"
    record kind=tape_tar run="$run" files="$TP_MAX_WRITERS" bytes=$((TP_MAX_WRITERS * file_bytes)) write_seconds="$(elapsed "$t0" "$t1")" \
        member_bytes="$file_bytes" member_seconds="$(elapsed "$t1" "$t2")"
    log "15. tape tar run $run: write $(elapsed "$t0" "$t1") s, one member back $(elapsed "$t1" "$t2") s"
    rm -rf "$SCRATCH/tp-files" "$SCRATCH/tp-$name" "$SCRATCH/tp-w$TP_MAX_WRITERS-$run"

    # --- table VIII: the CDP mirror against tape only (one writer)
    if "$CAIRN" mount --help | grep -q -- '--mirror'; then
        for mode in tape mirror; do
            name=cdp-$mode-$run
            tp_init "$name" "$SCRATCH/tp-cache-a"
            if [[ $mode == mirror ]]; then tp_mount "$name" "$SCRATCH/tp-cache-a" --mirror "$SCRATCH/tp-mirror"; else tp_mount "$name" "$SCRATCH/tp-cache-a"; fi
            sleep "$TP_SETTLE"
            t0=$(now)
            dd if="$RND" of="$MNT/w0" bs=1M count="$TP_FILE_MIB" status=none
            umount_volume "$MNT"
            t1=$(now)
            record kind=tape_cdp run="$run" mode="$mode" bytes="$file_bytes" seconds="$(elapsed "$t0" "$t1")" "{\"session\": $(tp_session "$name")}"
            log "15. tape VIII run $run, $mode: $(elapsed "$t0" "$t1") s"
            rm -rf "$SCRATCH/tp-$name" "$SCRATCH/tp-cache-a" "$SCRATCH/tp-mirror"
        done
    elif [[ $run == 1 ]]; then
        record kind=note text="15. tape: table VIII (CDP mirror) not measured: this cairn has no mount --mirror"
    fi
done

# --- tables VI/VII: PostMark-like whole-file reads, batch sizes vs FIFO (one set, read per batch size)
name=pm
tp_init "$name" "$SCRATCH/tp-cache-a"
tp_mount "$name" "$SCRATCH/tp-cache-a"
t0=$(now)
r=$("${TP[@]}" pm-write "$MNT" "$TP_PM_FILES" "$TP_PM_MIN" "$TP_PM_MAX" 15) || die "pm-write"
umount_volume "$MNT"
t1=$(now)
record kind=tape_pm_write seconds="$(elapsed "$t0" "$t1")" "$r" "{\"session\": $(tp_session "$name")}"
log "15. tape VI: $(json_get "$r" files) files, $(json_get "$r" bytes) bytes written in $(elapsed "$t0" "$t1") s"
rm -rf "$SCRATCH/tp-cache-a"
for b in $TP_PM_BATCHES; do
    rm -rf "$SCRATCH/tp-cache-b"
    tp_mount "$name" "$SCRATCH/tp-cache-b"
    r=$("${TP[@]}" pm-read "$MNT" "$TP_PM_FILES" "$TP_PM_READS" "$b" 16) || die "pm-read"
    umount_volume "$MNT"
    record kind=tape_pm_read batch="$b" "$r" "{\"session\": $(tp_session "$name")}"
    log "15. tape VII batch $b: $(json_get "$r" bytes) bytes in $(json_get "$r" seconds) s"
done
rm -rf "$SCRATCH/tp-cache-b" "$SCRATCH/tp-$name"
}
