#!/usr/bin/env python3
"""Helpers of bench/run.sh's sections 9-11 (zero-copy tar archives; stdlib
only). Each command prints one JSON object.

  archive.py gentree DIR FILES MIB   FILES files of random bytes adding up to
                                     MIB MiB in one directory DIR, fsynced
  archive.py run [--rss-pid PID] [--then CMD] [--sync-fs PATH] -- CMD...
                                     run CMD and time it; then time `--then`
                                     (a shell-split command, e.g. `cairn stats`)
                                     or syncfs(PATH). Reports CMD's own peak
                                     RSS (wait4), PID's peak RSS while CMD and
                                     the follow-up ran (VmHWM reset before,
                                     and VmRSS sampled every 10 ms), and the
                                     growth of the page cache
  archive.py mount-list MNT -- MOUNTCMD...
                                     run MOUNTCMD (it must return once MNT is
                                     mounted, or daemonise), wait until MNT is a
                                     mountpoint, then `ls -lR MNT`; times both

fsbench.py imports this module to render sections 9-11 of the report.
"""

import json
import os
import shlex
import subprocess
import sys
import threading
import time

MiB = 1 << 20
KiB = 1024


# --- helpers run by bench/run.sh ---------------------------------------------

def gentree(root, files, mib):
    os.mkdir(root)
    total = mib * MiB
    size = total // files
    for i in range(files):
        with open(os.path.join(root, f"f{i:05d}.bin"), "wb") as f:
            left = size
            while left:
                n = min(left, 16 * MiB)
                f.write(os.urandom(n))
                left -= n
    syncfs(root)
    print(json.dumps({"files": files, "bytes": size * files, "file_bytes": size}))


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Peak VmRSS of `pid`, read every `period` seconds."""

    def __init__(self, pid, period=0.010):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.peak, self.samples = 0, 0
        self.stop = threading.Event()

    def run(self):
        while True:
            v = status_kib(self.pid, "VmRSS")
            if v is not None:
                self.peak = max(self.peak, v)
                self.samples += 1
            if self.stop.wait(self.period):
                break

    def finish(self):
        self.stop.set()
        self.join()
        v = status_kib(self.pid, "VmRSS")  # one last sample
        if v is not None:
            self.peak = max(self.peak, v)


def syncfs(path):
    """syncfs(2) of the file system holding `path` (what `sync -f` does)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        os.close(fd)


