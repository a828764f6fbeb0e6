# Helpers for bench/run.sh: logging, timing, results, Cairn mounts, cleanup.
# Sourced, not run. Expects PY (the python command, an array), and CAIRN (the
# binary), SCRATCH, RESULTS and PASSFILE to be set by the caller.

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Seconds since the epoch with microseconds (bash 5, no fork).
now() { printf '%s' "$EPOCHREALTIME"; }
# elapsed T0 T1: T1 - T0 in seconds.
elapsed() { "${PY[@]}" -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.6f}")' "$1" "$2"; }

# record KEY=VALUE...: appends one JSON object to $RESULTS (values that look
# like numbers are stored as numbers; an argument starting with '{' is a JSON
# object merged in), tagged with the running section (section=$SECTION).
record() { "${PY[@]}" "$BENCH_DIR/fsbench.py" record "$RESULTS" ${SECTION:+section="$SECTION"} "$@"; }

# cmd SECTION COMMAND: remembers the exact command shown beside a table.
cmd() { record kind=cmd section="$1" cmd="$2"; }

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# --- Cairn volumes and mounts -------------------------------------------

MOUNTS=()            # Cairn mountpoints we mounted, for cleanup
LOOP_MOUNTS=()       # loop-mounted ext4 images, for cleanup
JFS_MOUNTS=()        # JuiceFS mountpoints (sections 12, 13), for cleanup; JUICEFS is its binary
SERVICE_PIDS=()      # servers a section started (section 13: the S3 server and its counting proxy), stopped after the unmounts
declare -A DAEMON=() # mountpoint -> PID of its daemon
UMOUNTED_AT=         # when the last umount_volume's `cairn umount` returned

new_volume() { # DIR: a fresh encrypted volume
    rm -rf "$1"
    "$CAIRN" init --encrypt --passphrase-file "$PASSFILE" "$1" >/dev/null
}

mount_volume() { # DIR MNT: mount (daemonised), wait until it is a mountpoint
    local dir=$1 mnt=$2 i pid
    mkdir -p "$mnt"
    "$CAIRN" mount "$dir" "$mnt" --passphrase-file "$PASSFILE"
    MOUNTS+=("$mnt")
    for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
    mountpoint -q "$mnt" || die "$mnt did not get mounted"
    pid=$(daemon_pid "$dir" "$mnt")
    [[ -n $pid ]] || die "no daemon found for $dir"
    DAEMON[$mnt]=$pid
}

daemon_pid() { # DIR MNT: PID of the process `cairn mount DIR MNT`
    pgrep -f -- "cairn mount $1 $2( |\$)" | head -n 1
}

peak_rss_kib() { # PID: VmHWM in KiB
    awk '/^VmHWM:/ {print $2}' "/proc/$1/status"
}

watch_peak_rss() { # PID FILE: keeps FILE at PID's VmHWM (KiB) until PID exits (run in the background)
    local v
    while v=$(awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null) && [[ -n $v ]]; do
        echo "$v" > "$2"
        sleep 0.05
    done
}

# is_daemon PID: the process is alive and still a `cairn mount` (not a
# reused PID).
is_daemon() { [[ $(tr '\0' ' ' 2>/dev/null < "/proc/$1/cmdline") == *"cairn mount "* ]]; }

umount_volume() { # MNT: unmount, wait for the flush (cairn umount) and for the daemon to exit
    local mnt=$1 pid=${DAEMON[$1]:-} i
    "$CAIRN" umount "$mnt" >/dev/null
    UMOUNTED_AT=$(now)
    # `cairn umount` returns once the volume lock is released; the process
    # lingers a little longer. Do not let it overlap the next measurement.
    if [[ -n $pid ]]; then
        for i in $(seq 600); do is_daemon "$pid" || break; sleep 0.05; done
        is_daemon "$pid" && log "warning: daemon $pid still running 30 s after cairn umount"
        unset "DAEMON[$mnt]"
    fi
    return 0
}

cleanup() {
    local rc=$? m p
    trap - EXIT INT TERM
    # JuiceFS first: its mountpoint may be one Cairn also used.
    for m in "${JFS_MOUNTS[@]}"; do
        if grep -q " $m fuse.juicefs " /proc/mounts; then
            log "cleanup: unmounting JuiceFS $m"
            "$JUICEFS" umount --force "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" 2>/dev/null || true
            for p in $(seq 100); do [[ -z $(pgrep -f -- "juicefs mount .* $m\$") ]] && break; sleep 0.05; done
        fi
        for p in $(pgrep -f -- "juicefs mount .* $m\$" || true); do
            log "cleanup: killing juicefs $p"
            kill "$p" 2>/dev/null || true
        done
    done
    for m in "${MOUNTS[@]}"; do
        if mountpoint -q "$m" 2>/dev/null; then
            log "cleanup: unmounting $m"
            "$CAIRN" umount --timeout 120 "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" 2>/dev/null || true
        fi
    done
    for m in "${LOOP_MOUNTS[@]}"; do
        if mountpoint -q "$m" 2>/dev/null; then
            log "cleanup: unmounting $m"
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        fi
    done
    for p in "${DAEMON[@]}"; do
        if is_daemon "$p"; then
            log "cleanup: killing daemon $p"
            kill "$p" 2>/dev/null || true
        fi
    done
    for p in "${SERVICE_PIDS[@]}"; do
        if kill -0 "$p" 2>/dev/null; then
            log "cleanup: stopping $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-60) (pid $p)"
            kill "$p" 2>/dev/null || true
        fi
    done
    if [[ -n "${SCRATCH:-}" && -d "$SCRATCH" ]]; then
        if grep -q " $SCRATCH/" /proc/mounts; then
            log "cleanup: something is still mounted under $SCRATCH; leaving it in place"
        else
            rm -rf "$SCRATCH"
        fi
    fi
    exit "$rc"
}
