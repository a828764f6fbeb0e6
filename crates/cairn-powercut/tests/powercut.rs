//! Real mounts (run as root): what survives a power cut is exactly what was
//! fsync'd.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_powercut::PowerCut;

/// A backing directory and a mount point under the cargo target dir, and a
/// guard that lazily unmounts the mount point whatever happens.
struct Env {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
}

impl Env {
    fn new() -> Env {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        fs::create_dir_all(root).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("powercut-")
            .tempdir_in(root)
            .unwrap();
        let backing = dir.path().join("backing");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mnt).unwrap();
        let mnt = mnt.canonicalize().unwrap();
        Env {
            _dir: dir,
            backing,
            mnt,
        }
    }

    fn mount(&self) -> PowerCut {
        PowerCut::mount(&self.backing, &self.mnt).expect("mount")
    }
}

fn mounted(path: &Path) -> bool {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .any(|l| l.split(' ').nth(4).map(|m| m.as_bytes()) == Some(path.as_os_str().as_bytes()))
}

fn lazy_unmount(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    while mounted(path) {
        // SAFETY: valid C string.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            break;
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        lazy_unmount(&self.mnt);
    }
}

/// Drops the kernel's cached pages of a file, so reads go to the daemon.
fn drop_cache(f: &File) {
    // SAFETY: valid descriptor.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn only_fsynced_content_survives_a_cut() {
    let env = Env::new();
    let pc = env.mount();
    let p = env.mnt.join("f");
    let mut f = File::create(&p).unwrap();
    f.write_all(b"hello world").unwrap();
    f.sync_all().unwrap();
    f.write_all(b", and more that is never synced").unwrap();
    assert_eq!(
        fs::read(&p).unwrap(),
        b"hello world, and more that is never synced"
    );
    assert_eq!(fs::metadata(&p).unwrap().len(), 42);
    // The backing file holds only the synced part.
    assert_eq!(fs::read(env.backing.join("f")).unwrap(), b"hello world");
    // A second file, open across the cut.
    let mut g = File::create(env.mnt.join("g")).unwrap();
    g.write_all(b"unsynced").unwrap();
    drop(f); // close persists nothing
    let stats = pc.cut().unwrap();
    println!("cut: {stats:?}");
    assert_eq!(stats.fsyncs, 1);
    assert_eq!(stats.bytes_persisted, 11);
    assert!(stats.bytes_dropped_at_cut >= 42, "{stats:?}");
    assert!(!mounted(&env.mnt));
    // The dead handle fails.
    assert!(g.write_all(b"x").and_then(|_| g.sync_all()).is_err());
    drop(g);

    let pc = env.mount();
    assert_eq!(fs::read(&p).unwrap(), b"hello world");
    assert_eq!(fs::metadata(&p).unwrap().len(), 11);
    // Created names are durable, their unsynced contents are not.
    assert_eq!(fs::metadata(env.mnt.join("g")).unwrap().len(), 0);
    pc.cut().unwrap();
}

#[test]
fn truncation_is_volatile_until_fsync() {
    let env = Env::new();
    let orig = pattern(10000, 1);
    let p = env.mnt.join("t");
    let pc = env.mount();
    {
        let mut f = File::create(&p).unwrap();
        f.write_all(&orig).unwrap();
        f.sync_data().unwrap();
    }
    let expected = |v: &[u8]| {
        assert_eq!(v.len(), 8192);
        assert_eq!(&v[..10], &orig[..10]);
        assert!(
            v[10..8000].iter().all(|&b| b == 0),
            "zeros between 10 and 8000"
        );
        assert!(v[8000..].iter().all(|&b| b == b'x'));
    };
    let shrink_and_grow = |p: &Path| {
        let f = OpenOptions::new().read(true).write(true).open(p).unwrap();
        f.set_len(10).unwrap();
        f.write_all_at(&[b'x'; 192], 8000).unwrap();
        drop_cache(&f);
        f
    };
    let f = shrink_and_grow(&p);
    expected(&fs::read(&p).unwrap());
    assert_eq!(fs::read(env.backing.join("t")).unwrap(), orig);
    drop(f);
    pc.cut().unwrap();

    let pc = env.mount();
    assert_eq!(fs::read(&p).unwrap(), orig, "the cut undid the truncation");
    // O_TRUNC is volatile too.
    {
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), 0);
        f.write_all(b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(fs::read(env.backing.join("t")).unwrap(), orig);
    }
    pc.cut().unwrap();

    let pc = env.mount();
    assert_eq!(fs::read(&p).unwrap(), orig);
    let f = shrink_and_grow(&p);
    f.sync_all().unwrap();
    drop(f);
    expected(&fs::read(env.backing.join("t")).unwrap());
    pc.cut().unwrap();

    let pc = env.mount();
    expected(&fs::read(&p).unwrap());
    pc.unmount().unwrap();
}

