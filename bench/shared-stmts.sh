#!/usr/bin/env bash
# Statements PostgreSQL runs for N creates, N stats, N unlinks and a 64 MiB write on one mount,
# for each build given (NAME=BIN ...): a throwaway cluster with log_statement=all, a volume in a
# moto bucket with --meta, statements counted from the server log between phases; the whole log
# is left in OUT/pgs3-NAME.log (cumulative: each build's log holds the earlier builds' too).
# Usage: bench/shared-stmts.sh before=/path/to/old/cairn after=target/release/cairn  (as root)
# Needs postgresql (Debian), moto_server, curl. Used for BENCHMARKS.md §16.7.
set -euo pipefail
N=${N:-200}
S=$(mktemp -d /var/tmp/i49m-stmts.XXXXXX); chmod 711 "$S"
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pg.sh"
MNT=
MOTOPID=
cleanup() { [[ -n $MNT ]] && mountpoint -q "$MNT" && "$BIN" umount "$MNT" > /dev/null 2>&1; pg_stop; [[ -n $MOTOPID ]] && { kill $MOTOPID 2>/dev/null; wait $MOTOPID 2>/dev/null; }; rm -rf "$S"; }
trap cleanup EXIT
pg_start "$S" -c log_statement=all -c logging_collector=off; PORT=$PG_PORT
MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p $MPORT > "$S/moto.log" 2>&1 &
MOTOPID=$!
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
EP=http://127.0.0.1:$MPORT
count() { grep -cE 'LOG:  (statement|execute)' "$S/pg.log" || true; }
dd if=/dev/urandom of="$S/rnd" bs=1M count=64 status=none
for spec in "$@"; do
  name=${spec%%=*} BIN=${spec#*=}
  pg_psql "CREATE DATABASE s_$name"
  URL=postgres://postgres@127.0.0.1:$PORT/s_$name
  for i in $(seq 100); do curl -sf -X PUT $EP/b-$name -o /dev/null && break; sleep 0.2; done
  VOLU=s3://b-$name/vol
  "$BIN" init "$VOLU" --cache-dir "$S/c-$name" --endpoint $EP --meta "$URL" > /dev/null
  MNT=$S/mnt-$name; mkdir -p "$MNT"
  "$BIN" mount "$VOLU" "$MNT" --cache-dir "$S/c-$name" --endpoint $EP --meta "$URL"
  for i in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
  sleep 3
  c0=$(count); sleep 10; c1=$(count)
  python3 - "$MNT/d" "$N" create <<'PY'
import os,sys
d,n=sys.argv[1],int(sys.argv[2]); os.makedirs(d)
PY
  sleep 1; c1=$(count)
  python3 -c 'import os,sys; d,n=sys.argv[1],int(sys.argv[2]); [os.close(os.open(f"{d}/f{i}", os.O_CREAT|os.O_EXCL|os.O_WRONLY)) for i in range(n)]' "$MNT/d" "$N"
  c2=$(count)
  sync; echo 3 > /proc/sys/vm/drop_caches
  c2=$(count)
  python3 -c 'import os,sys; d,n=sys.argv[1],int(sys.argv[2]); [os.stat(f"{d}/f{i}") for i in range(n)]' "$MNT/d" "$N"
  c3=$(count)
  python3 -c 'import os,sys; d,n=sys.argv[1],int(sys.argv[2]); [os.unlink(f"{d}/f{i}") for i in range(n)]' "$MNT/d" "$N"
  c4=$(count)
  dd if="$S/rnd" of="$MNT/seq.bin" bs=1M conv=fsync status=none
  c5=$(count)
  "$BIN" umount "$MNT" > /dev/null; MNT=
  c6=$(count)
  echo "$name: idle 10 s: $((c1 - c0)) statements; $N creates: $((c2 - c1)); $N stats: $((c3 - c2)); $N unlinks: $((c4 - c3)); 64 MiB dd conv=fsync: $((c5 - c4)); umount: $((c6 - c5))"
  cp "$S/pg.log" "${OUT:-/tmp}"/pgs3-$name.log
done
