//! 3. `kill -9` of the daemon under a writer that fsyncs: every file the
//! writer saw fsync'd survives byte for byte, and fsck finds no errors.
//!
//! The writer is this test binary run again (`writer_process` below, a
//! helper that does nothing unless CAIRN_E2E_WRITER is set), so that its
//! content generator is the same code as the checker's.

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FILES: u64 = 200;
const APPENDERS: u64 = 3;
/// Kill the daemon once this many whole files were reported fsync'd.
const KILL_AFTER: usize = 120;

fn file_len(i: u64) -> u64 {
    (64 << 10) + Rng::new(0xF11E + i).below((4 << 20) - (64 << 10) + 1)
}
fn file_seed(i: u64) -> u64 {
    1_000_000 + i
}
fn record(k: u64, r: u64) -> Vec<u8> {
    let seed = (k << 32) | r;
    gen(seed, (4096 + Rng::new(seed ^ 0xA99E).below(60_000)) as usize)
}

/// Writes the log line in one write(2) on an O_APPEND file: whole lines
/// survive even if the writer dies.
fn log_line(log: &fs::File, line: &str) {
    (&*log).write_all(line.as_bytes()).expect("writing the writer log");
}

fn writer_main(dir: &Path, log: &Path) {
    let log = fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let log = std::sync::Arc::new(log);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = {
        let (log, stop, dir) = (log.clone(), stop.clone(), dir.to_path_buf());
        std::thread::spawn(move || {
            let mut files = Vec::new();
            for k in 0..APPENDERS {
                match fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("app{k}"))) {
                    Ok(f) => files.push(f),
                    Err(e) => return log_line(&log, &format!("error open app{k}: {e}\n")),
                }
            }
            let mut len = vec![0u64; APPENDERS as usize];
            for r in 0.. {
                for k in 0..APPENDERS {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let rec = record(k, r);
                    let f = &mut files[k as usize];
                    if let Err(e) = f.write_all(&rec).and_then(|_| f.sync_all()) {
                        return log_line(&log, &format!("error append app{k}: {e}\n"));
                    }
                    len[k as usize] += rec.len() as u64;
                    log_line(&log, &format!("append app{k} {}\n", len[k as usize]));
                }
            }
        })
    };
    for i in 0..FILES {
        let name = format!("f{i:03}");
        let r = (|| {
            let mut f = fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o644)
                .open(dir.join(&name))?;
            write_stream(&mut f, file_seed(i), file_len(i))?;
            f.sync_all()
        })();
        match r {
            Ok(()) => log_line(&log, &format!("file {name} {i} {}\n", file_len(i))),
            Err(e) => {
                log_line(&log, &format!("error {name}: {e}\n"));
                break;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    appender.join().unwrap();
    log_line(&log, "done\n");
}

#[test]
#[ignore = "helper process of crash::kill9_daemon_keeps_fsynced_files (runs only with CAIRN_E2E_WRITER set)"]
fn writer_process() {
    let (Some(dir), Some(log)) = (std::env::var_os("CAIRN_E2E_WRITER"), std::env::var_os("CAIRN_E2E_WRITER_LOG")) else {
        return;
    };
    writer_main(Path::new(&dir), Path::new(&log));
}

#[test]
fn kill9_daemon_keeps_fsynced_files() {
    let _serial = serial();
    let env = Env::new("crash");
    let log = env.path("writer.log");
    let mut m = env.mount();
    fs::create_dir(m.join("crash")).unwrap();

    let mut writer = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash::writer_process", "--ignored", "--nocapture", "--test-threads=1"])
        .env("CAIRN_E2E_WRITER", m.join("crash"))
        .env("CAIRN_E2E_WRITER_LOG", &log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let done_files = |text: &str| text.lines().filter(|l| l.starts_with("file ")).count();
    let before = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if done_files(&text) >= KILL_AFTER || text.contains("done") || text.contains("error") {
            break text;
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = writer.kill();
            panic!("the writer fsync'd only {} files in 180 s:\n{text}", done_files(&text));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Checked before the kill: after it, the writer logs its errors.
    assert!(
        !before.contains("error") && !before.contains("done"),
        "the writer must be still running when the daemon dies:\n{before}"
    );
    m.kill9();

    // The writer sees the dead connection and stops.
    let t = Instant::now();
    loop {
        if writer.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = writer.kill();
            let _ = writer.wait();
            panic!("the writer hangs 60 s after the daemon died");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    m.detach();
    let text = fs::read_to_string(&log).unwrap();
    eprintln!(
        "crash: killed the daemon after {:.1?}; writer had fsync'd {} files and {} appends; its last lines:\n{}",
        start.elapsed(),
        done_files(&text),
        text.lines().filter(|l| l.starts_with("append ")).count(),
        text.lines().rev().take(3).collect::<Vec<_>>().join("\n")
    );

    let m = env.mount();
    let dir = m.join("crash");
    let mut problems = Vec::new();
    let mut appended: BTreeMap<u64, u64> = BTreeMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        match f[0] {
            "file" => {
                let (i, len): (u64, u64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
                if let Err(e) = check_stream(&dir.join(f[1]), file_seed(i), len, true) {
                    problems.push(e);
                }
            }
            "append" => {
                let k: u64 = f[1].trim_start_matches("app").parse().unwrap();
                let len: u64 = f[2].parse().unwrap();
                let e = appended.entry(k).or_default();
                *e = (*e).max(len);
            }
            _ => {}
        }
    }
    for (k, len) in &appended {
        let p = dir.join(format!("app{k}"));
        let data = match fs::read(&p) {
            Ok(d) => d,
            Err(e) => {
                problems.push(format!("{}: {e}", p.display()));
                continue;
            }
        };
        let mut want = Vec::new();
        let mut r = 0;
        while (want.len() as u64) < *len {
            want.extend_from_slice(&record(*k, r));
            r += 1;
        }
        if (data.len() as u64) < *len || data[..*len as usize] != want[..*len as usize] {
            problems.push(format!("{}: {} bytes, fsync'd prefix of {len} bytes does not match", p.display(), data.len()));
        }
    }
    // Whatever else is there (files caught mid-write) must read without error.
    for e in fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if let Err(e) = fs::read(&p) {
            problems.push(format!("reading {} (not fsync'd) failed: {e}", p.display()));
        }
    }
    assert!(problems.is_empty(), "after kill -9 and remount:\n{}", problems.join("\n"));
    m.umount();

    // Unreferenced packs (uploaded, never committed) are the one acceptable leftover.
    env.assert_fsck_clean(|w| w.contains("is in the backend but not in the metadata"));
}

/// A file unlinked while open, then the daemon killed: the next mount
/// deletes the orphan inode and its data becomes garbage gc can free.
#[test]
fn kill9_with_an_unlinked_open_file_leaves_no_orphan() {
    let _serial = serial();
    let env = Env::new("crash-orphan");
    let mut m = env.mount();
    write_random_file(&m.join("keep"), 0x4EE9, 1 << 20);
    fs::File::open(m.join("keep")).unwrap().sync_all().unwrap();
    let mut ghost = fs::File::create(m.join("ghost")).unwrap();
    write_stream(&mut ghost, 0x6405, 8 << 20).unwrap();
    ghost.sync_all().unwrap();
    fs::remove_file(m.join("ghost")).unwrap();
    ghost.sync_all().unwrap();
    // Let the flusher commit the orphan's data (files older than 5 s).
    std::thread::sleep(Duration::from_secs(7));
    m.kill9();
    drop(ghost);
    m.detach();

    let m = env.mount();
    let names: Vec<_> = fs::read_dir(m.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["keep"]);
    check_stream(&m.join("keep"), 0x4EE9, 1 << 20, true).unwrap();
    m.umount();
    let s = env.stats();
    assert_eq!(
        (s["files"].as_u64(), s["data_bytes"].as_u64()),
        (Some(1), Some(1 << 20)),
        "orphan still counted: {s}"
    );
    env.assert_fsck_clean(|w| w.contains("is in the backend but not in the metadata"));
    cairn_ok([std::ffi::OsStr::new("gc"), env.vol.as_os_str()]);
    let s = env.stats();
    assert!(
        s["stored_bytes"].as_u64().unwrap() < 2 << 20,
        "gc left {} stored bytes for 1 MiB of live data: {s}",
        s["stored_bytes"]
    );
    env.assert_fsck_clean(|_| false);
}

/// The atomic-replace pattern (write tmp, fsync, rename over, fsync the
/// directory) survives `kill -9` right after the last fsync returns, with
/// the metadata changes fsync'd along with it.
#[test]
fn kill9_after_atomic_replace_keeps_the_new_version() {
    let _serial = serial();
    let env = Env::new("crash-replace");
    let mut m = env.mount();
    let d = m.join("d");
    fs::create_dir(&d).unwrap();
    let fsync_dir = |p: &Path| fs::File::open(p).unwrap().sync_all().unwrap();
    for v in 0..40u64 {
        let mut f = fs::File::create(d.join("tmp")).unwrap();
        write_stream(&mut f, 0x5EED + v, 100_000 + v).unwrap();
        f.sync_all().unwrap();
        drop(f);
        fs::rename(d.join("tmp"), d.join("current")).unwrap();
        fsync_dir(&d);
    }
    fs::create_dir(d.join("sub")).unwrap();
    std::os::unix::fs::symlink("current", d.join("link")).unwrap();
    set_xattr(&d.join("current"), "user.version", b"39");
    std::fs::set_permissions(d.join("current"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    fsync_dir(&d);
    fs::File::open(d.join("current")).unwrap().sync_all().unwrap();
    m.kill9();
    m.detach();

    let m = env.mount();
    let d = m.join("d");
    let mut names: Vec<String> = fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["current", "link", "sub"]);
    check_stream(&d.join("current"), 0x5EED + 39, 100_039, true).unwrap();
    assert_eq!(fs::read_link(d.join("link")).unwrap(), Path::new("current"));
    assert_eq!(xattrs(&d.join("current")).unwrap(), vec![(b"user.version".to_vec(), b"39".to_vec())]);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(d.join("current")).unwrap().mode() & 0o7777, 0o600);
    m.umount();
    env.assert_fsck_clean(|w| w.contains("is in the backend but not in the metadata"));
}

/// The journal records of a segment: (start, data length, file offset).
fn journal_records(seg: &[u8]) -> Vec<(usize, usize, u64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 48 <= seg.len() {
        let len = u32::from_le_bytes(seg[pos + 40..pos + 44].try_into().unwrap()) as usize;
        let dlen = match seg[pos + 4] {
            1 if seg[pos + 5] & 1 == 1 => len + 28,
            1 => len,
            _ => 0,
        };
        out.push((pos, dlen, u64::from_le_bytes(seg[pos + 24..pos + 32].try_into().unwrap())));
        pos += 48 + dlen;
    }
    assert_eq!(pos, seg.len(), "the segment ends with a whole record");
    out
}

/// `kill -9` after several fsync'd appends, then one byte of a record in
/// the middle of the journal segment changed on disk: the mount refuses and
/// names the segment, nothing is deleted, `cairn fsck` reports it (exit 1),
/// and after `cairn fsck --salvage-journal` the mount shows every byte of
/// the records after the damaged one (and keeps a copy of the segment).
#[test]
fn kill9_then_a_damaged_journal_record_refuses_the_mount_until_salvaged() {
    let _serial = serial();
    let env = Env::new("crash-journal-damage");
    let mut m = env.mount();
    const PART: usize = 64 << 10;
    let want: Vec<u8> = (0..6).flat_map(|i| gen(0xDA3A6E + i, PART)).collect();
    let mut f = fs::OpenOptions::new().create(true).append(true).open(m.join("log")).unwrap();
    for p in want.chunks(PART) {
        f.write_all(p).unwrap();
        f.sync_all().unwrap();
    }
    m.kill9();
    drop(f);
    m.detach();

    let jdir = env.vol.join("journal");
    let segs: Vec<_> = fs::read_dir(&jdir).unwrap().flatten().map(|e| e.path()).filter(|p| fs::metadata(p).unwrap().len() > 0).collect();
    assert_eq!(segs.len(), 1, "one file's records, one segment: {segs:?}");
    let seg = &segs[0];
    let name = seg.file_name().unwrap().to_str().unwrap().to_string();
    let mut bytes = fs::read(seg).unwrap();
    let recs: Vec<_> = journal_records(&bytes).into_iter().filter(|r| r.1 > 0).collect();
    assert!(recs.len() >= 3, "{recs:?}");
    let (start, dlen, off) = recs[recs.len() / 2];
    bytes[start + 48 + dlen / 2] ^= 0x04;
    fs::write(seg, &bytes).unwrap();

    let out = Mount::new(&env.vol, &env.mnt, &[]).err().expect("the mount must refuse a damaged journal");
    let text = out.text();
    assert!(text.contains(&name) && text.contains(&format!("record at byte {start}")), "the error names the segment and offset: {out}");
    assert!(text.contains("salvage-journal"), "{out}");
    assert_eq!(fs::read(seg).unwrap(), bytes, "the damaged segment was changed or deleted");

    let (out, rep) = env.fsck(false);
    assert!(!out.ok(), "fsck must fail on a damaged journal: {out}");
    let errors = rep["errors"].as_array().unwrap();
    assert!(errors.iter().any(|e| e.as_str().unwrap().contains(&name)), "{out}");
    assert_eq!(fs::read(seg).unwrap(), bytes, "fsck changed or deleted the segment");

    let (out, rep) = fsck_at(&env.vol, false, &["--salvage-journal".into()]);
    assert!(rep["errors"].as_array().unwrap().iter().any(|e| e.as_str().unwrap().contains("salvaged")), "{out}");
    assert_eq!(fs::read(env.vol.join("journal-damaged").join(&name)).unwrap(), bytes, "the evidence");

    let m = env.mount();
    let got = fs::read(m.join("log")).unwrap();
    assert_eq!(got.len(), want.len(), "the last fsync'd append was lost");
    let lost = off as usize..off as usize + dlen;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if lost.contains(&i) {
            assert_eq!(*g, 0, "byte {i} of the damaged record was replayed");
        } else {
            assert_eq!(g, w, "byte {i} (damaged record {lost:?}) differs after salvage");
        }
    }
    m.umount();
    env.assert_fsck_clean(|w| w.contains("is in the backend but not in the metadata"));
}
