#!/usr/bin/env python3
"""runm.py [--pid PID] [--label L] -- CMD...
Runs CMD; prints one JSON line: wall seconds, the command's (and its reaped
children's) user/sys CPU and write_bytes, the daemon PID's CPU seconds
(utime+stime of all its threads, /proc/PID/stat) and /proc/PID/io deltas,
and the load average before and after."""
import json, os, resource, subprocess, sys, time

TCK = os.sysconf("SC_CLK_TCK")


def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[11]) / TCK, int(fields[12]) / TCK   # utime, stime


def pio(pid):
    d = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            d[k.strip()] = int(v)
    return d


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


args = sys.argv[1:]
pid = label = None
while args and args[0] != "--":
    if args[0] == "--pid":
        pid = args[1]; args = args[2:]
    elif args[0] == "--label":
        label = args[1]; args = args[2:]
    else:
        sys.exit("bad args")
argv = args[1:]
l0 = load()
if pid:
    u0, s0 = stat(pid); io0 = pio(pid)
c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
me0 = pio("self")
t0 = time.perf_counter()
r = subprocess.run(argv, stdout=subprocess.DEVNULL)
t1 = time.perf_counter()
c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
me1 = pio("self")
out = {"label": label, "wall": round(t1 - t0, 3), "rc": r.returncode,
       "cmd_user": round(c1.ru_utime - c0.ru_utime, 2), "cmd_sys": round(c1.ru_stime - c0.ru_stime, 2),
       "cmd_write_MB": round((me1["write_bytes"] - me0["write_bytes"]) / 1e6, 1)}
if pid:
    u1, s1 = stat(pid); io1 = pio(pid)
    out.update({"d_user": round(u1 - u0, 2), "d_sys": round(s1 - s0, 2), "d_cpu": round(u1 - u0 + s1 - s0, 2),
                "d_read_MB": round((io1["read_bytes"] - io0["read_bytes"]) / 1e6, 1),
                "d_write_MB": round((io1["write_bytes"] - io0["write_bytes"]) / 1e6, 1),
                "d_wchar_MB": round((io1["wchar"] - io0["wchar"]) / 1e6, 1),
                "d_rchar_MB": round((io1["rchar"] - io0["rchar"]) / 1e6, 1),
                "d_syscw": io1["syscw"] - io0["syscw"], "d_syscr": io1["syscr"] - io0["syscr"]})
out["load"] = f"{l0}->{load()}"
print(json.dumps(out), flush=True)