#[test]
fn reads_see_dirty_data() {
    let env = Env::new();
    let pc = env.mount();
    let p = env.mnt.join("r");
    let mut model = pattern(10000, 7);
    {
        let mut f = File::create(&p).unwrap();
        f.write_all(&model).unwrap();
        f.sync_all().unwrap();
    }
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    for (off, data) in [
        (5u64, &b"abc"[..]),
        (4090, &[1u8; 20][..]),           // spans pages 0 and 1
        (4096 * 2 - 1, &[2u8; 4098][..]), // spans three pages
        (9999, &b"XYZ"[..]),              // past EOF
    ] {
        f.write_all_at(data, off).unwrap();
        let end = off as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(data);
    }
    drop_cache(&f);
    let mut all = Vec::new();
    (&f).read_to_end(&mut all).unwrap();
    assert_eq!(all, model);
    // Reads at odd offsets, through the daemon.
    for (off, len) in [
        (0u64, 1usize),
        (3, 4093),
        (4095, 2),
        (8000, 2100),
        (9990, 100),
    ] {
        drop_cache(&f);
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off).unwrap();
        let want = &model[off as usize..(off as usize + len).min(model.len())];
        assert_eq!(&buf[..n], want, "read at {off}");
    }
    // pread past EOF is short, then empty.
    let len = model.len() as u64;
    assert_eq!(len, 8191 + 4098);
    assert_eq!(fs::metadata(&p).unwrap().len(), len);
    let mut buf = [0u8; 100];
    drop_cache(&f);
    assert_eq!(f.read_at(&mut buf, len - 2).unwrap(), 2);
    assert_eq!(&buf[..2], &model[model.len() - 2..]);
    assert_eq!(f.read_at(&mut buf, len).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, 20000).unwrap(), 0);
    // A hole written past EOF of a new file reads as zeros.
    let h = File::create(env.mnt.join("hole")).unwrap();
    h.write_all_at(b"end", 100_000).unwrap();
    drop_cache(&h);
    let v = fs::read(env.mnt.join("hole")).unwrap();
    assert_eq!(v.len(), 100_003);
    assert!(v[..100_000].iter().all(|&b| b == 0));
    assert_eq!(&v[100_000..], b"end");
    assert!(pc.stats().dirty_bytes > 0);
    drop((f, h));
    pc.cut().unwrap();

    let pc = env.mount();
    assert_eq!(fs::read(&p).unwrap(), pattern(10000, 7));
    assert_eq!(fs::metadata(env.mnt.join("hole")).unwrap().len(), 0);
    pc.cut().unwrap();
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let a = std::ffi::CString::new(from.as_os_str().as_bytes()).unwrap();
    let b = std::ffi::CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[test]
