//! A metadata database that fails over, under load (issue 49): PostgreSQL
//! with a synchronous standby and automatic failover by Patroni and etcd
//! (`cairn_testing::patroni`), reached with a multi-host URL and
//! `target_session_attrs=read-write`. Three mounts of one shared volume
//! (a bucket on the test's S3 server, as `pg_bucket.rs`) write small
//! fsync'd files; the primary's postmaster is killed with SIGKILL and
//! Patroni promotes the standby. The mounts are never reopened: their
//! writers must resume on the new primary, every file whose fsync
//! returned Ok must read back byte-exact, and fsck must find no error.
//! Every mount must write an fsync'd file again after the kill (a mount
//! whose commits were unproven at the kill replays its journal first);
//! the time from the kill to the first fsync'd write after it is printed
//! (BENCHMARKS.md §16). `scripts/soak-pg-failover.sh N` runs N kills.

use crate::common::*;
use crate::pg_bucket::{endpoint, fresh_url, REGION};
use crate::pg_failures::write_fsynced;
use cairn_engine::cloud::{self, CloudOptions};
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn opts(url: &str) -> OpenOptions {
    OpenOptions {
        meta_url: Some(url.to_string()),
        meta_timeout: Some(Duration::from_secs(30)),
        cloud: CloudOptions { cache_bytes: 64 << 20, meta_interval: Duration::from_millis(200), gc_interval: None, ..Default::default() },
        ..Default::default()
    }
}

#[test]
fn writers_on_three_mounts_resume_after_patroni_fails_over() {
    let kills: usize = std::env::var("CAIRN_PG_FAILOVER_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let cluster = cairn_testing::patroni::PatroniCluster::start().unwrap_or_else(|e| panic!("starting the Patroni cluster: {e}"));
    cluster.create_database("cairn").unwrap();
    let url = cluster.url("cairn");
    let bucket = fresh_url("failover");
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<std::path::PathBuf> = (0..3).map(|i| tmp.path().join(format!("m{i}"))).collect();
    let init_opts = InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), meta_url: Some(url.clone()), ..Default::default() };
    init_cloud(&dirs[0], &bucket, Some(&endpoint()), Some(REGION), &init_opts).unwrap();
    let mut vols: Vec<Arc<Volume>> = vec![Volume::load(&dirs[0], opts(&url)).unwrap()];
    for d in &dirs[1..] {
        cloud::attach(d, &bucket, Some(&endpoint()), Some(REGION), None).unwrap();
        vols.push(Volume::load(d, opts(&url)).unwrap());
    }
    let acked: Mutex<Vec<(String, u64, usize)>> = Mutex::new(Vec::new());
    let failed = AtomicU64::new(0);
    let mut figures = Vec::new();
    for round in 0..kills {
        let stop = AtomicBool::new(false);
        let killed_at: Mutex<Option<Instant>> = Mutex::new(None);
        // Per mount: when its first fsync'd file begun after the kill was done.
        let first_after: Mutex<Vec<Option<Instant>>> = Mutex::new(vec![None; vols.len()]);
        std::thread::scope(|s| {
            for (m, v) in vols.iter().enumerate() {
                let (v, stop, acked, failed, killed_at, first_after) = (v.clone(), &stop, &acked, &failed, &killed_at, &first_after);
                s.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let seed = (round as u64) << 40 | (m as u64) << 32 | i;
                        let len = 4096 + (seed.wrapping_mul(0x9E37_79B9) % (60 << 10)) as usize;
                        let name = format!("r{round}-m{m}-{i}");
                        let began = Instant::now();
                        match write_fsynced(&v, &name, &random_bytes(seed, len)) {
                            Ok(()) => {
                                acked.lock().unwrap().push((name, seed, len));
                                // Begun after the kill: a write on the new primary.
                                if killed_at.lock().unwrap().is_some_and(|k| began > k) {
                                    first_after.lock().unwrap()[m].get_or_insert_with(Instant::now);
                                }
                            }
                            Err(_) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        }
                        i += 1;
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(2000));
            let old = cluster.kill_primary().unwrap_or_else(|e| panic!("round {round}: {e}"));
            let at = Instant::now();
            *killed_at.lock().unwrap() = Some(at);
            let new = cluster.wait_new_primary(old, Duration::from_secs(90));
            let promoted = at.elapsed();
            if let Err(e) = new {
                stop.store(true, Ordering::SeqCst);
                panic!("round {round}: {e}");
            }
            let deadline = Instant::now() + Duration::from_secs(120);
            while first_after.lock().unwrap().iter().any(|f| f.is_none()) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let firsts = first_after.lock().unwrap().clone();
            // More load on the new primary.
            std::thread::sleep(Duration::from_millis(1500));
            stop.store(true, Ordering::SeqCst);
            let stuck: Vec<usize> = (0..firsts.len()).filter(|&m| firsts[m].is_none()).collect();
            assert!(stuck.is_empty(), "round {round}: mount(s) {stuck:?} wrote no fsync'd file within 120 s of the new primary (every mount must resume without a remount)");
            let to_write = firsts.iter().flatten().min().copied().unwrap() - at;
            let all = firsts.iter().flatten().max().copied().unwrap() - at;
            eprintln!(
                "failover {round}: kill -9 of the primary -> standby promoted {:.2} s, -> first fsync'd write {:.2} s, -> every mount wrote again {:.2} s",
                promoted.as_secs_f64(),
                to_write.as_secs_f64(),
                all.as_secs_f64()
            );
            figures.push((promoted, to_write));
        });
        if round + 1 < kills {
            cluster.wait_healthy(Duration::from_secs(180)).unwrap_or_else(|e| panic!("round {round}: the old primary did not rejoin: {e}"));
        }
    }
    // The same mounts, never reopened: every acknowledged file, exact, on
    // each of them.
    let acked = acked.into_inner().unwrap();
    let mut lost = Vec::new();
    for v in &vols {
        for (name, seed, len) in &acked {
            match v.resolve(name.as_bytes()) {
                Ok(ino) if read_all(v, ino) == random_bytes(*seed, *len) => {}
                Ok(_) => lost.push(format!("{name}: bytes differ")),
                Err(e) => lost.push(format!("{name}: {e}")),
            }
        }
    }
    let rep = maintenance::fsck(&vols[0], true, &NoProgress).unwrap();
    eprintln!(
        "{kills} failovers: {} fsync'd files, {} lost; {} tries failed (EIO: not acknowledged); fsck: {} errors, {} warnings {:?}; \
         kill -> first write: {:?}",
        acked.len(),
        lost.len(),
        failed.load(Ordering::Relaxed),
        rep.errors.len(),
        rep.warnings.len(),
        rep.warnings.iter().take(3).collect::<Vec<_>>(),
        figures.iter().map(|f| format!("{:.2} s", f.1.as_secs_f64())).collect::<Vec<_>>()
    );
    assert!(lost.is_empty(), "files whose fsync returned Ok were lost or differ after a failover: {lost:?}");
    assert!(rep.errors.is_empty(), "fsck after the failover: {rep:?}");
    for v in vols {
        v.close().unwrap();
    }
}
