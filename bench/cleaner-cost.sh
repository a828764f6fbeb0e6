#!/usr/bin/env bash
# The cleaner's cost to a rewrite workload (issue 55: at most 10%):
# interleaved pairs of scripts/soak-rewrite.sh runs of the fsx-like
# workload on one kind of volume, one with the mount's cleaner off
# (--gc-interval 0) and one with it on, the order alternating from pair to
# pair so that a drift of the machine's load counts against both. Each run
# is MINUTES long; its throughput is the workload's operations in that
# time. Prints one line per pair and the median of the on/off ratios.
# Not part of bench/run.sh.
#
#   bench/cleaner-cost.sh [--pairs 4] [--minutes 2] [--kind local] [--out DIR]
#                         [--cairn target/release/cairn] [-- EXTRA MOUNT ARGS]
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
PAIRS=4 MINUTES=2 KIND=local OUT= EXTRA=() CAIRN=$HERE/target/release/cairn
while (($#)); do
    case $1 in
        --pairs) PAIRS=$2; shift 2 ;;
        --minutes) MINUTES=$2; shift 2 ;;
        --kind) KIND=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --cairn) CAIRN=$2; shift 2 ;;
        --) shift; EXTRA=(-- "$@"); break ;;
        *) echo "usage: $0 [--pairs N] [--minutes M] [--kind local|bucket|shared] [--out DIR] [--cairn BIN] [-- MOUNT ARGS]" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$(mktemp -d /tmp/cleaner-cost.XXXXXX)}
mkdir -p "$OUT"
run() { # run PAIR CLEANER: prints the operations done and the daemon's CPU seconds
    local dir=$OUT/p$1-$2
    # The soak's own targets fail with the cleaner off; only the count matters.
    "$HERE/scripts/soak-rewrite.sh" --minutes "$MINUTES" --kinds "$KIND" --cleaner "$2" --cairn "$CAIRN" --out "$dir" "${EXTRA[@]}" > "$dir.log" 2>&1 || true
    [[ -s $dir/$KIND/ops && -s $dir/$KIND/daemon_cpu ]] || { echo "run $1 $2 failed: $(tail -n 3 "$dir.log")" >&2; exit 1; }
    echo "$(cat "$dir/$KIND/ops") $(cat "$dir/$KIND/daemon_cpu")"
}
# Per pair: operations and the daemon's CPU microseconds per operation, off
# and on; ratio = on/off operations (below 1: the cleaner cost throughput).
printf 'pair\torder\toff_ops\ton_ops\tratio\toff_cpu_us_per_op\ton_cpu_us_per_op\n' > "$OUT/pairs.tsv"
for i in $(seq "$PAIRS"); do
    if ((i % 2)); then
        read -r off offcpu < <(run "$i" off); read -r on oncpu < <(run "$i" on); order=off,on
    else
        read -r on oncpu < <(run "$i" on); read -r off offcpu < <(run "$i" off); order=on,off
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$i" "$order" "$off" "$on" \
        "$(python3 -c "print(f'{$on/$off:.3f}\t{$offcpu*1e6/$off:.1f}\t{$oncpu*1e6/$on:.1f}')")" | tee -a "$OUT/pairs.tsv"
done
python3 - "$OUT/pairs.tsv" "$MINUTES" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()[1:]]
m = float(sys.argv[2])
r = [float(x[4]) for x in rows]
off = [int(x[2]) / m for x in rows]
on = [int(x[3]) / m for x in rows]
print(f"cleaner off: median {statistics.median(off):,.0f} ops/min; on: median {statistics.median(on):,.0f} ops/min")
print(f"on/off ratio per pair: {', '.join(f'{x:.3f}' for x in r)}; median {statistics.median(r):.3f} (cost {100 * (1 - statistics.median(r)):.1f}%)")
offc = [float(x[5]) for x in rows]
onc = [float(x[6]) for x in rows]
print(f"daemon CPU per operation: off median {statistics.median(offc):.1f} us, on median {statistics.median(onc):.1f} us "
      f"(the cleaner's share {100 * (1 - statistics.median(offc) / statistics.median(onc)):.1f}%)")
PY
