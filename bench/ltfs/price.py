#!/usr/bin/env python3
"""Prices reading one LTFS file back with Cairn's emulated drive (section 15).

  price.py CAIRN_BENCH OUT_DIR [FILE]   (FILE default /w1)

For every OUT_DIR/layout-nN[-rK].json that run.sh wrote, the file's extents
become runs of blocks (contiguous extents merged) on a tape of the data
partition's length, and `cairn-bench tape-price` reads them back from the end
of data with the default emulated drive: locating to every run (as LTFS
positions for each extent) and reading on through gaps under 256 MiB (as
Cairn's store does). Prints one JSON object per layout on stdout.
"""
import glob, json, os, re, subprocess, sys


def runs_of(layout, name):
    bs = layout["blocksize"]
    f = next(x for x in layout["index"]["files"] if x["path"] == name)
    runs = []
    for e in sorted(f["extents"], key=lambda e: e["fileoffset"]):
        n = -(-(e["byteoffset"] + e["bytecount"]) // bs)
        if runs and runs[-1][0] + runs[-1][1] == e["startblock"]:
            runs[-1][1] += n
        else:
            runs.append([e["startblock"], n])
    return bs, runs, [x["n_runs"] for x in layout["index"]["files"]]


def main():
    bench, out = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "/w1"
    for path in sorted(glob.glob(os.path.join(out, "layout-n*.json"))):
        m = re.search(r"layout-n(\d+)(-r\d+)?\.json$", path)
        layout = json.load(open(path))
        bs, runs, per_file = runs_of(layout, name)
        req = {"block_size": bs, "blocks": layout["data_partition_blocks"], "runs": runs}
        p = subprocess.run([bench, "tape-price"], input=json.dumps(req), capture_output=True, text=True, check=True)
        r = json.loads(p.stdout)
        print(json.dumps({"writers": int(m.group(1)), "rep": m.group(2) or "", "file": name, "runs_per_file": per_file, **r}))


if __name__ == "__main__":
    main()