def run(a):
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    res = {}
    sampler = None
    if a.rss_pid:
        res["rss_before_kib"] = status_kib(a.rss_pid, "VmRSS")
        try:  # proc(5): "5" resets VmHWM to the current RSS
            with open(f"/proc/{a.rss_pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        if not a.timing_only:
            sampler = Sampler(a.rss_pid)
            sampler.start()
    cache0 = meminfo_kib("Cached")
    # --timing-only: the command alone, as the timed figures want it. A
    # cold start of /usr/bin/time and a sampling thread cost milliseconds,
    # nothing beside GNU tar's seconds but a tenth of a zero-copy archive.
    wrap = [] if a.timing_only else ["/usr/bin/time", "-f", "%M", "-o", a.time_out]
    t0 = time.perf_counter()
    # GNU time's %M: the command's own peak RSS (wait4's ru_maxrss of a
    # child forked from Python would count Python's pages from before exec).
    r = subprocess.run(wrap + argv, stdout=subprocess.DEVNULL)
    t1 = time.perf_counter()
    if r.returncode != 0:
        sys.exit(f"{argv} exited with {r.returncode}")
    maxrss = None
    if wrap:
        with open(a.time_out) as f:
            maxrss = int(f.read().split()[-1])
        os.unlink(a.time_out)
    if a.then:
        r = subprocess.run(shlex.split(a.then), stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            sys.exit(f"{a.then} exited with {r.returncode}")
    elif a.sync_fs:
        syncfs(a.sync_fs)
    t2 = time.perf_counter()
    cache1 = meminfo_kib("Cached")
    res.update(seconds=t1 - t0, then_seconds=t2 - t1, total_seconds=t2 - t0, page_cache_growth_kib=cache1 - cache0)
    if maxrss is not None:
        res["maxrss_kib"] = maxrss
    if a.rss_pid:
        res["rss_hwm_kib"] = status_kib(a.rss_pid, "VmHWM")
        peak = res["rss_hwm_kib"] or 0
        if sampler:
            sampler.finish()
            res["rss_sampled_peak_kib"] = sampler.peak
            res["rss_samples"] = sampler.samples
            peak = max(peak, sampler.peak)
        res["rss_after_kib"] = status_kib(a.rss_pid, "VmRSS")
        res["rss_extra_kib"] = peak - (res["rss_before_kib"] or 0)
    print(json.dumps(res))


def mount_list(a):
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"{argv} exited with {r.returncode}")
    t1 = time.perf_counter()
    for _ in range(3000):
        if os.path.ismount(a.mnt):
            break
        time.sleep(0.005)
    else:
        sys.exit(f"{a.mnt} did not get mounted")
    t2 = time.perf_counter()
    with open(os.devnull, "w") as null:
        r = subprocess.run(["ls", "-lR", a.mnt], stdout=null)
    t3 = time.perf_counter()
    if r.returncode != 0:
        sys.exit(f"ls -lR {a.mnt} exited with {r.returncode}")
    print(json.dumps({"mount_cmd_seconds": t1 - t0, "mount_seconds": t2 - t0, "list_seconds": t3 - t2,
                      "total_seconds": t3 - t0}))


# --- report (called by fsbench.py report) -------------------------------------

METHODS = [("ext4", "(i) GNU tar, ext4"), ("cairn", "(ii) Cairn zero-copy"),
           ("tarfuse", "(iii) GNU tar in the mount"), ("tarfuse1m", "(iv) GNU tar -b 2048 in the mount")]


def render(rows, b, summary, h):
    """Appends sections 9-11 to the report body (b: append a line; summary:
    (what, target, result, met) tuples; h: fsbench's helpers)."""
    med, fmt_s, human, met, code = h["med"], h["fmt_s"], h["human"], h["met"], h["code"]
    cmds = lambda s: h["cmds_for"](rows, s)
    mib = lambda kib: f"{kib / 1024:,.1f}"

    def t(rs, method, phase, files, size, key="total_seconds"):
        return med([r[key] for r in rs if r["method"] == method and r["phase"] == phase and r["files"] == files and r["bytes"] == size])

    def nruns(rs, method, files, size):
        return len({r["run"] for r in rs if r["method"] == method and r["files"] == files and r["bytes"] == size})

    # --- 9. archive
    arc = [r for r in rows if r.get("kind") == "arc"]
    if arc:
        setups = sorted({(r["files"], r["bytes"]) for r in arc}, key=lambda x: (x[1], x[0]))
        b("## 9. Archive and extract without copying (AvaTar, figure 3)")
        b("")
        b("AvaTar (IEEE Access 2020, section IV.B.1) archives and extracts random files with its kernel merge/split "
          "operations against GNU tar on ext4, uncached: (a) 1,024 files of 64 MiB to 4 GiB in all, (b) 1 GiB in all in "
          "64 to 4,096 files. Same setups here, each file random bytes (incompressible), all in one directory `src`. "
          "Methods: (i) GNU tar on ext4, source and archive in the scratch directory; (ii) `cairn archive create` / "
          "`cairn archive extract` inside the mount (the archive is a new extent list over the members' chunks; "
          "extracted files are slices of the archive's); (iii) GNU tar inside the mount, source and archive both in the "
          "volume (what a user without the zero-copy commands gets); (iv) the same with 1 MiB records (`-b 2048`) instead "
          "of tar's default 10 KiB. Every timed command starts uncached: `sync; echo 3 > /proc/sys/vm/drop_caches` "
          "before it, and for (ii)-(iv) a freshly mounted daemon as well. Timed until the result is durable: (i) "
          "plus `syncfs` of ext4 (`sync -f`), (ii)-(iv) plus `cairn stats`, which flushes every dirty file into packs "
          "and syncs the metadata database. Each figure is the median of the runs, run after run interleaved (i), (ii), "
          "(iii), (iv); the runs column gives their number per method, in column order (GNU tar inside the mount "
          "runs fewer times: it takes seconds to minutes, Cairn tens of milliseconds, which a shared machine moves more). Run 1 of each setup checks every result outside the timing: `diff -r` of each extracted tree "
          "against the source, and `tar -d` (GNU tar reads Cairn's archive and compares every member's data and "
          "attributes with the source on ext4). The commands run directly under the timer (`archive.py run "
          "--timing-only`): section 10 wraps them in `/usr/bin/time` and samples the daemon's RSS every 10 ms, "
          "which adds milliseconds that would be a tenth of a Cairn figure here.")
        b("")
        body_cmds = cmds("archive")
        if body_cmds:
            b("```sh")
            for c in body_cmds:
                b(c)
            b("```")
            b("")
        figs = [("(a) 1,024 files", lambda f, s: f == 1024, lambda f, s: human(s)),
                ("(b) 1 GiB in all", lambda f, s: s == 1 << 30, lambda f, s: f"{f:,} files")]
        have = {m for m, _ in METHODS if any(r["method"] == m for r in arc)}
        cols = [(m, n) for m, n in METHODS if m in have]
        for title, pick, label in figs:
            sel = [x for x in setups if pick(*x)]
            if title.startswith("(b)"):
                sel.sort()
            if not sel:
                continue
            b(f"### {title}")
            b("")
            b("| setup | runs | | " + " | ".join(n for _, n in cols) + " | GNU tar ext4 ÷ Cairn | GNU tar in the mount ÷ Cairn |")
            b("|---|---:|---|" + "---:|" * len(cols) + "---:|---:|")
            for f, s in sel:
                for ph in ("archive", "extract"):
                    v = {m: t(arc, m, ph, f, s) for m, _ in cols}
                    nr = "/".join(str(nruns(arc, m, f, s)) for m, _ in cols)
                    sp = v["ext4"] / v["cairn"] if "ext4" in v and "cairn" in v else float("nan")
                    sf = v["tarfuse"] / v["cairn"] if "tarfuse" in v and "cairn" in v else float("nan")
                    b(f"| {label(f, s)} | {nr} | {ph} | " + " | ".join(fmt_s(v[m]) for m, _ in cols) + f" | {sp:,.0f}× | {sf:,.0f}× |")
            b("")
        # where Cairn's time goes
        ca = [r for r in arc if r["method"] == "cairn"]
        if ca:
            b("Cairn's figures include starting the `cairn` CLI (it sends one request over the control socket) and the "
              f"`cairn stats` call after it: median {fmt_s(med([r['then_seconds'] for r in ca]))} over all setups. "
              "The command alone, by setup (archive / extract): "
              + "; ".join(f"{f:,} files, {human(s)}: {fmt_s(t(ca, 'cairn', 'archive', f, s, 'seconds'))} / "
                          f"{fmt_s(t(ca, 'cairn', 'extract', f, s, 'seconds'))}" for f, s in setups) + ".")
            b("")
        if ca and "rss_extra_kib" in ca[0]:
            b("The daemon's extra memory during (ii) (peak RSS, VmHWM, minus RSS before), archive / extract: "
              + "; ".join(f"{f:,} files, {human(s)}: {mib(t(ca, 'cairn', 'archive', f, s, 'rss_extra_kib'))} / "
                          f"{mib(t(ca, 'cairn', 'extract', f, s, 'rss_extra_kib'))} MiB" for f, s in setups) + ".")
            b("")
        tf = [r for r in arc if r["method"] in ("tarfuse", "tarfuse1m")]
        if tf:
            big = max(setups, key=lambda x: (x[1], -x[0]))
            f, s = big
            parts = []
            for m, n in (("tarfuse", "10 KiB records"), ("tarfuse1m", "1 MiB records")):
                a_, x_ = t(tf, m, "archive", f, s), t(tf, m, "extract", f, s)
                if a_ == a_:
                    parts.append(f"{n}: archive {s / (1 << 20) / a_:,.0f} MiB/s, extract {s / (1 << 20) / x_:,.0f} MiB/s")
            tfr = [r for r in tf if r["method"] == "tarfuse" and r["files"] == f and r["bytes"] == s and "rss_extra_kib" in r]
            extra = (f" Meanwhile the daemon's RSS grows by {mib(med([r['rss_extra_kib'] for r in tfr if r['phase'] == 'archive']))} / "
                     f"{mib(med([r['rss_extra_kib'] for r in tfr if r['phase'] == 'extract']))} MiB (archive / extract; "
                     "the data passes through it)." if tfr else "")
            b(f"GNU tar inside the mount moves every byte through FUSE twice (read the source, write the archive or the "
              f"members), and without the kernel's write-back cache (Cairn mounts had none before e68deda) each `write` is one FUSE request: with tar's default "
              f"10 KiB records that is about 100,000 requests per GiB. At {human(s)} ({f:,} files): " + "; ".join(parts) + "." + extra)
            b("")
        # targets
        key = (1024, 4 << 30)
        if key in setups and "cairn" in have:
            ca_ = t(arc, "cairn", "archive", *key)
            ce_ = t(arc, "cairn", "extract", *key)
            worst = max(ca_, ce_)
            ok = worst < 0.2
            b(f"Target: Cairn < 0.2 s for 1,024 files / 4 GiB: archive {fmt_s(ca_)}, extract {fmt_s(ce_)}: {met(ok)}.")
            summary.append(("archive / extract 1,024 files, 4 GiB in all (uncached, until durable)", "< 0.2 s",
                            f"{fmt_s(ca_)} / {fmt_s(ce_)}", ok))
            if "ext4" in have:
                ra = t(arc, "ext4", "archive", *key) / ca_
                re_ = t(arc, "ext4", "extract", *key) / ce_
                ok = min(ra, re_) >= 300
                b(f"Target: ≥ 300× faster than GNU tar on ext4 at 1,024 files / 4 GiB: archive {ra:,.0f}×, extract "
                  f"{re_:,.0f}×: {met(ok)} (AvaTar: 132× for this extraction). Over all setups: "
                  + ", ".join(f"{min(t(arc, 'ext4', 'archive', f, s) / t(arc, 'cairn', 'archive', f, s), t(arc, 'ext4', 'extract', f, s) / t(arc, 'cairn', 'extract', f, s)):,.0f}× "
                              f"({f:,} files, {human(s)})" for f, s in setups) + " (the smaller of archive and extract).")
                summary.append(("… speedup over GNU tar on ext4 at 1,024 files / 4 GiB", "≥ 300×", f"archive {ra:,.0f}×, extract {re_:,.0f}×", ok))
            b("")

    # --- 10. memory
    mem = [r for r in rows if r.get("kind") == "mem"]
    if mem:
        sizes = sorted({r["bytes"] for r in mem})
        files = sorted({r["files"] for r in mem})
        b(f"## 10. Memory during archive and extract (AvaTar, table 1)")
        b("")
        b(f"{', '.join(f'{f:,}' for f in files)} files, {', '.join(human(s) for s in sizes)} in all; the same procedure "
          "and uncached start as section 9, methods (i) and (ii), "
          f"{len({r['run'] for r in mem})} runs. GNU tar: the tar process's peak RSS (`/usr/bin/time -f %M`). Cairn: "
          "the daemon's extra memory while the command and the `cairn stats` after it run: its peak RSS (VmHWM, reset with "
          "`echo 5 > /proc/PID/clear_refs` just before, and VmRSS sampled every 10 ms; the larger) minus its RSS "
          "before (a freshly mounted daemon each time). The `cairn` CLI's own peak RSS is shown too. AvaTar's table "
          "counts memory that grows with the data (its Tar rows are about twice the data size): that is the page cache, "
          "so the growth of `Cached` in `/proc/meminfo` over each command (starting from dropped caches; other users "
          "of the machine add noise) is shown for both. MiB, medians.")
        b("")
        mc = cmds("memory")
        if mc:
            b("```sh")
            for c in mc:
                b(c)
            b("```")
            b("")

        def mm(method, phase, s, key):
            return med([r[key] for r in mem if r["method"] == method and r["phase"] == phase and r["bytes"] == s])

        b("| MiB | " + " | ".join(human(s) for s in sizes) + " |")
        b("|---|" + "---:|" * len(sizes))
        for label, method, phase, key in (
                ("GNU tar archive: tar's peak RSS", "ext4", "archive", "maxrss_kib"),
                ("GNU tar extract: tar's peak RSS", "ext4", "extract", "maxrss_kib"),
                ("Cairn archive: daemon's extra", "cairn", "archive", "rss_extra_kib"),
                ("Cairn extract: daemon's extra", "cairn", "extract", "rss_extra_kib"),
                ("Cairn: daemon's RSS before (fresh mount)", "cairn", "archive", "rss_before_kib"),
                ("Cairn archive: `cairn` CLI's peak RSS", "cairn", "archive", "maxrss_kib"),
                ("GNU tar archive: page cache growth", "ext4", "archive", "page_cache_growth_kib"),
                ("GNU tar extract: page cache growth", "ext4", "extract", "page_cache_growth_kib"),
                ("Cairn archive: page cache growth", "cairn", "archive", "page_cache_growth_kib"),
                ("Cairn extract: page cache growth", "cairn", "extract", "page_cache_growth_kib")):
            b(f"| {label} | " + " | ".join(mib(mm(method, phase, s, key)) for s in sizes) + " |")
        b("")
        lo, hi = sizes[0], sizes[-1]
        grow = max(mm("cairn", ph, hi, "rss_extra_kib") - mm("cairn", ph, lo, "rss_extra_kib") for ph in ("archive", "extract"))
        worst = max(mm("cairn", ph, s, "rss_extra_kib") for ph in ("archive", "extract") for s in sizes)
        ok = grow <= 4 * 1024
        b(f"Target: the daemon's extra memory flat in the total size (from {human(lo)} to {human(hi)}, {hi // lo}× the data, "
          f"it may grow by at most 4 MiB): it grows by {mib(grow)} MiB; the largest median is {mib(worst)} MiB: {met(ok)}.")
        b("")
        summary.append((f"daemon's extra memory during archive / extract, {human(lo)} → {human(hi)}", "flat (≤ 4 MiB growth)",
                        f"+{mib(grow)} MiB (at most {mib(worst)} MiB)", ok))

    # --- 11. mount
    mt = [r for r in rows if r.get("kind") == "mount"]
    if mt:
        st = next((r for r in rows if r.get("kind") == "mount_setup"), {})
        b(f"## 11. Mounting an archive: `cairn archive mount` vs ratarmount")
        b("")
        b(f"A GNU tar archive of {st.get('files', 0):,} random files, {human(st.get('bytes', 0))} in all "
          f"({human(st.get('archive_bytes', 0))}), on ext4. Each tool mounts it read-only and `ls -lR` lists the mount "
          "(a `stat` of every member). First mount: no index (Cairn's in `$XDG_CACHE_HOME/cairn/tar-index`, "
          "ratarmount's `.index.sqlite` beside the archive, both on ext4), so the tool reads every header and writes "
          "its index; second mount: the index the first one left. Caches dropped before every mount. \"mount\" is "
          "until the command has returned and the directory is a mountpoint; ratarmount's includes starting Python "
          f"and importing its modules. ratarmount: {st.get('ratarmount', '?')}. "
          f"{len({r['run'] for r in mt})} runs, interleaved, medians. Run 1 checks both mounts with `diff -r` against "
          "the source tree (not timed).")
        b("")
        mc = cmds("mount")
        if mc:
            b("```sh")
            for c in mc:
                b(c)
            b("```")
            b("")
        b("| tool | mount | mount time | `ls -lR` | total |")
        b("|---|---|---:|---:|---:|")
        tot = {}
        for tool, name in (("cairn", "`cairn archive mount`"), ("ratarmount", "ratarmount")):
            for state, sname in (("first", "first (builds the index)"), ("second", "second (index reused)")):
                rs = [r for r in mt if r["tool"] == tool and r["state"] == state]
                if not rs:
                    continue
                tot[(tool, state)] = med([r["total_seconds"] for r in rs])
                b(f"| {name} | {sname} | {fmt_s(med([r['mount_seconds'] for r in rs]))} | "
                  f"{fmt_s(med([r['list_seconds'] for r in rs]))} | {fmt_s(tot[(tool, state)])} |")
        b("")
        if ("ratarmount", "first") in tot:
            su = next((r for r in rows if r.get("kind") == "mount_startup"), None)
            b("ratarmount ÷ Cairn, mount + list: "
              f"{tot[('ratarmount', 'first')] / tot[('cairn', 'first')]:,.1f}× on the first mount, "
              f"{tot[('ratarmount', 'second')] / tot[('cairn', 'second')]:,.1f}× on the second."
              + (f" `ratarmount --version` alone (warm) takes {fmt_s(su['total_seconds'])}." if su else ""))
            b("")
            if ("cairn", "first") in tot:
                summary.append((f"mount + `ls -lR` of a {st.get('files', 0):,}-file tar on ext4, first / second mount",
                                "faster than ratarmount (same run)",
                                f"Cairn {fmt_s(tot[('cairn', 'first')])} / {fmt_s(tot[('cairn', 'second')])}; ratarmount "
                                f"{fmt_s(tot[('ratarmount', 'first')])} / {fmt_s(tot[('ratarmount', 'second')])}",
                                tot[("cairn", "first")] < tot[("ratarmount", "first")] and tot[("cairn", "second")] < tot[("ratarmount", "second")]))


def main(args=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gentree")
    g.add_argument("dir")
    g.add_argument("files", type=int)
    g.add_argument("mib", type=int)
    r = sub.add_parser("run")
    r.add_argument("--rss-pid", type=int)
    r.add_argument("--then")
    r.add_argument("--sync-fs")
    r.add_argument("--timing-only", action="store_true",
                   help="run the command directly (no /usr/bin/time, no RSS sampling thread; the daemon's peak is VmHWM only)")
    r.add_argument("--time-out", default=f"/tmp/archive-bench-time.{os.getpid()}")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    m = sub.add_parser("mount-list")
    m.add_argument("mnt")
    m.add_argument("argv", nargs=argparse.REMAINDER)
    a = p.parse_args(args)
    if a.cmd == "gentree":
        gentree(a.dir, a.files, a.mib)
    elif a.cmd == "run":
        run(a)
    elif a.cmd == "mount-list":
        mount_list(a)


if __name__ == "__main__":
    sys.exit(main())
