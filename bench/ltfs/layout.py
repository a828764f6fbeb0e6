#!/usr/bin/env python3
"""Print the on-tape layout recorded in an LTFS index.

Usage:
  layout.py INDEX.xml [--blocksize N] [--tape-dir DIR] [--json]
  layout.py --tape-dir DIR [--extract-index OUT.xml] [--json]

INDEX.xml      an LTFS index (<ltfsindex>); if omitted, the newest index found
               in --tape-dir is used.
--tape-dir     directory of LTFS's `file` tape backend (records are files named
               <partition>_<block>_<R|F|E>: R = record, F = filemark, E = EOD).
               Used to read the label (block size, partition letters) and to
               count blocks/filemarks per partition and locate every index.
--blocksize    tape block size in bytes if no --tape-dir (default 524288,
               the LTFS default).
--extract-index OUT  write the newest index XML found in --tape-dir to OUT.

A "run" is a maximal group of a file's extents (in fileoffset order) that are
contiguous on tape: extent k+1 starts on the same partition at
startblock(k) + ceil((byteoffset(k) + bytecount(k)) / blocksize).
"""
import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

DEFAULT_BLOCKSIZE = 524288


def strip_ns(tag):
    return tag.rsplit('}', 1)[-1]


def child(el, name):
    for c in el:
        if strip_ns(c.tag) == name:
            return c
    return None


def text(el, name, default=None):
    c = child(el, name)
    return c.text.strip() if c is not None and c.text is not None else default


# ---------------------------------------------------------------- tape dir
REC_RE = re.compile(r'^(\d+)_(\d+)_([RFE])$')


def scan_tape_dir(d):
    """Return {part: {block: 'R'|'F'|'E'}}."""
    parts = {}
    for name in os.listdir(d):
        m = REC_RE.match(name)
        if m:
            parts.setdefault(int(m.group(1)), {})[int(m.group(2))] = m.group(3)
    return parts


def read_record(d, part, block):
    with open(os.path.join(d, '%d_%d_R' % (part, block)), 'rb') as f:
        return f.read()


def read_label(d):
    """LTFS label = first record after the VOL1 label (block 0) and its filemark
    (block 2 on this backend: 0 VOL1, 1 FM, 2 XML label, 3 FM)."""
    recs = scan_tape_dir(d).get(0, {})
    b = min(k for k, t in recs.items() if t == 'R' and k > 0)
    raw = read_record(d, 0, b).rstrip(b'\0')
    root = ET.fromstring(raw)
    loc = child(root, 'location')
    parts = child(root, 'partitions')
    return {
        'blocksize': int(text(root, 'blocksize', DEFAULT_BLOCKSIZE)),
        'compression': text(root, 'compression'),
        'volumeuuid': text(root, 'volumeuuid'),
        'formattime': text(root, 'formattime'),
        'creator': text(root, 'creator'),
        'label_partition_letter': text(loc, 'partition'),  # letter of physical partition 0
        'index_partition': text(parts, 'index'),
        'data_partition': text(parts, 'data'),
    }


def find_indexes(d, parts):
    """Every index on tape: records that begin with an <ltfsindex> document.
    An index may span several records; it ends at the next filemark."""
    out = []
    for p, recs in sorted(parts.items()):
        for b in sorted(recs):
            if recs[b] != 'R':
                continue
            path = os.path.join(d, '%d_%d_R' % (p, b))
            if os.path.getsize(path) > 64 * 1024 * 1024:
                continue
            with open(path, 'rb') as f:
                head = f.read(512)
            if b'<ltfsindex' not in head:
                continue
            data = b''
            bb = b
            while recs.get(bb) == 'R':
                data += read_record(d, p, bb)
                bb += 1
            data = data.rstrip(b'\0')
            root = ET.fromstring(data)
            out.append({'partition': p, 'startblock': b, 'nblocks': bb - b,
                        'generation': int(text(root, 'generationnumber', '0')),
                        'bytes': len(data), 'xml': data})
    return out


def summarize_partition(recs):
    eod = [b for b, t in recs.items() if t == 'E']
    nrec = sum(1 for t in recs.values() if t == 'R')
    fms = sorted(b for b, t in recs.items() if t == 'F')
    end = eod[0] if eod else (max(recs) + 1 if recs else 0)
    return {'eod_block': end, 'records': nrec, 'filemarks': fms}


# ---------------------------------------------------------------- index
def walk(dirnode, path):
    contents = child(dirnode, 'contents')
    if contents is None:
        return
    for c in contents:
        t = strip_ns(c.tag)
        name = text(c, 'name', '')
        if t == 'directory':
            yield from walk(c, path + name + '/')
        elif t == 'file':
            yield path + name, c


