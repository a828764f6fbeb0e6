#!/usr/bin/env python3
"""Section 15 of bench/run.sh (volumes on tape): helpers run by bench/tape.sh,
and the section's part of the report (render, called by fsbench.py).

  tape.py params                      the emulator's default parameters (JSON)
  tape.py session DIR                 the emulated tape's last-session.json (JSON; {} if none)
  tape.py pm-write DIR N MIN MAX SEED N files of MIN..MAX KiB (random sizes and bytes)
  tape.py pm-read DIR N READS B SEED  READS random whole files of those, B at a time, concurrently
  tape.py read-file PATH              reads PATH in 1 MiB reads: bytes, seconds, seconds to the first MiB
  tape.py tape-order CAIRN PATH...    the files in the order their first bytes were put on the tape
                                      (by their lowest chunk id, from `cairn info --json`; puts go to
                                      a tape one at a time, in order), as a JSON list of base names
"""
import json
import os
import random
import subprocess
import sys
import threading
import time

MiB = 1 << 20


def params():
    # The defaults of cairn-tape's EmuParams::default() (lto9_scaled(0.2)),
    # as docs/tape.md B3 states them; the tape's own params.json is the
    # truth for a run and is what `session` reads next to it.
    print(json.dumps({"native_mbps": 80.0, "min_mbps": 35.4, "locate_fixed_secs": 3.0, "backhitch_secs": 3.0, "buffer_mib": 204.8}))


def session(d):
    out = {}
    try:
        s = json.load(open(os.path.join(d, "last-session.json")))
        out = {"seconds": s["seconds"], **s["stats"]}
    except (OSError, ValueError, KeyError):
        pass
    try:
        p = json.load(open(os.path.join(d, "params.json")))
        out["native_rate"] = p.get("native_rate")
    except (OSError, ValueError):
        pass
    print(json.dumps(out))


def pm_names(n):
    return [f"d{i % 20:02d}/f{i:05d}" for i in range(n)]


def pm_write(d, n, lo_kib, hi_kib, seed):
    rng = random.Random(seed)
    total = 0
    t0 = time.perf_counter()
    for name in pm_names(n):
        size = rng.randint(lo_kib, hi_kib) * 1024
        p = os.path.join(d, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            left = size
            while left:
                k = min(left, 4 * MiB)
                f.write(os.urandom(k))
                left -= k
        total += size
    print(json.dumps({"files": n, "bytes": total, "write_seconds": time.perf_counter() - t0}))


def pm_read(d, n, reads, batch, seed):
    rng = random.Random(seed)
    names = pm_names(n)
    picks = [rng.choice(names) for _ in range(reads)]
    got = [0] * len(picks)

    def read(i):
        with open(os.path.join(d, picks[i]), "rb") as f:
            while True:
                b = f.read(4 * MiB)
                if not b:
                    break
                got[i] += len(b)

    t0 = time.perf_counter()
    for g in range(0, len(picks), batch):
        ts = [threading.Thread(target=read, args=(i,)) for i in range(g, min(g + batch, len(picks)))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    secs = time.perf_counter() - t0
    print(json.dumps({"reads": len(picks), "batch": batch, "bytes": sum(got), "seconds": secs}))


def read_file(path):
    t0 = time.perf_counter()
    first = None
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(MiB)
            if not b:
                break
            n += len(b)
            if first is None:
                first = time.perf_counter() - t0
    print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0, "first_mib_seconds": first or 0.0}))


def tape_order(cairn, paths):
    first = {}
    for p in paths:
        info = json.loads(subprocess.run([cairn, "info", "--json", p], check=True, capture_output=True, text=True).stdout)
        ids = [r["chunk"] for r in info.get("runs", []) if r.get("chunk") is not None]
        first[os.path.basename(p)] = min(ids) if ids else float("inf")
    print(json.dumps(sorted(first, key=lambda n: first[n])))