fn namespace_passes_through() {
    let env = Env::new();
    let pc = env.mount();
    let m = &env.mnt;
    // mkdir -p, and the pack dance: tmp/ file, fsync, rename into packs/XY/,
    // fsync the directory.
    fs::create_dir_all(m.join("packs/ab")).unwrap();
    fs::create_dir(m.join("tmp")).unwrap();
    assert!(env.backing.join("packs/ab").is_dir());
    let pack = pattern(300_000, 3);
    {
        let mut f = File::create(m.join("tmp/p1.tmp")).unwrap();
        f.write_all(&pack).unwrap();
        f.sync_all().unwrap();
    }
    fs::rename(m.join("tmp/p1.tmp"), m.join("packs/ab/p1")).unwrap();
    File::open(m.join("packs/ab")).unwrap().sync_all().unwrap();
    assert!(!env.backing.join("tmp/p1.tmp").exists());
    assert_eq!(fs::read(env.backing.join("packs/ab/p1")).unwrap(), pack);

    // An unsynced file keeps its overlay across a rename, also of its
    // directory.
    fs::create_dir(m.join("d1")).unwrap();
    fs::write(m.join("d1/u"), b"dirty").unwrap();
    fs::rename(m.join("d1"), m.join("d2")).unwrap();
    fs::rename(m.join("d2/u"), m.join("d2/v")).unwrap();
    assert_eq!(fs::read(m.join("d2/v")).unwrap(), b"dirty");
    assert_eq!(fs::read(env.backing.join("d2/v")).unwrap(), b"");

    // unlink drops the overlay; a new file of the same name starts clean.
    fs::write(m.join("gone"), b"dirty data").unwrap();
    fs::remove_file(m.join("gone")).unwrap();
    File::create(m.join("gone")).unwrap();
    assert_eq!(fs::read(m.join("gone")).unwrap(), b"");
    fs::remove_file(m.join("gone")).unwrap();
    assert!(!env.backing.join("gone").exists());

    // Errors carry the backing errno.
    let errno = |r: io::Result<()>| r.unwrap_err().raw_os_error().unwrap();
    assert_eq!(errno(fs::remove_file(m.join("nope"))), libc::ENOENT);
    assert_eq!(errno(fs::create_dir(m.join("tmp"))), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(m.join("packs"))), libc::ENOTEMPTY);
    fs::create_dir(m.join("empty")).unwrap();
    fs::remove_dir(m.join("empty")).unwrap();
    assert!(!env.backing.join("empty").exists());

    // renameat2 flags.
    fs::write(m.join("a"), b"A").unwrap();
    fs::write(m.join("b"), b"B").unwrap();
    assert_eq!(
        errno(renameat2(
            &m.join("a"),
            &m.join("b"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    renameat2(&m.join("a"), &m.join("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.join("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.join("b")).unwrap(), b"A");
    assert_eq!(
        errno(renameat2(&m.join("a"), &m.join("c"), libc::RENAME_WHITEOUT)),
        libc::EINVAL
    );
    renameat2(&m.join("a"), &m.join("c"), libc::RENAME_NOREPLACE).unwrap();
    // Rename over an existing file drops the replaced file's overlay.
    fs::rename(m.join("c"), m.join("b")).unwrap();
    assert_eq!(fs::read(m.join("b")).unwrap(), b"B");

    // Symlinks, hard links, modes, times.
    std::os::unix::fs::symlink("packs/ab/p1", m.join("link")).unwrap();
    assert_eq!(
        fs::read_link(m.join("link")).unwrap(),
        Path::new("packs/ab/p1")
    );
    assert_eq!(fs::read(m.join("link")).unwrap().len(), pack.len());
    fs::hard_link(m.join("packs/ab/p1"), m.join("hard")).unwrap();
    assert_eq!(
        fs::metadata(m.join("hard")).unwrap().len(),
        pack.len() as u64
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(m.join("hard"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(env.backing.join("packs/ab/p1"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o640
    );
    let names: Vec<_> = fs::read_dir(m)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for n in ["packs", "tmp", "d2", "b", "link", "hard"] {
        assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
    }
    // Locks are the kernel's (no FUSE_POSIX_LOCKS/FLOCK_LOCKS): flock and
    // OFD fcntl locks conflict between descriptors as on a local disk.
    let rw = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.join("b"))
            .unwrap()
    };
    let (l1, l2) = (rw(), rw());
    // SAFETY: valid descriptors.
    unsafe {
        assert_eq!(
            libc::flock(l1.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            0
        );
        assert_eq!(
            libc::flock(l2.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            -1
        );
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EWOULDBLOCK)
        );
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_RDLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_len = 10;
        assert_eq!(libc::fcntl(l1.as_raw_fd(), libc::F_OFD_SETLK, &fl), 0);
        fl.l_type = libc::F_WRLCK as i16;
        assert_eq!(libc::fcntl(l2.as_raw_fd(), libc::F_OFD_SETLK, &fl), -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EAGAIN)
        );
    }
    drop((l1, l2));
    let stats = pc.cut().unwrap();
    println!("cut: {stats:?}");

    let pc = env.mount();
    assert_eq!(fs::read(m.join("packs/ab/p1")).unwrap(), pack);
    assert!(m.join("tmp").is_dir() && !m.join("tmp/p1.tmp").exists());
    assert_eq!(fs::read(m.join("d2/v")).unwrap(), b"", "never synced");
    assert_eq!(fs::read(m.join("b")).unwrap(), b"", "never synced");
    assert!(!m.join("a").exists() && !m.join("c").exists());
    pc.cut().unwrap();
}

#[test]
fn sqlite_wal_survives_a_cut_up_to_the_last_wal_fsync() {
    use rusqlite::Connection;
    let env = Env::new();
    let pc = env.mount();
    let db = env.mnt.join("db.sqlite");
    let wal = env.mnt.join("db.sqlite-wal");
    let conn = Connection::open(&db).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch(
        "PRAGMA synchronous=NORMAL;
         PRAGMA mmap_size=268435456;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);",
    )
    .unwrap();
    let mmap: i64 = conn
        .query_row("PRAGMA mmap_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mmap, 268435456);
    let mapped = |suffix: &str| {
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        maps.contains(&format!("{}{suffix}\n", db.display()))
    };
    // The wal-index is a shared writable mapping of the -shm file.
    assert!(mapped("-shm"), "-shm mapped");
    // The database file itself (its header says WAL) must be on disk.
    File::open(&db).unwrap().sync_all().unwrap();
    File::open(&wal).unwrap().sync_all().unwrap();

    let mut next_id = 1i64;
    let mut synced = 0i64;
    let mut insert = |conn: &Connection, rows: i64| {
        conn.execute_batch("BEGIN").unwrap();
        for _ in 0..rows {
            conn.execute(
                "INSERT INTO t(id, v) VALUES (?1, randomblob(300))",
                [next_id],
            )
            .unwrap();
            next_id += 1;
        }
        conn.execute_batch("COMMIT").unwrap();
        next_id - 1
    };
    for round in 0..9 {
        let last = insert(&conn, 40);
        if round % 3 == 2 {
            File::open(&wal).unwrap().sync_all().unwrap();
            synced = last;
        }
        if round == 4 {
            // A checkpoint copies the WAL into the database file and syncs
            // it (SQLite's own fsyncs); later reads of those pages go
            // through the mapping of the database file.
            let busy: i64 = conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .unwrap();
            assert_eq!(busy, 0);
            synced = last;
            conn.query_row("SELECT sum(length(v)) FROM t", [], |r| r.get::<_, i64>(0))
                .unwrap();
            assert!(mapped(""), "database file mapped");
        }
        // Reads go through the mapped database and the WAL.
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, last);
    }
    // Committed, not followed by a WAL fsync.
    let committed = insert(&conn, 40);
    assert!(committed > synced);
    // No close: closing would checkpoint the WAL into the database file.
    std::mem::forget(conn);
    let stats = pc.cut().unwrap();
    println!("sqlite cut: {stats:?}");

    let pc = env.mount();
    {
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch("PRAGMA mmap_size=268435456").unwrap();
        let ok: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        let prefix: i64 = conn
            .query_row("SELECT count(*) FROM t WHERE id <= ?1", [synced], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(
            prefix, synced,
            "every row committed before the last WAL fsync"
        );
        assert!(n >= synced);
        println!(
            "sqlite: {committed} rows committed, {synced} before the last WAL fsync, {n} after the cut ({} unsynced commits lost)",
            committed - n
        );
    }
    pc.unmount().unwrap();
}

/// The binary, killed: stderr is drained in a thread once it is serving.
struct Daemon {
    child: Child,
    mnt: PathBuf,
}

impl Daemon {
    fn start(backing: &Path, mnt: &Path) -> Daemon {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-powercut"))
            .arg(backing)
            .arg(mnt)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let line = lines.next().expect("daemon exited before serving").unwrap();
            if line == format!("cairn-powercut: serving {}", mnt.display()) {
                break;
            }
            eprintln!("daemon: {line}");
            assert!(Instant::now() < deadline, "daemon not serving");
        }
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                eprintln!("daemon: {l}");
            }
        });
        Daemon {
            child,
            mnt: mnt.to_path_buf(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        lazy_unmount(&self.mnt);
    }
}

#[test]
fn binary_sigkill_is_a_power_cut() {
    let env = Env::new();
    let help = Command::new(env!("CARGO_BIN_EXE_cairn-powercut"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("fsync"));

    let mut d = Daemon::start(&env.backing, &env.mnt);
    let p = env.mnt.join("k");
    let mut f = File::create(&p).unwrap();
    f.write_all(b"synced").unwrap();
    f.sync_data().unwrap();
    f.write_all(b" lost").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"synced lost");
    d.child.kill().unwrap(); // SIGKILL
    d.child.wait().unwrap();
    assert!(f.write_all(b"!").is_err() || f.sync_all().is_err());
    drop(f);
    // The dead mount answers ENOTCONN until it is unmounted (a stat could
    // still be served from the kernel's attribute cache).
    let dead = fs::read_dir(&env.mnt).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN), "{dead}");
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(&env.mnt)
        .status()
        .expect("fusermount3 (apt-get install fuse3)");
    assert!(st.success());
    assert!(!mounted(&env.mnt));
    drop(d);

    let mut d = Daemon::start(&env.backing, &env.mnt);
    assert_eq!(fs::read(&p).unwrap(), b"synced");
    fs::write(env.mnt.join("late"), b"unsynced").unwrap();
    // SIGTERM: a clean unmount that persists nothing more.
    // SAFETY: plain kill(2) of our child.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) }, 0);
    assert!(d.child.wait().unwrap().success());
    assert!(!mounted(&env.mnt));
    assert_eq!(fs::read(env.backing.join("late")).unwrap(), b"");
    assert_eq!(fs::read(env.backing.join("k")).unwrap(), b"synced");
}

