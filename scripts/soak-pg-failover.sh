#!/usr/bin/env bash
# The failover soak: PostgreSQL with a synchronous standby under Patroni
# and etcd (cairn-testing's PatroniCluster, on loopback), three mounts of
# one shared volume writing fsync'd files; the primary's postmaster is
# killed with SIGKILL N times, Patroni promotes the standby each time (the
# old primary rejoins as the standby before the next kill). The mounts are
# never reopened; every file whose fsync returned Ok must read back exact
# on each of them afterwards, and fsck must find no error
# (crates/cairn-engine/tests/engine/pg_failover.rs). Prints, per kill, the
# time to the promotion and to the first fsync'd write after the kill.
# Needs patroni, etcd-server and postgresql (Debian packages) and moto
# (pip install 'moto[server]'), which this script starts on loopback unless
# CAIRN_TEST_S3_ENDPOINT is set.
#   scripts/soak-pg-failover.sh [KILLS]     (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-10}
for t in patroni etcd; do
  command -v $t >/dev/null || { echo "soak-pg-failover: $t is missing: apt-get install -y patroni etcd-server" >&2; exit 1; }
done
if [ -z "${CAIRN_TEST_S3_ENDPOINT:-}" ]; then
  command -v moto_server >/dev/null || { echo "soak-pg-failover: moto_server is missing: pip install 'moto[server]'" >&2; exit 1; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  slog=$(mktemp)
  moto_server -H 127.0.0.1 -p "$port" > "$slog" 2>&1 &
  spid=$!
  trap 'kill $spid 2>/dev/null; rm -f "$slog"' EXIT
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
  curl -sf -X PUT "http://127.0.0.1:$port/cairn-test" -o /dev/null
  export CAIRN_TEST_S3_ENDPOINT="http://127.0.0.1:$port" CAIRN_TEST_S3_BUCKET=cairn-test
  export AWS_ACCESS_KEY_ID=cairn-test AWS_SECRET_ACCESS_KEY=cairn-test AWS_REGION=us-east-1
fi
echo "soak-pg-failover: $kills kill -9 of the primary under fsync'd writers on three mounts"
CAIRN_PG_FAILOVER_KILLS=$kills \
  cargo test --release -p cairn-engine --test engine pg_failover:: -- --nocapture --test-threads=1
