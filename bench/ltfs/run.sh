#!/bin/bash
# For n = 1..4 concurrent writers: format a fresh simulated tape (LTFS `file`
# backend), mount it, run n concurrent dd writers of S MiB each, unmount,
# then extract the final index and the layout.
#   usage: run.sh [S_MiB] [n-list] [tag]   default: 256 "1 2 3 4" ""
#   tag (e.g. -r2) is appended to output names, for repeat runs.
set -euo pipefail
W=${LTFS_DIR:-/var/tmp/ltfs}
P=$W/prefix
S=${1:-256}
NS=${2:-"1 2 3 4"}
T=${3:-}
OUT=$W/out
export PATH=$P/bin:$PATH
export LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p $OUT $W/tapes $W/mnt $W/logs

wait_bench() {
  while pgrep -f bench/run.sh >/dev/null; do echo "bench running; waiting 60s"; sleep 60; done
}

for n in $NS; do
  wait_bench
  TAPE=$W/tapes/n$n
  MNT=$W/mnt/n$n
  LOG=$W/logs/n$n
  mountpoint -q $MNT && { fusermount3 -u $MNT || umount $MNT; sleep 2; }
  rm -rf $TAPE; mkdir -p $TAPE $MNT $LOG
  echo "=== n=$n: mkltfs on $TAPE"
  # Tape-serial must be 6 chars. Default cartridge capacity of the file backend
  # is 3 GiB (5% index partition, 95% data partition) which fits 4 x 256 MiB.
  mkltfs -e file -d $TAPE -s TAPE0$n -f > $LOG/mkltfs.log 2>&1
  echo "=== n=$n: mount"
  ltfs -f -o devname=$TAPE -o tape_backend=file -o sync_type=unmount $MNT > $LOG/ltfs.log 2>&1 &
  LPID=$!
  for i in $(seq 1 60); do mountpoint -q $MNT && break; sleep 1; done
  mountpoint -q $MNT || { echo "mount failed"; cat $LOG/ltfs.log; exit 1; }
  echo "=== n=$n: $n writers x $S MiB"
  t0=$(date +%s.%N)
  pids=()
  for i in $(seq 1 $n); do
    dd if=/dev/urandom of=$MNT/w$i bs=1M count=$S status=none &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  t1=$(date +%s.%N)
  echo "writers done in $(echo "$t1 - $t0" | bc) s"
  echo "n=$n S=${S}MiB tag=$T dd_wall_s=$(echo "$t1 - $t0" | bc)" >> $OUT/timings.txt
  ls -l $MNT
  fusermount3 -u $MNT || umount $MNT
  wait $LPID || echo "ltfs exited with $?"
  echo "=== n=$n: extract index + layout"
  python3 "$(dirname "$0")/layout.py" --tape-dir $TAPE --extract-index $OUT/index-n$n$T.xml --json > $OUT/layout-n$n$T.json
  python3 "$(dirname "$0")/layout.py" --tape-dir $TAPE | tee $OUT/layout-n$n$T.txt
  cp $TAPE/filedebug_tc_conf.xml $OUT/tapeconf-n$n$T.xml
  # keep only the metadata of the simulated tape (record names + sizes), drop the data
  (cd $TAPE && ls -l --time-style=+ | awk 'NR>1{print $5, $NF}' | sort -t_ -k1,1n -k2,2n) > $OUT/tape-records-n$n$T.txt
done
