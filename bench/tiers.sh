#!/usr/bin/env bash
# Tiers: a year of access, priced (issue 53, docs/tiers.md §8).
#
#   bench/tiers.sh [CAIRN_BIN]
#
# Generates the six synthetic year-long workloads (`cairn sim --generate`,
# seed 1), replays each through `cairn sim --tier-policies` with the four
# policies at AWS us-east-1 list prices, keeps the raw output in
# bench/results/tiers.txt and tiers.json, and rewrites the BENCHMARKS.md
# section between the markers `<!-- tiers:begin -->` and
# `<!-- tiers:end -->` (appended if absent). Pure computation: no mount,
# no server; a few minutes on 2 cores.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CAIRN=${1:-$REPO/target/release/cairn}
[[ -x $CAIRN ]] || { echo "bench/tiers.sh: no cairn binary at $CAIRN (cargo build --release -p cairn-cli)" >&2; exit 1; }
SEED=${TIERS_SEED:-1}
DAYS=${TIERS_DAYS:-365}
WORK=$(mktemp -d /var/tmp/cairn-tiers.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=$REPO/bench/results
mkdir -p "$OUT"
: > "$OUT/tiers.txt"
echo "[" > "$OUT/tiers.json"
first=1
for w in fileserver webserver varmail kernel backup media; do
    gen="cairn sim --generate $w --seed $SEED --days $DAYS $w.trace"
    run="cairn sim $w.trace --tier-policies all-standard,intelligent,pins,cairn"
    "$CAIRN" sim --generate "$w" --seed "$SEED" --days "$DAYS" "$WORK/$w.trace" > /dev/null
    { echo "### $w"; echo "\$ $gen"; echo "\$ $run"; "$CAIRN" sim "$WORK/$w.trace" --tier-policies all-standard,intelligent,pins,cairn; echo; } >> "$OUT/tiers.txt"
    [[ $first == 1 ]] || echo "," >> "$OUT/tiers.json"
    first=0
    printf '{"workload": "%s", "seed": %s, "days": %s, "report": ' "$w" "$SEED" "$DAYS" >> "$OUT/tiers.json"
    "$CAIRN" sim "$WORK/$w.trace" --tier-policies all-standard,intelligent,pins,cairn --json >> "$OUT/tiers.json"
    echo "}" >> "$OUT/tiers.json"
done
echo "]" >> "$OUT/tiers.json"
python3 - "$OUT/tiers.json" "$REPO/BENCHMARKS.md" "$(git -C "$REPO" rev-parse --short HEAD)" <<'PY'
import json, sys, datetime
res = json.load(open(sys.argv[1]))
bm, commit = sys.argv[2], sys.argv[3]
archive = {"backup", "media"}
L = []
L.append("<!-- tiers:begin -->")
L.append("## 19. Tiers: a year of access, priced (issue 53)")
L.append("")
L.append(f"Produced by `bench/tiers.sh` ({datetime.date.today()}, commit {commit}); raw output in `bench/results/tiers.txt` and `tiers.json`. "
         "Each workload is a synthetic year (docs/tiers.md §8: `cairn sim --generate WORKLOAD --seed 1 --days 365 W.trace`) replayed by "
         "`cairn sim W.trace --tier-policies all-standard,intelligent,pins,cairn` (pins from `W.trace.pins`) at AWS us-east-1 list prices "
         "(crates/cairn-model/src/tiers.rs). Dollars for the year; transfer out is left out (the same for every policy). "
         "`waits`: reads that waited for a restore (hours in brackets).")
L.append("")
L.append("| workload | policy | storage | requests | retrieval | early del. | monitoring | total | vs all-standard | vs intelligent | waits (h) |")
L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
verdicts = []
for r in res:
    rows = {x["policy"]: x for x in r["report"]["rows"]}
    std, it = rows["all-standard"]["bill"]["total"], rows["intelligent"]["bill"]["total"]
    for p in ["all-standard", "intelligent", "pins", "cairn"]:
        x = rows[p]; b = x["bill"]
        L.append(f"| {r['workload']} | {p} | ${b['storage']:.4f} | ${b['requests']:.4f} | ${b['retrieval']:.4f} | ${b['early_deletion']:.4f} | ${b['monitoring']:.4f} | **${b['total']:.4f}** | {100*(b['total']/std-1):+.1f}% | {100*(b['total']/it-1):+.1f}% | {x['restore_waits']} ({x['wait_hours']:.0f}) |")
    c = rows["cairn"]["bill"]["total"]
    if r["workload"] in archive:
        ok1, ok2 = c <= 0.5 * std, c <= 0.75 * it
        verdicts.append(f"- {r['workload']} (archive-like): cairn {100*(c/std-1):+.1f}% vs all-standard (target ≤ -50%: {'met' if ok1 else 'MISSED'}), {100*(c/it-1):+.1f}% vs Intelligent-Tiering (target ≤ -25%: {'met' if ok2 else 'MISSED'}); {rows['cairn']['restore_waits']} reads waited for a restore.")
    else:
        ok = c <= 1.02 * std
        verdicts.append(f"- {r['workload']} (hot): cairn {100*(c/std-1):+.1f}% vs all-standard (target ≤ +2%: {'met' if ok else 'MISSED'}); {rows['cairn']['restore_waits']} reads waited for a restore.")
L.append("")
L.append("Against the issue's targets:")
L.append("")
L.extend(verdicts)
L.append("")
L.append("Why the misses (the analysis of docs/tiers.md §8): ")
L.append("- media: Intelligent-Tiering's Archive Instant Access tier ($0.004) is nearly GLACIER's price ($0.0036) with no retrieval fee and no wait, "
         "so the rare reads of the long tail (1 in 3,000 files a day) cost Cairn a restore each (whole-pack retrieval, the move back up) and a wait; "
         "the planner sends the tail to GLACIER/DEEP_ARCHIVE because a never-read chunk's rate estimate is 0. Glacier Instant Retrieval ($0.004, read at once) "
         "in the sheet took media from +1.2% to -3.8% against Intelligent-Tiering and its restore waits from 891 to 574 (varmail from -4.6% to -7.1%, fileserver "
         "+4.9% to +5.1%); not yet tried: a population prior for never-read chunks (the rate at which untouched data is read again), which would keep "
         "the reactivated part of the tail instant and send the rest to DEEP_ARCHIVE.")
L.append("- fileserver: files are deleted and recreated (the whole set turns over ~4.5 times a year); new files not read for 30 days move down and some are then read "
         "(restores, moves back up). The settling time (`settle_days`, 30) bounds this; the per-file read rate (1.5/month) is close to the IA break-even for 128 KiB files.")
L.append("- These are simulated bills of synthetic traces (no live run here); the simulator's simplifications are in docs/tiers.md §8.")
L.append("<!-- tiers:end -->")
sec = "\n".join(L) + "\n"
text = open(bm).read()
b, e = "<!-- tiers:begin -->", "<!-- tiers:end -->"
if b in text and e in text:
    text = text[:text.index(b)] + sec.rstrip("\n") + text[text.index(e) + len(e):]
else:
    text = text.rstrip("\n") + "\n\n" + sec
open(bm, "w").write(text)
print("\n".join(verdicts))
PY
