#!/usr/bin/env python3
"""fusestat.py FUSE.data DEV [NDIV]: FUSE requests of one connection (from the
fuse:fuse_request_send/_end tracepoints): count per opcode, count / NDIV,
mean and summed time from send to end (queue + daemon + reply)."""
import re, subprocess, sys, collections
data, dev = sys.argv[1], sys.argv[2]
conn = dev.split(":")[1] if ":" in dev else dev
ndiv = float(sys.argv[3]) if len(sys.argv) > 3 else None
p = subprocess.run(["perf", "script", "-i", data, "-F", "time,event,trace"], capture_output=True, text=True)
send = {}; cnt = collections.Counter(); lat = collections.defaultdict(float); err = collections.Counter()
first = last = None
rs = re.compile(r"([\d.]+):\s+fuse:fuse_request_send: connection (\d+) req (\d+) opcode \d+ \((\w+)\)")
re_ = re.compile(r"([\d.]+):\s+fuse:fuse_request_end: connection (\d+) req (\d+) len \d+ error (-?\d+)")
for line in p.stdout.splitlines():
    m = rs.search(line)
    if m:
        if m.group(2) != conn: continue
        t = float(m.group(1)); op = m.group(4).replace("FUSE_", "")
        send[m.group(3)] = (t, op); cnt[op] += 1
        first = first or t; last = t
        continue
    m = re_.search(line)
    if m and m.group(2) == conn and m.group(3) in send:
        t0, op = send.pop(m.group(3)); lat[op] += float(m.group(1)) - t0
        if m.group(4) != "0": err[op] += 1
tot = sum(cnt.values())
print(f"connection {conn}: {tot} requests over {last-first if first else 0:.1f} s")
print(f"{'opcode':<14}{'count':>9}{'/unit':>8}{'mean ms':>9}{'sum s':>8}{'errors':>8}")
for op, c in cnt.most_common():
    print(f"{op:<14}{c:>9}{(c/ndiv if ndiv else 0):>8.2f}{lat[op]/c*1e3:>9.3f}{lat[op]:>8.1f}{err[op]:>8}")
print(f"{'all':<14}{tot:>9}{(tot/ndiv if ndiv else 0):>8.2f}{sum(lat.values())/max(tot,1)*1e3:>9.3f}{sum(lat.values()):>8.1f}")
