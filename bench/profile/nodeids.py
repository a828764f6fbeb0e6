import glob, re, sys, collections
d = sys.argv[1]
def hb(s): return bytes(int(x, 16) for x in re.findall(r"\\x([0-9a-f]{2})", s))
ops = collections.defaultdict(collections.Counter)
for f in glob.glob(d + "/t.*"):
    for line in open(f, errors="replace"):
        if not line.startswith("read(") or "/dev/fuse" not in line: continue
        try: b = hb(line.split('"')[1])
        except IndexError: continue
        if len(b) < 24: continue
        ops[int.from_bytes(b[4:8], "little")][int.from_bytes(b[16:24], "little")] += 1
dirs = set(ops[35]) | set(ops[9])  # parents of CREATE and MKDIR
for op, name in ((3, "GETATTR"), (4, "SETATTR"), (1, "LOOKUP")):
    c = ops[op]; tot = sum(c.values()); ond = sum(v for k, v in c.items() if k in dirs)
    print(f"{name}: {tot} requests, {ond} on directories (nodeids that were CREATE/MKDIR parents), {tot-ond} on other nodes")
