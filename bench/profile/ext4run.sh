#!/bin/bash
# ext4 baseline of every workload, in a directory on the same disk
# Needs PROF (scratch directory with linux.tar and out/ in it); run as root (drop_caches).
H=$(cd "$(dirname "$0")" && pwd); S=${PROF:?PROF: scratch directory}; R="python3 $H/runm.py"; E=$S/ext4/$1; T=$1
rm -rf $E; mkdir -p $E
$R --label ext4-untar -- $H/wl.sh untar $E
$R --label ext4-untar-sync -- $H/wl.sh sync $E
sync; echo 3 > /proc/sys/vm/drop_caches
$R --label ext4-md5-cold -- $H/wl.sh md5 $E
$R --label ext4-rm -- $H/wl.sh rm $E
$R --label ext4-rm-sync -- $H/wl.sh sync $E
$R --label ext4-postmark -- $H/wl.sh postmark $E ext4.$T
$R --label ext4-dbench -- $H/wl.sh dbench $E ext4.$T
$H/wl.sh fiolay $E; sync; echo 3 > /proc/sys/vm/drop_caches
$R --label ext4-fio -- $H/wl.sh fio $E ext4.$T
$R --label ext4-create -- $H/wl.sh create $E
$R --label ext4-create-sync -- $H/wl.sh sync $E
rm -rf $E
