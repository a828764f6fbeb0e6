//! A volume in a bucket whose metadata is in PostgreSQL (issue 26,
//! docs/shared-volume.md §10–§11), mounted by several "machines" (cache
//! directories of their own) at once, read-write or read-only. Real moto
//! S3 (CAIRN_TEST_S3_ENDPOINT, see cloud.rs), a real PostgreSQL server
//! (postgres.rs) and real FUSE mounts.

use crate::cloud::s3_env;
use crate::common::*;
use crate::postgres::database;
use crate::roundtrip::{build_tree_with, check_copy};
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The kernel's attribute and entry TTL the daemon answers with
/// (cairn-fuse `TTL`).
const ATTR_TTL: Duration = Duration::from_secs(1);

/// A bucket volume with PostgreSQL metadata and the local directories of
/// its machines.
struct Shared {
    env: Env,
    url: String,
    meta: String,
    endpoint: String,
}

impl Shared {
    /// `cairn init s3://BUCKET/PREFIX --meta URL` from machine "a".
    fn new(name: &str) -> Shared {
        Shared::with_meta(name, database(&name.replace('-', "_")))
    }

    /// The same with the metadata in database `meta` (a server of the
    /// test's own).
    fn with_meta(name: &str, meta: String) -> Shared {
        let (endpoint, bucket) = s3_env();
        let env = Env::bare(name);
        let url = format!("s3://{bucket}/{}", env.root.file_name().unwrap().to_string_lossy());
        let s = Shared { env, url, meta, endpoint };
        let out = cairn_ok(s.with_args("init", "a", &[]));
        assert!(out.stdout.contains("PostgreSQL"), "{out}");
        s
    }

    /// A local directory ("machine") of this volume.
    fn dir(&self, machine: &str) -> PathBuf {
        self.env.path(&format!("cache-{machine}"))
    }

