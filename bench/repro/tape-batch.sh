#!/bin/bash
# Tables VI/VII of section 15 in small, on a virtual clock: FILES files of
# 256 KiB-8 MiB written through a tape mount, then READS random whole-file
# reads on a fresh cache directory, BATCH at a time; prints the drive's
# session (locates, bytes read, positioning seconds) per batch size.
#   FILES=200 READS=40 bench/repro/tape-batch.sh 1 40
set -e
B=${CAIRN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/cairn}
TP="python3 $(cd "$(dirname "$0")/.." && pwd)/tape.py"
W=/tmp/tbatch; rm -rf $W; mkdir -p $W/mnt
export CAIRN_TAPE_CLOCK=${CLOCK:-virtual}
FILES=${FILES:-200}; READS=${READS:-40}
$B init tape-emu:$W/tape --cache-dir $W/a >/dev/null
$B mount tape-emu:$W/tape $W/mnt --cache-dir $W/a
$TP pm-write $W/mnt $FILES 256 8192 7 >/dev/null
$B umount $W/mnt
for b in "$@"; do
    rm -rf $W/b
    $B mount tape-emu:$W/tape $W/mnt --cache-dir $W/b ${MOUNTARGS}
    r=$($TP pm-read $W/mnt $FILES $READS $b 7)
    $B umount $W/mnt
    python3 -c "import json;s=json.load(open('$W/tape/last-session.json'))['stats'];r=json.loads('$r');print('batch',$b,'locates',s['locates'],'bytes_read',s['bytes_read'],'positioning_s',round(s['positioning_secs'],1),'streaming_s',round(s['streaming_secs'],1))"
done