#[test]
fn concurrent_journals_keep_their_synced_prefix() {
    // Journal-segment style: several threads append, fdatasync now and
    // then, and delete some segments, while the others are read.
    let env = Env::new();
    let pc = env.mount();
    let dir = env.mnt.join("journal");
    fs::create_dir(&dir).unwrap();
    let synced: Vec<(PathBuf, Vec<u8>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u8)
            .map(|t| {
                let dir = dir.clone();
                s.spawn(move || {
                    let mut kept = Vec::new();
                    for seg in 0..3 {
                        let p = dir.join(format!("seg-{t}-{seg}"));
                        let mut f = OpenOptions::new()
                            .create_new(true)
                            .append(true)
                            .open(&p)
                            .unwrap();
                        let mut all = Vec::new();
                        let mut durable = Vec::new();
                        for rec in 0..220usize {
                            let r =
                                pattern(100 + (rec * 37 + usize::from(t)) % 3000, t ^ rec as u8);
                            f.write_all(&r).unwrap();
                            all.extend_from_slice(&r);
                            if rec % 50 == 49 {
                                f.sync_data().unwrap();
                                durable = all.clone();
                            }
                        }
                        assert_eq!(fs::read(&p).unwrap(), all);
                        if seg == 1 {
                            fs::remove_file(&p).unwrap();
                        } else {
                            kept.push((p, durable));
                        }
                    }
                    kept
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let stats = pc.cut().unwrap();
    println!("journal cut: {stats:?}");
    assert_eq!(stats.fsyncs, 4 * 3 * 4);
    assert!(stats.bytes_dropped_at_cut > 0);
    let pc = env.mount();
    for (p, durable) in &synced {
        assert_eq!(&fs::read(p).unwrap(), durable, "{}", p.display());
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 8);
    pc.cut().unwrap();
}
