#!/usr/bin/env python3
"""Helpers of bench/run.sh's section 16 (one volume, many mounts: Cairn with
PostgreSQL metadata against JuiceFS with the same PostgreSQL, both on the same
moto S3 server; issue 26). Stdlib only. Each command prints one JSON object,
or exits non-zero with a message naming what failed.

  shared.py meta N DIR...            one worker process per DIR (a mount's
                                     directory), each with N empty files of its
                                     own (names w{i}-f{n}); three phases, each
                                     started in every worker at once and timed
                                     from the start until the last worker is
                                     done: create (O_CREAT|O_EXCL, close), stat
                                     (after dropping the kernel's caches), unlink
  shared.py vis A B TRIALS           time until a change made through mount A
                                     is seen through mount B (polling os.stat
                                     on B every 0.5 ms; B has looked the name up
                                     just before, so its caches are warm): a
                                     create, a write + close that grows a file,
                                     a rename; TRIALS of each, interleaved, a
                                     random 0-50 ms pause before each; measured
                                     from the return of A's close/rename
  shared.py bucket ENDPOINT BUCKET [PREFIX]
                                     the objects under PREFIX and their bytes
                                     (ListObjectsV2 on moto, every page)

fsbench.py imports this module to render section 16 of the report.
"""

import http.client
import json
import os
import random
import re
import statistics
import sys
import time
import urllib.parse

MiB = 1 << 20


# --- helpers run by bench/shared.sh ------------------------------------------

def _drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _worker(i, d, n, conn):
    names = [os.path.join(d, f"w{i}-f{k:06d}") for k in range(n)]
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    while True:
        phase = conn.recv()
        if phase is None:
            return
        t0 = time.perf_counter()
        err = None
        try:
            if phase == "create":
                for p in names:
                    os.close(os.open(p, flags, 0o644))
            elif phase == "stat":
                for p in names:
                    os.stat(p)
            elif phase == "unlink":
                for p in names:
                    os.unlink(p)
        except OSError as e:
            err = f"{phase} in {d}: {e}"
        conn.send((time.perf_counter() - t0, err))


def meta(n, dirs):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    procs, conns = [], []
    for i, d in enumerate(dirs):
        os.makedirs(d, exist_ok=True)
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(i, d, n, b))
        p.start()
        procs.append(p)
        conns.append(a)
    out = {"mounts": len(dirs), "files_per_mount": n, "files": n * len(dirs)}
    try:
        for phase in ("create", "stat", "unlink"):
            if phase == "stat":
                _drop_caches()
            t0 = time.perf_counter()
            for c in conns:
                c.send(phase)
            res = [c.recv() for c in conns]
            wall = time.perf_counter() - t0
            errs = [e for _, e in res if e]
            if errs:
                sys.exit(f"meta: {'; '.join(errs)}")
            out[f"{phase}_s"] = wall
            out[f"{phase}_per_s"] = n * len(dirs) / wall
            out[f"{phase}_worker_s"] = [t for t, _ in res]
    finally:
        for c in conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in procs:
            p.join(10)
    print(json.dumps(out))


def _wait_seen(pred, timeout=10.0):
    t0 = time.perf_counter()
    while True:
        if pred():
            return time.perf_counter()
        if time.perf_counter() - t0 > timeout:
            return None
        time.sleep(0.0005)


def _exists(p):
    try:
        os.stat(p)
        return True
    except FileNotFoundError:
        return False


def _size(p):
    try:
        return os.stat(p).st_size
    except FileNotFoundError:
        return -1


