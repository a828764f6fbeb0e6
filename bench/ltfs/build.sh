#!/bin/bash
# Builds IBM/LinearTapeFileSystem reference LTFS from source on Debian 12 into
# $LTFS_DIR/prefix (default /var/tmp/ltfs), for the side-by-side of section 15.
set -euo pipefail
W=${LTFS_DIR:-/var/tmp/ltfs}
SRC=$W/src
PREFIX=$W/prefix
LTFS_GIT=${LTFS_GIT:-https://github.com/LinearTapeFileSystem/ltfs.git}   # built here from commit 7c01479 (a mirror: LTFS_GIT=DIR)

wait_bench() {  # be polite to a timing-sensitive benchmark on this 2-core box
  while pgrep -f bench/run.sh >/dev/null; do echo "bench running; waiting 60s"; sleep 60; done
}

# 1. packages (fuse2 dev only; do NOT install package 'fuse', it conflicts with fuse3)
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  build-essential automake autoconf libtool pkg-config \
  libfuse-dev libfuse2 libxml2-dev uuid-dev libicu-dev icu-devtools python3

# 2. source
if [ ! -d "$SRC/.git" ]; then git clone -q "$LTFS_GIT" "$SRC"; fi
git -C "$SRC" log -1 --format='building commit %H (%cd) %s'
# git submodule src/libltfs/uthash_submodule (github troydhanson/uthash), pinned commit
# taken from the superproject tree; github is not reachable, so use the fetched mirror.
UTHASH_GIT=${UTHASH_GIT:-https://github.com/troydhanson/uthash.git}
UTHASH_COMMIT=$(git -C "$SRC" ls-tree HEAD src/libltfs/uthash_submodule | awk '{print $3}')
if [ ! -f "$SRC/src/libltfs/uthash_submodule/src/uthash.h" ]; then
  rm -rf "$SRC/src/libltfs/uthash_submodule"
  git clone -q "$UTHASH_GIT" "$SRC/src/libltfs/uthash_submodule"
  git -C "$SRC/src/libltfs/uthash_submodule" checkout -q "$UTHASH_COMMIT"
fi
echo "uthash submodule at $(git -C "$SRC/src/libltfs/uthash_submodule" rev-parse HEAD)"

# 3. icu-config shim (Debian 12 has no icu-config and no 'icu' pkg-config module)
mkdir -p $W/bin
if [ ! -x $W/bin/icu-config ]; then
cat > $W/bin/icu-config <<'EOS'
#!/bin/sh
case "$1" in
  --cppflags) pkg-config --cflags icu-uc icu-i18n ;;
  --ldflags)  pkg-config --libs icu-uc icu-i18n ;;
  --version)  pkg-config --modversion icu-uc ;;
  *) echo "icu-config shim: unsupported option $1" >&2; exit 1 ;;
esac
EOS
chmod +x $W/bin/icu-config
fi
export PATH=$W/bin:$PATH

# 4. build
cd "$SRC"
wait_bench
./autogen.sh
wait_bench
./configure --prefix="$PREFIX" --disable-snmp --enable-icu-6x
wait_bench
nice make -j1
make install
$PREFIX/bin/ltfs -V 2>&1 | head -3 || true
