#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 20). Needs cargo-fuzz and a
# nightly toolchain; installs cargo-fuzz if missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECS=${1:-20}
if ! rustup toolchain list 2>/dev/null | grep -q nightly; then
  echo "fuzz.sh: no nightly toolchain; cannot run cargo fuzz" >&2
  exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for t in pack extent_page journal journal_damage config tar tape_layout tape_catalog meta_chain trace_reader; do
  mkdir -p corpus/$t
  echo "fuzz.sh: $t for ${SECS}s"
  # Seeds kept in the tree (seeds/TARGET) start the search where the
  # parser is deep: libFuzzer reads every directory given, writes to the first.
  seeds=(); [ -d "seeds/$t" ] && seeds=("seeds/$t")
  cargo +nightly fuzz run "$t" "corpus/$t" "${seeds[@]}" -- -max_total_time="$SECS" -rss_limit_mb=2048 2>&1 | tail -n 3
done
echo "fuzz.sh: no crashes"
