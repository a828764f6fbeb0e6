#!/usr/bin/env python3
"""Helpers of bench/run.sh's section 14 (frugality in a bucket: seed 004
§4's figures 9, 10, 12, 13 and 15 on Cairn, with BlueSky's layout simulated
from Cairn's own traces and JuiceFS measured on the same server; stdlib
only). Each command prints one JSON object, or exits non-zero with a
message naming what failed.

  frugal.py fb-compact RUN.json [--data-bytes N]
        the fields the report uses of one bench/filebench/run.sh result (the
        real Filebench's settings, its IO summary, and operations and bytes
        per flowop type over the run), with the data set in bytes if given
  frugal.py kernel-tar TXZ EVERY LIST OUT.tar
        one plain tar of the kernel source TXZ: the files and symlinks of
        every EVERY-th directory (section 12's sample) and every file named
        in LIST (the files a partial build reads: `kbuild-list`), with the
        directories leading to them
  frugal.py kbuild-list TXZ WORKDIR OUT -- BUILD...
        which source files BUILD reads: the whole tree unpacked in WORKDIR
        (then removed), every atime set to 1971, BUILD run in the tree's
        top directory, and the files whose atime moved listed (relative to
        the top directory, sorted) into OUT
  frugal.py rewrite DIR populate|run [--sets N] [--files N] [--file-bytes B]
                    [--fraction F] [--io B] [--region B] [--period S] [--seed N]
        seed 004 §4.3.3's cleaning workload: SETS file sets of FILES files
        of B bytes; `run` rewrites FRACTION of the bytes in regions of
        --region bytes, each written in --io byte writes and fsynced, one
        region every --period seconds
  frugal.py sample OUT STOP INTERVAL CAIRN ENDPOINT NAME=URL,CACHEDIR...
        every INTERVAL seconds until the file STOP exists, `CAIRN stats URL
        --cache-dir CACHEDIR --endpoint ENDPOINT --json` of each volume at
        once (threads), one JSON line per volume and sample into OUT
  frugal.py prices COST.json FACTOR OUT.toml
        the price table of a `cairn cost --json` report as a TOML file for
        --gc-prices / --prices, its storage price multiplied by FACTOR
  frugal.py jfs-stats MNT
        a JuiceFS mount's own object-storage counters (MNT/.stats): requests
        and bytes by method
  frugal.py billrow PRICES.json COUNT.json [--cairn COST.json] [--jfs STATS.json...]
        one live bill, priced by the table of PRICES.json (a `cairn cost
        --json`): Cairn's from its own count (COST.json) with the proxy's
        count (COUNT.json, `cloud.py count`) beside it; JuiceFS's from the
        proxy's count and the bytes of its .stats counters
  frugal.py compact-sim SIM.json
        a `cairn sim --json` report with only the fields the report uses

fsbench.py renders section 14 through bench/cloud.py, which imports this
module.
"""

import json
import os
import random
import subprocess
import sys
import tarfile
import threading
import time

MiB = 1 << 20
KiB = 1 << 10

# --- the real Filebench's results (bench/filebench/run.sh) ------------------------

# What each flowop type does to bytes: read, written, or neither.
FB_READS = {"read", "readwholefile"}
FB_WRITES = {"write", "writewholefile", "appendfile", "appendfilerand"}


def fb_compact(path, data_bytes=None):
    """The fields the report uses of a run.sh result."""
    r = json.load(open(path))
    secs = r.get("measured_s") or 0
    ops, read, written = {}, 0.0, 0.0
    for f in r.get("flowops", []):
        t = f.get("type", f.get("name", "?"))
        ops[t] = ops.get(t, 0) + int(f.get("ops", 0))
        mib = f.get("mib_per_s", 0) * secs * MiB
        if t in FB_READS:
            read += mib
        elif t in FB_WRITES:
            written += mib
    out = {k: r.get(k) for k in ("personality", "runtime_s", "data", "filebench_version", "variables", "filesets",
                                 "prealloc_s", "measured_s", "ops", "ops_per_s", "read_mib_per_s", "write_mib_per_s",
                                 "mean_latency_ms")}
    out["ops_by_type"] = ops
    out["bytes_read"] = int(read)
    out["bytes_written"] = int(written)
    if data_bytes is not None:
        out["data_bytes"] = data_bytes
    return out


# --- the kernel workload's tree ---------------------------------------------------

def kernel_tar(src, every, listfile, dst):
    """Section 12's 1/EVERY sample (datapath.copy_sample's rule: the files
    and symlinks of every EVERY-th directory in archive order) plus the
    files of LIST, in one pass over SRC."""
    import datapath
    want = {l.strip() for l in open(listfile) if l.strip() and not l.startswith("#")}
    c = datapath.copy_sample(src, dst, every, frozenset(want))
    missing = sorted(want - c["seen"])
    print(json.dumps({"files": c["files"], "dirs": c["dirs"], "symlinks": c["symlinks"], "file_bytes": c["file_bytes"], "every": every,
                      "listed": len(want), "from_list_only": c["from_extra_only"], "missing_from_list": len(missing),
                      "missing_examples": missing[:5], "top": c["top"], "tar_bytes": c["tar_bytes"]}))


