#!/usr/bin/env bash
# 16.1's 1-mount phases (FILES files, default 2,000; bench/shared.py meta) on a local volume directory with --meta
# PostgreSQL (no S3), two builds alternating, PAIRS pairs (before first in odd pairs). Prints one
# JSON row per build and pair. Usage (as root): bench/shared-meta-pairs.sh BEFORE_CAIRN AFTER_CAIRN
# Used for BENCHMARKS.md §16.7.
set -euo pipefail
PAIRS=${PAIRS:-8}; B=$1; A=$2; REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
S=$(mktemp -d /var/tmp/i49m-stat.XXXXXX); chmod 711 "$S"
source "$REPO/bench/pg.sh"
MNT=; BIN=
cleanup() { [[ -n $MNT ]] && mountpoint -q "$MNT" && "$BIN" umount "$MNT" > /dev/null 2>&1; pg_stop; rm -rf "$S"; }
trap cleanup EXIT
pg_start "$S"; PORT=$PG_PORT
for run in $(seq "$PAIRS"); do
  order="before after"; ((run % 2 == 0)) && order="after before"
  for build in $order; do
    BIN=$A; [[ $build == before ]] && BIN=$B
    db=s_$build$run; pg_psql "CREATE DATABASE $db"
    URL=postgres://postgres@127.0.0.1:$PORT/$db
    "$BIN" init "$S/vol-$db" --meta "$URL" > /dev/null
    MNT=$S/mnt-$db; mkdir -p "$MNT"
    "$BIN" mount "$S/vol-$db" "$MNT" --meta "$URL"
    for i in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
    load=$(cut -d' ' -f1 /proc/loadavg)
    r=$(python3 -S $REPO/bench/shared.py meta ${FILES:-2000} "$MNT/own")
    echo "{\"build\": \"$build\", \"run\": $run, \"load\": $load, \"r\": $r}"
    "$BIN" umount "$MNT" > /dev/null; MNT=
  done
done
