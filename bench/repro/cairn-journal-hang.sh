#!/usr/bin/env bash
# Fixed in 75e8bad ("Flusher: hold back no tail under journal pressure"): on
# that build and later the writer finishes in ~10 s. Kept to check old builds.
#
# Reproduction of a Cairn hang found by bench/run.sh section 7: a write into
# the mount gets no answer, until something syncs the volume. It happens when
# a program inserts bytes the POSIX way: in one open of an existing file, it
# moves a tail longer than journal_limit (2 GiB) up, from the end backwards.
#
# What happens: the program's first write extends the file. While the file is
# open, each background flush holds back the file's last chunk (hold_tail in
# Volume::prepare). That chunk contains the first write, so committed_seq
# stays below it and the file's flushed_seq never advances. Journal::retire
# then keeps every segment from that write on, and once the journal holds
# 2 GiB, wait_for_journal_room blocks every write, for good. A sync
# (`cairn stats`: a flush with all=true, no held tail) commits everything and
# releases the writer. The data is right afterwards.
#
# Usage: bench/repro/cairn-journal-hang.sh [CAIRN_BINARY] [tail|forward]
#   tail     (default) the tail moved from the end backwards: before 75e8bad, the writer blocks at ~2 GiB
#   forward  control: the same 2.25 GiB of writes in place, forwards: completes in ~10 s
# Needs root (FUSE), python3, about 8 GiB free under /var/tmp, and ~3 minutes.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
D=$(mktemp -d /var/tmp/cairn-hang.XXXXXX)
cp "${1:-$REPO/target/release/cairn}" "$D/cairn"
CAIRN=$D/cairn MODE=${2:-tail}
cleanup() {
    mountpoint -q "$D/mnt" 2>/dev/null && { "$CAIRN" umount "$D/mnt" > /dev/null || fusermount3 -u -z "$D/mnt"; }
    rm -rf "$D"
}
trap cleanup EXIT
echo pw > "$D/pass"
"$CAIRN" init --encrypt --passphrase-file "$D/pass" "$D/vol" > /dev/null
mkdir "$D/mnt"
"$CAIRN" mount "$D/vol" "$D/mnt" --passphrase-file "$D/pass"
for _ in $(seq 50); do mountpoint -q "$D/mnt" && break; sleep 0.1; done
# A 2.5 GiB file, written and closed; then, in one open, the POSIX way to
# insert 4 KiB at 256 MiB: move the 2.25 GiB tail up by 4 KiB in 8 MiB
# blocks, from the end backwards (the first write extends the file).
head -c $((2560 << 20)) /dev/urandom > "$D/src"
dd if="$D/src" of="$D/mnt/f" bs=1M conv=fsync status=none
"$CAIRN" stats --json "$D/vol" > /dev/null
python3 - "$D/mnt/f" "$MODE" <<'EOF' &
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
size, off, n, B = os.fstat(fd).st_size, 256 << 20, 4096, 8 << 20
t0 = time.time()
if sys.argv[2] == "tail":       # backwards: the first write is the file's new last block
    pos = size
    while pos > off:
        k = min(B, pos - off); pos -= k
        os.pwrite(fd, os.pread(fd, k, pos), pos + n)
        if (size - pos) % (256 << 20) == 0:
            print(f"  {time.time() - t0:6.1f} s: {(size - pos) >> 20} MiB moved", flush=True)
else:                           # control: the same amount of writes, forwards, in place
    pos = off
    while pos < size - n:
        k = min(B, size - n - pos)
        os.pwrite(fd, os.pread(fd, k, pos), pos)
        pos += k
        if (pos - off) % (256 << 20) == 0:
            print(f"  {time.time() - t0:6.1f} s: {(pos - off) >> 20} MiB rewritten", flush=True)
os.fsync(fd)
os.close(fd)
print(f"  done in {time.time() - t0:.1f} s", flush=True)
EOF
PY=$!
for _ in $(seq 120); do kill -0 "$PY" 2>/dev/null || break; sleep 1; done
if kill -0 "$PY" 2>/dev/null; then
    echo "BUG: writer still blocked after 120 s; journal: $(du -sb "$D/vol/journal" | cut -f1) bytes in $(ls "$D/vol/journal" | wc -l) segments"
    echo "writer's kernel stack: $(tr '\n' ' ' < "/proc/$PY/stack" 2>/dev/null | cut -c1-120)"
    echo "running 'cairn stats' (a sync: a flush that does not hold the tail back)"
    "$CAIRN" stats --json "$D/vol" > /dev/null
    wait "$PY" && echo "writer finished after the sync"
else
    wait "$PY"
fi
if [[ $MODE == tail ]]; then  # 4 KiB inserted at 256 MiB (they hold what was there: the tail's first 4 KiB)
    { head -c $((256 << 20)) "$D/src"; head -c $(((256 << 20) + 4096)) "$D/src" | tail -c 4096; tail -c +$(((256 << 20) + 1)) "$D/src"; } |
        cmp - "$D/mnt/f" && echo "content as expected"
else
    cmp "$D/src" "$D/mnt/f" && echo "content as expected"
fi