def render(rows, b, summary, h):
    """Appends section 15 to the report body."""
    med, human, met, code, cmds_for = h["med"], h["human"], h["met"], h["code"], h["cmds_for"]
    tp = [r for r in rows if r.get("section") == "tape"]
    if not any(r.get("kind", "").startswith("tape_") for r in tp):
        return
    st = next((r for r in tp if r.get("kind") == "tape_setup"), {})
    raw = [r for r in tp if r.get("kind") == "tape_raw"]
    wr = [r for r in tp if r.get("kind") == "tape_write"]
    rd = [r for r in tp if r.get("kind") == "tape_read"]
    tars = [r for r in tp if r.get("kind") == "tape_tar"]
    cdp = [r for r in tp if r.get("kind") == "tape_cdp"]
    pmw = [r for r in tp if r.get("kind") == "tape_pm_write"]
    pmr = [r for r in tp if r.get("kind") == "tape_pm_read"]
    mb = lambda n, s: n / s / 1e6 if s else float("nan")
    raw_w = med([mb(r["bytes"], r["write_seconds"]) for r in raw])
    raw_r = med([mb(r["bytes"], r["read_seconds"]) for r in raw])
    b("## 15. Volumes on tape: the emulated drive in real time (seed 002, HPTFS §VI)")
    b("")
    b("Every tape is Cairn's emulated drive with its default parameters (an LTO-9 scaled by 0.2: 80 MB/s native, "
      "35.4 MB/s slowest matching speed, 3 s per locate and per backhitch, 205 MiB buffer; docs/tape.md B3) running on "
      "the real clock, a fresh tape per measurement, volumes not encrypted. The reference of every ratio is the raw rate "
      "measured in the same run through the device API with no file system (`cairn tape dd`, the paper's `dd` to "
      "`/dev/nst0`); it includes the drive's start (filling its buffer) and the final flush. Backhitches, streaming and "
      "idle time are the emulator's own record of the session (`last-session.json`).")
    b("")
    b(f"Raw drive: write **{raw_w:.1f} MB/s**, read **{raw_r:.1f} MB/s** ({human(raw[0]['bytes']) if raw else 'n/a'}, "
      f"{len(raw)} run(s); the model's native rate is 80 MB/s).")
    b("")
    if wr:
        b(f"**Table II: n concurrent `dd` writers of {human(st.get('file_bytes', 0))} each.** Rate = all bytes / time from the "
          "first write to the end of `cairn umount` (every byte and the catalog on tape; the writes themselves are "
          "acknowledged from the local journal, so `dd` alone finishes earlier, column dd). The writers start a few seconds "
          "after the mount returns, once the mount has moved the tape to its append point (it does so when the drive has "
          "been idle 0.5 s after its own reads: a 3 s locate); a write issued sooner waits for that locate, once. "
          "The daemon's peak RSS is its VmHWM until it exits, the unmount's flush included (`--tape-memory` at its "
          "default, 1 GiB).")
        b("")
        b("| writers | dd done | all on tape | rate | vs raw | backhitches | streaming | idle | locates | daemon peak RSS |")
        b("|---|---|---|---|---|---|---|---|---|---|")
        for n in sorted({r["writers"] for r in wr}):
            rs = [r for r in wr if r["writers"] == n]
            rate = med([mb(r["bytes"], r["seconds"]) for r in rs])
            sess = [r.get("session", {}) for r in rs]
            b(f"| {n} | {med([r['dd_seconds'] for r in rs]):.1f} s | {med([r['seconds'] for r in rs]):.1f} s | {rate:.1f} MB/s | "
              f"{rate / raw_w:.0%} | {med([s.get('backhitches', float('nan')) for s in sess]):.0f} | "
              f"{med([s.get('streaming_secs', float('nan')) for s in sess]):.1f} s | {med([s.get('idle_secs', float('nan')) for s in sess]):.1f} s | "
              f"{med([s.get('locates', float('nan')) for s in sess]):.0f} | {human(med([r['peak_rss_kib'] * 1024 for r in rs]))} |")
        b("")
        worst = min(med([mb(r["bytes"], r["seconds"]) for r in wr if r["writers"] == n]) for n in {r["writers"] for r in wr}) / raw_w
        bh = max(r.get("session", {}).get("backhitches", 0) for r in wr)
        summary.append(("Tape II: 1-4 concurrent dd writers through the mount, vs the raw drive", ">= 98%, 0 backhitches",
                        f"lowest {worst:.0%}, at most {bh} backhitches", worst >= 0.98 and bh == 0))
        rss4 = [r["peak_rss_kib"] * 1024 for r in wr if r["writers"] == max(x["writers"] for x in wr)]
        summary.append(("Tape: daemon peak RSS in the 4-writer run, unmount included", "bounded by --tape-memory (1 GiB) + base", human(med(rss4)), med(rss4) < (1 << 30) + (256 << 20)))
    mounts = [r for r in tp if r.get("kind") == "tape_mount"]
    if mounts:
        b("**Mounting a tape on a machine that has only it** (a fresh cache directory, `--read-only`, unmounted at once): "
          "the time until the mount point is ready, and the drive's session from open to close. The catalog (read from the "
          "end of data) carries the volume's config and metadata chain (docs/tape.md §8), so the mount reads nothing else; "
          "the session also counts the idle drive's move to the first data if the unmount came after it (0.5 s idle).")
        b("")
        b("| tape written by | data | mount | locates | bytes read |")
        b("|---|---|---|---|---|")
        for n in sorted({r["writers"] for r in mounts}):
            rs = [r for r in mounts if r["writers"] == n]
            sess = [r.get("session", {}) for r in rs]
            b(f"| {n} writer(s) | {human(rs[0]['bytes'])} | {med([r['seconds'] for r in rs]):.1f} s | "
              f"{med([s.get('locates', float('nan')) for s in sess]):.0f} | {human(med([s.get('bytes_read', float('nan')) for s in sess]))} |")
        b("")
        full = [r for r in mounts if r["writers"] == max(x["writers"] for x in mounts)]
        summary.append(("Tape: mounting a full tape on a fresh cache directory", "at most two locates, seconds",
                        f"{med([r['seconds'] for r in full]):.1f} s, {med([r.get('session', {}).get('locates', 99) for r in full]):.0f} locates",
                        med([r.get("session", {}).get("locates", 99) for r in full]) <= 2 and med([r["seconds"] for r in full]) < 30))
    if rd:
        rds = [r for r in tp if r.get("kind") == "tape_read_session"]
        b(f"**Table III: {human(rd[0]['bytes'])} files read back** on a fresh cache directory (a machine with only the tape), "
          "after n files were written at once, through a read-only mount (a restore): its idle drive moves from the end of "
          "data, where the catalog is, to the first data on the tape; the first file is opened once that is done. As HPTFS "
          "measured it, the n files are then read one by one in name order (w0 first), each timed from its open, with "
          f"{st.get('read_gap', 5)} s between two reads so that the drive has stopped. \"From open\" includes any locate to "
          "the file; \"after the first MiB\" is the rate once it streams. Tape order: the files by where their first bytes "
          "lie (lowest chunk id; puts reach a tape one at a time, in order), from the last run.")
        b("")
        b("| interleave | w0: time | to the first MiB | rate from open | vs raw read | after the first MiB | vs raw read | "
          "every file from its open: lowest | median | tape order | locates in the session | HPTFS from open (setting B) |")
        b("|---|---|---|---|---|---|---|---|---|---|---|---|")
        hptfs = {1: "31.8 of 35.1 MB/s (91%)", 2: "15.1 (43%)", 3: "11.4 (33%)", 4: "8.6 (25%)"}
        worst = worst_open = 1e9
        for n in sorted({r["interleave"] for r in rd}):
            rs = [r for r in rd if r["interleave"] == n and r.get("file", 0) == 0]
            rate = med([mb(r["bytes"], r["seconds"]) for r in rs])
            stream = med([mb(r["bytes"] - MiB, r["seconds"] - r.get("first_mib_seconds", 0.0)) for r in rs])
            # Per file (all runs): the median over runs of each file's rate
            # from its open; the lowest of those and their median.
            per_file = []
            for i in sorted({r.get("file", 0) for r in rd if r["interleave"] == n}):
                per_file.append(med([mb(r["bytes"], r["seconds"]) for r in rd if r["interleave"] == n and r.get("file", 0) == i]))
            low, mid = min(per_file), med(per_file)
            worst, worst_open = min(worst, stream / raw_r), min(worst_open, low / raw_r)
            sess = [r for r in rds if r["interleave"] == n] or rs
            locs = med([r.get("session", {}).get("locates", float("nan")) for r in sess])
            order = " ".join((sess[-1].get("tape_order") or rs[-1].get("tape_order") or []))
            b(f"| {n} | {med([r['seconds'] for r in rs]):.1f} s | {med([r.get('first_mib_seconds', float('nan')) for r in rs]):.1f} s | "
              f"{rate:.1f} MB/s | {rate / raw_r:.0%} | {stream:.1f} MB/s | {stream / raw_r:.0%} | "
              f"{low:.1f} MB/s ({low / raw_r:.0%}) | {mid:.1f} MB/s ({mid / raw_r:.0%}) | {order or '-'} | {locs:.0f} | {hptfs.get(n, '')} |")
        b("")
        summary.append(("Tape III: 500 MiB files read back one by one at interleave 1-4, vs the raw read", ">= 80% from the open at every degree",
                        f"lowest {worst_open:.0%} from the open, {worst:.0%} once streaming", worst_open >= 0.8))
    if tars:
        t = tars
        b("**The conventional way:** GNU tar of the same files streamed to a fresh tape with `cairn tape dd --to` (one stream, "
          "no file system), and one member (the archive's first, where tar stops: its best case) read back with "
          "`cairn tape dd --from | tar -x`, against Cairn's table II (4 writers) and table III (interleave 4) figures.")
        b("")
        b("| | tar + raw drive | Cairn |")
        b("|---|---|---|")
        c_w = [r for r in wr if r["writers"] == max(x["writers"] for x in wr)]
        c_r = [r for r in rd if r["interleave"] == max(x["interleave"] for x in rd)]
        b(f"| write {human(t[0]['bytes'])} | {med([mb(r['bytes'], r['write_seconds']) for r in t]):.1f} MB/s | "
          f"{med([mb(r['bytes'], r['seconds']) for r in c_w]):.1f} MB/s |")
        b(f"| one member back | {med([r['member_seconds'] for r in t]):.1f} s | {med([r['seconds'] for r in c_r]):.1f} s |")
        b("")
    if cdp:
        tape_only = med([mb(r["bytes"], r["seconds"]) for r in cdp if r["mode"] == "tape"])
        mirror = med([mb(r["bytes"], r["seconds"]) for r in cdp if r["mode"] == "mirror"])
        b("**Table VIII: the CDP mirror** (`--mirror DIR`: every pack to the tape and a local directory at once), one writer, "
          "until unmounted.")
        b("")
        b("| | rate | vs tape only |")
        b("|---|---|---|")
        b(f"| tape only | {tape_only:.1f} MB/s | 100% |")
        b(f"| tape + mirror | {mirror:.1f} MB/s | {mirror / tape_only:.0%} |")
        b("")
        summary.append(("Tape VIII: write rate with the CDP mirror vs tape only", ">= 95%", f"{mirror / tape_only:.0%}", mirror / tape_only >= 0.95))
    if pmw and pmr:
        w0 = pmw[0]
        b(f"**Tables VI/VII: PostMark-like.** {w0['files']} files of {st.get('pm_min_kib')} KiB to {st.get('pm_max_kib')} KiB "
          f"({human(w0['bytes'])}) written by one writer: {mb(w0['bytes'], w0['seconds']):.1f} MB/s until unmounted. Then "
          f"{st.get('pm_reads')} random whole files read on a fresh cache directory, issued b at a time concurrently: the "
          "store serves each batch in tape-position order; b = 1 is FIFO (one at a time, in the random order).")
        b("")
        b("| batch size | time | rate | vs FIFO | locates |")
        b("|---|---|---|---|---|")
        fifo = next((mb(r["bytes"], r["seconds"]) for r in pmr if r["batch"] == 1), float("nan"))
        for r in sorted(pmr, key=lambda r: r["batch"]):
            rate = mb(r["bytes"], r["seconds"])
            b(f"| {r['batch']} | {r['seconds']:.1f} s | {rate:.1f} MB/s | {rate / fifo:.2f}x | {r.get('session', {}).get('locates', 'n/a')} |")
        b("")
        top = max(pmr, key=lambda r: r["batch"])
        ratio = mb(top["bytes"], top["seconds"]) / fifo
        summary.append((f"Tape VI/VII: {top['batch']} whole-file reads at once vs one at a time", ">= 4x faster",
                        f"{ratio:.2f}x ({top.get('session', {}).get('locates', '?')} locates)", ratio >= 4))
    b("Commands:")
    b("")
    for line in code(cmds_for(rows, "tape")):
        b(line)
    b("")


def main():
    a = sys.argv[1:]
    if not a:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if a[0] == "params":
        params()
    elif a[0] == "session":
        session(a[1])
    elif a[0] == "pm-write":
        pm_write(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    elif a[0] == "read-file":
        read_file(a[1])
    elif a[0] == "tape-order":
        tape_order(a[1], a[2:])
    elif a[0] == "pm-read":
        pm_read(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
