#!/usr/bin/env bash
# Install what the tests need and run every test: unit, property, engine
# integration, FUSE end-to-end (real mounts), the S3 backend against a real
# S3-compatible server (moto, started here on loopback), and short fuzz runs.
#   scripts/test.sh [--no-fuzz]
# Fuzz runs need a nightly toolchain; without one they are skipped and the
# closing summary line says so.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ=1
[ "${1:-}" = "--no-fuzz" ] && FUZZ=0

need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v bsdtar >/dev/null || need+=(libarchive-tools)
command -v rsync >/dev/null || need+=(rsync)
command -v python3 >/dev/null || need+=(python3)
command -v cc >/dev/null || need+=(gcc)   # the C ABI test compiles against cairn.h
command -v curl >/dev/null || need+=(curl)
command -v tar >/dev/null || need+=(tar)
command -v attr >/dev/null 2>&1 || command -v getfattr >/dev/null || need+=(attr)
command -v man >/dev/null || need+=(man-db)   # generated man pages render with man -l
command -v systemd-analyze >/dev/null || need+=(systemd)   # the shipped mount unit is verified (installing it starts nothing)
# SQLite's session extension (metadata deltas of cloud volumes) is built
# with bindgen, which loads libclang.
# libclang.so itself: libclang-cpp.so (another package) does not count.
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || need+=(libclang-dev)
# PostgreSQL's server binaries: tests start throwaway clusters on loopback
# (cairn-testing's PgServer) and stop them by PID; the package's own
# cluster is not used.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# A database that fails over (pg_failover.rs): etcd and two PostgreSQL
# nodes under Patroni, started on loopback by cairn-testing's
# PatroniCluster; the packages' own services are not used.
command -v patroni >/dev/null || need+=(patroni)
command -v etcd >/dev/null || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi
[ -e /dev/fuse ] || { echo "test.sh: /dev/fuse is missing: the end-to-end tests need FUSE" >&2; exit 1; }

# An S3-compatible server for the S3 backend's tests: moto on loopback,
# stopped by PID when this script exits.
command -v moto_server >/dev/null || python3 -m pip install -q 'moto[server]'
# The Debian package test builds the .deb with cargo-deb.
command -v cargo-deb >/dev/null || cargo install --quiet cargo-deb --locked
command -v cargo-deb >/dev/null || { echo "test.sh: cargo-deb is missing after cargo install cargo-deb (is ~/.cargo/bin on PATH?)" >&2; exit 1; }
command -v moto_server >/dev/null || { echo "test.sh: moto_server is missing after pip install 'moto[server]'" >&2; exit 1; }
S3_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
S3_LOG=$(mktemp)
log=$(mktemp)
pglog=$(mktemp)
moto_server -H 127.0.0.1 -p "$S3_PORT" > "$S3_LOG" 2>&1 &
S3_PID=$!
trap 'kill $S3_PID 2>/dev/null; rm -f "$log" "$pglog" "$S3_LOG"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/" && break; sleep 0.1; done
curl -sf -X PUT "http://127.0.0.1:$S3_PORT/cairn-test" -o /dev/null || { echo "test.sh: moto_server did not start:" >&2; tail -n 20 "$S3_LOG" >&2; exit 1; }
export CAIRN_TEST_S3_ENDPOINT="http://127.0.0.1:$S3_PORT" CAIRN_TEST_S3_BUCKET=cairn-test
export AWS_ACCESS_KEY_ID=cairn-test AWS_SECRET_ACCESS_KEY=cairn-test AWS_REGION=us-east-1

start=$(date +%s)
# Release build: the end-to-end tests move hundreds of MiB through the mount.
cargo build --release --workspace
cargo test --release --workspace 2>&1 | tee "$log"
# The engine's suites that hold for every metadata store, again with the
# metadata in PostgreSQL (a server of the test process's own; issue 26).
CAIRN_TEST_META=postgres cargo test --release -p cairn-engine --test engine -- cases:: archive:: edits:: model:: inspect:: patches:: 2>&1 | tee "$pglog"
cat "$pglog" >> "$log"
# cargo fuzz needs a nightly toolchain (sanitizer flags). Without one the
# fuzz runs are skipped, and the closing line says so, rather than failing
# a machine with only stable Rust.
if [ $FUZZ = 0 ]; then
  fuzz="fuzz skipped (--no-fuzz)"
elif ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz="fuzz SKIPPED: no nightly Rust toolchain (cargo fuzz needs one: rustup toolchain install nightly)"
  echo "test.sh: $fuzz" >&2
else
  scripts/fuzz.sh 20
  fuzz="fuzz: every target 20s, no crashes"
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start ))s"
# The closing lines over every cargo test target (the last target's own
# summary is a doc-test run that may well count zero). Each "test result:"
# line reads "ok. P passed; F failed; I ignored; M measured; ...". The
# PostgreSQL re-run runs tests already counted once with SQLite: the detail
# line says how many of the passes it holds. The last line keeps the plain
# shape a CI parser reads ('N passed, N failed, N skipped', skipped being
# the ignored tests: helpers run as child processes, benchmarks, tests of
# hardware this machine lacks).
count() { awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d %d %d\n", p, f, i }' "$1"; }
read -r passed failed ignored < <(count "$log")
read -r pg_passed _ _ < <(count "$pglog")
echo "test.sh: $passed passed ($pg_passed of them the PostgreSQL re-run of the engine suites), $failed failed, $ignored ignored; $fuzz"
echo "$passed passed, $failed failed, $ignored skipped"
