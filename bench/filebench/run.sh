#!/bin/bash
# bench/filebench/run.sh PERSONALITY DIR OUT_JSON [--runtime SECONDS] [--nfiles N]
#     [--nthreads N] [--set VAR=VALUE ...] [--data zero|random] [--after-setup CMD]
#     [--timeout SECONDS]
# Runs one stock Filebench personality (fileserver, webserver, varmail, netsfs: the
# workloads/*.f of the prefix bench/filebench/build.sh installs) with its fileset in
# DIR, and writes OUT_JSON (its totals and per-flowop table); Filebench's full output
# goes to OUT_JSON minus .json plus .log, the workload it ran to ... plus .f.
#
# The workload is the stock file with only its `set $VAR=` lines changed ($dir, and
# each --nfiles, --nthreads, --set) and its final `run` given --runtime (default 60,
# the stock value); the diff against the stock file is printed to stderr.
#   --data random   LD_PRELOAD $PREFIX/lib/fb-randdata.so: every byte Filebench writes
#                   to a file is pseudo-random (stock Filebench writes only zeros,
#                   which a compressing, deduplicating file system barely stores).
#   --after-setup CMD  adds `create files` and `system "CMD"` before the run: CMD runs
#                   between the pre-allocation and the timed run (drop caches, mark a
#                   request counter, ...). Filebench's `run` skips the files created.
#   --timeout S     kill Filebench after S seconds (default: runtime + 3600).
# Filebench's worker processes need ASLR off (with it on, they die at start with
# "Unexpected Process termination Code 2": its per-process personality(2) switch is
# not enough on this kernel), so /proc/sys/kernel/randomize_va_space is set to 0 for
# the run and restored on exit, failure included. Two concurrent runs would race on
# that restore; run one at a time. Needs root (that file, and drop caches if wanted).
# netsfs is rate-bound: `eventgen rate=$eventrate` (10/s) paces its one thread's loop
# (flowop eventlimit), so it does ~10 loops/s (~610 ops/s, ~2.7 MiB/s) whatever the
# file system, until the file system cannot keep up; --set eventrate=0 lifts the limit
# (then Filebench's eventgen thread busy-loops). Filebench's "mb" is MiB; per-flowop
# MiB/s come rounded to 0.1 as Filebench prints them.
# None of these personalities asks for directio (Filebench's default is off, no
# O_DIRECT), so DIR may be on a FUSE mount.
set -euo pipefail
W=${FILEBENCH_DIR:-/var/tmp/filebench}
PREFIX=$W/prefix
FB=$PREFIX/bin/filebench
WORKLOADS=$PREFIX/share/filebench/workloads

die() { echo "filebench/run.sh: $*" >&2; exit 1; }
usage() { sed -n '2,4p' "$0" | sed 's/^# //' >&2; exit 2; }

[[ $# -ge 3 ]] || usage
P=$1 DIR=$2 OUT=$3
shift 3
case $P in fileserver|webserver|varmail|netsfs) ;; *) die "unknown personality '$P' (fileserver, webserver, varmail or netsfs)" ;; esac
RUNTIME=60 DATA=zero AFTER= TIMEOUT=
SETS=()
while [[ $# -gt 0 ]]; do
    [[ $# -ge 2 ]] || die "$1 needs a value"
    case $1 in
        --runtime) RUNTIME=$2 ;;
        --nfiles) SETS+=("nfiles=$2") ;;
        --nthreads) SETS+=("nthreads=$2") ;;
        --set) SETS+=("$2") ;;
        --data) DATA=$2 ;;
        --after-setup) AFTER=$2 ;;
        --timeout) TIMEOUT=$2 ;;
        *) die "unknown option $1" ;;
    esac
    shift 2