def parse_index(xml_bytes, blocksize):
    root = ET.fromstring(xml_bytes)
    loc = child(root, 'location')
    top = child(root, 'directory')
    files = []
    for path, f in walk(top, '/'):
        exts = []
        ei = child(f, 'extentinfo')
        if ei is not None:
            for e in ei:
                if strip_ns(e.tag) != 'extent':
                    continue
                exts.append({
                    'fileoffset': int(text(e, 'fileoffset', '0')),
                    'partition': text(e, 'partition'),
                    'startblock': int(text(e, 'startblock')),
                    'byteoffset': int(text(e, 'byteoffset', '0')),
                    'bytecount': int(text(e, 'bytecount')),
                })
        exts.sort(key=lambda x: x['fileoffset'])
        runs = []
        for e in exts:
            nblk = -(-(e['byteoffset'] + e['bytecount']) // blocksize)
            if runs and runs[-1]['partition'] == e['partition'] and \
                    runs[-1]['endblock'] == e['startblock']:
                r = runs[-1]
                r['endblock'] = e['startblock'] + nblk
                r['bytecount'] += e['bytecount']
                r['extents'] += 1
            else:
                runs.append({'partition': e['partition'], 'startblock': e['startblock'],
                             'endblock': e['startblock'] + nblk,
                             'fileoffset': e['fileoffset'],
                             'bytecount': e['bytecount'], 'extents': 1})
        for r in runs:
            r['nblocks'] = r['endblock'] - r['startblock']
        files.append({
            'path': path,
            'size': int(text(f, 'length', '0')),
            'start_block': exts[0]['startblock'] if exts else None,
            'start_partition': exts[0]['partition'] if exts else None,
            'n_extents': len(exts),
            'n_runs': len(runs),
            'extents': exts,
            'runs': runs,
        })
    return {
        'generation': int(text(root, 'generationnumber', '0')),
        'updatetime': text(root, 'updatetime'),
        'creator': text(root, 'creator'),
        'index_version': root.get('version'),
        'index_location': {'partition': text(loc, 'partition'),
                           'startblock': int(text(loc, 'startblock'))} if loc is not None else None,
        'files': files,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('index', nargs='?')
    ap.add_argument('--tape-dir')
    ap.add_argument('--blocksize', type=int)
    ap.add_argument('--extract-index')
    ap.add_argument('--json', action='store_true')
    a = ap.parse_args()
    if not a.index and not a.tape_dir:
        ap.error('need INDEX.xml or --tape-dir')

    out = {}
    blocksize = a.blocksize or DEFAULT_BLOCKSIZE
    xml_bytes = None
    if a.tape_dir:
        label = read_label(a.tape_dir)
        blocksize = a.blocksize or label['blocksize']
        parts = scan_tape_dir(a.tape_dir)
        idx = find_indexes(a.tape_dir, parts)
        # physical partition number -> letter (label on partition 0 names its own letter)
        l0 = label['label_partition_letter']
        other = label['data_partition'] if l0 == label['index_partition'] else label['index_partition']
        letter = {0: l0, 1: other}
        out['label'] = label
        out['partitions'] = {letter.get(p, str(p)): dict(summarize_partition(r), physical=p)
                             for p, r in sorted(parts.items())}
        out['indexes_on_tape'] = [{'partition': letter.get(i['partition']),
                                   'startblock': i['startblock'], 'nblocks': i['nblocks'],
                                   'generation': i['generation'], 'bytes': i['bytes']}
                                  for i in idx]
        if idx:
            # newest generation; among equal generations prefer the index partition copy
            newest = max(idx, key=lambda i: (i['generation'],
                                             letter.get(i['partition']) == label['index_partition'],
                                             i['startblock']))
            if not a.index:
                xml_bytes = newest['xml']
            if a.extract_index:
                with open(a.extract_index, 'wb') as f:
                    f.write(newest['xml'] + b'\n')
    if a.index:
        with open(a.index, 'rb') as f:
            xml_bytes = f.read()
    out['blocksize'] = blocksize
    if xml_bytes is None:
        sys.exit('no index found')
    out['index'] = parse_index(xml_bytes, blocksize)
    if 'partitions' in out:
        dp = out['label']['data_partition']
        out['data_partition_blocks'] = out['partitions'].get(dp, {}).get('eod_block')

    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    ix = out['index']
    print('blocksize %d  index generation %d  index at %s' %
          (blocksize, ix['generation'], ix['index_location']))
    if 'partitions' in out:
        for letter, s in out['partitions'].items():
            print('partition %s (physical %d): EOD at block %d, %d records, filemarks at %s' %
                  (letter, s['physical'], s['eod_block'], s['records'], s['filemarks']))
        for i in out['indexes_on_tape']:
            print('  index gen %d at %s:%d (%d block(s), %d bytes)' %
                  (i['generation'], i['partition'], i['startblock'], i['nblocks'], i['bytes']))
    for f in ix['files']:
        print('%s size %d start %s:%s extents %d runs %d' %
              (f['path'], f['size'], f['start_partition'], f['start_block'],
               f['n_extents'], f['n_runs']))
        for r in f['runs']:
            print('   run %s:[%d,%d) %d blocks, fileoffset %d, %d bytes, %d extent(s)' %
                  (r['partition'], r['startblock'], r['endblock'], r['nblocks'],
                   r['fileoffset'], r['bytecount'], r['extents']))


if __name__ == '__main__':
    main()