    fn args(&self, machine: &str, extra: &[&str]) -> Vec<String> {
        let mut a = vec!["--cache-dir".to_string(), self.dir(machine).display().to_string(), "--endpoint".into(), self.endpoint.clone(), "--meta".into(), self.meta.clone()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// `cairn CMD URL --cache-dir ... --endpoint ... --meta ... EXTRA...`.
    fn with_args(&self, cmd: &str, machine: &str, extra: &[&str]) -> Vec<String> {
        let mut a = vec![cmd.to_string(), self.url.clone()];
        a.extend(self.args(machine, extra));
        a
    }

    /// A mountpoint of its own for `name` (`mnt` is the Env's).
    fn mountpoint(&self, name: &str) -> PathBuf {
        let p = self.env.path(name);
        if !p.exists() {
            fs::create_dir(&p).unwrap();
        }
        fs::canonicalize(p).unwrap()
    }

    fn try_mount(&self, machine: &str, mnt: &Path, extra: &[&str]) -> Result<Mount, Out> {
        let a = self.args(machine, extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Mount::new(Path::new(&self.url), mnt, &a)
    }

    fn mount(&self, machine: &str, mnt: &Path, extra: &[&str]) -> Mount {
        self.try_mount(machine, mnt, extra).unwrap_or_else(|out| panic!("mount ({machine}) failed: {out}"))
    }
}

/// A mixed tree copied into a mount on machine A, unmounted, then mounted
/// from a fresh local directory (machine B, which has nothing of the
/// volume): byte for byte and attribute for attribute the same; fsck of
/// the bucket URL with the PostgreSQL URL is clean.
#[test]
fn a_bucket_volume_with_postgres_metadata_mounts_through_fuse() {
    let _serial = serial();
    let s = Shared::new("shared-tree");
    let src = s.env.path("src");
    build_tree_with(&src, 200, 2 * MIB);
    let m = s.mount("a", &s.env.mnt, &[]);
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    // `cairn status` says where the metadata lives and under which session.
    let out = cairn(["status", "--json"]);
    assert!(out.ok(), "{out}");
    let all: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mnt = fs::canonicalize(m.path()).unwrap();
    let row = all.iter().find(|r| r["mountpoint"].as_str() == mnt.to_str()).unwrap_or_else(|| panic!("{} not in `cairn status`: {out}", mnt.display()));
    let meta = row["metadata"].as_str().unwrap_or_else(|| panic!("no metadata in `cairn status`: {row}"));
    assert!(meta.starts_with("postgres://") && meta.contains("(session "), "{meta}");
    m.umount();

    assert!(!s.dir("b").exists());
    let m = s.mount("b", &s.env.mnt, &[]);
    check_copy(&src, m.path(), "postgres metadata, bucket data, a fresh cache directory");
    m.umount();
    // Nothing of the metadata went to the bucket's cache directory.
    assert!(!s.dir("b").join("meta.sqlite").exists(), "no SQLite database beside PostgreSQL");

    let extra: Vec<OsString> = s.args("c", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
}

/// Sizes of the `n` files of the close-to-open test: mostly small (0 to
/// 64 KiB), every 100th over a megabyte (several chunks).
fn c2o_size(i: u64, rng: &mut Rng) -> u64 {
    if i % 100 == 37 {
        MIB + rng.below(MIB / 2)
    } else {
        rng.below(64 * KIB + 1)
    }
}

/// The `q`-quantile of sorted `v`.
fn quantile(v: &[Duration], q: f64) -> Duration {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Polls `stat` of `path` until its size is `len`; the time it took.
fn until_size(path: &Path, len: u64, limit: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    loop {
        let got = fs::metadata(path).map_err(|e| format!("stat {}: {e}", path.display()))?.len();
        if got == len {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            return Err(format!("{}: size {got}, not {len}, {:.2?} after the close on the writer", path.display(), t.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Close-to-open between two machines: a file written and closed on the
/// read-write mount A is read byte for byte by an open on the read-only
/// mount B right after the close returns: 1,000 new files (0 to 64 KiB,
/// every 100th over a megabyte), so B has nothing of them cached. With the
/// commit at close left out, B fails on the first file.
#[test]
fn a_close_on_one_mount_is_seen_by_an_open_on_another() {
    let _serial = serial();
    let s = Shared::new("shared-c2o");
    let a = s.mount("a", &s.env.mnt, &[]);
    fs::create_dir(a.join("c2o")).unwrap();
    let mnt_b = s.mountpoint("mnt-b");
    let b = s.mount("b", &mnt_b, &["--read-only"]);

    let mut rng = Rng::new(2026);
    let t = Instant::now();
    let mut bytes = 0;
    for i in 0..1000u64 {
        let name = format!("c2o/f{i}");
        let data = gen(10_000 + i, c2o_size(i, &mut rng) as usize);
        bytes += data.len();
        fs::write(a.join(&name), &data).unwrap_or_else(|e| panic!("write {name} on A: {e}"));
        let got = fs::read(b.join(&name)).unwrap_or_else(|e| panic!("open+read {name} on B right after its close on A: {e}"));
        assert!(got.len() == data.len() && got == data, "{name}: B read {} bytes, A closed {} (first difference at {})", got.len(), data.len(), got.iter().zip(&data).position(|(x, y)| x != y).unwrap_or(got.len().min(data.len())));
    }
    eprintln!("shared: 1000 files ({:.1} MiB) written+closed on A and read on B in {:.2?}", bytes as f64 / MIB as f64, t.elapsed());
    b.umount();
    a.umount();
}

/// Files the tests of change visibility change: a read-write mount A
/// and a read-only mount B of a new volume, and `N` files
/// `{prefix}{k}` (up to 32 KiB, bytes `gen(seed + k)`) written on A; the
/// rng the sizes came from goes on for the changes.
const N: u64 = 40;

fn writer_and_reader(name: &str, prefix: &str, rng_seed: u64, seed: u64) -> (Shared, Mount, Mount, Rng, Vec<u64>) {
    let s = Shared::new(name);
    let a = s.mount("a", &s.env.mnt, &[]);
    fs::create_dir(a.join(prefix.split('/').next().unwrap())).unwrap();
    let mnt_b = s.mountpoint("mnt-b");
    let b = s.mount("b", &mnt_b, &["--read-only"]);
    let mut rng = Rng::new(rng_seed);
    let mut lens = Vec::new();
    for k in 0..N {
        let len = rng.below(32 * KIB) + 1;
        fs::write(a.join(&format!("{prefix}{k}")), gen(seed + k, len as usize)).unwrap();
        lens.push(len);
    }
    (s, a, b, rng, lens)
}

/// A file the read-only mount B has stat'ed and read before, then changed
/// (appended to, or replaced by a longer or shorter file) and closed on the
/// read-write mount A: B's `stat` shows the new size within the kernel's
/// attribute TTL (B's cached attributes) plus a second of slack, and B
/// then reads A's bytes. The median and p99 delays are printed. (B once
/// kept the first open's state of a file for good: a read-only mount has
/// no flusher to forget clean files, and its kernel trusted its own sizes
/// under the writeback cache.)
#[test]
fn a_change_closed_on_one_mount_is_seen_by_a_stat_on_another_within_the_ttl() {
    let _serial = serial();
    // Files B has stat'ed (and read) before A changes their size.
    let (_s, a, b, mut rng, lens) = writer_and_reader("shared-grow", "grow/g", 2027, 20_000);
    for k in 0..N {
        let p = b.join(&format!("grow/g{k}"));
        assert_eq!(fs::metadata(&p).unwrap().len(), lens[k as usize], "g{k} on B");
        assert_eq!(fs::read(&p).unwrap(), gen(20_000 + k, lens[k as usize] as usize), "g{k} on B");
    }
    let mut delays = Vec::new();
    let mut failures = Vec::new();
    for k in 0..N {
        let name = format!("grow/g{k}");
        // Half are appended to, half replaced by a longer or shorter file.
        let want = if k % 2 == 0 {
            let extra = gen(30_000 + k, (rng.below(16 * KIB) + 1) as usize);
            let mut f = fs::OpenOptions::new().append(true).open(a.join(&name)).unwrap();
            f.write_all(&extra).unwrap();
            drop(f);
            let mut w = gen(20_000 + k, lens[k as usize] as usize);
            w.extend_from_slice(&extra);
            w
        } else {
            let len = lens[k as usize] + 1 + rng.below(16 * KIB);
            let len = if k % 4 == 1 { len } else { lens[k as usize] / 2 };
            let w = gen(40_000 + k, len as usize);
            fs::write(a.join(&name), &w).unwrap();
            w
        };
        // The close returned: B's kernel may still answer from attributes
        // it cached up to a TTL ago.
        match until_size(&b.join(&name), want.len() as u64, Duration::from_secs(5)) {
            Ok(d) => {
                delays.push(d);
                let got = fs::read(b.join(&name)).unwrap();
                if got != want {
                    failures.push(format!("{name}: B's size is right but its bytes are not A's ({} bytes read)", got.len()));
                }
            }
            Err(e) => failures.push(e),
        }
    }
    delays.sort();
    if !delays.is_empty() {
        eprintln!(
            "shared: B saw A's new size after {} of {N} closes; delay median {:.1?}, p99 {:.1?}, max {:.1?} (attribute TTL {ATTR_TTL:?})",
            delays.len(),
            quantile(&delays, 0.5),
            quantile(&delays, 0.99),
            delays.last().unwrap()
        );
    }
    assert!(failures.is_empty(), "{} of {N} changes not seen on B:\n{}", failures.len(), failures.join("\n"));
    let max = *delays.last().unwrap();
    assert!(max < ATTR_TTL + Duration::from_secs(1), "B's stat took {max:?} to show a closed file's new size");
    b.umount();
    a.umount();
}

/// Polls `stat` of `path` until its size and mtime are `want`; the time it
/// took (as [`until_size`]).
fn until_attrs(path: &Path, want: (u64, i64, i64), limit: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    loop {
        let m = fs::metadata(path).map_err(|e| format!("stat {}: {e}", path.display()))?;
        let got = (m.len(), m.mtime(), m.mtime_nsec());
        if got == want {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            return Err(format!("{}: (size, mtime s, ns) {got:?}, not {want:?}, {:.2?} after the close on the writer", path.display(), t.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Other machines' changes reach a mount promptly, not after a TTL
/// (docs/shared-volume.md §6, §11.4): the read-only mount B has every file
/// open and read (its pages cached with `FOPEN_KEEP_CACHE`, its engine state
/// held by the open descriptor) and `stat`s each one right before the
/// read-write mount A rewrites it: half with other bytes of the same size,
/// half with another size. From A's close returning, B's `stat` shows A's
/// size and mtime within 100 ms at p99 (median and p99 printed; without
/// invalidation the open descriptor keeps the old state for good), and B's
/// next open+read, and a read through the descriptor it kept, return A's
/// bytes.
#[test]
fn a_rewrite_on_one_mount_reaches_another_mounts_open_files_promptly() {
    let _serial = serial();
    let (_s, a, b, mut rng, lens) = writer_and_reader("shared-inval", "inval/f", 2028, 60_000);
    let mut held = Vec::new();
    for k in 0..N {
        let p = b.join(&format!("inval/f{k}"));
        let mut f = fs::File::open(&p).unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut got).unwrap();
        assert_eq!(got, gen(60_000 + k, lens[k as usize] as usize), "f{k} on B");
        held.push(f);
    }
    let mut delays = Vec::new();
    let mut failures = Vec::new();
    for k in 0..N {
        let name = format!("inval/f{k}");
        let p = b.join(&name);
        // B's kernel holds fresh attributes: valid for a whole TTL.
        let before = fs::metadata(&p).unwrap();
        let len = if k % 2 == 0 { lens[k as usize] } else { lens[k as usize] + 1 + rng.below(16 * KIB) };
        let w = gen(70_000 + k, len as usize);
        fs::write(a.join(&name), &w).unwrap();
        let closed = Instant::now();
        let am = fs::metadata(a.join(&name)).unwrap();
        let want = (len, am.mtime(), am.mtime_nsec());
        assert!((before.mtime(), before.mtime_nsec()) != (want.1, want.2), "{name}: A's rewrite has a new mtime");
        match until_attrs(&p, want, ATTR_TTL + Duration::from_secs(1)) {
            Ok(_) => {
                delays.push(closed.elapsed());
                let got = fs::read(&p).unwrap();
                if got != w {
                    failures.push(format!("{name}: B's stat is A's but its next open+read is not A's bytes ({} bytes read)", got.len()));
                }
                let mut kept = vec![0u8; len as usize];
                let n = std::os::unix::fs::FileExt::read_at(&held[k as usize], &mut kept, 0).unwrap();
                if kept[..n] != w[..] {
                    failures.push(format!("{name}: B's descriptor opened before the rewrite reads {n} bytes, not A's"));
                }
            }
            Err(e) => failures.push(e),
        }
        if failures.len() >= 3 {
            break;
        }
    }
    delays.sort();
    if !delays.is_empty() {
        eprintln!(
            "shared: B saw A's rewrite (new size or same size, new mtime) after {} of {N} closes, files open on B; delay median {:.1?}, p99 {:.1?}, max {:.1?}",
            delays.len(),
            quantile(&delays, 0.5),
            quantile(&delays, 0.99),
            delays.last().unwrap()
        );
    }
    // Every change was seen, each within its bound (the attribute TTL and
    // a second); how fast (the p99 target of 100 ms) is measured by
    // bench/shared.py (section 16), not asserted here.
    assert!(failures.is_empty(), "{} changes not seen on B:\n{}", failures.len(), failures.join("\n"));
    drop(held);
    b.umount();
    a.umount();
}

/// Three read-write mounts of one volume (three cache directories) at
/// once, each creating the same 100 names and 100 of its own in one
/// directory from its own thread: each shared name is won by exactly one
/// mount (the others get EEXIST), all three list the same 400 entries, a
/// file written and closed on one mount is read byte for byte on the
/// others, and fsck is clean after they unmount.
#[test]
fn three_read_write_mounts_create_in_one_directory_at_once() {
    let _serial = serial();
    let s = Shared::new("shared-three");
    let mnts: Vec<PathBuf> = ["m-a", "m-b", "m-c"].iter().map(|n| s.mountpoint(n)).collect();
    let mounts: Vec<Mount> = ["a", "b", "c"].iter().zip(&mnts).map(|(m, p)| s.mount(m, p, &[])).collect();
    fs::create_dir(mounts[0].join("common")).unwrap();
    let won: Vec<Vec<String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(m, mnt)| {
                let dir = mnt.join("common");
                sc.spawn(move || {
                    let mut won = Vec::new();
                    for i in 0..100 {
                        let name = format!("same{i}");
                        match fs::OpenOptions::new().write(true).create_new(true).open(dir.join(&name)) {
                            Ok(mut f) => {
                                f.write_all(format!("mount {m} won {name}\n").as_bytes()).unwrap();
                                won.push(name);
                            }
                            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "mount {m} creating {name}: {e}"),
                        }
                        let own = format!("m{m}-{i}");
                        fs::write(dir.join(&own), gen((m * 1000 + i) as u64, 1000 + i * 300)).unwrap_or_else(|e| panic!("mount {m} writing {own}: {e}"));
                    }
                    won
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut winners: Vec<&String> = won.iter().flatten().collect();
    winners.sort();
    winners.dedup();
    assert_eq!(winners.len(), 100, "each shared name won once: {won:?}");
    assert_eq!(won.iter().map(Vec::len).sum::<usize>(), 100, "a shared name won twice: {won:?}");
    let mut want: Vec<String> = (0..100).map(|i| format!("same{i}")).collect();
    for m in 0..3 {
        want.extend((0..100).map(|i| format!("m{m}-{i}")));
    }
    want.sort();
    for (m, mnt) in mounts.iter().enumerate() {
        let mut got: Vec<String> = fs::read_dir(mnt.join("common")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        got.sort();
        assert!(got == want, "mount {m} lists {} entries, {} expected", got.len(), want.len());
        // Every mount reads every other mount's closed files.
        for o in 0..3 {
            for i in (0..100).step_by(7) {
                let name = format!("m{o}-{i}");
                let got = fs::read(mnt.join("common").join(&name)).unwrap_or_else(|e| panic!("mount {m} reading {name}: {e}"));
                assert!(got == gen((o * 1000 + i) as u64, 1000 + i * 300), "mount {m} reads {name} wrong");
            }
        }
        for (w, names) in won.iter().enumerate() {
            for name in names {
                assert_eq!(fs::read_to_string(mnt.join("common").join(name)).unwrap(), format!("mount {w} won {name}\n"), "mount {m}");
            }
        }
    }
    for m in mounts {
        m.umount();
    }
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
}

/// Four read-write mounts write the same 32 MiB into files of their own
/// at the same time: the volume holds the data once (`cairn stats` of a
/// fifth machine while they are mounted: unique bytes 32 MiB for 128 MiB
/// of files), every mount reads every copy back, and fsck reading every
/// byte is clean.
#[test]
fn four_mounts_writing_the_same_data_store_it_once() {
    let _serial = serial();
    let s = Shared::new("shared-four");
    let len = 32 * MIB;
    let src = s.env.path("same.bin");
    write_random_file(&src, 4242, len);
    let mounts: Vec<Mount> = ["a", "b", "c", "d"].iter().map(|m| s.mount(m, &s.mountpoint(&format!("m-{m}")), &[])).collect();
    std::thread::scope(|sc| {
        for (m, mnt) in mounts.iter().enumerate() {
            let (src, dst) = (&src, mnt.join(&format!("copy{m}")));
            sc.spawn(move || {
                let out = run(Command::new("cp").arg(src).arg(&dst));
                assert!(out.ok(), "cp on mount {m}: {out}");
            });
        }
    });
    let out = cairn_ok(s.with_args("stats", "e", &["--json"]));
    let st: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(st["data_bytes"].as_u64(), Some(4 * len), "{st}");
    assert_eq!(st["unique_bytes"].as_u64(), Some(len), "four mounts' copies are one in the volume: {st}");
    for (m, mnt) in mounts.iter().enumerate() {
        for o in 0..4 {
            check_stream(&mnt.join(&format!("copy{o}")), 4242, len, true).unwrap_or_else(|e| panic!("mount {m} reading copy{o}: {e}"));
        }
    }
    for m in mounts {
        m.umount();
    }
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
}

/// gc and the cleaner running while other mounts write and deduplicate
/// the same data (issue 26): mounts A and B write files that are copies of
/// a few shared blobs, replacing and deleting them, so that chunks die and
/// come back by deduplication across machines; mount C's cleaner runs
/// every second with prices that make every pack with dead bytes due, and
/// `cairn gc` runs again and again from a fourth directory, both with no
/// chunk grace (the races the grace makes rare happen here). Every file
/// reads back byte for byte on every mount, and fsck reading every byte
/// is clean.
#[test]
fn gc_and_the_cleaner_beside_mounts_deduplicating_the_same_data_lose_nothing() {
    let _serial = serial();
    let s = Shared::new("shared-gcload");
    let dear = s.env.path("dear.toml");
    fs::write(&dear, "name = \"dear storage\"\nstorage_per_gb_month = 1e6\ntransfer_up_per_gb = 0\ntransfer_down_per_gb = 0.09\n[per_1000_requests]\nGET = 0.0004\nHEAD = 0.0004\nPUT = 0.005\nPOST = 0.005\nLIST = 0.005\nDELETE = 0\n").unwrap();
    let ma = s.mount("a", &s.mountpoint("m-a"), &[]);
    let mb = s.mount("b", &s.mountpoint("m-b"), &[]);
    let mc = s.mount("c", &s.mountpoint("m-c"), &["--gc-interval", "1", "--gc-prices", dear.to_str().unwrap(), "--chunk-grace", "0"]);
    let blobs: Vec<Vec<u8>> = (0..12).map(|i| gen(500 + i, MIB as usize)).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Packs a gc pass kept because a chunk it planned as dead came back
    // (the race this test is about): the writers go on past their 100
    // steps until one was seen, up to MAX_STEPS.
    const MAX_STEPS: usize = 400;
    let kept_so_far = std::sync::atomic::AtomicU64::new(0);
    let ((passes, deleted, kept), models) = std::thread::scope(|sc| {
        let collector = sc.spawn(|| {
            let (mut passes, mut deleted, mut kept) = (0, 0, 0);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let out = cairn(s.with_args("gc", "g", &["--chunk-grace", "0", "--repack-below", "0.9", "--json"]));
                assert!(out.ok(), "gc pass {passes} beside the writers: {out}");
                let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
                deleted += rep["packs_deleted"].as_u64().unwrap_or(0);
                kept += rep["packs_kept"].as_u64().unwrap_or(0);
                kept_so_far.store(kept, std::sync::atomic::Ordering::SeqCst);
                passes += 1;
            }
            (passes, deleted, kept)
        });
        let writers: Vec<_> = [&ma, &mb]
            .into_iter()
            .enumerate()
            .map(|(m, mnt)| {
                let (blobs, kept_so_far) = (&blobs, &kept_so_far);
                sc.spawn(move || {
                    let mut model = std::collections::BTreeMap::new();
                    for i in 0..MAX_STEPS {
                        if i >= 100 && kept_so_far.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                            break;
                        }
                        let name = format!("w{m}-{}", i % 3);
                        let p = mnt.join(&name);
                        if i % 5 == 4 {
                            // A delete: its chunks die unless the other mount holds a copy.
                            if model.remove(&name).is_some() {
                                fs::remove_file(&p).unwrap_or_else(|e| panic!("mount {m}: rm {name}: {e}"));
                            }
                            continue;
                        }
                        let k = (i * 7 + m) % blobs.len();
                        fs::write(&p, &blobs[k]).unwrap_or_else(|e| panic!("mount {m}: writing {name} (step {i}): {e}"));
                        model.insert(name, k);
                    }
                    model
                })
            })
            .collect();
        let models: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        // A few more passes once the writers are done.
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (collector.join().unwrap(), models)
    });
    assert!(passes >= 2 && deleted > 0, "gc ran {passes} times beside the writers and deleted {deleted} packs: the test did not test");
    assert!(kept > 0, "in {passes} gc passes beside writers of up to {MAX_STEPS} steps each, gc never kept a pack whose chunk came back: the race was never reached");
    for mnt in [&ma, &mb, &mc] {
        for model in &models {
            for (name, &k) in model {
                let got = fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{} reading {name}: {e}", mnt.path().display()));
                assert!(got == blobs[k], "{name} on {} differs after {passes} gc passes", mnt.path().display());
            }
        }
    }
    eprintln!("{passes} gc passes beside two writers and a cleaning mount: {deleted} packs deleted, {kept} kept (a chunk came back meanwhile)");
    for m in [ma, mb, mc] {
        m.umount();
    }
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
}

/// `SELECT ...` in the volume's schema (the only `cairn_*` schema of the
/// test's database `db`).
fn volume_sql(db: &str, sql: &str) -> String {
    let schema = crate::postgres::psql(db, "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'cairn\\_%'");
    assert!(!schema.is_empty() && !schema.contains('\n'), "one volume schema in {db}: {schema:?}");
    crate::postgres::psql(db, &format!("SET search_path TO {schema}; {sql}"))
}

/// `kill -9` of one of two mounts while it writes (issue 26): the other
/// keeps creating and reading; the dead mount's session is removed by the
/// other's cleaner once past its lifetime (`--session-ttl 3`), and the
/// file it held open whose name the other removed is freed with it; its
/// fsync'd file and the bytes its writer had written (acknowledged, in its
/// journal) are there when its directory mounts again; fsck is clean
/// after gc put its uncommitted packs in the trash.
#[test]
fn a_mount_killed_while_writing_leaves_the_others_working_and_is_cleaned_up() {
    let _serial = serial();
    let s = Shared::new("shared-kill9");
    let db = "shared_kill9";
    let fast = ["--session-ttl", "3", "--gc-interval", "1"];
    let mut ma = s.mount("a", &s.mountpoint("m-a"), &fast);
    let mb = s.mount("b", &s.mountpoint("m-b"), &fast);
    let sessions = || volume_sql(db, "SELECT id FROM sessions ORDER BY id");
    let before: Vec<String> = sessions().lines().map(str::to_string).collect();
    assert_eq!(before.len(), 2, "two mounts, two sessions: {before:?}");

    // An fsync'd file, and a file A holds open while B removes its name.
    let synced = s.env.path("synced.src");
    write_random_file(&synced, 71, 3 * MIB);
    let out = run(Command::new("dd").arg(format!("if={}", synced.display())).arg(format!("of={}", ma.join("synced").display())).args(["bs=1M", "conv=fsync"]));
    assert!(out.ok(), "dd: {out}");
    fs::write(ma.join("held"), vec![7u8; 300_000]).unwrap();
    let mut holder = Command::new("python3")
        .args(["-c", "import sys, time\nf = open(sys.argv[1], 'rb')\nprint('open', flush=True)\ntime.sleep(600)", &ma.join("held").display().to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("this test needs python3 (apt-get install -y python3): {e}"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "open");
    fs::remove_file(mb.join("held")).unwrap();
    assert_eq!(volume_sql(db, "SELECT count(*) FROM inodes WHERE nlink = 0"), "1", "the file A has open was freed by B's unlink");

    // A writer on A, killed with its daemon mid-way.
    let big = s.env.path("big.src");
    write_random_file(&big, 72, 256 * MIB);
    let mut writer = Command::new("dd").arg(format!("if={}", big.display())).arg(format!("of={}", ma.join("big").display())).arg("bs=256k").stderr(std::process::Stdio::null()).spawn().unwrap();
    let t = Instant::now();
    while fs::metadata(ma.join("big")).map_or(0, |m| m.len()) < 16 * MIB {
        assert!(t.elapsed() < Duration::from_secs(60), "the writer on A wrote less than 16 MiB in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    ma.kill9();
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = writer.kill();
    let _ = writer.wait();
    ma.detach();

    // B works on while A's session runs out and B's cleaner removes it.
    let t = Instant::now();
    let mut i = 0;
    loop {
        let p = mb.join(&format!("b{i}"));
        let data = format!("written by B while A was dead, {i}").repeat(100);
        fs::write(&p, &data).unwrap_or_else(|e| panic!("B writing {}: {e}", p.display()));
        assert_eq!(fs::read_to_string(&p).unwrap(), data);
        i += 1;
        let now: Vec<String> = sessions().lines().map(str::to_string).collect();
        if now.len() == 1 && volume_sql(db, "SELECT count(*) FROM inodes WHERE nlink = 0") == "0" {
            assert!(before.contains(&now[0]), "B's session went, or a new one came: {before:?} -> {now:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "A's session and its open file were not cleaned up within 30 s (sessions {now:?})");
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("kill -9: cleaned up {:?} after the kill, B wrote {i} files meanwhile", t.elapsed());

    // A's directory mounts again: the fsync'd file whole, the killed
    // writer's acknowledged bytes a prefix of what it wrote.
    let ma = s.mount("a", &s.mountpoint("m-a2"), &[]);
    assert_eq!(fs::read(ma.join("synced")).unwrap(), fs::read(&synced).unwrap(), "the fsync'd file after kill -9");
    let got = fs::read(ma.join("big")).unwrap();
    let want = fs::read(&big).unwrap();
    assert!(got.len() >= 16 * MIB as usize && want.starts_with(&got), "the killed writer's file: {} bytes, not a prefix of what it wrote", got.len());
    assert_eq!(fs::read(mb.join("synced")).unwrap(), fs::read(&synced).unwrap(), "B reads A's fsync'd file");
    ma.umount();
    mb.umount();
    // Packs A uploaded but never committed are recorded as uploading by
    // its dead session: gc keeps them for the grace (15 min; issue 49:
    // fencing keeps A from ever naming them, the grace leaves room for a
    // PUT still in flight), fsck counts them as uploading; orphans that
    // gc trashes count as waiting in the trash; neither is a leak.
    let out = cairn_ok(s.with_args("gc", "c", &["--json"]));
    let gc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("gc after kill -9: {gc}");
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    let rep = assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
    assert_eq!(rep["packs_in_trash"], gc["orphans_deleted"], "fsck {rep}");
}

/// Issue 49, a machine that stalls: mount A's daemon is stopped with
/// SIGSTOP (as a paused VM is) right after writing a file it has not
/// fsync'd, while it holds a flock, for longer than its session's
/// lifetime; mount B's cleaner removes A's expired session meanwhile and
/// B keeps working. B then gets the lock A held; when A is continued,
/// its next write fails with EIO (fenced: it must not commit under a
/// session the others have cleaned up) instead of succeeding; A's
/// directory mounted again replays the stalled file from its journal;
/// every fsync'd byte reads back and fsck is clean.
#[test]
fn a_mount_stopped_past_its_session_is_fenced_and_loses_nothing() {
    let _serial = serial();
    let s = Shared::new("shared-sigstop");
    let db = "shared_sigstop";
    let fast = ["--session-ttl", "3", "--gc-interval", "1"];
    let ma = s.mount("a", &s.mountpoint("m-a"), &fast);
    let mb = s.mount("b", &s.mountpoint("m-b"), &fast);
    let sessions = || volume_sql(db, "SELECT id FROM sessions ORDER BY id");
    assert_eq!(sessions().lines().count(), 2, "two mounts, two sessions");

    let synced = s.env.path("synced.src");
    write_random_file(&synced, 81, 2 * MIB);
    let out = run(Command::new("dd").arg(format!("if={}", synced.display())).arg(format!("of={}", ma.join("synced").display())).args(["bs=1M", "conv=fsync"]));
    assert!(out.ok(), "dd: {out}");
    fs::write(ma.join("locked"), b"lock me").unwrap();
    let (_holder, _o) = lock_holder(&ma.join("locked"), "flock");
    assert_eq!(run(Command::new("flock").args(["-n", "-E", "75"]).arg(mb.join("locked")).arg("true")).code, Some(75), "B got the flock A holds");
    // Written, not fsync'd: the bytes are in A's journal (or already
    // committed by a background round; either way they must survive).
    let stalled = gen(82, 3 * MIB as usize);
    fs::write(ma.join("stalled"), &stalled).unwrap();

    let pid = ma.pid.expect("daemon pid");
    // From here until SIGCONT nothing may touch A's mountpoint: any call
    // there would hang on the stopped daemon.
    // SAFETY: plain kill(2) of the daemon identified by its command line.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "kill -STOP {pid}: {}", std::io::Error::last_os_error());
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: as above; a failed assertion must not leave it stopped.
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    let cont = Cont(pid);
    let t = Instant::now();
    let mut i = 0;
    loop {
        let p = mb.join(&format!("b{i}"));
        fs::write(&p, format!("B while A was stopped, {i}")).unwrap_or_else(|e| panic!("B writing {}: {e}", p.display()));
        i += 1;
        if sessions().lines().count() == 1 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "B never removed A's expired session (sessions {:?})", sessions());
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("SIGSTOP: A's session removed {:?} after the stop; B wrote {i} files meanwhile", t.elapsed());
    // A's lock went with its session.
    let out = run(Command::new("flock").args(["-n", "-E", "75"]).arg(mb.join("locked")).arg("true"));
    assert_eq!(out.code, Some(0), "B did not get the lock of the stopped machine: {out}");
    drop(cont);

    // A, continued, is fenced. Which errno depends on who learns first
    // that its session is gone: its heartbeat turns the mount read-only
    // (EROFS, as ext4 with errors=remount-ro), or the create's commit is
    // refused by the fence (EIO, and the mount turns read-only then).
    // Success would be the defect.
    let out = python(
        "import os, sys\ntry:\n    fd = os.open(sys.argv[-1], os.O_WRONLY | os.O_CREAT, 0o644)\n    os.write(fd, b'after the stop' * 1000)\n    os.fsync(fd)\n    print('ok')\nexcept OSError as e:\n    print('errno', e.errno)",
        &[ma.join("after-thaw").as_os_str()],
        None,
    );
    let fenced = [format!("errno {}", libc::EROFS), format!("errno {}", libc::EIO)];
    assert!(fenced.contains(&out.stdout.trim().to_string()), "a write on the fenced mount (want EROFS or EIO): {out}");
    assert!(fs::metadata(mb.join("after-thaw")).is_err(), "the fenced mount's create reached the volume");
    assert_eq!(fs::read(mb.join("synced")).unwrap(), fs::read(&synced).unwrap(), "A's fsync'd file on B");
    drop(_holder);
    let out = ma.umount_failing();
    eprintln!("the fenced mount's umount: {out}");

    // A's directory mounts again (a new session): the stalled bytes are
    // there, from its journal if no round committed them before the stop.
    let ma = s.mount("a", &s.mountpoint("m-a2"), &[]);
    assert!(fs::read(ma.join("stalled")).unwrap() == stalled, "the stopped machine's written bytes after its remount");
    assert_eq!(fs::read(ma.join("synced")).unwrap(), fs::read(&synced).unwrap());
    assert!(fs::read(mb.join("stalled")).unwrap() == stalled, "B reads the replayed file");
    ma.umount();
    mb.umount();
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |w| w.contains("uploading") || w.contains("trash"));
}

/// A child process killed when dropped (a failed assertion must not
/// leave a lock holder keeping the mount busy).
struct Killed(std::process::Child);

impl std::ops::Deref for Killed {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A python3 process holding a lock on `path` until killed: prints "held"
/// once it has it. `how`: `flock` (exclusive flock) or `lockf START LEN`
/// (an exclusive POSIX range).
fn lock_holder(path: &Path, how: &str) -> (Killed, std::io::BufReader<std::process::ChildStdout>) {
    let script = "import fcntl, sys, time
f = open(sys.argv[1], 'r+b')
if sys.argv[2] == 'flock':
    fcntl.flock(f, fcntl.LOCK_EX)
else:
    fcntl.lockf(f, fcntl.LOCK_EX, int(sys.argv[4]), int(sys.argv[3]))
print('held', flush=True)
time.sleep(600)";
    let mut c = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .args(how.split(' '))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("this test needs python3 (apt-get install -y python3): {e}"));
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "held", "the lock holder did not get its lock");
    (Killed(c), out)
}

/// A python3 `lockf` of `len` bytes at `start` on `path`: exit 0 if
/// granted, 11 if refused (`nb`: without waiting).
fn lockf(path: &Path, start: u64, len: u64, nb: bool) -> Command {
    let script = "import fcntl, sys
f = open(sys.argv[1], 'r+b')
flags = fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[4] == '1' else 0)
try:
    fcntl.lockf(f, flags, int(sys.argv[3]), int(sys.argv[2]))
except (BlockingIOError, PermissionError):
    sys.exit(11)";
    let mut c = Command::new("python3");
    c.arg("-c").arg(script).arg(path).arg(start.to_string()).arg(len.to_string()).arg(if nb { "1" } else { "0" });
    c
}

/// `F_GETLK` of a write lock on `start..start+len` of `path`: (type, pid)
/// of the conflicting lock, or F_UNLCK.
fn getlk(path: &Path, start: u64, len: u64) -> (i32, u32) {
    let script = "import fcntl, struct, sys
f = open(sys.argv[1], 'r+b')
fl = struct.pack('hhqqixxxx', fcntl.F_WRLCK, 0, int(sys.argv[2]), int(sys.argv[3]), 0)
t, _, _, _, pid = struct.unpack('hhqqixxxx', fcntl.fcntl(f, fcntl.F_GETLK, fl))
print(t, pid)";
    let out = run(Command::new("python3").arg("-c").arg(script).arg(path).arg(start.to_string()).arg(len.to_string()));
    assert!(out.ok(), "F_GETLK: {out}");
    let v: Vec<i64> = out.stdout.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0] as i32, v[1] as u32)
}

/// Waits up to `limit` for `c` to exit; its status, or None if it still
/// runs.
fn wait_exit(c: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return Some(st);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While a lock request waits on mount B, B still answers (stat, list,
/// create): the wait holds no FUSE worker. The calls run on a thread and
/// must all answer before the caller releases the lock (a generous minute,
/// not a speed: a mount whose workers wait would never answer).
fn b_answers(b: &Path, name: &str) {
    let (b, name) = (b.to_path_buf(), name.to_string());
    let calls = std::thread::spawn(move || {
        fs::metadata(b.join("f")).unwrap();
        fs::read_dir(&b).unwrap().count();
        fs::write(b.join(&name), b"x").unwrap();
    });
    let limit = Instant::now() + Duration::from_secs(60);
    while !calls.is_finished() {
        assert!(Instant::now() < limit, "mount B did not answer a stat, a listing and a create within 60 s while a lock request waited");
        std::thread::sleep(Duration::from_millis(20));
    }
    calls.join().unwrap();
}

/// flock and POSIX byte-range locks held on one mount are seen by another
/// mount of the volume (docs/shared-volume.md §8): a non-blocking request
/// there is refused, a blocking one waits (without starving the mount)
/// and is granted once the holder is killed; a disjoint range is free;
/// F_GETLK names the holder.
#[test]
fn locks_held_on_one_mount_block_the_other_mounts() {
    let _serial = serial();
    let s = Shared::new("shared-locks");
    let a = s.mount("a", &s.mountpoint("m-a"), &[]);
    let b = s.mount("b", &s.mountpoint("m-b"), &[]);
    fs::write(a.join("f"), b"0123456789abcdefghij").unwrap();
    let (fa, fb) = (a.join("f"), b.join("f"));
    assert_eq!(fs::read(&fb).unwrap(), b"0123456789abcdefghij");

    // flock: held on A, refused on B without waiting.
    let (mut holder, _o) = lock_holder(&fa, "flock");
    let out = run(Command::new("flock").args(["-n", "-E", "75"]).arg(&fb).arg("true"));
    assert_eq!(out.code, Some(75), "flock -n on mount B got a lock mount A holds: {out}");
    // A blocking flock on B waits, B keeps answering, and it is granted
    // once the holder dies.
    let mut waiter = Killed(Command::new("flock").arg(&fb).arg("true").spawn().unwrap_or_else(|e| panic!("this test needs flock (util-linux): {e}")));
    assert!(wait_exit(&mut waiter, Duration::from_secs(1)).is_none(), "a blocking flock on B did not wait for A's lock");
    b_answers(b.path(), "during-flock");
    assert!(waiter.0.try_wait().unwrap().is_none(), "B's blocking flock ended before A's holder was killed, so B's answers were not given while it waited");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let st = wait_exit(&mut waiter, Duration::from_secs(60)).expect("B's flock still waits 60 s after A's holder was killed");
    assert!(st.success(), "B's flock: {st}");

    // POSIX ranges: bytes 0..10 held on A.
    let (mut holder, _o) = lock_holder(&fa, "lockf 0 10");
    assert_eq!(run(&mut lockf(&fb, 5, 5, true)).code, Some(11), "an overlapping range on B was granted");
    assert_eq!(run(&mut lockf(&fb, 10, 10, true)).code, Some(0), "a disjoint range on B was refused");
    assert_eq!(getlk(&fb, 0, 1), (libc::F_WRLCK as i32, holder.id()), "F_GETLK on B names A's holder");
    assert_eq!(getlk(&fb, 10, 10).0, libc::F_UNLCK as i32);
    let mut waiter = Killed(lockf(&fb, 5, 5, false).spawn().unwrap());
    assert!(wait_exit(&mut waiter, Duration::from_secs(1)).is_none(), "a blocking lockf on B did not wait for A's range");
    b_answers(b.path(), "during-lockf");
    assert!(waiter.0.try_wait().unwrap().is_none(), "B's blocking lockf ended before A's holder was killed, so B's answers were not given while it waited");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let st = wait_exit(&mut waiter, Duration::from_secs(60)).expect("B's lockf still waits 60 s after A's holder was killed");
    assert_eq!(st.code(), Some(0), "B's lockf: {st}");
    a.umount();
    b.umount();
}

/// PostgreSQL stopped for 20 s and started again under load (issue 26):
/// writers on two mounts block and then finish, every file they were told
/// was written reads back byte for byte on both mounts; a mount with
/// `--meta-timeout 5` answers an operation during the outage with EIO
/// after about 5 s, not a wrong answer, and works again afterwards; fsck
/// is clean. A server of the test's own, so no other test loses its
/// database.
///
/// A file stays open with unflushed bytes across the restart: a process
/// started meanwhile by this one (the server, if the harness started it
/// from here) closes that descriptor at exec, and the close commits the
/// file, waiting for the server being started; the harness starts it from
/// a process of its own (`cairn_testing::postgres`), so the restart is not
/// held up.
#[test]
fn postgres_stopped_for_20s_under_load_resumes_and_loses_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = serial();
    let mut pg = cairn_testing::postgres::PgServer::start().unwrap_or_else(|e| panic!("starting a PostgreSQL server: {e}"));
    pg.create_database("pgdown").unwrap();
    let s = Shared::with_meta("shared-pgdown", pg.url("pgdown"));
    let ma = s.mount("a", &s.mountpoint("m-a"), &[]);
    let mb = s.mount("b", &s.mountpoint("m-b"), &[]);
    let mc = s.mount("c", &s.mountpoint("m-c"), &["--meta-timeout", "5"]);
    let content = |m: usize, i: usize| format!("mount {m} file {i} ").repeat(2000 + i % 7 * 500).into_bytes();
    let stop = AtomicBool::new(false);
    let held_path = ma.join("held-open");
    let mut held = fs::File::create(&held_path).unwrap();
    held.write_all(b"written before the outage\n").unwrap();
    let (written, down_for) = std::thread::scope(|sc| {
        let writers: Vec<_> = [ma.path().to_path_buf(), mb.path().to_path_buf()]
            .into_iter()
            .enumerate()
            .map(|(m, dir)| {
                let stop = &stop;
                sc.spawn(move || {
                    // (file, how long its write took)
                    let mut done: Vec<(usize, Duration)> = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let t = Instant::now();
                        let r = (|| -> std::io::Result<()> {
                            let mut f = fs::File::create(dir.join(format!("w{m}-{i}")))?;
                            f.write_all(&content(m, i))?;
                            f.sync_all()
                        })();
                        match r {
                            Ok(()) => done.push((i, t.elapsed())),
                            Err(e) => panic!("mount {m} file {i} failed after {:?} (deadline 30 s, outage 20 s): {e}", t.elapsed()),
                        }
                        i += 1;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    done
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let down = Instant::now();
        pg.stop().unwrap();
        eprintln!("PostgreSQL took {:?} to stop (fast shutdown)", down.elapsed());
        held.write_all(b"written during the outage\n").unwrap();
        // Past its deadline an operation fails with EIO.
        let t = Instant::now();
        let e = fs::create_dir(mc.join("during")).expect_err("mkdir with PostgreSQL down succeeded");
        let took = t.elapsed();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "mkdir during the outage: {e}");
        // It tried until its deadline (not failing at the first refused
        // connection), and failed while the server was still down (the
        // restart below comes after): order, not speed.
        assert!(took >= Duration::from_secs(4), "EIO after {took:?} with --meta-timeout 5: it did not wait for its deadline");
        eprintln!("mkdir during the outage: EIO after {took:?} with --meta-timeout 5");
        std::thread::sleep(Duration::from_secs(20).saturating_sub(down.elapsed()));
        let t = Instant::now();
        pg.start_again().unwrap();
        let down_for = down.elapsed();
        eprintln!("PostgreSQL took {:?} to start again", t.elapsed());
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, Ordering::SeqCst);
        (writers.into_iter().map(|w| w.join().unwrap()).collect::<Vec<_>>(), down_for)
    });
    // The held file's close commits both writes.
    held.sync_all().unwrap();
    drop(held);
    let blocked = written.iter().flatten().map(|(_, t)| *t).max().unwrap();
    eprintln!("PostgreSQL down {down_for:?}: {} + {} files written, the longest write took {blocked:?}", written[0].len(), written[1].len());
    assert!(blocked >= Duration::from_secs(10), "no write waited for the server (longest {blocked:?}): the outage was not under load");
    // Everything acknowledged is there, on both mounts and the third.
    for (m, files) in written.iter().enumerate() {
        for &(i, _) in files {
            for mnt in [&ma, &mb, &mc] {
                let p = mnt.join(&format!("w{m}-{i}"));
                assert!(fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())) == content(m, i), "{} differs after the outage", p.display());
            }
        }
    }
    for mnt in [&mb, &mc] {
        assert_eq!(fs::read(mnt.join("held-open")).unwrap(), b"written before the outage\nwritten during the outage\n", "the file held open across the outage, on another mount");
    }
    assert!(!mc.join("during").exists(), "the mkdir that failed with EIO left its directory");
    fs::create_dir(mc.join("after")).unwrap();
    assert!(ma.join("after").is_dir());
    ma.umount();
    mb.umount();
    mc.umount();
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
}

/// One system call waits for about one metadata deadline, not one per
/// metadata operation it makes (issue 26 defect: an fsync and a close each
/// chain several, and an application waited 180 s with `--meta-timeout
/// 30`). PostgreSQL stopped, `--meta-timeout 5`: a write and fsync of a
/// file with unflushed bytes answer EIO while the server is still down
/// (that one deadline covers all of a call's operations, not one each, is
/// counted in cairn-meta's `postgres_outage`: after it, an operation fails
/// after one try), an fsync again answers EIO too (the bytes it could not commit are never
/// reported durable), and so does the close. The server back, the same
/// mount works without a remount: the file's bytes are still there, an
/// fsync commits them and another mount reads them; fsck is clean.
#[test]
fn a_syscall_during_a_postgres_outage_fails_within_about_one_deadline() {
    use std::os::fd::IntoRawFd;
    let _serial = serial();
    let mut pg = cairn_testing::postgres::PgServer::start().unwrap_or_else(|e| panic!("starting a PostgreSQL server: {e}"));
    pg.create_database("pgsyscall").unwrap();
    let s = Shared::with_meta("shared-pgsyscall", pg.url("pgsyscall"));
    let deadline = Duration::from_secs(5);
    let ma = s.mount("a", &s.mountpoint("m-a"), &["--meta-timeout", "5"]);
    let mb = s.mount("b", &s.mountpoint("m-b"), &[]);
    let first = b"committed before the outage\n".repeat(1000);
    let second = b"written during the outage\n".repeat(3000);
    let mut f = fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(ma.join("dirty")).unwrap();
    f.write_all(&first).unwrap();
    f.sync_all().unwrap();
    pg.stop().unwrap();

    // The three calls run on a thread of their own; the server stays down
    // until all three answered, so each answer comes from the mount's own
    // deadline, not from the server's return. A generous limit (many
    // deadlines) only keeps a hang from hanging the suite; how long each
    // took is printed, not asserted (speed belongs in bench/).
    let calls = {
        let second = second.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            f.write_all(&second).unwrap();
            let fsync = f.sync_all().expect_err("fsync with PostgreSQL down succeeded");
            let fsync_took = t.elapsed();
            let t = Instant::now();
            let again = f.sync_all().expect_err("a second fsync with PostgreSQL down succeeded: bytes it could not commit were reported durable");
            let again_took = t.elapsed();
            let t = Instant::now();
            // SAFETY: the descriptor is ours (into_raw_fd) and closed once.
            let rc = unsafe { libc::close(f.into_raw_fd()) };
            let close = std::io::Error::last_os_error();
            eprintln!("write + fsync: {fsync} after {fsync_took:?}; fsync again: {again} after {again_took:?}; close: {rc} ({close}) after {:?}", t.elapsed());
            (fsync, again, rc, close)
        })
    };
    let limit = Instant::now() + 24 * deadline;
    while !calls.is_finished() {
        assert!(Instant::now() < limit, "write + fsync, fsync and close with --meta-timeout 5 had not all answered after {:?} with PostgreSQL down", 24 * deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    let (fsync, again, rc, close) = calls.join().unwrap();
    assert_eq!(fsync.raw_os_error(), Some(libc::EIO), "fsync during the outage: {fsync}");
    assert_eq!(again.raw_os_error(), Some(libc::EIO), "second fsync during the outage: {again}");
    assert_eq!((rc, close.raw_os_error()), (-1, Some(libc::EIO)), "close of the dirty file during the outage");

    pg.start_again().unwrap();
    let want = [first.clone(), second.clone()].concat();
    assert!(fs::read(ma.join("dirty")).unwrap() == want, "the file's bytes on the same mount after the outage");
    let f = fs::OpenOptions::new().write(true).open(ma.join("dirty")).unwrap();
    f.sync_all().unwrap_or_else(|e| panic!("fsync after the server came back (no remount): {e}"));
    drop(f);
    assert!(fs::read(mb.join("dirty")).unwrap() == want, "another mount reads the bytes once the fsync after the outage committed them");
    fs::create_dir(ma.join("after")).unwrap();
    assert!(mb.join("after").is_dir());
    ma.umount();
    mb.umount();
    let extra: Vec<OsString> = s.args("fsck", &[]).into_iter().map(OsString::from).collect();
    assert_fsck_clean_at(Path::new(&s.url), true, &extra, |_| false);
}
