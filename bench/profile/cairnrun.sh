#!/bin/bash
# cairnrun.sh MODE TAG WORKLOAD... ; MODE = time | perf | strace
# Needs PROF (scratch directory on the disk under test, with linux.tar and out/ in it)
# and CAIRN (the cairn binary); run as root (mount, drop_caches, perf, strace).
# every workload of issue 12 on a Cairn mount at $S/mnt (volume $S/vol)
H=$(cd "$(dirname "$0")" && pwd); S=${PROF:?PROF: scratch directory}; C=${CAIRN:-cairn}; M=$S/mnt; V=$S/vol
MODE=$1; TAG=$2; shift 2
O=$S/out/$MODE.$TAG; mkdir -p $O
pid() { pgrep -f "cairn mount $V $M" | head -1; }
fresh() { mountpoint -q $M && $C umount $M; rm -rf $V; $C init $V > /dev/null; mnt; }
mnt() { $C mount $V $M; for i in $(seq 50); do mountpoint -q $M && break; sleep 0.1; done; P=$(pid); echo "# daemon $P dev $(mountpoint -d $M)" >&2; }
remount_cold() { $C umount $M; sync; echo 3 > /proc/sys/vm/drop_caches; mnt; }
begin() {  # start the tracers of workload $1
  W=$1
  case $MODE in
    perf) perf record -q -F 499 -g -p $P -o $O/cpu.$W.data 2>/dev/null & PR=$!
          perf record -q -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o $O/fuse.$W.data 2>/dev/null & PF=$!
          echo "$(mountpoint -d $M)" > $O/dev.$W; sleep 2 ;;
    strace) mkdir -p $O/st.$W; strace -ff -y -s 32 -x -qq -o $O/st.$W/t -p $P & PR=$!; sleep 2 ;;
  esac
}
end() {
  case $MODE in
    perf) kill -INT $PR $PF; wait $PR $PF ;;
    strace) kill -INT $PR; wait $PR ;;
  esac
}
ph() { python3 $H/runm.py --pid $P --label "$TAG-$1" -- "${@:2}" | tee -a $O/times.jsonl; }
drain() { ph $1-drain $C stats $V; }
for w in "$@"; do
  case $w in
    untar) fresh; begin untar; ph untar $H/wl.sh untar $M; ph untar-sync $H/wl.sh sync $M; drain untar; end ;;
    md5)   remount_cold; begin md5; ph md5-cold $H/wl.sh md5 $M; end ;;
    rm)    begin rm; ph rm $H/wl.sh rm $M; ph rm-sync $H/wl.sh sync $M; drain rm; end ;;
    postmark) fresh; begin postmark; ph postmark $H/wl.sh postmark $M $MODE.$TAG; drain postmark; end ;;
    dbench) fresh; begin dbench; ph dbench $H/wl.sh dbench $M $MODE.$TAG; drain dbench; end ;;
    fio)   fresh; $H/wl.sh fiolay $M; $C stats $V > /dev/null; remount_cold; begin fio; ph fio $H/wl.sh fio $M $MODE.$TAG; drain fio; end ;;
    fiosplit) fresh; $H/wl.sh fiolay $M; $C stats $V > /dev/null
           remount_cold; begin fioread; ph fioread $H/wl.sh fioread $M $MODE.$TAG; drain fioread; end
           remount_cold; begin fiowrite; ph fiowrite $H/wl.sh fiowrite $M $MODE.$TAG; drain fiowrite; end ;;
    fiodwarf) fresh; $H/wl.sh fiolay $M; $C stats $V > /dev/null; remount_cold
           perf record -q -F 99 --call-graph dwarf,16384 -p $P -o $O/dwarf.fio.data -- sleep 12 2>/dev/null & PD=$!
           ph fio $H/wl.sh fio $M $MODE.$TAG; wait $PD; drain fio ;;
    create) fresh; begin create; ph create $H/wl.sh create $M; ph create-sync $H/wl.sh sync $M; drain create; end ;;
    umount) $C umount $M ;;
  esac
done
