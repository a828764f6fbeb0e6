#!/bin/bash
# seq-cpu.sh BIN: 1 GiB dd conv=fsync into a fresh volume + umount; prints dd time, the daemon's CPU
# seconds (utime+stime), its peak RSS and the MiB written to /dev/vda (docs/profile.md). Needs /var/tmp/src1g.bin
# (head -c 1G /dev/urandom > /var/tmp/src1g.bin).
BIN=$1; SB=${2:-}  # SB: a --stream-buffer value (only builds that had the option)
W=$(mktemp -d /var/tmp/seq-cpu.XXXX)
$BIN init $W/vol >/dev/null; mkdir $W/mnt; $BIN mount $W/vol $W/mnt ${SB:+--stream-buffer $SB}
for i in $(seq 50); do mountpoint -q $W/mnt && break; sleep 0.1; done
pid=$(pgrep -f "mount $W/vol" | head -1)
sync; s0=$(awk '{print $7}' /sys/block/vda/stat); t0=$(date +%s.%N)
dd if=/var/tmp/src1g.bin of=$W/mnt/f bs=1M conv=fsync 2>/dev/null
t1=$(date +%s.%N); cpu=$(awk '{print ($14+$15)/100}' /proc/$pid/stat); rss=$(grep VmHWM /proc/$pid/status | awk '{print int($2/1024)}')
$BIN umount $W/mnt; sync; s1=$(awk '{print $7}' /sys/block/vda/stat)
printf "%-28s dd %5.2fs  cpu %5.2fs  rss %4d MiB  disk %5d MiB\n" "$(basename $BIN) ${SB}" $(echo "$t1-$t0"|bc) $cpu $rss $(( (s1-s0)/2048 ))
rm -rf $W
