#!/bin/bash
# wl.sh WORKLOAD DIR : one workload of issue 12 in DIR
S=${PROF:?PROF: scratch directory}
W=$1; D=$2
case $W in
  untar)  tar xf $S/linux.tar -C "$D" ;;
  sync)   sync ;;
  md5)    cd "$D" && find . -type f -print0 | xargs -0 md5sum > /dev/null ;;
  rm)     rm -rf "$D"/linux-source-6.1 ;;
  postmark)
          mkdir -p "$D/pm"
          printf 'set location %s\nset number 2000\nset size 4096 1048576\nset transactions 5000\nrun\nquit\n' "$D/pm" | postmark > "$S/out/pm.$3.txt" ;;
  dbench) dbench -D "$D" -c /usr/share/dbench/client.txt -t 30 4 > "$S/out/dbench.$3.txt" ;;
  fiolay) fio --name=rr --filename="$D/fio.bin" --size=512M --bs=4k --rw=randrw --rwmixread=70 --refill_buffers --ioengine=psync --create_only=1 > /dev/null ;;
  fio)    fio --name=rr --filename="$D/fio.bin" --size=512M --bs=4k --rw=randrw --rwmixread=70 --refill_buffers --ioengine=psync --time_based --runtime=30 --output-format=json > "$S/out/fio.$3.json" ;;
  fioread)  fio --name=rr --filename="$D/fio.bin" --size=512M --bs=4k --rw=randread --refill_buffers --ioengine=psync --time_based --runtime=20 --output-format=json > "$S/out/fioread.$3.json" ;;
  fiowrite) fio --name=rr --filename="$D/fio.bin" --size=512M --bs=4k --rw=randwrite --refill_buffers --ioengine=psync --time_based --runtime=20 --output-format=json > "$S/out/fiowrite.$3.json" ;;
  create) python3 -c '
import os,sys
d=sys.argv[1]; os.mkdir(d)
fl=os.O_CREAT|os.O_EXCL|os.O_WRONLY
for i in range(20000): os.close(os.open(os.path.join(d,"f%06d"%i),fl,0o644))' "$D/c" ;;
  *) echo "unknown $W"; exit 2;;
esac
