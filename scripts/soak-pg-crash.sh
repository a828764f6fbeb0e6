#!/usr/bin/env bash
# The PostgreSQL crash soak: many immediate stops (SIGQUIT, as
# `pg_ctl stop -m immediate`) of the metadata server while four writers on
# two volumes create small files (4-135 KiB) and fsync each; after each
# stop the server recovers, the volumes are mounted again (their journals
# replay) and every file whose fsync returned Ok must be there, byte-exact
# (crates/cairn-engine/tests/engine/pg_failures.rs). Needs PostgreSQL's
# server binaries (apt-get install -y postgresql), like scripts/test.sh.
#   scripts/soak-pg-crash.sh [ROUNDS]     (default 25 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-25}
echo "soak-pg-crash: $rounds immediate stops of PostgreSQL under fsync'd writers"
CAIRN_PG_CRASH_ROUNDS=$rounds \
  cargo test --release -p cairn-engine --test engine pg_failures::fsynced_files_survive -- --nocapture --test-threads=1
