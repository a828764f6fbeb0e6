#!/bin/bash
# Builds Filebench (github filebench/filebench, 1.5-alpha3+) from source on
# Debian 12 into $FILEBENCH_DIR/prefix (default /var/tmp/filebench), for the
# fileserver, webserver, varmail and netsfs personalities of section 14
# (bench/filebench/run.sh runs them). Idempotent: each step is skipped when done.
set -euo pipefail
W=${FILEBENCH_DIR:-/var/tmp/filebench}
SRC=$W/src
PREFIX=$W/prefix
FILEBENCH_GIT=${FILEBENCH_GIT:-https://github.com/filebench/filebench.git}   # a mirror: FILEBENCH_GIT=DIR (a clone or bare git dir)
FILEBENCH_COMMIT=22620e602cbbebad90c0bd041896ebccf70dbf5f   # 2020-02-20 "Fix issue #138" (the last commit of master)

wait_bench() {  # be polite to a timing-sensitive benchmark on this 2-core box
  # the pattern does not match bench/filebench/run.sh
  while pgrep -f '(^|[ /])bench/run[.]sh' >/dev/null; do echo "bench running; waiting 60s"; sleep 60; done
}

# 1. packages (bison and flex: parser_gram.y and parser_lex.l; autotools: no configure in git)
missing=
for p in build-essential autoconf automake libtool bison flex; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=" $p"
done
if [ -n "$missing" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential autoconf automake libtool bison flex
fi

# 2. fb-randdata.so, for run.sh --data random. Filebench writes only zero bytes (its
# threads' I/O memory is memset to 0 in flowop.c and the pre-allocation buffer is a
# fresh malloc), which a file system that compresses and deduplicates (Cairn) stores
# as almost nothing. This LD_PRELOAD shim, outside Filebench's source, makes every
# write()/pwrite() of the process to a regular file (fd > 2) write that many fresh
# pseudo-random bytes instead (xorshift64*, one thread-local buffer): incompressible
# and never duplicated. Sizes, offsets and calls stay Filebench's own.
mkdir -p "$PREFIX/lib"
if [ ! -f "$PREFIX/lib/fb-randdata.so" ]; then
  cat > "$W/fb-randdata.c" <<'EOC'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static __thread uint64_t st;
static __thread char *tbuf;
static __thread size_t tcap;

static const void *randomize(int fd, const void *buf, size_t n)
{
	struct stat sb;
	int e = errno;
	uint64_t x, *p;
	size_t i, w;

	if (n == 0 || fd <= 2 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		errno = e;
		return buf;
	}
	if (tcap < n) {
		free(tbuf);
		tcap = (n + 7) & ~(size_t)7;
		if ((tbuf = malloc(tcap)) == NULL) {
			tcap = 0;
			errno = e;
			return buf;
		}
	}
	if (st == 0) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		st = ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uintptr_t)&st;
		st |= 1;
	}
	x = st;
	p = (uint64_t *)tbuf;
	w = (n + 7) / 8;
	for (i = 0; i < w; i++) {
		x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
		p[i] = x * 0x2545F4914F6CDD1DULL;
	}
	st = x;
	errno = e;
	return tbuf;
}

ssize_t write(int fd, const void *buf, size_t n)
{
	static ssize_t (*real)(int, const void *, size_t);
	if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	return real(fd, randomize(fd, buf, n), n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	static ssize_t (*real)(int, const void *, size_t, off_t);
	if (!real) real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
	return real(fd, randomize(fd, buf, n), n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
	static ssize_t (*real)(int, const void *, size_t, off64_t);
	if (!real) real = (ssize_t (*)(int, const void *, size_t, off64_t))dlsym(RTLD_NEXT, "pwrite64");
	return real(fd, randomize(fd, buf, n), n, off);
}
EOC
  gcc -O2 -Wall -shared -fPIC -o "$PREFIX/lib/fb-randdata.so" "$W/fb-randdata.c" -ldl
fi

if [ -x "$PREFIX/bin/filebench" ] && [ "$(cat "$PREFIX/.commit" 2>/dev/null)" = "$FILEBENCH_COMMIT" ]; then
  echo "filebench already built: $PREFIX/bin/filebench (commit $FILEBENCH_COMMIT); $PREFIX/lib/fb-randdata.so"
  exit 0
fi

# 3. source, pinned
if [ ! -d "$SRC/.git" ]; then git clone -q "$FILEBENCH_GIT" "$SRC"; fi
if [ "$(git -C "$SRC" rev-parse HEAD)" != "$FILEBENCH_COMMIT" ]; then
  git -C "$SRC" checkout -q "$FILEBENCH_COMMIT"
fi
git -C "$SRC" log -1 --format='building commit %H (%cd) %s'

# 4. autotools bootstrap, the sequence of the README (git has no configure)
cd "$SRC"
wait_bench
if [ ! -x configure ]; then
  libtoolize
  aclocal
  autoheader
  automake --add-missing
  autoconf
fi

# 5. build. No fix needed on Debian 12 (gcc 12.2, bison 3.8.2, flex 2.6.4, autoconf
# 2.71, automake 1.16.5, libtool 2.4.7): it builds as is, with only warnings
# (obsolete autoconf macros, deprecated sigignore, strncpy truncation). Filebench's
# cvar libraries go to $PREFIX/lib/filebench, where the binary looks for them.
wait_bench
if [ ! -f Makefile ]; then ./configure --prefix="$PREFIX"; fi
wait_bench
nice make -j1
make install
echo "$FILEBENCH_COMMIT" > "$PREFIX/.commit"
ls "$PREFIX/share/filebench/workloads" | grep -E '^(fileserver|webserver|varmail|netsfs)\.f$'
"$PREFIX/bin/filebench" -h 2>&1 | head -3 || true
