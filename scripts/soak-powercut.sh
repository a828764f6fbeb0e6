#!/usr/bin/env bash
# The power-cut soak: many rounds of fsync'd writes, kill -9 and a simulated
# power cut (see crates/cairn-cli/tests/e2e/powercut.rs), every fifth round
# cut in the middle of gc. Needs root and /dev/fuse, like scripts/test.sh.
#   scripts/soak-powercut.sh [ROUNDS [SEED]]     (default 120 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-120}
seed=${2:-$RANDOM$RANDOM}
command -v fusermount3 >/dev/null || { echo "soak-powercut: fusermount3 is missing (apt-get install fuse3)" >&2; exit 1; }
echo "soak-powercut: $rounds rounds, seed $seed (rerun a failure with the same seed)"
CAIRN_POWERCUT_ROUNDS=$rounds CAIRN_POWERCUT_SEED=$seed \
  cargo test --release -p cairn-cli --test e2e powercut -- --nocapture --test-threads=1