def kbuild_list(src, work, out, build):
    import shutil
    os.makedirs(work, exist_ok=True)
    subprocess.run(["tar", "xf", src, "-C", work], check=True)
    top = os.path.join(work, os.listdir(work)[0])
    old = 31536000  # 1971-01-01
    for d, dn, fn in os.walk(top):
        for f in fn:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                os.utime(p, (old, os.stat(p).st_mtime))
    t0 = time.time()
    r = subprocess.run(build, cwd=top, shell=len(build) == 1, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t1 = time.time()
    if r.returncode != 0:
        sys.exit(f"{' '.join(build)} failed in {top}:\n{r.stdout[-3000:]}")
    got = []
    for d, dn, fn in os.walk(top):
        for f in fn:
            p = os.path.join(d, f)
            st = os.lstat(p)
            if os.path.islink(p) or st.st_mtime >= t0 - 1:
                continue  # generated by the build
            if st.st_atime > old + 1:
                got.append(os.path.relpath(p, top))
    got.sort()
    with open(out, "w") as f:
        f.write(f"# the files of {os.path.basename(src)} that `{' '.join(build)}` reads\n")
        f.write("# (bench/frugal.py kbuild-list; bench/frugal.sh's kernel workload)\n")
        for g in got:
            f.write(g + "\n")
    shutil.rmtree(work)
    print(json.dumps({"files": len(got), "build_seconds": t1 - t0, "out": out}))


# --- the cleaning workload (seed 004 §4.3.3) ----------------------------------------

def rewrite(root, phase, a):
    rng = random.Random(a.seed)
    data = random.Random(a.seed + 7)
    names = [os.path.join(f"set{s:02d}", f"f{f:02d}") for s in range(a.sets) for f in range(a.files)]
    total = len(names) * a.file_bytes
    t0 = time.perf_counter()
    if phase == "populate":
        for s in range(a.sets):
            os.makedirs(os.path.join(root, f"set{s:02d}"), exist_ok=True)
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
            left = a.file_bytes
            while left:
                k = min(MiB, left)
                os.write(fd, data.randbytes(k))
                left -= k
            os.fsync(fd)
            os.close(fd)
        print(json.dumps({"files": len(names), "bytes": total, "seconds": time.perf_counter() - t0}))
        return
    target = int(total * a.fraction)
    steps = max(1, -(-target // a.region))
    done = late = 0
    start = time.monotonic()
    for i in range(steps):
        due = start + i * a.period
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            late += 1
        n = names[rng.randrange(len(names))]
        length = min(a.region, target - done)
        blocks = a.file_bytes // a.io
        off = rng.randrange(max(1, blocks - length // a.io + 1)) * a.io
        fd = os.open(os.path.join(root, n), os.O_WRONLY)
        for k in range(0, length, a.io):
            os.pwrite(fd, data.randbytes(min(a.io, length - k)), off + k)
        os.fsync(fd)
        os.close(fd)
        done += length
    print(json.dumps({"files": len(names), "bytes": total, "rewritten": done, "steps": steps, "late_steps": late,
                      "seconds": time.perf_counter() - t0, "region": a.region, "io": a.io, "period": a.period}))


# --- sampling cairn stats ------------------------------------------------------------

def sample(out, stop, interval, cairn, endpoint, vols):
    lock = threading.Lock()
    f = open(out, "a")
    start = time.monotonic()

    def one(name, url, cache, tick):
        t0 = time.monotonic()
        r = subprocess.run([cairn, "stats", url, "--cache-dir", cache, "--endpoint", endpoint, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t1 = time.monotonic()
        row = {"name": name, "tick": tick, "t": t0 - start, "call_s": t1 - t0}
        if r.returncode == 0:
            d = json.loads(r.stdout)
            for k in ("dead_bytes", "stored_bytes", "live_stored_bytes", "packs", "chunks", "dead_chunks", "data_bytes"):
                row[k] = d.get(k)
        else:
            row["error"] = r.stderr.strip()[-300:]
        with lock:
            f.write(json.dumps(row) + "\n")
            f.flush()

    tick = 0
    while not os.path.exists(stop):
        ts = [threading.Thread(target=one, args=(n, u, c, tick)) for n, u, c in vols]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        tick += 1
        nxt = start + tick * interval
        while time.monotonic() < nxt and not os.path.exists(stop):
            time.sleep(min(0.05, max(0.0, nxt - time.monotonic())))
    print(json.dumps({"samples": tick, "seconds": time.monotonic() - start}))


# --- prices and bills ----------------------------------------------------------------

def prices_toml(cost_json, factor, out):
    p = json.load(open(cost_json))["prices"]
    lines = [f'name = "{p["name"]}, storage x{factor:g} (bench/frugal.sh: the cleaner acts within the run)"',
             f'storage_per_gb_month = {p["storage_per_gb_month"] * factor!r}',
             f'transfer_up_per_gb = {p["transfer_up_per_gb"]!r}',
             f'transfer_down_per_gb = {p["transfer_down_per_gb"]!r}',
             "", "[per_1000_requests]"]
    for k, v in p["per_1000_requests"].items():
        lines.append(f"{k} = {v!r}")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(json.dumps({"factor": factor, "storage_per_gb_month": p["storage_per_gb_month"] * factor,
                      "base": p, "out": out}))


# How the proxy's kinds are billed (S3: a multipart part is a PUT, its
# start and completion are POSTs; a batch delete is a POST... priced as DELETE
# by `cairn cost`, which counts DELETE requests: free either way at AWS's
# list prices for DELETE, and $0.005 per 1,000 as a POST: the bill takes the
# kind `cloud.py count` gives).
BILL_KINDS = {"PUT": "PUT", "PUT part": "PUT", "POST": "POST", "GET": "GET", "LIST": "LIST", "HEAD": "HEAD",
              "DELETE": "DELETE"}


def bill_of(prices, by_kind, bytes_down, bytes_up=0):
    """GET (GET + HEAD), PUT (PUT, parts, POST, LIST) and transfer dollars, as
    seed 004's fig. 9 splits a bill (storage left out, as there)."""
    per = prices["per_1000_requests"]
    get = put = other = 0.0
    for k, n in by_kind.items():
        kind = BILL_KINDS.get(k, k)
        c = n * per.get(kind, 0.0) / 1000
        if kind in ("GET", "HEAD"):
            get += c
        elif kind in ("PUT", "POST", "LIST"):
            put += c
        else:
            other += c
    gb = 1 << 30
    transfer = bytes_down / gb * prices["transfer_down_per_gb"] + bytes_up / gb * prices["transfer_up_per_gb"]
    return {"get": get, "put": put, "other": other, "transfer": transfer, "total": get + put + other + transfer}


def jfs_stats(mnt):
    """JuiceFS's metrics file (MNT/.stats): object requests and bytes by
    method (`juicefs_object_request_data_bytes_GET 123`,
    `juicefs_object_request_durations_histogram_seconds_GET_total 4`)."""
    req, data = {}, {}
    for line in open(os.path.join(mnt, ".stats")).read().splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, _, val = line.rpartition(" ")
        try:
            val = float(val)
        except ValueError:
            continue
        if key.startswith("juicefs_object_request_data_bytes_"):
            m = key[len("juicefs_object_request_data_bytes_"):]
            data[m] = data.get(m, 0) + val
        elif key.startswith("juicefs_object_request_durations_histogram_seconds_") and key.endswith("_total"):
            m = key[len("juicefs_object_request_durations_histogram_seconds_"):-len("_total")]
            req[m] = req.get(m, 0) + val
    print(json.dumps({"requests": req, "data_bytes": data}))


def compact_sim(path):
    """A `cairn sim --json` report without what the report does not use."""
    d = json.load(open(path))
    keep = ("layout", "policy", "cache_percent", "cache_bytes", "reads", "hits", "hit_ratio", "gets", "puts", "posts",
            "bytes_down", "bytes_up", "cost_requests", "cost_transfer", "cost_storage", "cost", "at_capacity")
    return {"summary": d.get("summary", {}), "data_sets": d.get("data_sets", []), "prices": d.get("prices", {}),
            "rows": [{k: r.get(k) for k in keep} for r in d.get("rows", [])]}


def billrow(prices_json, count_json, cairn_cost=None, jfs=()):
    """One live bill: the requests the proxy counted, priced; Cairn's own
    count (`cairn cost --json`) when given (its requests and bytes make the
    bill: it counts exactly what it sent), else JuiceFS's bytes down from its
    .stats counters (one JSON per mount, summed)."""
    pr = json.load(open(prices_json))
    pr = pr.get("prices", pr)
    c = json.load(open(count_json))
    out = {"proxy": c}
    if cairn_cost:
        own = json.load(open(cairn_cost))
        out["own"] = {"requests": own["requests"], "subsystems": own.get("subsystems", []), "total": own.get("total")}
        out["bytes_up"], out["bytes_down"] = own["bytes_up"], own["bytes_down"]
        out["bill"] = bill_of(pr, own["requests"], own["bytes_down"], own["bytes_up"])
        out["bill_by_proxy"] = bill_of(pr, c["by_kind"], own["bytes_down"], own["bytes_up"])
    else:
        down = up = 0
        for j in jfs:
            d = json.load(open(j)).get("data_bytes", {})
            down += d.get("GET", 0)
            up += d.get("PUT", 0)
        out["bytes_up"], out["bytes_down"] = up, down
        out["bill"] = bill_of(pr, c["by_kind"], down, up)
    return out


# --- report ----------------------------------------------------------------------

WORKLOADS = [("kernel", "kernel: untar, checksum (cold), build"), ("fileserver", "fileserver"),
             ("webserver", "webserver"), ("varmail", "varmail"), ("netsfs", "netsfs")]
POLICY_NAMES = {"lru": "LRU", "kd": "KD", "ti": "t_i alone", "tb": "t_b alone", "h": "h alone"}
LAYOUT_NAMES = {"cairn": "Cairn (BLOCK of packs)", "cairn-segment": "Cairn, segments",
                "bluesky": "BlueSky-like log (4 MiB objects, 32 KiB ranged GETs)"}


def size_bytes(s):
    """'256K', '4M', '1G' or a number of bytes."""
    s = str(s).strip()
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}.get(s[-1:].upper())
    return int(float(s[:-1]) * mult) if mult else int(s)


SIM_FIELDS = ("cache_bytes", "reads", "hits", "gets", "puts", "posts", "bytes_down", "bytes_up",
              "cost_requests", "cost_transfer", "cost_storage", "cost")


def _sum_traces(sims, at_capacity):
    """The rows of the traces of one run (the kernel's two mounts), summed
    per (layout, policy, cache percent), or per (layout, policy, "live")
    with at_capacity (the caches of the live cache's size)."""
    out = {}
    for s in sims:
        for r in s["rows"]:
            if bool(r.get("at_capacity")) != at_capacity:
                continue
            k = (r["layout"], r["policy"], "live" if at_capacity else r["cache_percent"])
            if k not in out:
                out[k] = dict(r)
            else:
                o = out[k]
                for f in SIM_FIELDS:
                    o[f] = o.get(f, 0) + r.get(f, 0)
    for o in out.values():
        o["hit_ratio"] = o["hits"] / o["reads"] if o.get("reads") else float("nan")
    return out


def _merge_sims(sims, at_capacity=False):
    """The simulated rows of one workload and live policy: each run's
    traces summed (_sum_traces), then per key the median over the runs of
    every count, price and the hit ratio."""
    by_run = {}
    for s in sims:
        by_run.setdefault(s.get("run", 1), []).append(s)
    runs = [_sum_traces(v, at_capacity) for _, v in sorted(by_run.items(), key=lambda kv: str(kv[0]))]
    if len(runs) <= 1:
        return runs[0] if runs else {}

    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    out = {}
    for k in {k for r in runs for k in r}:
        rows = [r[k] for r in runs if k in r]
        o = dict(rows[0])
        for f in SIM_FIELDS + ("hit_ratio",):
            o[f] = median([x.get(f, 0) for x in rows])
        out[k] = o
    return out


def packing_label(p):
    """FR_ALT_PACKINGS's `order=ORDER` or `open=SIZE`, in words."""
    k, _, v = p.partition("=")
    if k == "order":
        return {"kd": "files in KD order (t_i) in a round's packs", "next-read": "files in next-read order (an oracle)"}.get(v, f"order {v}")
    if k == "open":
        return f"open packs ({v}, at most 5 s)"
    return p


def render(rows, b, summary, h):
    """Appends section 14 to the report body (b: append a line; summary:
    (what, target, result, met) tuples; h: fsbench's helpers)."""
    med, human, met, code, fmt_s = h["med"], h["human"], h["met"], h["code"], h["fmt_s"]
    fr = [r for r in rows if r.get("section") == "frugal"]
    if not any(r.get("kind", "").startswith("frugal_") for r in fr):
        return
    st = next((r for r in fr if r.get("kind") == "frugal_setup"), {})
    run = next((r for r in fr if r.get("kind") == "run"), None)
    cmds = [r for r in fr if r.get("kind") == "cmd"]
    part = lambda p: [r["cmd"] for r in cmds if r.get("part") == p]
    phases = [r for r in fr if r.get("kind") == "frugal_phase"]
    bills = [r for r in fr if r.get("kind") == "frugal_bill"]
    sims = [r for r in fr if r.get("kind") == "frugal_sim"]
    alts = [r for r in fr if r.get("kind") == "frugal_sim_alt" and not r.get("packing")]
    packings = [r for r in fr if r.get("kind") == "frugal_sim_alt" and r.get("packing")]
    lives = [r for r in fr if r.get("kind") == "frugal_live"]
    gcs = [r for r in fr if r.get("kind") == "frugal_gc"]
    gcset = next((r for r in fr if r.get("kind") == "frugal_gc_setup"), {})
    gcbill = [r for r in fr if r.get("kind") == "frugal_gc_bill"]
    wls = [(w, n) for w, n in WORKLOADS if any(r.get("workload") == w for r in phases)]
    nan = float("nan")
    blk = size_bytes(st.get("block", "256K"))
    # What the live cache (and the cairn layout) fetches on a miss.
    fetch_unit = "extents" if blk == 0 else f"{human(blk)}-aligned extents"
    lname = lambda lay: LAYOUT_NAMES[lay].replace("BLOCK", fetch_unit)

    def usd(x):
        if x != x:
            return "n/a"
        if x == 0:
            return "0"
        return f"${x:.6f}" if x < 0.01 else f"${x:,.4f}"

    def pct(x):
        return "n/a" if x != x else f"{100 * x:.1f}%"

    def ratio(a, c):
        return "—" if not (a == a and c == c and c) else f"{a / c:.2f}"

    b("## 14. Frugality in a bucket: the bill, the cache policy, the cleaner (seed 004 §4)")
    b("")
    if run:
        t = int(run["seconds"])
        b(f"Measured {run['date']} in {t // 60}m {t % 60:02d}s ({run['git']}; load {run['load']}"
          + ("; **--quick**: small sizes, not meaningful" if run.get("quick") else "") + ").")
        b("")
    pr = next((r["prices"] for r in sims if r.get("prices")), {})
    b("Coral (seed 004) decides a cloud file system's bill by what its cache evicts (its kd-tree policy, KD, "
      "against LRU), how blocks are grouped into objects (Cairn's packs and segments against BlueSky's log of "
      "4 MiB objects) and when dead bytes are cleaned (theorem 1). This section measures the three on Cairn, "
      "all on one moto S3 server started for the section (as section 13), each workload on a fresh bucket. "
      "Per workload: Cairn mounted with `--cache-policy lru`, then with `kd`, both recording a trace (`--trace`) "
      "and both through a **simulated WAN** (the counting proxy of section 13 holding each request "
      f"{st.get('latency_ms', '?')} ms and passing at most {st.get('mbit', '?')} Mbit/s each way: `cloud.py proxy "
      "--latency-ms --mbit`), with a cache bound of "
      f"{100 * st.get('cache_fraction', nan):.0f}% of the workload's data (`--cache-dir-size`, so the cache "
      f"evicts) and `--cache-size {st.get('mem_cache', '?')}` for decoded chunks in memory; then JuiceFS on the "
      "same workload through the counting proxy without the WAN (its bill does not depend on it). The bills are "
      f"priced by `{pr.get('name', 'aws')}` (Cairn's default table: `cairn cost --help`), without storage, "
      "as seed 004's fig. 9: GET (GET, HEAD), PUT (PUT, multipart parts, POST, LIST) and transfer out.")
    b("")
    for line in code(part("setup")):
        b(line)
    b("")

    # --- workloads
    b("### 14.1 Workloads")
    b("")
    b("| workload | what | data written | read | |")
    b("|---|---|---:|---:|---|")
    for w, n in wls:
        s = st.get("workloads", {}).get(w, {})
        if w == "kernel":
            k = st.get("kernel", {})
            b(f"| kernel | untar of {k.get('files', 0):,} files ({human(k.get('file_bytes', 0))}) of "
              f"`{st.get('kernel_txz', '?')}`: section 12's 1/{k.get('every', '?')} sample plus the "
              f"{k.get('listed', 0):,} files the build reads ({k.get('from_list_only', 0):,} of them not in the sample); "
              f"unmount; a fresh mount with an empty cache; `md5sum` of every file; `{st.get('kbuild', '?')}` | "
              f"{human(k.get('file_bytes', 0))} + the build's | every file, then the build's reads | |")
            continue
        runs = [r for r in fr if r.get("kind") == "frugal_filebench" and r.get("workload") == w]
        v = s.get("variables", {})
        ops = {}
        for r in runs:
            for k, n in r.get("ops_by_type", {}).items():
                ops.setdefault(k, []).append(n)
        written = med([r.get("bytes_written", 0) for r in runs]) if runs else nan
        read = med([r.get("bytes_read", 0) for r in runs]) if runs else nan
        by_sys = {}
        for r in runs:
            by_sys.setdefault(f"{r.get('fs')}{' ' + r['policy'] if r.get('policy') else ''}", []).append(r.get("ops_per_s", 0))
        rate = ", ".join(f"{k} {med(v):,.0f}" for k, v in by_sys.items()) + (" (medians)" if len(runs) > len(by_sys) else "")
        rt = runs[0].get("runtime_s") if runs else "?"
        b(f"| {w} | Filebench {s.get('filebench_version', '?')}'s stock `{w}.f`: {int(v.get('nfiles', 0)):,} files, "
          f"{v.get('nthreads', '?')} threads, {rt} s after the files are made "
          f"({human(s.get('data_bytes', 0))}); flowops per run (median): "
          f"{', '.join(f'{int(med(n)):,} {k}' for k, n in sorted(ops.items()))}; ops/s: {rate} | "
          f"{human(s.get('data_bytes', 0))} + {human(written)} | {human(read)} | |")
    b("")
    b("The real Filebench (`bench/filebench/build.sh` builds it from its repository; `bench/filebench/run.sh` "
      "runs one stock personality, changing only its `set` lines: the directory, `nfiles`, `nthreads` and the run "
      "time; the diff is in each run's log). The numbers of files are lowered from the .f files' so that JuiceFS, "
      "which writes and reads each file with requests of its own, and Cairn through the simulated WAN each "
      "finish a personality in minutes; file sizes, flowops and their mix are Filebench's own. Filebench "
      "writes only zero bytes, which a deduplicating, compressing store barely keeps and a BlueSky-like log "
      "stores in full; with `--data random` every byte it writes to a file is pseudo-random instead (a "
      "preloaded library, `bench/filebench/build.sh`), so every layout stores what it is given. The caches are "
      "dropped between the files' creation and the timed run. Data written and read are Filebench's "
      "per-flowop rates times the run time.")
    b("")
    for line in code(part("workloads")):
        b(line)
    b("")

    # --- (a) fig. 9: the bill
    sz = st.get("sim_sizes", [2, 5, 10, 15, 20])
    live_pct = round(100 * st.get("cache_fraction", 0.1))
    b(f"### 14.2 The bill (fig. 9): Cairn against a BlueSky-like layout, and JuiceFS")
    b("")
    b("From each Cairn run's trace, `cairn sim` replays the same file requests against three layouts "
      f"(Cairn's recorded packs fetched as the live cache fetches them: {'exactly the bytes a read misses' if blk == 0 else f'misses rounded out to {human(blk)}'}, "
      "gaps closer than a GET's price in transfer in one GET, and a miss continuing the pack's last GET reading "
      "ahead (`--cache-block`, `--cache-ahead`; `cairn sim --pack-block`, `--pack-ahead`); the same packs fetched by "
      "segments; and a BlueSky-like log: every write appended in request order, no dedup or compression, sealed "
      "into 4 MiB objects, a miss fetching the missing 32 KiB blocks of one object by one ranged GET per run), "
      f"each with each policy at cache sizes of {', '.join(f'{x:g}' for x in sz)}% of the workload's data set as "
      "written (the BlueSky-like log's: the distinct bytes the trace reads or writes, without dedup or compression; "
      "`cairn sim --cache-of bluesky`), so every layout has the same cache in bytes. "
      f"Below, the simulated bills at {live_pct}% (the live runs' bound is {live_pct}% of the files there before the "
      "run; the simulated bill at exactly that size is further below) from the LRU run's trace "
      "(the KD run's trace gives the ratios in the last column), the live bills of the two Cairn runs "
      "(`cairn cost --json` after the unmount, every request from `cairn init` on: metadata versions and the "
      "lease included, which the simulator leaves out) and JuiceFS's (the proxy's request count; bytes down "
      "from JuiceFS's own counters, `MNT/.stats`).")
    b("")
    for line in code(part("bill")):
        b(line)
    b("")
    b("| workload | bill | GET | PUT | transfer | total | ÷ BlueSky LRU | (KD run's trace) |")
    b("|---|---|---:|---:|---:|---:|---:|---:|")
    heads, by_size, size_ratios = [], [], []
    for w, n in wls:
        per_trace = {}
        for pol in ("lru", "kd"):
            ss = [r for r in sims if r["workload"] == w and r["live_policy"] == pol]
            if ss:
                per_trace[pol] = _merge_sims(ss)
        if not per_trace:
            continue
        base = per_trace.get("lru") or next(iter(per_trace.values()))
        other = per_trace.get("kd")

        def sim_bill(m, layout, pol):
            r = m.get((layout, pol, float(live_pct))) or m.get((layout, pol, live_pct))
            if not r:
                return None
            perq = pr.get("per_1000_requests", {})
            get = r["gets"] * perq.get("GET", 0) / 1000
            put = r["puts"] * perq.get("PUT", 0) / 1000 + r["posts"] * perq.get("POST", 0) / 1000
            tr = r["cost_transfer"]
            return {"get": get, "put": put, "transfer": tr, "total": get + put + tr}
        bs = sim_bill(base, "bluesky", "lru")
        bs_o = sim_bill(other, "bluesky", "lru") if other else None
        lines = [("BlueSky-like log, LRU (sim)", "bluesky", "lru"), ("BlueSky-like log, KD (sim)", "bluesky", "kd"),
                 ("Cairn layout, LRU (sim)", "cairn", "lru"), ("Cairn layout, KD (sim)", "cairn", "kd"),
                 ("Cairn segments, KD (sim)", "cairn-segment", "kd")]
        alt_blocks = sorted({r["block"] for r in alts if r["workload"] == w}, key=size_bytes)
        alt = {}
        for blk_ in alt_blocks:
            for pol_ in ("lru", "kd"):
                ss = [r for r in alts if r["workload"] == w and r["live_policy"] == pol_ and r["block"] == blk_]
                if ss:
                    alt[(blk_, pol_)] = _merge_sims(ss)
        for blk_ in reversed(alt_blocks):
            lines.insert(4, (f"Cairn layout, {human(size_bytes(blk_))} blocks, KD (sim)", ("alt", blk_), "kd"))
        for pk_ in sorted({r["packing"] for r in packings if r["workload"] == w}):
            for pol_ in ("lru", "kd"):
                ss = [r for r in packings if r["workload"] == w and r["live_policy"] == pol_ and r["packing"] == pk_]
                if ss:
                    alt[(pk_, pol_)] = _merge_sims(ss)
            lines.insert(len(lines) - 1, (f"Cairn layout, {packing_label(pk_)}, KD (sim)", ("alt", pk_), "kd"))
        first = True
        for label, lay, pol in lines:
            if isinstance(lay, tuple):
                x = sim_bill(alt.get((lay[1], "lru"), {}), "cairn", pol)
                xo = sim_bill(alt.get((lay[1], "kd"), {}), "cairn", pol)
            else:
                x = sim_bill(base, lay, pol)
                xo = sim_bill(other, lay, pol) if other else None
            if not x:
                continue
            b(f"| {n if first else ''} | {label} | {usd(x['get'])} | {usd(x['put'])} | {usd(x['transfer'])} | "
              f"{usd(x['total'])} | {ratio(x['total'], bs['total']) if bs else '—'} | "
              f"{ratio(xo['total'], bs_o['total']) if xo and bs_o else '—'} |")
            first = False
        for fs, pol, label in (("cairn", "lru", "Cairn live, LRU (`cairn cost`)"), ("cairn", "kd", "Cairn live, KD (`cairn cost`)"),
                               ("juicefs", "", "JuiceFS live (proxy + .stats)")):
            bl = [r for r in bills if r["workload"] == w and r["fs"] == fs and r.get("policy", "") == pol]
            if not bl:
                continue
            x = {k: med([r["bill"][k] for r in bl]) for k in ("get", "put", "transfer", "total")}
            b(f"| | {label} | {usd(x['get'])} | {usd(x['put'])} | {usd(x['transfer'])} | {usd(x['total'])} | "
              f"{ratio(x['total'], bs['total']) if bs else '—'} | |")
        ck, bl_ = sim_bill(base, "cairn", "kd"), bs
        if ck and bl_:
            heads.append((w, ck["total"], bl_["total"]))
        over = []
        for sz_ in sorted({k[2] for k in base}):
            c_, l_ = base.get(("cairn", "kd", sz_)), base.get(("bluesky", "lru", sz_))
            if c_ and l_:
                tc = c_["cost_requests"] + c_["cost_transfer"]
                tl = l_["cost_requests"] + l_["cost_transfer"]
                over.append(f"{sz_:g}% {ratio(tc, tl)}")
                if tl:
                    size_ratios.append((w, sz_, tc / tl))
        if over:
            by_size.append(f"{w}: {', '.join(over)}")
    b("")
    if heads:
        rs = [c / l for _, c, l in heads if l]
        avg = sum(rs) / len(rs) if rs else nan
        ok = bool(rs) and all(x <= 0.6 for x in rs)
        res = (", ".join(f"{w} {c / l:.2f}" for w, c, l in heads if l)
               + (f" (mean {avg:.2f}: {100 * (1 - avg):.0f}% lower)" if avg < 1 else f" (mean {avg:.2f}: {avg:.1f}× BlueSky's)"))
        b(f"Cairn's layout with KD against the BlueSky-like log with LRU, simulated at {live_pct}%, bill ÷ bill: {res}. "
          f"Target (issue 14): at least 40% lower (ratio ≤ 0.60) on every workload: {met(ok)}; Coral reached 28% "
          "lower on average.")
        b("")
        summary.append((f"frugal (section 14): bill of Cairn's layout + KD ÷ a BlueSky-like log + LRU (sim, {live_pct}% cache; GET, PUT, transfer)",
                        "≤ 0.60 (≥ 40% lower)", res, ok))
    if by_size:
        b("The same ratio (Cairn's layout with KD ÷ the BlueSky-like log with LRU, requests and transfer as the "
          "simulator prices them) at each cache size: " + "; ".join(by_size) + ".")
        b("")
    if size_ratios and heads:
        worst = max(size_ratios, key=lambda x: x[2])
        rs = [c / l for _, c, l in heads if l]
        avg = sum(rs) / len(rs) if rs else nan
        ok = worst[2] < 1 and avg <= 0.6
        res = f"largest {worst[2]:.2f} ({worst[0]} at {worst[1]:g}%); mean at {live_pct}% {avg:.2f}"
        b(f"Target (issue 28): below the BlueSky-like log on every workload at every cache size, and on average at "
          f"least 40% below: {res}: {met(ok)}.")
        b("")
        summary.append(("frugal (section 14): Cairn's layout + KD ÷ BlueSky-like log + LRU at every size 2–20% (sim, same cache in bytes)",
                        "< 1 everywhere, mean ≤ 0.60", res, ok))
    # Coral's layout decisions tried in the simulator (docs/frugal.md §7)
    if packings:
        sizes_ = sorted({k[2] for s in sims for k in _sum_traces([s], False)})
        b("Coral's layout decisions (§3.2, §3.4.2), tried on the LRU runs' traces before the flusher is changed "
          "(`cairn sim --pack-order`, `--open-packs`): each flush round's packs re-cut with the files in another "
          "order (KD's t_i, the file's last read before the round; or the first read after it, an oracle no flusher "
          "has, the most any order can give), or rounds appended to one open pack sealed at 16 MiB or at the first "
          "round 5 s after it opened (a metadata version, shipped every 5 s, may not name a pack the bucket lacks). "
          "Cairn's layout with KD: PUTs, hit ratio, and bill ÷ the BlueSky-like log with LRU at each size "
          "(medians over runs).")
        b("")
        for line in code([c for c in part("sim") if "--pack-order" in c]):
            b(line)
        b("")
        b("| workload | packing | PUTs | " + " | ".join(f"hit {s:g}%" for s in sizes_) + " | "
          + " | ".join(f"bill ÷ log {s:g}%" for s in sizes_) + " |")
        b("|---|---|---:|" + "---:|" * (2 * len(sizes_)))
        for w, n in wls:
            ss = [r for r in sims if r["workload"] == w and r["live_policy"] == "lru"]
            if not ss:
                continue
            base_ = _merge_sims(ss)
            variants = [("as recorded (inode order, sealed per round)", base_)]
            for pk_ in sorted({r["packing"] for r in packings if r["workload"] == w}):
                ps = [r for r in packings if r["workload"] == w and r["live_policy"] == "lru" and r["packing"] == pk_]
                if ps:
                    variants.append((packing_label(pk_), _merge_sims(ps)))
            first = True
            for label, m in variants:
                row_ = [m.get(("cairn", "kd", s)) for s in sizes_]
                if not any(row_):
                    continue
                puts = next((r["puts"] for r in row_ if r), nan)
                hits = " | ".join(pct(r["hit_ratio"]) if r else "—" for r in row_)
                bills_ = []
                for s, r in zip(sizes_, row_):
                    l_ = base_.get(("bluesky", "lru", s))
                    bills_.append(ratio(r["cost_requests"] + r["cost_transfer"], l_["cost_requests"] + l_["cost_transfer"]) if r and l_ else "—")
                b(f"| {n if first else ''} | {label} | {puts:.0f} | {hits} | {' | '.join(bills_)} |")
                first = False
        b("")
    # the live bill against the simulated one at the live cache's size
    cmp_rows = []
    for w, n in wls:
        for pol in ("lru", "kd"):
            # Run by run (a run's live bill against its own traces), then
            # the medians: of the simulated bills, the live ones, the ratios.
            data_subs = ("write", "read_miss", "prefetch")
            per_run = []
            for bl in (r for r in bills if r["workload"] == w and r["fs"] == "cairn" and r.get("policy") == pol and r.get("own")):
                ss = [r for r in sims if r["workload"] == w and r["live_policy"] == pol and r.get("run") == bl.get("run")]
                sim = _merge_sims(ss, at_capacity=True).get(("cairn", pol, "live")) if ss else None
                if not sim:
                    continue
                live = sum(x.get("cost", 0) for x in bl["own"].get("subsystems", []) if x.get("subsystem") in data_subs)
                simc = sim.get("cost_requests", 0) + sim.get("cost_transfer", 0)
                per_run.append((sim.get("cache_bytes", 0), simc, live, live / simc if simc else nan))
            if not per_run:
                continue
            cmp_rows.append((n, POLICY_NAMES[pol], human(med([x[0] for x in per_run])), med([x[1] for x in per_run]),
                             med([x[2] for x in per_run]), med([x[3] for x in per_run]), len(per_run)))
    if cmp_rows:
        b("The live bill against the simulated one at the live cache's own size (`cairn sim --capacity`, Cairn's "
          "layout with the live run's policy; the live side counts the data's requests and bytes only: the writes' "
          "uploads, the read misses and prefetches, as `cairn cost` splits them by subsystem, without the metadata "
          "versions and the lease, which the simulator leaves out):")
        b("")
        b("| workload | policy | cache | simulated | live | live ÷ simulated (median of the runs') |")
        b("|---|---|---:|---:|---:|---:|")
        worst = 0.0
        for n, p, cap, simc, live, r, runs in cmp_rows:
            if r == r:
                worst = max(worst, abs(r - 1))
            b(f"| {n} | {p} | {cap} | {usd(simc)} | {usd(live)} | {'n/a' if r != r else f'{r:.2f}'} |")
        b("")
        ok = worst <= 0.05
        b(f"Largest difference: {100 * worst:.1f}%; target (issue 28): within 5%: {met(ok)}.")
        b("")
        summary.append(("frugal (section 14): live bill vs simulated at the live cache's size (Cairn's layout)",
                        "within 5%", f"largest difference {100 * worst:.1f}%", ok))
    # requests behind the live bills
    if bills:
        b("Requests behind the live bills (the proxy's count from before `cairn init` / `juicefs format` to after "
          "the unmount and, for Cairn, `cairn cost`; and Cairn's own count, which `cairn cost` keeps). The proxy sees a "
          "few requests more than Cairn's count: those of `cairn cost` itself (it opens the unmounted volume and "
          "counts them in the next report) and, for the kernel, the first mount's last ones (after its last metadata "
          "version they wait in that mount's local directory, which is not mounted again):")
        b("")
        b("| workload | system | proxy: GET | HEAD | PUT (+parts) | POST | LIST | DELETE | total | Cairn's count | bytes up | bytes down |")
        b("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for w, n in wls:
            for fs, pol, label in (("cairn", "lru", "Cairn LRU"), ("cairn", "kd", "Cairn KD"), ("juicefs", "", "JuiceFS")):
                bl = [r for r in bills if r["workload"] == w and r["fs"] == fs and r.get("policy", "") == pol]
                if not bl:
                    continue
                k = lambda key: med([r["proxy"]["by_kind"].get(key, 0) for r in bl])
                own = med([sum(r["own"]["requests"].values()) for r in bl if r.get("own")]) if fs == "cairn" else nan
                b(f"| {n.split(':')[0]} | {label} | {k('GET'):,.0f} | {k('HEAD'):,.0f} | {k('PUT') + k('PUT part'):,.0f} | "
                  f"{k('POST'):,.0f} | {k('LIST'):,.0f} | {k('DELETE'):,.0f} | {med([r['proxy']['requests'] for r in bl]):,.0f} | "
                  f"{'—' if own != own else f'{own:,.0f}'} | {human(med([r['bytes_up'] for r in bl]))} | "
                  f"{human(med([r['bytes_down'] for r in bl]))} |")
        b("")

    # --- (b) fig. 12-13: hit ratios
    b("### 14.3 Hit ratio against the cache size (fig. 12 and 13)")
    b("")
    b("`cairn sim` on the LRU run's trace: the hit ratio (reads served by the cache ÷ reads) of each policy, KD "
      "and its three metrics alone (t_i: the file's last access; t_b: the block's; h: hotness), at each cache "
      f"size, for Cairn's layout ({fetch_unit}, as the live cache), and LRU and KD for the other two layouts. "
      "Spread: the largest minus the smallest hit ratio of a row over the sizes (seed 004: KD's is smaller). "
      "The live column is the live cache of each run (`cairn stats`: hits ÷ (hits + misses)) at its bound"
      + (f" ({live_pct}%)" if live_pct else "") + "; `cairn sim --live` replays the live cache's own records through "
      "both policies at that size.")
    b("")
    for line in code(part("sim")):
        b(line)
    b("")
    kd_ge, kd_seg, metrics_vs_lru = [], [], []
    for w, n in wls:
        ss = [r for r in sims if r["workload"] == w and r["live_policy"] == "lru"]
        if not ss:
            continue
        m = _merge_sims(ss)
        sizes = sorted({k[2] for k in m})
        b(f"**{n}**")
        b("")
        b("| layout | policy | " + " | ".join(f"{s:g}%" for s in sizes) + " | spread | live |")
        b("|---|---|" + "---:|" * len(sizes) + "---:|---:|")
        for lay, unit in (("cairn", blk or 64 * KiB), ("bluesky", 32 * KiB)):
            cb = [m.get((lay, "lru", s), {}).get("cache_bytes", nan) for s in sizes]
            b(f"| ({lname(lay).split(' (')[0]}: cache size, in {human(unit)} blocks) | | "
              + " | ".join("n/a" if x != x else f"{human(x)} ({x / unit:,.0f})" for x in cb) + " | | |")
        for lay in ("cairn", "cairn-segment", "bluesky"):
            pols = ("lru", "kd", "ti", "tb", "h") if lay == "cairn" else ("lru", "kd")
            for pol in pols:
                hs = [m.get((lay, pol, s), {}).get("hit_ratio", nan) for s in sizes]
                if all(x != x for x in hs):
                    continue
                good = [x for x in hs if x == x]
                live = ""
                if lay == "cairn" and pol in ("lru", "kd"):
                    lv = [r for r in lives if r["workload"] == w and r["policy"] == pol]
                    if lv:
                        live = pct(med([r["hit_ratio"] for r in lv]))
                b(f"| {lname(lay) if pol == 'lru' else ''} | {POLICY_NAMES[pol]} | " + " | ".join(pct(x) for x in hs)
                  + f" | {pct(max(good) - min(good)) if good else 'n/a'} | {live} |")
            if lay == "cairn":
                lru = [m.get((lay, "lru", s), {}).get("hit_ratio", nan) for s in sizes]
                kd = [m.get((lay, "kd", s), {}).get("hit_ratio", nan) for s in sizes]
                kd_ge.append((w, all(k >= l - 1e-9 for k, l in zip(kd, lru) if k == k and l == l),
                               [(s, k, l) for s, k, l in zip(sizes, kd, lru)]))
                seg = [(m.get(("cairn-segment", "kd", s), {}).get("hit_ratio", nan), m.get(("cairn-segment", "lru", s), {}).get("hit_ratio", nan)) for s in sizes]
                kd_seg.append((w, seg))
                # eq. 1's metrics alone against LRU: which of them can tell
                # KD anything recency does not
                alone = {p_: [m.get((lay, p_, s), {}).get("hit_ratio", nan) for s in sizes] for p_ in ("ti", "tb", "h")}
                same = {p_: all(abs(x - l) <= 1e-9 for x, l in zip(alone[p_], lru) if x == x and l == l) for p_ in ("ti", "tb")}
                hd = [x - l for x, l in zip(alone["h"], lru) if x == x and l == l]
                metrics_vs_lru.append((w, same["ti"], same["tb"], max(hd, default=nan), min(hd, default=nan)))
        b("")
        rep = [r for r in lives if r["workload"] == w and r.get("replay")]
        if rep:
            parts = []
            for r in rep:
                rp = r["replay"]
                parts.append(f"the {r['policy'].upper()} run's cache (capacity {human(rp[0]['capacity'])}, live "
                             f"{pct(rp[0]['recorded_hit_ratio'])}) replayed: "
                             + ", ".join(f"{x['policy'].upper()} {pct(x['hit_ratio'])}" for x in rp))
            b("Live cache replayed (`cairn sim --live`): " + "; ".join(parts) + ".")
            b("")
    if kd_ge:
        allok = all(ok for _, ok, _ in kd_ge)

        def tally(d):
            gt = sum(1 for _, k, l in d if k == k and l == l and k > l + 1e-9)
            eq = sum(1 for _, k, l in d if k == k and l == l and abs(k - l) <= 1e-9)
            return f"higher at {gt}, equal at {eq} of {len(d)} sizes"
        res = "; ".join(f"{w}: " + ("yes, " + tally(d) if ok else "no (" + ", ".join(f"{s:g}%: KD {100 * k:.2f}% < LRU {100 * l:.2f}%" for s, k, l in d if k == k and l == l and k < l - 1e-9) + ")")
                        for w, ok, d in kd_ge)
        b(f"KD ≥ LRU at every size (Cairn's layout): {res}.")
        b("")
        segs = []
        for w, d in kd_seg:
            good = [(k, l) for k, l in d if k == k and l == l]
            if good:
                segs.append(f"{w} {sum(1 for k, l in good if k > l + 1e-9)} higher, {sum(1 for k, l in good if k < l - 1e-9)} lower")
        if segs:
            b("With segments as the cache's unit (many more, smaller entries), KD against LRU over the sizes: " + "; ".join(segs) + ".")
            b("")
        if metrics_vs_lru:
            both = [w for w, ti, tb, _, _ in metrics_vs_lru if ti and tb]
            worst_loss = max((l - k for _, _, d in kd_ge for _, k, l in d if k == k and l == l), default=0.0)
            b("Why KD follows LRU here, from eq. 1's metrics (the rows of each metric alone): "
              + "; ".join(f"{w}: t_i alone {'=' if ti else '≠'} LRU, t_b alone {'=' if tb else '≠'} LRU at every size, "
                          f"h alone {100 * hi:+.1f} to {100 * lo:+.1f} points against LRU"
                          for w, ti, tb, hi, lo in metrics_vs_lru) + ". "
              + (f"Where t_i and t_b both order the entries exactly as LRU does ({', '.join(both)}), a cached extent is "
                 "one file's run of one pack, read whole and together: the file's last access is the extent's, so two "
                 "of KD's three axes are LRU's recency, and the min corner of the space is LRU's victim up to the "
                 "third axis. That axis, h = 2/π·atan(N/S′) with S′ the size in 4 KiB pages, is near 0 for every "
                 "extent of more than a few pages read a few times (N/S′ ≪ 1), so it moves few victims; the batch "
                 "eviction (1/64 of the entries within dist of the corner) then takes some not quite oldest entries "
                 f"(KD's largest loss against LRU here: {100 * worst_loss:.2f} points). Where h alone beats LRU (frequency matters: a "
                 "file read again and again) KD gains only that share of it that survives being one axis of three. "
                 if both else "")
              + "Coral's gain over LRU comes from workloads whose blocks of one file are read at different times "
              "(t_i ≠ t_b), which Filebench's whole-file reads here are not.")
            b("")
        summary.append(("frugal (section 14): KD hit ratio ≥ LRU's at every cache size 2–20% (sim, Cairn's layout)",
                        "KD ≥ LRU", res, allok))

    # --- (c) fig. 15: the cleaner
    if gcs:
        b("### 14.4 Dead bytes over time, with and without the cleaner (fig. 15)")
        b("")
        f = gcset.get("factor", nan)
        p = gcset.get("prices", {})
        put = p.get("base", {}).get("per_1000_requests", {}).get("PUT", nan) / 1000
        s_base = p.get("base", {}).get("storage_per_gb_month", nan) / (1 << 30) / (730 * 3600)
        tau = lambda dead, fac: put / (dead * s_base * fac) if dead and s_base == s_base else nan
        w_ = gcset.get("workload", {})
        gph = [r for r in fr if r.get("kind") == "frugal_gc_phase"]
        pop = max((r.get("seconds", 0) for r in gph if r.get("phase") == "populate"), default=nan)
        rwr = max((r.get("seconds", 0) for r in gph if r.get("phase") == "run"), default=nan)
        b(f"Seed 004 §4.3.3's workload, scaled: {w_.get('sets', '?')} file sets of {w_.get('files', '?')} files of "
          f"{human(w_.get('file_bytes', 0))} ({human(w_.get('bytes', 0))}), then {100 * w_.get('fraction', nan):.0f}% "
          f"of the bytes rewritten in {human(w_.get('io', 0))} writes, a region of {human(w_.get('region', 0))} "
          f"(one file, random offset) every {w_.get('period', '?')} s, each fsynced. Two volumes on two buckets do "
          "it at the same time: one mounted with the cleaner (`--gc-interval "
          f"{gcset.get('interval', '?')}`), one without (`--gc-interval 0`), and every second `cairn stats --json` "
          "of each gives `dead_bytes` (the stats call syncs first; the workload's fsyncs already flush once a "
          f"second); sampling starts with the populate ({pop:,.0f} s), the rewrites take the next {rwr:,.0f} s, and "
          f"sampling goes on {gcset.get('tail', '?')} s after them. The cleaner weighs a price table whose storage price is "
          f"**{f:g}×** AWS's ({usd(p.get('storage_per_gb_month', nan))} per GB-month): theorem 1 cleans a pack when "
          "its dead bytes have cost in storage what cleaning costs (one PUT for the new pack, plus the GETs and "
          "transfer of live bytes not in the local cache, here none: the cache keeps the packs it uploaded). At "
          f"AWS's price a pack holding 8 MiB of dead bytes becomes due after "
          f"{tau(8 * MiB, 1) / 3600:,.1f} hours; at {f:g}× after {tau(8 * MiB, f):,.1f} s (1 MiB dead: "
          f"{tau(MiB, f):,.0f} s), so cleaning happens within the run. Everything else about the cleaner is as "
          "shipped.")
        b("")
        for line in code(part("gc")):
            b(line)
        b("")
        by = {}
        for r in gcs:
            by.setdefault(r["name"], []).append(r)
        names = [n for n in ("gc", "nogc") if n in by]
        ticks = sorted({r["tick"] for r in gcs})
        label = {"gc": f"with the cleaner", "nogc": "without"}
        b("| | " + " | ".join(label[n] for n in names) + " |")
        b("|---|" + "---:|" * len(names))
        for key, lab in (("dead_bytes", "peak dead bytes"),):
            b(f"| {lab} | " + " | ".join(human(max((r.get(key) or 0) for r in by[n])) for n in names) + " |")
        b("| final dead bytes | " + " | ".join(human(by[n][-1].get("dead_bytes") or 0) for n in names) + " |")
        b("| final stored bytes | " + " | ".join(human(by[n][-1].get("stored_bytes") or 0) for n in names) + " |")
        b("| final live stored bytes | " + " | ".join(human(by[n][-1].get("live_stored_bytes") or 0) for n in names) + " |")
        b("| final packs | " + " | ".join(f"{by[n][-1].get('packs') or 0:,}" for n in names) + " |")
        mean_dead = {n: sum((r.get("dead_bytes") or 0) for r in by[n]) / len(by[n]) for n in names}
        b("| mean dead bytes over the samples | " + " | ".join(human(mean_dead[n]) for n in names) + " |")
        if gcbill:
            def gbv(n, k):
                x = [r for r in gcbill if r["name"] == n]
                return x[0].get(k, nan) if x else nan
            b("| PUT requests in all (of them `cairn cost` tags write) | " + " | ".join(
                f"{gbv(n, 'put'):,.0f} ({gbv(n, 'write_put'):,.0f})" for n in names) + " |")
            b("| GET requests in all; bytes down | " + " | ".join(
                f"{gbv(n, 'get'):,.0f}; {human(gbv(n, 'bytes_down'))}" for n in names) + " |")
            b("| requests `cairn cost` tags gc (GET / PUT / DELETE) | " + " | ".join(
                f"{gbv(n, 'gc_get'):,.0f} / {gbv(n, 'gc_put'):,.0f} / {gbv(n, 'gc_delete'):,.0f}" for n in names) + " |")
            b("| cleaner's transfer down | " + " | ".join(human(gbv(n, "gc_bytes_down")) for n in names) + " |")
            b("| dead byte-seconds (`cairn cost`) | " + " | ".join(f"{gbv(n, 'dead_byte_seconds'):,.3g}" for n in names) + " |")
            b(f"| bill at the {f:g}× table: storage of dead bytes + cleaning | " + " | ".join(
                usd(gbv(n, "dead_storage_cost") + gbv(n, "gc_cost")) for n in names) + " |")
        b("")
        b("Samples (dead bytes, MiB, every 5th second):")
        b("")
        b("| s | " + " | ".join(label[n] for n in names) + " |")
        b("|---:|" + "---:|" * len(names))
        for t in ticks[::5]:
            vals = []
            for n in names:
                x = next((r for r in by[n] if r["tick"] == t), None)
                vals.append(f"{(x.get('dead_bytes') or 0) / MiB:,.1f}" if x and x.get("dead_bytes") is not None else "")
            b(f"| {t} | " + " | ".join(vals) + " |")
        b("")
        if "gc" in by and "nogc" in by:
            pk_g = max((r.get("dead_bytes") or 0) for r in by["gc"])
            pk_n = max((r.get("dead_bytes") or 0) for r in by["nogc"])
            fin_g, fin_n = by["gc"][-1].get("dead_bytes") or 0, by["nogc"][-1].get("dead_bytes") or 0
            res = f"peak {human(pk_g)} vs {human(pk_n)}, final {human(fin_g)} vs {human(fin_n)}"
            b(f"With the cleaner against without: {res}.")
            b("")
            summary.append(("frugal (section 14): dead bytes with the cleaner (theorem 1, storage price scaled) vs without",
                            "fewer, bounded", res, fin_g < fin_n and pk_g <= pk_n))

    # --- (d) fig. 10: wall time under a WAN
    if phases:
        b("### 14.5 Wall time through a simulated WAN (fig. 10)")
        b("")
        b(f"The same runs as 14.2: Cairn through the proxy adding {st.get('latency_ms', '?')} ms per request and "
          f"limiting bodies to {st.get('mbit', '?')} Mbit/s each way, with `--cache-policy lru` and `kd`, each "
          "phase timed; medians over the runs. JuiceFS's times are without the WAN (for scale only: not "
          "comparable). KD ÷ LRU below 1 means KD was faster.")
        b("")
        for line in code(part("workloads")):
            b(line)
        b("")
        b("| workload | phase | Cairn LRU | Cairn KD | KD ÷ LRU | JuiceFS (no WAN) |")
        b("|---|---|---:|---:|---:|---:|")
        for w, n in wls:
            phs = list(dict.fromkeys(r["phase"] for r in phases if r["workload"] == w))
            for ph in phs:
                v = {}
                for fs, pol in (("cairn", "lru"), ("cairn", "kd"), ("juicefs", "")):
                    v[(fs, pol)] = med([r["seconds"] for r in phases if r["workload"] == w and r["phase"] == ph
                                        and r["fs"] == fs and r.get("policy", "") == pol])
                b(f"| {n.split(':')[0]} | {ph} | {fmt_s(v[('cairn', 'lru')])} | {fmt_s(v[('cairn', 'kd')])} | "
                  f"{ratio(v[('cairn', 'kd')], v[('cairn', 'lru')])} | {fmt_s(v[('juicefs', '')])} |")
        b("")

    # --- raw
    b("<details><summary>Section 14 raw rows (simulator rows left out)</summary>")
    b("")
    b("```")
    for r in fr:
        if r.get("kind") in ("frugal_setup", "frugal_phase", "frugal_filebench", "frugal_bill", "frugal_live", "frugal_gc_setup", "frugal_gc_phase", "frugal_gc_bill"):
            b(json.dumps(r))
    b("```")
    b("")
    b("</details>")
    b("")


# --- command line ------------------------------------------------------------------

def main(args=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    fc = sub.add_parser("fb-compact")
    fc.add_argument("run")
    fc.add_argument("--data-bytes", type=int)
    k = sub.add_parser("kernel-tar")
    k.add_argument("src")
    k.add_argument("every", type=int)
    k.add_argument("list")
    k.add_argument("dst")
    kb = sub.add_parser("kbuild-list")
    kb.add_argument("src")
    kb.add_argument("work")
    kb.add_argument("out")
    kb.add_argument("build", nargs=argparse.REMAINDER)
    rw = sub.add_parser("rewrite")
    rw.add_argument("dir")
    rw.add_argument("phase", choices=["populate", "run"])
    rw.add_argument("--sets", type=int, default=10)
    rw.add_argument("--files", type=int, default=8)
    rw.add_argument("--file-bytes", type=int, default=2 * MiB)
    rw.add_argument("--fraction", type=float, default=0.5)
    rw.add_argument("--io", type=int, default=32 * KiB)
    rw.add_argument("--region", type=int, default=512 * KiB)
    rw.add_argument("--period", type=float, default=1.0)
    rw.add_argument("--seed", type=int, default=15)
    sm = sub.add_parser("sample")
    sm.add_argument("out")
    sm.add_argument("stop")
    sm.add_argument("interval", type=float)
    sm.add_argument("cairn")
    sm.add_argument("endpoint")
    sm.add_argument("vols", nargs="+", help="NAME=URL,CACHEDIR")
    pt = sub.add_parser("prices")
    pt.add_argument("cost")
    pt.add_argument("factor", type=float)
    pt.add_argument("out")
    js = sub.add_parser("jfs-stats")
    js.add_argument("mnt")
    cs = sub.add_parser("compact-sim")
    cs.add_argument("sim")
    bl = sub.add_parser("billrow")
    bl.add_argument("prices")
    bl.add_argument("count")
    bl.add_argument("--cairn")
    bl.add_argument("--jfs", nargs="*", default=[])
    a = p.parse_args(args)
    if a.cmd == "fb-compact":
        print(json.dumps(fb_compact(a.run, a.data_bytes)))
    elif a.cmd == "kernel-tar":
        kernel_tar(a.src, a.every, a.list, a.dst)
    elif a.cmd == "kbuild-list":
        build = a.build[1:] if a.build[:1] == ["--"] else a.build
        kbuild_list(a.src, a.work, a.out, build)
    elif a.cmd == "rewrite":
        rewrite(a.dir, a.phase, a)
    elif a.cmd == "sample":
        vols = []
        for v in a.vols:
            n, _, rest = v.partition("=")
            u, _, c = rest.partition(",")
            vols.append((n, u, c))
        sample(a.out, a.stop, a.interval, a.cairn, a.endpoint, vols)
    elif a.cmd == "prices":
        prices_toml(a.cost, a.factor, a.out)
    elif a.cmd == "jfs-stats":
        jfs_stats(a.mnt)
    elif a.cmd == "compact-sim":
        print(json.dumps(compact_sim(a.sim)))
    elif a.cmd == "billrow":
        print(json.dumps(billrow(a.prices, a.count, a.cairn, a.jfs)))


if __name__ == "__main__":
    sys.exit(main())