done
[[ $RUNTIME =~ ^[1-9][0-9]*$ ]] || die "--runtime must be a positive whole number of seconds, not '$RUNTIME'"
TIMEOUT=${TIMEOUT:-$((RUNTIME + 3600))}
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive whole number of seconds"
case $DATA in zero) PRELOAD= ;; random) PRELOAD=$PREFIX/lib/fb-randdata.so ;; *) die "--data is zero or random, not '$DATA'" ;; esac
[[ -z $PRELOAD || -f $PRELOAD ]] || die "$PRELOAD missing: run bench/filebench/build.sh"
[[ $AFTER != *'"'* && $AFTER != *$'\n'* ]] || die "--after-setup CMD may not contain a double quote or a newline"
[[ -x $FB ]] || die "$FB missing: run bench/filebench/build.sh (FILEBENCH_DIR=$W)"
STOCK=$WORKLOADS/$P.f
[[ -f $STOCK ]] || die "$STOCK missing"
[[ $OUT == *.json ]] || die "OUT_JSON must end in .json: $OUT"
[[ $DIR == /* && $DIR =~ ^[A-Za-z0-9._/+-]+$ ]] || die "DIR must be an absolute path of letters, digits and ._/+- (WML has no quoting for \$dir): $DIR"
mkdir -p "$DIR" "$(dirname "$OUT")"
BASE=${OUT%.json}
LOG=$BASE.log GEN=$BASE.f

# 1. the workload: the stock file, its set lines and its run line changed
python3 - "$STOCK" "$GEN" "$RUNTIME" "$AFTER" "dir=$DIR" "${SETS[@]}" <<'EOF' || die "could not make the workload from $STOCK"
import re, sys
stock, gen, runtime, after, sets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
lines = open(stock).read().split("\n")
setre = re.compile(r"^\s*set\s+\$(\w+)\s*=")
have = {m.group(1): i for i, l in enumerate(lines) if (m := setre.match(l))}
over = {}
for s in sets:
    var, eq, val = s.partition("=")
    var = var.lstrip("$")
    if not eq or not re.fullmatch(r"\w+", var) or not val or "\n" in val or "#" in val:
        sys.exit(f"bad --set '{s}' (VAR=VALUE)")
    over[var] = val
if "runtime" in over:
    sys.exit("use --runtime, not --set runtime=")
if "runtime" in have:  # fileserver.f: set $runtime=60 ... run $runtime
    over["runtime"] = runtime
for var, val in over.items():
    if var not in have:
        sys.exit(f"{stock} has no `set ${var}=` line (its variables: {', '.join(sorted(have))})")
    old = lines[have[var]]
    if old.count("(") != old.count(")") or old.count("{") != old.count("}"):
        sys.exit(f"`set ${var}` spans several lines in {stock}; not overridable here")
    lines[have[var]] = f"set ${var}={val}"
runs = [i for i, l in enumerate(lines) if re.match(r"^\s*run(\s|$)", l)]
if len(runs) != 1:
    sys.exit(f"{stock}: expected one `run` line, found {len(runs)}")
new = [f"run {runtime}"]
if after:
    new = ["create files", f'system "{after}"'] + new
lines[runs[0]:runs[0] + 1] = new
open(gen, "w").write("\n".join(lines))
EOF
echo "filebench/run.sh: $P: $GEN differs from the stock $STOCK by:" >&2
diff -u "$STOCK" "$GEN" >&2 || true

# 2. ASLR off for the run, restored on exit
ASLR=/proc/sys/kernel/randomize_va_space
ASLR_OLD=$(cat "$ASLR")
restore_aslr() {
    if [[ $(cat "$ASLR") != "$ASLR_OLD" ]]; then
        echo "$ASLR_OLD" > "$ASLR" || echo "filebench/run.sh: could not restore $ASLR to $ASLR_OLD" >&2
    fi
}
FBPID=
on_exit() {
    # timeout(1) put itself, filebench and its workers in one process group
    if [[ -n $FBPID ]] && kill -0 "$FBPID" 2>/dev/null; then
        kill -TERM -- "-$FBPID" 2>/dev/null || true
        sleep 2
        kill -KILL -- "-$FBPID" 2>/dev/null || true
    fi
    restore_aslr
    # a killed filebench leaves its 180 MB shared-memory file (mkstemp /tmp/filebench-shm-XXXXXX)
    local f
    for f in /tmp/filebench-shm-*; do
        [[ -f $f && " $SHM_BEFORE " != *" $f "* ]] && rm -f "$f"
    done
    return 0
}
SHM_BEFORE=$(echo /tmp/filebench-shm-*)
trap on_exit EXIT
trap 'echo "filebench/run.sh: interrupted" >&2; exit 130' INT
trap 'echo "filebench/run.sh: terminated" >&2; exit 143' TERM
echo 0 > "$ASLR" 2>/dev/null || die "cannot write 0 to $ASLR (needs root); Filebench's workers crash with ASLR on"

# 3. the run
echo "filebench/run.sh: $P in $DIR, ${RUNTIME}s, data $DATA; output in $LOG" >&2
t0=$(date +%s.%N)
rc=0
# in the background, so that a signal to this script is handled at once (bash runs
# traps only between foreground commands)
LD_PRELOAD=$PRELOAD timeout --kill-after=30 "$TIMEOUT" "$FB" -f "$GEN" > "$LOG" 2>&1 &
FBPID=$!
wait "$FBPID" || rc=$?
FBPID=
t1=$(date +%s.%N)
restore_aslr
if [[ $rc == 124 || $rc == 137 ]]; then
    tail -n 20 "$LOG" >&2
    die "$P: filebench did not finish in ${TIMEOUT}s (killed); see $LOG"
fi

# 4. the results
if ! msg=$(python3 - "$LOG" "$GEN" "$OUT" "$P" "$RUNTIME" "$DATA" "$DIR" "$rc" "$t0" "$t1" "$STOCK" "$AFTER" 2>&1 <<'EOF'
import json, re, sys
log, gen, out, pers, runtime, data, d, rc, t0, t1, stock, after = sys.argv[1:]
text = open(log, errors="replace").read()
wml = open(gen).read()
# the type of each named flowop, from the workload (composite flowops: their definition's name)
types = {m.group(2): m.group(1) for m in re.finditer(r"flowop\s+(\w+)\s+name=([\w.-]+)", wml)}
READ = {"read", "readwholefile", "aioread"}
WRITE = {"write", "writewholefile", "appendfile", "appendfilerand", "aiowrite"}
variables = {m.group(1): m.group(2).strip() for m in re.finditer(r"^\s*set\s+\$(\w+)\s*=\s*(.*\S)\s*$", wml, re.M)
             if m.group(2).count("(") == m.group(2).count(")") and "{" not in m.group(2)}
ts = lambda pat: (float(m.group(1)) if (m := re.search(r"^\s*([\d.]+): " + pat, text, re.M)) else None)
fatal = [l.strip() for l in text.splitlines() if re.search(
    r"Unexpected Process termination|NO VALID RESULTS|Failed to|Run stopped early|could not obtain a file|Segmentation|syntax error", l, re.I)]
if any("could not obtain a file" in l for l in fatal):  # fileserver, varmail: createfile found no free entry
    fatal.insert(0, "Run stopped early: createfile found every file of the fileset existing (deletefile skips a file "
                    "another thread holds open, so existing files creep up; sooner with few files, many threads, a fast "
                    "file system): raise --nfiles, lower --nthreads or shorten --runtime")
res = {"personality": pers, "runtime_s": int(runtime), "dir": d, "data": data, "after_setup": after or None,
       "workload": gen, "stock_workload": stock, "log": log, "exit_code": int(rc),
       "variables": variables}
if (m := re.search(r"Filebench Version (\S+)", text)):
    res["filebench_version"] = m.group(1)
res["filesets"] = [{"name": m.group(1), "files": int(m.group(2)), "mib": float(m.group(4)), "leafdirs": int(m.group(3))}
                   for m in re.finditer(r"(\S+) populated: (\d+) files, .*?(\d+) leafdirs, ([\d.]+)MB total size", text)]
a, b, r, e = ts("Populating and pre-allocating"), ts("Population and pre-allocation of filesets completed"), ts("Running\\.\\.\\."), ts("IO Summary")
res["prealloc_s"] = round(b - a, 3) if a is not None and b is not None else None
res["startup_s"] = round(r - b, 3) if r is not None and b is not None else None
res["measured_s"] = round(e - r, 3) if e is not None and r is not None else None
res["wall_s"] = round(float(t1) - float(t0), 3)
flowops = []
blk = re.search(r"Per-Operation Breakdown\n(.*?)\n\s*[\d.]+: IO Summary", text, re.S)
for l in (blk.group(1).splitlines() if blk else []):
    m = re.match(r"^(\S+)\s+(\d+)ops\s+([\d.]+)ops/s\s+([\d.]+)mb/s\s+([\d.]+)ms/op\s+\[([\d.]+)ms - \s*([\d.]+)ms\]", l)
    if m:
        t = types.get(m.group(1).split(".")[-1], "?")
        flowops.append({"name": m.group(1), "type": t, "ops": int(m.group(2)), "ops_per_s": float(m.group(3)),
                        "mib_per_s": float(m.group(4)), "ms_per_op": float(m.group(5)),
                        "min_ms": float(m.group(6)), "max_ms": float(m.group(7))})
m = re.search(r"IO Summary:\s+(\d+) ops ([\d.]+) ops/s ([\d.]+)/([\d.]+) rd/wr\s+([\d.]+)mb/s\s+([\d.]+)ms/op", text)
if m:
    res.update(ops=int(m.group(1)), ops_per_s=float(m.group(2)), read_ops_per_s=float(m.group(3)),
               write_ops_per_s=float(m.group(4)), mib_per_s=float(m.group(5)), mean_latency_ms=float(m.group(6)),
               read_mib_per_s=round(sum(f["mib_per_s"] for f in flowops if f["type"] in READ), 1),
               write_mib_per_s=round(sum(f["mib_per_s"] for f in flowops if f["type"] in WRITE), 1))
res["flowops"] = flowops
res["errors"] = fatal
json.dump(res, open(out, "w"), indent=1)
if int(rc) != 0:
    sys.exit(f"{pers}: filebench exited {rc}" + (f": {fatal[0]}" if fatal else ""))
if fatal:
    sys.exit(f"{pers}: filebench reported: {fatal[0]}")
if not m:
    sys.exit(f"{pers}: no IO Summary in {log}")
if res["ops"] == 0:
    sys.exit(f"{pers}: IO Summary counts no operations")
size = sum(f["mib"] for f in res["filesets"])
print(f"filebench/run.sh: {pers}: {res['ops_per_s']:.1f} ops/s, read {res['read_mib_per_s']} MiB/s, write {res['write_mib_per_s']} MiB/s, "
      f"{res['mean_latency_ms']} ms/op; data set {size:.1f} MiB, pre-allocation {res['prealloc_s']} s; {out}")
EOF
); then
    tail -n 20 "$LOG" >&2
    die "$msg (filebench exit $rc; results so far in $OUT, output in $LOG)"
fi
echo "$msg" >&2
