#!/usr/bin/env python3
"""ststat.py DIR [NDIV]: summarise `strace -ff -y -s 32 -x -o DIR/t` of the daemon.
Syscall counts per thread name, fsync/fdatasync by file, bytes written by
file class (journal segments, packs, SQLite WAL, SQLite db, FUSE replies),
SQLite WAL commit frames (24-byte frame headers whose 'db size after commit'
field is non-zero = one transaction each), FUSE requests by opcode read from
the /dev/fuse read buffers (opcode at byte 4, nodeid at byte 16)."""
import collections, glob, os, re, sys
d = sys.argv[1]; ndiv = float(sys.argv[2]) if len(sys.argv) > 2 else None
OPS = {1:"LOOKUP",2:"FORGET",3:"GETATTR",4:"SETATTR",5:"READLINK",6:"SYMLINK",8:"MKNOD",9:"MKDIR",10:"UNLINK",11:"RMDIR",12:"RENAME",13:"LINK",14:"OPEN",15:"READ",16:"WRITE",17:"STATFS",18:"RELEASE",20:"FSYNC",21:"SETXATTR",22:"GETXATTR",23:"LISTXATTR",24:"REMOVEXATTR",25:"FLUSH",26:"INIT",27:"OPENDIR",28:"READDIR",29:"RELEASEDIR",30:"FSYNCDIR",34:"ACCESS",35:"CREATE",39:"IOCTL",42:"BATCH_FORGET",43:"FALLOCATE",44:"READDIRPLUS",45:"RENAME2",46:"LSEEK",47:"COPY_FILE_RANGE",50:"SYNCFS",52:"STATX"}
def cls(path):
    if "/dev/fuse" in path: return "fuse"
    if "/journal/" in path: return "journal"
    if "/store/" in path: return "pack"
    if path.endswith("-wal"): return "wal"
    if path.endswith("-shm"): return "shm"
    if path.endswith("meta.sqlite"): return "db"
    if path.startswith("socket:") or "socket" in path: return "socket"
    return path
line_re = re.compile(r"^(\w+)\((\d+)<([^>]*)>(.*)\)\s+= (-?\d+)")
any_re = re.compile(r"^(\w+)\(")
calls = collections.Counter(); bythread = collections.defaultdict(collections.Counter)
syncs = collections.Counter(); sync_time = collections.Counter()
wbytes = collections.Counter(); wcalls = collections.Counter(); rbytes = collections.Counter(); rcalls = collections.Counter()
commits = 0; fuseops = collections.Counter(); nodeids = collections.defaultdict(collections.Counter)
def hexbytes(s):
    return bytes(int(x, 16) for x in re.findall(r"\\x([0-9a-f]{2})", s))
for f in glob.glob(os.path.join(d, "t.*")):
    tid = f.rsplit(".", 1)[1]
    try: comm = open(f"/proc/{tid}/comm").read().strip()
    except OSError: comm = "?"
    first = None
    for line in open(f, errors="replace"):
        m = any_re.match(line)
        if not m: continue
        sc = m.group(1); calls[sc] += 1
        m2 = line_re.match(line)
        if m2 and first is None and sc == "read" and "/dev/fuse" in m2.group(3): first = "fuser"
        if first is None and sc in ("pwrite64","pread64","fsync","fdatasync") : first = first
        bythread[tid][sc] += 1
        if not m2: continue
        fd, path, rest, ret = m2.group(2), m2.group(3), m2.group(4), int(m2.group(5))
        c = cls(path)
        if sc in ("fsync", "fdatasync"): syncs[(sc, c)] += 1
        elif sc in ("pwrite64", "write", "writev", "pwritev", "pwritev2"):
            if ret > 0: wbytes[c] += ret
            wcalls[(sc, c)] += 1
            if c == "wal" and sc == "pwrite64" and ret == 24:
                b = hexbytes(rest.split('"')[1])
                if len(b) >= 8 and int.from_bytes(b[4:8], "big") != 0: commits += 1
        elif sc in ("pread64", "read", "readv", "preadv"):
            if ret > 0: rbytes[c] += ret
            rcalls[(sc, c)] += 1
            if c == "fuse" and ret > 0:
                b = hexbytes(rest.split('"')[1])
                if len(b) >= 24:
                    op = OPS.get(int.from_bytes(b[4:8], "little"), str(int.from_bytes(b[4:8], "little")))
                    fuseops[op] += 1; nodeids[op][int.from_bytes(b[16:24], "little")] += 1

def per(n): return f"{n/ndiv:.2f}" if ndiv else ""
print("== syscalls (all threads)"); 
for sc, n in calls.most_common(25): print(f"  {sc:<18}{n:>9} {per(n)}")
print("== per thread (tid: top syscalls; threads with < 100 calls summed)")
small = collections.Counter(); nsmall = 0
for tid, c in sorted(bythread.items(), key=lambda kv: -sum(kv[1].values())):
    tot = sum(c.values())
    if tot < 100:
        small.update(c); nsmall += 1; continue
    print(f"  {tid}: {tot} " + ", ".join(f"{k} {v}" for k, v in c.most_common(7)))
if nsmall: print(f"  {nsmall} short threads: " + ", ".join(f"{k} {v}" for k, v in small.most_common(8)))
print("== fsync/fdatasync by file class")
for k, n in syncs.most_common(): print(f"  {k[0]:<10}{k[1]:<10}{n:>8} {per(n)}")
print("== writes by class: calls, MB")
for k, n in sorted(wcalls.items(), key=lambda kv: -kv[1]): print(f"  {k[0]:<10}{k[1]:<10}{n:>9} {per(n)}")
for c, b in wbytes.most_common(): print(f"  bytes {c:<10}{b/1e6:>10.2f} MB {(b/ndiv/1024 if ndiv else 0):.2f} KiB/unit")
print("== reads by class: calls, MB")
for k, n in sorted(rcalls.items(), key=lambda kv: -kv[1]): print(f"  {k[0]:<10}{k[1]:<10}{n:>9} {per(n)}")
for c, b in rbytes.most_common(): print(f"  bytes {c:<10}{b/1e6:>10.2f} MB")
print(f"== SQLite WAL commit frames (transactions): {commits} {per(commits)}")
print("== FUSE requests read from /dev/fuse")
for op, n in fuseops.most_common(): print(f"  {op:<14}{n:>9} {per(n)}  top nodeids {nodeids[op].most_common(2)}")
print(f"  all {sum(fuseops.values())} {per(sum(fuseops.values()))}")
