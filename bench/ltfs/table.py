#!/usr/bin/env python3
"""Section 15's LTFS side-by-side as Markdown, from price.py's JSON lines
(stdin) and Cairn's table III rates (once streaming) given as N=MB/s."""
import json, statistics, sys

cairn = dict(a.split("=") for a in sys.argv[1:])
rows = [json.loads(l) for l in sys.stdin if l.strip()]
med = statistics.median
print("| writers | LTFS runs per file (each repetition) | LTFS: a locate per run | LTFS: reading through gaps | LTFS once at the file | Cairn runs per file | Cairn once at the file (table III) |")
print("|---|---|---|---|---|---|---|")
for n in sorted({r["writers"] for r in rows}):
    rs = [r for r in rows if r["writers"] == n]
    runs = ", ".join("/".join(str(x) for x in r["runs_per_file"]) for r in rs)
    f = lambda k: f"{med([r[k]['seconds'] for r in rs]):.1f} s, {med([r[k]['mb_per_s'] for r in rs]):.1f} MB/s"
    c = cairn.get(str(n))
    print(f"| {n} | {runs} | {f('locate')} | {f('read-through')} | {f('streaming')} | 1 | {c + ' MB/s' if c else 'n/a'} |")