def vis(a, b, trials):
    """Mount A's directory a and mount B's view of the same directory b."""
    rng = random.Random(26)
    os.makedirs(a, exist_ok=True)
    if not _wait_seen(lambda: os.path.isdir(b), 30):
        sys.exit(f"vis: {b} (made through the other mount as {a}) not seen in 30 s")
    res = {"create": [], "write": [], "rename": []}
    missed = {k: 0 for k in res}
    grow = os.path.join(a, "grow")
    with open(grow, "wb"):
        pass
    if not _wait_seen(lambda: _exists(os.path.join(b, "grow")), 30):
        sys.exit("vis: the first file was not seen on the other mount in 30 s")
    for t in range(trials):
        for kind in ("create", "write", "rename"):
            time.sleep(rng.uniform(0, 0.05))
            if kind == "create":
                pa, pb = os.path.join(a, f"c{t}"), os.path.join(b, f"c{t}")
                _exists(pb)  # B looks the name up first (a negative entry, if it caches them)
                os.close(os.open(pa, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                t0 = time.perf_counter()
                t1 = _wait_seen(lambda: _exists(pb))
            elif kind == "write":
                pb = os.path.join(b, "grow")
                before = _size(pb)  # B has the file's attributes
                with open(grow, "ab") as f:
                    f.write(b"x" * 100)
                after = os.stat(grow).st_size
                t0 = time.perf_counter()
                t1 = _wait_seen(lambda: _size(pb) == after)
                if before == after:
                    sys.exit("vis: the write did not grow the file")
            else:
                src, dst = os.path.join(a, f"c{t}"), os.path.join(a, f"r{t}")
                pb = os.path.join(b, f"r{t}")
                _exists(pb)
                os.rename(src, dst)
                t0 = time.perf_counter()
                t1 = _wait_seen(lambda: _exists(pb))
            if t1 is None:
                missed[kind] += 1
            else:
                res[kind].append(t1 - t0)
    out = {"trials": trials, "missed": missed, "timeout_s": 10.0}
    for k, v in res.items():
        out[k] = v
    print(json.dumps(out))


def bucket(endpoint, name, prefix=""):
    u = urllib.parse.urlparse(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    auth = ("AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, Signature=0")
    token, objects, total = None, 0, 0
    while True:
        q = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
        if token:
            q["continuation-token"] = token
        conn.request("GET", f"/{name}?{urllib.parse.urlencode(q)}", headers={"Authorization": auth})
        r = conn.getresponse()
        data = r.read().decode()
        if r.status != 200:
            sys.exit(f"listing {name}/{prefix}: HTTP {r.status}: {data[:300]}")
        for size in re.findall(r"<Size>(\d+)</Size>", data):
            objects += 1
            total += int(size)
        m = re.search(r"<NextContinuationToken>([^<]+)</NextContinuationToken>", data)
        if "<IsTruncated>true</IsTruncated>" in data and m:
            token = m.group(1)
        else:
            break
    print(json.dumps({"objects": objects, "bytes": total}))


# --- report --------------------------------------------------------------------

SYSTEMS = [("cairn", "Cairn"), ("juicefs", "JuiceFS")]


def _pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def render(rows, b, summary, h):
    rs = [r for r in rows if r.get("section") == "shared"]
    if not rs:
        return
    med, human, met, code, cmds_for, fmt_s = h["med"], h["human"], h["met"], h["code"], h["cmds_for"], h["fmt_s"]
    st = next((r for r in rs if r.get("kind") == "sh_setup"), {})
    run = next((r for r in rs if r.get("kind") == "run"), {})
    fails = [r for r in rs if r.get("kind") == "sh_fail"]
    b("## 16. One volume, many mounts: Cairn vs JuiceFS on PostgreSQL and S3 (moto)")
    b("")
    b("Issue 26. Both systems keep their metadata in **the same PostgreSQL server** "
      f"({st.get('pg', '?')}, Debian's package, a throwaway cluster started by the section on a loopback port with its "
      "default settings (fsync on, synchronous_commit on) but max_connections=200, stopped by PID; each system has a "
      "database of its own) and their data in **the same moto S3 server** "
      f"(moto {st.get('moto', '?')}, a bucket per system). Up to {st.get('max_mounts', 4)} mounts of one volume on this "
      "machine, each with its own cache directory, all mounted during the whole run (idle ones included: their sessions "
      f"and change listeners run). JuiceFS {st.get('juicefs', '?')} with its defaults (4 MiB blocks, no compression, "
      "1 s attribute/entry cache); Cairn not encrypted, its defaults. Both volumes are mounted side by side ("
      f"{2 * st.get('max_mounts', 4)} mounts) and each workload runs on Cairn, then on JuiceFS, before the next one; "
      "one run. **The machine has 2 cores shared with PostgreSQL, moto, every mount and other jobs (builds of "
      f"other sessions); load (1, 5, 15 min) at the start and end of the section: {run.get('load', '?')}.** Targets "
      "(issue 26): ahead of JuiceFS on every figure; a change visible on another mount within 100 ms at p99 (JuiceFS: up "
      "to its 1 s cache).")
    b("")
    for line in code(cmds_for(rows, "shared")):
        b(line)
    b("")
    _notes("shared-changes.md", b)
    if fails:
        b("**Failures recorded in this run:**")
        b("")
        for r in fails:
            b(f"- {r.get('fs')}: {r.get('what')}: `{r.get('cmd', '')}`" + (f" — {r['tail']}" if r.get("tail") else ""))
        b("")

    # --- metadata rates
    mt = [r for r in rs if r.get("kind") == "sh_meta"]
    if mt:
        n = mt[0].get("files_per_mount", 0)
        b(f"### 16.1 Creates, stats and unlinks per second, 1 to {st.get('max_mounts', 4)} mounts at once")
        b("")
        b(f"{n:,} empty files per mount (`python3 bench/shared.py meta {n} DIR...`: one process per mount, every "
          "process starts a phase at once, the phase timed until the last is done; the kernel's caches dropped before "
          "the stats). *own*: each mount in a directory of its own; *shared*: all mounts in one directory (made through "
          "the first mount). Operations per second over all mounts together.")
        b("")
        b("| layout | mounts | op | Cairn | JuiceFS | Cairn ÷ JuiceFS |")
        b("|---|---:|---|---:|---:|---:|")
        wins, total = 0, 0
        for layout in ("own", "shared"):
            for k in sorted({r["mounts"] for r in mt}):
                for op in ("create", "stat", "unlink"):
                    v = {}
                    for fs, _ in SYSTEMS:
                        xs = [r[f"{op}_per_s"] for r in mt if r["fs"] == fs and r["mounts"] == k and r["layout"] == layout]
                        v[fs] = med(xs)
                    c, j = v["cairn"], v["juicefs"]
                    rat = f"{c / j:.2f}" if c == c and j == j and j else "n/a"
                    if c == c and j == j:
                        total += 1
                        wins += c > j
                    b(f"| {layout} | {k} | {op} | {c:,.0f} | {j:,.0f} | {rat} |")
        b("")
        if total:
            ok = wins == total
            summary.append(("shared (section 16): creates, stats, unlinks per second, 1-4 mounts, own and shared directory",
                            "ahead of JuiceFS on every figure", f"ahead on {wins} of {total}", ok))
            b(f"Cairn ahead of JuiceFS on {wins} of {total} figures: {met(ok)}.")
            b("")

    # --- sequential
    sq = [r for r in rs if r.get("kind") == "sh_seq"]
    if sq:
        b("### 16.2 Sequential write and cold read per mount")
        b("")
        b(f"Each of K mounts at once writes a file of {sq[0].get('mib', '?')} MiB of its own random bytes with `dd` "
          "(`conv=fsync`), timed until the last `dd` returns. Then every mount is unmounted and mounted again with an "
          "empty cache directory, the kernel's caches dropped, and each mount reads the file **another** mount wrote "
          "(K = 1: its own) with `dd`, all at once. MiB/s per mount (its bytes over the phase's wall time) and in all.")
        b("")
        b("| mounts | phase | Cairn, per mount | JuiceFS, per mount | Cairn, all | JuiceFS, all | Cairn ÷ JuiceFS |")
        b("|---:|---|---:|---:|---:|---:|---:|")
        wins, total = 0, 0
        for k in sorted({r["mounts"] for r in sq}):
            for ph in ("write", "read"):
                v = {fs: med([r["mib_s_per_mount"] for r in sq if r["fs"] == fs and r["mounts"] == k and r["phase"] == ph])
                     for fs, _ in SYSTEMS}
                c, j = v["cairn"], v["juicefs"]
                if c == c and j == j:
                    total += 1
                    wins += c > j
                b(f"| {k} | {ph} | {c:,.1f} MiB/s | {j:,.1f} MiB/s | {c * k:,.1f} MiB/s | {j * k:,.1f} MiB/s | "
                  + (f"{c / j:.2f}" if c == c and j == j and j else "n/a") + " |")
        b("")
        if total:
            summary.append(("shared (section 16): sequential write and cold read per mount, 1 and 4 mounts",
                            "ahead of JuiceFS", f"ahead on {wins} of {total}", wins == total))

    # --- visibility
    vs = [r for r in rs if r.get("kind") == "sh_vis"]
    if vs:
        b("### 16.3 Time until a change on one mount is visible on another")
        b("")
        tr = vs[0].get("trials", 0)
        b(f"`python3 bench/shared.py vis MNT1/vis MNT2/vis {tr}`: {tr} trials of each change, interleaved, a random "
          "0–50 ms pause before each. Mount B looks the name (or the file's size) up just before mount A makes the "
          "change, so B's caches hold the old answer; then B polls `stat` every 0.5 ms until it sees the change. Timed "
          "from the return of A's `close` or `rename`. A trial not seen within 10 s counts as missed.")
        b("")
        b("| change | Cairn median | Cairn p99 | Cairn max | JuiceFS median | JuiceFS p99 | JuiceFS max | missed (Cairn, JuiceFS) |")
        b("|---|---:|---:|---:|---:|---:|---:|---:|")
        allv = {}
        for kind, label in (("create", "create on A, `stat` on B"), ("write", "append + close on A, size on B"),
                            ("rename", "rename on A, `stat` of the new name on B"), ("all", "all three")):
            cells, miss = [], []
            for fs, _ in SYSTEMS:
                r = next((x for x in vs if x["fs"] == fs), None)
                if r is None:
                    cells += ["n/a"] * 3
                    miss.append("n/a")
                    continue
                xs = r["create"] + r["write"] + r["rename"] if kind == "all" else r[kind]
                ms = sum(r["missed"].values()) if kind == "all" else r["missed"][kind]
                allv.setdefault(fs, {})[kind] = xs
                cells += [fmt_s(_pct(xs, 50)), fmt_s(_pct(xs, 99)), fmt_s(max(xs) if xs else float("nan"))]
                miss.append(str(ms))
            b(f"| {label} | " + " | ".join(cells) + f" | {', '.join(miss)} |")
        b("")
        c = allv.get("cairn", {}).get("all", [])
        j = allv.get("juicefs", {}).get("all", [])
        if c:
            p99 = _pct(c, 99)
            ok = p99 < 0.1 and not sum(next(x for x in vs if x["fs"] == "cairn")["missed"].values())
            summary.append(("shared (section 16): change visible on another mount, p99",
                            "< 100 ms (and ahead of JuiceFS)",
                            f"Cairn {fmt_s(p99)} (median {fmt_s(_pct(c, 50))}); JuiceFS {fmt_s(_pct(j, 99)) if j else 'n/a'}",
                            ok and (not j or p99 < _pct(j, 99))))
            b(f"Cairn's p99 over all changes: {fmt_s(p99)}; target < 100 ms: {met(ok)}.")
            b("")

    # --- dedup
    dd = [r for r in rs if r.get("kind") == "sh_dedup"]
    if dd:
        b("### 16.4 Bytes stored when four mounts write the same data")
        b("")
        mib = dd[0].get("mib", 0)
        b(f"A fresh volume per system (its own bucket and database); {dd[0].get('mounts', 4)} mounts each write the same "
          f"{human(mib * MiB)} of random bytes to a file of its own at once (`dd ... conv=fsync`), then all are unmounted "
          "(everything uploaded), and the bucket is listed (`python3 bench/shared.py bucket`: every object's size).")
        b("")
        b("| system | written | bucket bytes | objects | bucket ÷ one copy | write time (all at once) |")
        b("|---|---:|---:|---:|---:|---:|")
        v = {}
        for fs, nm in SYSTEMS:
            r = next((x for x in dd if x["fs"] == fs), None)
            if not r:
                b(f"| {nm} | — | n/a | | | |")
                continue
            v[fs] = r["bytes"]
            b(f"| {nm} | {human(r['mounts'] * mib * MiB)} | {human(r['bytes'])} | {r['objects']:,} | "
              f"{r['bytes'] / (mib * MiB):.2f} | {fmt_s(r['seconds'])} |")
        b("")
        if "cairn" in v:
            ok = v["cairn"] < 1.1 * mib * MiB and ("juicefs" not in v or v["cairn"] < v["juicefs"])
            summary.append((f"shared (section 16): bucket bytes after 4 mounts wrote the same {human(mib * MiB)}",
                            "stored once, below JuiceFS", f"Cairn {human(v['cairn'])}, JuiceFS {human(v.get('juicefs', float('nan')))}", ok))

    _seam(rs, b, summary, fmt_s)
    _notes("shared-failover.md", b)
    _i49(rs, b, summary, code)


def _notes(name, b):
    """Hand-written text kept beside the raw results (bench/results/NAME):
    what changed since the previous run, what 16.7's figures mean, and 16.6, whose figures come from
    scripts of their own (scripts/soak-pg-failover.sh, juicefs-pg-failover.sh),
    not from this section. Rendered as it is, so a re-run keeps it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    if os.path.exists(path):
        for line in open(path).read().rstrip("\n").split("\n"):
            b(line)
        b("")


def _i49(rs, b, summary, code):
    """16.7: this run's cairn against the build before the issue-49 fixes, on
    the section's PostgreSQL and moto, in alternating pairs."""
    st = next((r for r in rs if r.get("kind") == "sh_i49_setup"), {})
    mt = [r for r in rs if r.get("kind") == "sh_i49_meta"]
    sq = [r for r in rs if r.get("kind") == "sh_i49_seq"]
    if not mt and not sq:
        return
    loads = [float(r["load"].split()[0]) for r in mt + sq if r.get("load")]
    b("### 16.7 Before and after the issue-49 fixes (PostgreSQL and moto, interleaved pairs)")
    b("")
    b(f"cairn built at {st.get('before', '?')} (the last commit before the first issue-49 change, the merge of "
      "`i49-durable`; built by the section from this repository's history) and this run's cairn, on the section's "
      f"PostgreSQL and moto, {st.get('runs', '?')} pairs, the builds alternating (before first in odd pairs, after first "
      f"in even ones), each on a fresh volume (its own bucket and database) with {st.get('mounts', 2)} mounts: 16.1's "
      f"phases ({st.get('files_per_mount', 0):,} empty files per mount) with 1 and 2 mounts, then 16.2's sequential "
      f"write of {st.get('seq_mib', '?')} MiB on 1 mount. Medians of each build; after ÷ before is the median of the "
      "pairs' ratios (each pair measured within a minute or two, so the load hits both sides), with the smallest and "
      "largest pair's ratio."
      + (f" Load (1 min) at the samples: {min(loads):.2f} to {max(loads):.2f} on 2 cores." if loads else ""))
    b("")
    for line in code([r["cmd"] for r in rs if r.get("kind") == "sh_i49_cmd"]):
        b(line)
    b("")
    b("| layout | mounts | op | before | after | after ÷ before | pairs' ratios (min–max) |")
    b("|---|---:|---|---:|---:|---:|---|")
    worst = None

    def row(label, key_rows, key):
        nonlocal worst
        by = {}
        for r in key_rows:
            by.setdefault(r["run"], {})[r["build"]] = r[key]
        pairs = [v["after"] / v["before"] for v in by.values() if "after" in v and "before" in v and v["before"]]
        bf = [v["before"] for v in by.values() if "before" in v]
        af = [v["after"] for v in by.values() if "after" in v]
        if not bf or not af:
            b(f"| {label} | n/a | n/a | n/a | |")
            return
        rat = statistics.median(pairs) if pairs else float("nan")
        if pairs and (worst is None or rat < worst[0]):
            worst = (rat, label)
        unit = " MiB/s" if key == "mib_s" else ""
        dig = 1 if key == "mib_s" else 0
        b(f"| {label} | {statistics.median(bf):,.{dig}f}{unit} | {statistics.median(af):,.{dig}f}{unit} | "
          f"{rat:.2f} | " + (f"{min(pairs):.2f}–{max(pairs):.2f} ({len(pairs)})" if pairs else "") + " |")

    for k in sorted({r["mounts"] for r in mt}):
        for layout in ("own", "shared"):
            for op in ("create", "stat", "unlink"):
                row(f"{layout} | {k} | {op}/s", [r for r in mt if r["mounts"] == k and r["layout"] == layout], f"{op}_per_s")
    if sq:
        row("16.2 | 1 | write", sq, "mib_s")
    b("")
    _notes("shared-i49.md", b)
    if worst:
        ok = worst[0] >= 0.95
        summary.append(("shared (section 16): after the issue-49 fixes ÷ before (16.1 at 1-2 mounts, 16.2 write)",
                        "none below 0.95 without a reason", f"lowest {worst[0]:.2f} ({worst[1].replace(' | ', ' ')})", ok))


def _seam(rs, b, summary, fmt_s):
    """16.5: a local volume (SQLite metadata) with the build before the
    metadata-store seam and this run's."""
    sm = [r for r in rs if r.get("kind") == "sh_seam"]
    st = next((r for r in rs if r.get("kind") == "sh_seam_setup"), {})
    if not sm:
        return
    b("### 16.5 A volume with SQLite metadata, before and after the metadata-store seam")
    b("")
    b(f"The same machine, the same disk: cairn built at {st.get('before', '?')} (the commit before `b28c295` "
      "\"The metadata store becomes a seam\", built by the section from this repository's history) and this run's "
      f"cairn, alternating, {st.get('runs', '?')} runs, each workload on a fresh encrypted local volume: "
      f"create, stat and unlink {st.get('files', 0):,} empty files in one directory (`bench/fsbench.py meta`), and the "
      f"untar of the kernel tree's 1/16 sample ({st.get('tree_files', 0):,} files) + `sync`. Medians.")
    b("")
    b("| workload | before the seam | after | after ÷ before |")
    b("|---|---:|---:|---:|")
    med = {}
    for build in ("before", "after"):
        xs = [r for r in sm if r["build"] == build]
        if not xs:
            continue
        med[build] = {
            "create": statistics.median(r["files"] / r["create_s"] for r in xs),
            "stat": statistics.median(r["files"] / r["stat_s"] for r in xs),
            "unlink": statistics.median(r["files"] / r["unlink_s"] for r in xs),
            "untar": statistics.median(r["untar_s"] for r in xs),
        }
    if len(med) < 2:
        b("| (a build did not finish) | | | |")
        return
    bf, af = med["before"], med["after"]
    for k, label in (("create", "creates/s"), ("stat", "stats/s"), ("unlink", "unlinks/s")):
        b(f"| {label} | {bf[k]:,.0f} | {af[k]:,.0f} | {af[k] / bf[k]:.2f} |")
    b(f"| untar + sync | {fmt_s(bf['untar'])} | {fmt_s(af['untar'])} | {af['untar'] / bf['untar']:.2f} (time) |")
    b("")
    # "No slower": within the noise of a shared 2-core machine (5%).
    ok = all(af[k] >= 0.95 * bf[k] for k in ("create", "stat", "unlink")) and af["untar"] <= 1.05 * bf["untar"]
    summary.append(("shared (section 16): SQLite volume after the seam vs before (creates, stats, unlinks, untar)",
                    "no slower", f"creates {af['create'] / bf['create']:.2f}×, untar time {af['untar'] / bf['untar']:.2f}×", ok))


def main(args=None):
    a = sys.argv[1:] if args is None else args
    cmd = a[0] if a else "-h"
    if cmd == "meta":
        return meta(int(a[1]), a[2:])
    if cmd == "vis":
        return vis(a[1], a[2], int(a[3]))
    if cmd == "bucket":
        return bucket(a[1], a[2], a[3] if len(a) > 3 else "")
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
