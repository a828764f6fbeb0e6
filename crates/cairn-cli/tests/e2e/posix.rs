//! 6. POSIX surface spot checks through the mount.

use crate::common::*;
use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn renameat2(a: &Path, b: &Path, flags: libc::c_uint) -> Result<(), i32> {
    let (ca, cb) = (cpath(a), cpath(b));
    // SAFETY: valid path strings.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

#[test]
fn rename_noreplace_and_exchange() {
    let _serial = serial();
    let env = Env::new("rename2");
    let m = env.mount();
    let p = |r: &str| m.join(r);
    fs::write(p("a"), b"A").unwrap();
    fs::write(p("b"), b"B").unwrap();

    // RENAME_NOREPLACE onto an existing name: EEXIST, nothing changes.
    assert_eq!(renameat2(&p("a"), &p("b"), libc::RENAME_NOREPLACE).map_err(errno_name), Err("EEXIST".into()));
    assert_eq!((fs::read(p("a")).unwrap(), fs::read(p("b")).unwrap()), (b"A".to_vec(), b"B".to_vec()));
    // ... onto a free name: a plain rename.
    renameat2(&p("a"), &p("c"), libc::RENAME_NOREPLACE)
        .map_err(errno_name)
        .expect("NOREPLACE to a free name");
    assert!(!p("a").exists());
    assert_eq!(fs::read(p("c")).unwrap(), b"A");

    // RENAME_EXCHANGE of two files.
    let (ino_b, ino_c) = (fs::metadata(p("b")).unwrap().ino(), fs::metadata(p("c")).unwrap().ino());
    renameat2(&p("b"), &p("c"), libc::RENAME_EXCHANGE)
        .map_err(errno_name)
        .expect("EXCHANGE two files");
    assert_eq!((fs::read(p("b")).unwrap(), fs::read(p("c")).unwrap()), (b"A".to_vec(), b"B".to_vec()));
    assert_eq!((fs::metadata(p("b")).unwrap().ino(), fs::metadata(p("c")).unwrap().ino()), (ino_c, ino_b));
    // ... with a missing name: ENOENT; both flags: EINVAL.
    assert_eq!(
        renameat2(&p("b"), &p("missing"), libc::RENAME_EXCHANGE).map_err(errno_name),
        Err("ENOENT".into())
    );
    assert_eq!(
        renameat2(&p("b"), &p("c"), libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE).map_err(errno_name),
        Err("EINVAL".into())
    );

    // RENAME_EXCHANGE of a directory and a file in different directories:
    // link counts and ".." follow.
    fs::create_dir_all(p("x/sub")).unwrap();
    fs::write(p("x/sub/inner"), b"inner").unwrap();
    fs::create_dir(p("y")).unwrap();
    fs::write(p("y/file"), b"file").unwrap();
    let (nx, ny) = (fs::metadata(p("x")).unwrap().nlink(), fs::metadata(p("y")).unwrap().nlink());
    assert_eq!((nx, ny), (3, 2));
    renameat2(&p("x/sub"), &p("y/file"), libc::RENAME_EXCHANGE)
        .map_err(errno_name)
        .expect("EXCHANGE a dir and a file");
    assert_eq!(fs::read(p("x/sub")).unwrap(), b"file");
    assert_eq!(fs::read(p("y/file/inner")).unwrap(), b"inner");
    assert_eq!(
        fs::metadata(p("y/file/..")).unwrap().ino(),
        fs::metadata(p("y")).unwrap().ino(),
        "'..' of the moved directory"
    );
    assert_eq!(
        (fs::metadata(p("x")).unwrap().nlink(), fs::metadata(p("y")).unwrap().nlink()),
        (2, 3),
        "nlink of x, y after the exchange"
    );
    m.umount();

    // It all persisted, and the namespace invariants hold.
    let m = env.mount();
    let p = |r: &str| m.join(r);
    assert_eq!((fs::read(p("b")).unwrap(), fs::read(p("c")).unwrap()), (b"A".to_vec(), b"B".to_vec()));
    assert_eq!(fs::read(p("x/sub")).unwrap(), b"file");
    assert_eq!(fs::read(p("y/file/inner")).unwrap(), b"inner");
    assert_eq!((fs::metadata(p("x")).unwrap().nlink(), fs::metadata(p("y")).unwrap().nlink()), (2, 3));
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn unlinked_open_file_stays_readable_until_close() {
    let _serial = serial();
    let env = Env::new("unlink-open");
    let m = env.mount();
    let path = m.join("doomed");
    write_random_file(&path, 31, 3 * MIB);
    let mut f = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    fs::remove_file(&path).unwrap();
    assert_eq!(err_of(fs::metadata(&path), "stat after unlink"), libc::ENOENT);
    assert!(fs::read_dir(m.path()).unwrap().next().is_none(), "unlinked name still listed");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    // Readable and writable through the descriptor.
    let mut all = Vec::new();
    f.read_to_end(&mut all).unwrap();
    assert!(all == gen(31, 3 * MIB as usize), "content of the unlinked file");
    f.write_all_at(b"still here", MIB).unwrap();
    f.sync_all().unwrap();
    assert_eq!(pread_exact(&f, MIB, 10), b"still here");
    assert_eq!(f.metadata().unwrap().len(), 3 * MIB);
    // Same once the daemon may have flushed it (give the flusher its 5 s age).
    std::thread::sleep(Duration::from_secs(6));
    let mut all = vec![0u8; 3 * MIB as usize];
    f.read_exact_at(&mut all, 0).unwrap();
    assert_eq!(&all[MIB as usize..MIB as usize + 10], b"still here");
    assert_eq!(all[..MIB as usize], gen(31, 3 * MIB as usize)[..MIB as usize]);
    drop(f);
    m.umount();

    // Gone for good: no inode, no data left referenced.
    let s = env.stats();
    assert_eq!(s["files"], 0, "stats after the last close of an unlinked file: {s}");
    assert_eq!(s["data_bytes"], 0, "stats after the last close of an unlinked file: {s}");
    env.assert_fsck_clean(|_| false);
}

/// A file whose last name goes while the kernel still holds its inode (an
/// `O_PATH` descriptor: no open handle reaches the daemon) lives until the
/// kernel forgets it: its attributes stay readable (nlink 0), the kernel's
/// write-back of its times succeeds (a `syncfs` used to fail with ENOENT),
/// and the FORGET frees it while the volume is still mounted.
#[test]
fn a_file_unlinked_while_the_kernel_holds_it_is_freed_at_its_forget() {
    let _serial = serial();
    let env = Env::new("forget");
    let m = env.mount();
    let path = m.join("held");
    write_random_file(&path, 7, MIB);
    let held = fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(&path).unwrap();
    // The kernel owns the file's times (writeback cache): it sends them at eviction.
    fs::write(m.join("other"), b"x").unwrap();
    fs::remove_file(&path).unwrap();
    // Past the attribute TTL, so fstat asks the daemon.
    std::thread::sleep(Duration::from_millis(1500));
    let meta = fs::File::from(held.try_clone().unwrap()).metadata();
    let meta = meta.unwrap_or_else(|e| panic!("fstat of a held, unlinked file: {e}"));
    assert_eq!((meta.nlink(), meta.len()), (0, MIB));
    assert_eq!(env.stats()["files"], 2, "the held file is still there, beside `other`");
    let dir = fs::File::open(m.path()).unwrap();
    // SAFETY: syncfs on a descriptor owned by `dir`.
    assert_eq!(unsafe { libc::syncfs(dir.as_raw_fd()) }, 0, "syncfs: {}", errno_name(errno()));
    drop(dir);
    drop(held);
    let t = Instant::now();
    while env.stats()["files"] != 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "the forgotten file was not freed while mounted: {}", env.stats());
        // Eviction of unused dentries (what an idle kernel does by itself, later).
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    m.umount();
    let s = env.stats();
    assert_eq!((s["files"].as_u64(), s["data_bytes"].as_u64()), (Some(1), Some(1)), "after unmount: {s}");
    env.assert_fsck_clean(|_| false);
}

const APPENDER: &str = r#"
import os, sys
path, tag, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
sys.stdin.readline()
for i in range(n):
    line = ("%s %06d " % (tag, i)).encode()
    line += b"." * (99 - len(line)) + b"\n"
    assert os.write(fd, line) == 100
os.close(fd)
"#;

#[test]
fn o_append_from_two_processes() {
    let _serial = serial();
    let env = Env::new("append");
    let m = env.mount();
    let path = m.join("log");
    fs::write(&path, b"").unwrap();
    const N: usize = 4000;
    let spawn = |tag: &str| {
        Command::new("/usr/bin/python3")
            .args(["-I", "-c", APPENDER, "--"])
            .arg(&path)
            .args([tag, &N.to_string()])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut kids = [spawn("P"), spawn("Q")];
    std::thread::sleep(Duration::from_millis(300));
    for k in kids.iter_mut() {
        k.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    for k in kids.iter_mut() {
        assert!(k.wait().unwrap().success());
    }
    let check = |data: &[u8]| {
        assert_eq!(data.len(), 2 * N * 100, "appended bytes: writes were lost or overlapped");
        let mut next = [0usize; 2];
        let mut switches = 0;
        let mut last = b'?';
        for (i, line) in data.chunks(100).enumerate() {
            let tag = line[0];
            let k = match tag {
                b'P' => 0,
                b'Q' => 1,
                _ => panic!("garbage line {i}: {:?}", String::from_utf8_lossy(line)),
            };
            let want = format!("{} {:06} ", tag as char, next[k]);
            assert!(
                line.starts_with(want.as_bytes()) && line[99] == b'\n',
                "line {i} is {:?}, expected {want:?}...",
                String::from_utf8_lossy(line)
            );
            next[k] += 1;
            switches += usize::from(last != tag);
            last = tag;
        }
        switches
    };
    let switches = check(&fs::read(&path).unwrap());
    eprintln!("append: the two writers interleaved {switches} times");
    m.umount();
    let m = env.mount();
    check(&fs::read(m.join("log")).unwrap());
    m.umount();
}

#[test]
fn truncate_up_and_down() {
    let _serial = serial();
    let env = Env::new("truncate");
    let m = env.mount();
    let mut want = gen(41, (MIB + 17) as usize);
    // Dirty data (not flushed yet): down, up, write past the old end.
    let path = m.join("t");
    fs::write(&path, &want).unwrap();
    let f = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    f.set_len(100_000).unwrap();
    want.truncate(100_000);
    assert_eq!(fs::read(&path).unwrap(), want, "after truncate down");
    f.set_len(3 * MIB).unwrap();
    want.resize(3 * MIB as usize, 0);
    assert_eq!(fs::read(&path).unwrap(), want, "after truncate up (zeros)");
    f.write_all_at(b"0123456789", 2 * MIB).unwrap();
    want[2 * MIB as usize..2 * MIB as usize + 10].copy_from_slice(b"0123456789");
    f.set_len(2 * MIB + 5).unwrap();
    want.truncate(2 * MIB as usize + 5);
    assert_eq!(fs::read(&path).unwrap(), want, "after write + truncate into it");
    drop(f);
    // A committed file (written, unmounted): down into a chunk, then up.
    let mut want2 = gen(42, 5 * MIB as usize);
    fs::write(m.join("c"), &want2).unwrap();
    m.umount();
    let m = env.mount();
    let f = fs::OpenOptions::new().write(true).open(m.join("c")).unwrap();
    f.set_len(1_234_567).unwrap();
    f.set_len(4 * MIB).unwrap();
    want2.truncate(1_234_567);
    want2.resize(4 * MIB as usize, 0);
    drop(f);
    assert_eq!(fs::read(m.join("c")).unwrap(), want2, "committed file after truncate down + up");
    assert_eq!(fs::read(m.join("t")).unwrap(), want, "first file after remount");
    // O_TRUNC.
    fs::write(m.join("c2"), b"will be truncated").unwrap();
    fs::OpenOptions::new().write(true).truncate(true).open(m.join("c2")).unwrap();
    m.umount();
    let m = env.mount();
    assert_eq!(fs::read(m.join("t")).unwrap(), want, "first file after second remount");
    assert_eq!(fs::read(m.join("c")).unwrap(), want2, "second file after second remount");
    assert_eq!(fs::metadata(m.join("c2")).unwrap().len(), 0);
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn mmap_shared_write_and_read() {
    let _serial = serial();
    let env = Env::new("mmap");
    let m = env.mount();
    let len = 4 * MIB as usize;
    let mut want = gen(51, len);
    fs::write(m.join("map"), &want).unwrap();
    m.umount();

    let m = env.mount();
    let f = fs::OpenOptions::new().read(true).write(true).open(m.join("map")).unwrap();
    // SAFETY: a fresh shared mapping of a file we hold open; unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    // SAFETY: the mapping is `len` bytes long and only used in this scope.
    let map = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) };
    assert!(map[..] == want[..], "mmap read differs from the file");
    for (k, off) in [0usize, 4095, 4096, MIB as usize + 3, len - 1].into_iter().enumerate() {
        map[off] = !map[off];
        want[off] = !want[off];
        let stamp = format!("mmap-{k}");
        let o = (off / 2).min(len - 16);
        map[o..o + stamp.len()].copy_from_slice(stamp.as_bytes());
        want[o..o + stamp.len()].copy_from_slice(stamp.as_bytes());
    }
    // SAFETY: the mapping above.
    assert_eq!(unsafe { libc::msync(ptr, len, libc::MS_SYNC) }, 0, "msync: {}", std::io::Error::last_os_error());
    // SAFETY: unmapping the mapping above; `map` is not used after.
    assert_eq!(unsafe { libc::munmap(ptr, len) }, 0);
    drop(f);
    assert!(fs::read(m.join("map")).unwrap() == want, "read(2) after msync does not see the mmap writes");
    m.umount();

    let m = env.mount();
    assert!(fs::read(m.join("map")).unwrap() == want, "mmap writes lost after remount");
    m.umount();
}

const LOCKER: &str = r#"
import fcntl, os, sys
fd = os.open(sys.argv[2], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
fd2 = os.open(sys.argv[3], os.O_RDWR)
fcntl.lockf(fd2, fcntl.LOCK_EX, 100, 0)
print("locked", flush=True)
sys.stdin.read()
"#;

#[test]
fn flock_contention_between_processes() {
    let _serial = serial();
    let env = Env::new("flock");
    let m = env.mount();
    let (a, b) = (m.join("lock-a"), m.join("lock-b"));
    fs::write(&a, b"a").unwrap();
    fs::write(&b, b"b").unwrap();
    let mut holder = Command::new("/usr/bin/python3")
        .args(["-I", "-c", LOCKER, "--"])
        .arg(&a)
        .arg(&b)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");

    let fa = fs::OpenOptions::new().read(true).write(true).open(&a).unwrap();
    // SAFETY: flock on an fd we own.
    let rc = unsafe { libc::flock(fa.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(
        (rc, errno_name(errno())),
        (-1, "EAGAIN".to_string()),
        "flock(LOCK_EX|LOCK_NB) while another process holds it"
    );
    // SAFETY: as above.
    let rc = unsafe { libc::flock(fa.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    assert_eq!(
        (rc, errno_name(errno())),
        (-1, "EAGAIN".to_string()),
        "flock(LOCK_SH|LOCK_NB) while another process holds LOCK_EX"
    );
    // fcntl record locks conflict too.
    let fb = fs::OpenOptions::new().read(true).write(true).open(&b).unwrap();
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 50;
    fl.l_len = 10;
    // SAFETY: F_SETLK with a valid struct flock.
    let rc = unsafe { libc::fcntl(fb.as_raw_fd(), libc::F_SETLK, &fl) };
    let e = errno();
    assert!(
        rc == -1 && (e == libc::EAGAIN || e == libc::EACCES),
        "F_SETLK on a locked range: rc {rc} {}",
        errno_name(e)
    );

    // A blocking flock waits for the holder to go.
    let fd = fa.as_raw_fd();
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        // SAFETY: blocking flock on an fd that outlives the thread (joined below).
        let rc = unsafe { libc::flock(fd, libc::LOCK_EX) };
        (rc, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "blocking flock returned while the other process holds the lock");
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let (rc, waited) = waiter.join().unwrap();
    assert_eq!(rc, 0, "blocking flock after the holder exited");
    assert!(waited >= Duration::from_millis(400), "blocking flock waited only {waited:?}");
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::fcntl(fb.as_raw_fd(), libc::F_SETLK, &fl) },
        0,
        "F_SETLK once free: {}",
        errno_name(errno())
    );
    drop((fa, fb));
    m.umount();
}

#[test]
fn fsync_fdatasync_and_statfs() {
    let _serial = serial();
    let env = Env::new("fsync");
    let m = env.mount();
    let mut f = fs::File::create(m.join("f")).unwrap();
    f.write_all(&gen(61, 300_000)).unwrap();
    f.sync_all().expect("fsync");
    f.write_all(b"more").unwrap();
    f.sync_data().expect("fdatasync");
    drop(f);
    let r = fs::File::open(m.join("f")).unwrap();
    r.sync_all().expect("fsync of a read-only descriptor");
    fs::create_dir(m.join("d")).unwrap();
    let d = fs::File::open(m.join("d")).unwrap();
    d.sync_all().expect("fsync of a directory");
    d.sync_data().expect("fdatasync of a directory");
    drop((r, d));

    // statfs
    let c = cpath(m.path());
    // SAFETY: zeroed plain struct filled by statvfs.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and struct.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0, "statvfs: {}", std::io::Error::last_os_error());
    assert!(sv.f_bsize > 0 && sv.f_frsize > 0, "block size {} / {}", sv.f_bsize, sv.f_frsize);
    assert!(sv.f_namemax >= 255, "name max {}", sv.f_namemax);
    assert!(
        sv.f_blocks > 0 && sv.f_bavail <= sv.f_blocks && sv.f_bfree <= sv.f_blocks,
        "blocks {} free {} avail {}",
        sv.f_blocks,
        sv.f_bfree,
        sv.f_bavail
    );
    let out = run(Command::new("df").arg("-P").arg(m.path()));
    assert!(out.ok(), "{out}");
    let last = out.stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with(fs::canonicalize(&env.vol).unwrap().to_str().unwrap()) && last.ends_with(m.path().to_str().unwrap()),
        "df line: {last:?}\n{out}"
    );
    m.umount();
    let m = env.mount();
    let mut want = gen(61, 300_000);
    want.extend_from_slice(b"more");
    assert!(fs::read(m.join("f")).unwrap() == want);
    m.umount();
}

#[test]
fn sparse_file_beyond_4gib() {
    let _serial = serial();
    let env = Env::new("bigsparse");
    let m = env.mount();
    let path = m.join("huge");
    let data = gen(71, MIB as usize);
    let check = |path: &Path| {
        let f = fs::File::open(path).unwrap();
        let md = f.metadata().unwrap();
        assert_eq!(md.len(), 5 * GIB + MIB);
        assert!(
            md.blocks() * 512 < 16 * MIB,
            "{} bytes of blocks for 1 MiB + 4 bytes of data",
            md.blocks() * 512
        );
        assert!(pread_exact(&f, 5 * GIB, MIB as usize) == data, "data at 5 GiB");
        assert!(pread_exact(&f, 4 * GIB + 123, 65536).iter().all(|b| *b == 0), "hole at 4 GiB");
        assert!(pread_exact(&f, GIB, 65536).iter().all(|b| *b == 0), "hole at 1 GiB");
        let edge = pread_exact(&f, 5 * GIB - 10, 20);
        assert_eq!(&edge[..10], &[0; 10]);
        assert_eq!(&edge[10..], &data[..10]);
        assert_eq!(pread_exact(&f, 4 * GIB - 2, 4), b"4GiB", "bytes across the 4 GiB boundary");
        let mut tail = Vec::new();
        let mut g = fs::File::open(path).unwrap();
        g.seek(SeekFrom::Start(5 * GIB + MIB - 100)).unwrap();
        g.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, data[MIB as usize - 100..]);
    };
    let f = fs::OpenOptions::new().create(true).write(true).truncate(true).open(&path).unwrap();
    f.write_all_at(&data, 5 * GIB).unwrap();
    f.write_all_at(b"4GiB", 4 * GIB - 2).unwrap();
    f.sync_all().unwrap();
    drop(f);
    check(&path);
    m.umount();
    let m = env.mount();
    check(&m.join("huge"));
    m.umount();
    env.assert_fsck_clean(|_| false);
}

/// The largest file is the kernel's (2^63 - 1 bytes, its `s_maxbytes`
/// for FUSE, which a daemon cannot lower). A write the kernel takes into its
/// page cache (with the writeback cache) must be one the daemon stores:
/// written at 2^63 - 2 and fsync'd, it is there after the daemon is killed
/// and the volume remounted, byte for byte, with and without the writeback
/// cache; a write past it fails at the write.
#[test]
fn largest_file_size_is_the_kernels() {
    let _serial = serial();
    const MAX: u64 = i64::MAX as u64;
    for extra in [&[][..], &["--no-writeback-cache"][..]] {
        let env = Env::new("maxsize");
        let m = env.mount_with(extra);
        let path = m.join("edge");
        let f = fs::OpenOptions::new().create(true).read(true).write(true).open(&path).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        // As on tmpfs (whose largest file is the same): a write whose end
        // does not fit in an off_t is the kernel's EINVAL, the last byte
        // is written, and fallocate past it is EFBIG.
        assert_eq!(err_of(f.write_at(b"xy", MAX - 1), "pwrite across 2^63 - 1"), libc::EINVAL, "{extra:?}");
        assert_eq!(f.write_at(b"x", MAX - 1).unwrap(), 1, "{extra:?}: pwrite at 2^63 - 2");
        assert_eq!(err_of(f.write_at(b"a", MAX), "pwrite at 2^63 - 1"), libc::EINVAL, "{extra:?}");
        // SAFETY: fallocate on an open descriptor.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, (MAX - 10) as i64, 100) };
        assert_eq!((r, errno()), (-1, libc::EFBIG), "{extra:?}: fallocate past the largest size");
        f.sync_all().unwrap_or_else(|e| panic!("{extra:?}: fsync after a write the kernel took: {e}"));
        assert_eq!(f.metadata().unwrap().len(), MAX);
        // What fsync acknowledged survives the daemon's death.
        let mut m = m;
        m.kill9();
        drop(f);
        m.detach();
        let m = env.mount_with(extra);
        let f = fs::File::open(m.join("edge")).unwrap();
        let md = f.metadata().unwrap();
        assert_eq!(md.len(), MAX, "{extra:?}: size after a crash and a remount");
        assert!(md.blocks() * 512 < MIB, "{extra:?}: {} bytes of blocks for a sparse file", md.blocks() * 512);
        assert_eq!(pread_exact(&f, 0, 4), b"head", "{extra:?}");
        let tail = pread_exact(&f, MAX - 8192, 8192);
        assert_eq!(tail[8191], b'x', "{extra:?}: the last byte after remount");
        assert!(tail[..8191].iter().all(|b| *b == 0), "{extra:?}: the hole before the last byte");
        let mut buf = [0u8; 1];
        assert_eq!((f.read_at(&mut buf, MAX - 1).unwrap(), buf[0]), (1, b'x'), "{extra:?}: a read of the last byte");
        drop(f);
        m.umount();
        env.assert_fsck_clean(|_| false);
    }
}

#[test]
fn readdir_of_5000_entries() {
    let _serial = serial();
    let env = Env::new("readdir");
    let m = env.mount();
    let dir = m.join("many");
    fs::create_dir(&dir).unwrap();
    let want: BTreeSet<String> = (0..5000).map(|i| format!("entry-{i:05}-{}", "n".repeat(i % 40))).collect();
    for name in &want {
        fs::OpenOptions::new().create_new(true).write(true).mode(0o644).open(dir.join(name)).unwrap();
    }
    let check = |dir: &Path| {
        let mut seen = BTreeSet::new();
        let mut dups = Vec::new();
        for e in fs::read_dir(dir).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            if !seen.insert(n.clone()) {
                dups.push(n);
            }
        }
        assert!(dups.is_empty(), "names returned twice: {:?}", &dups[..dups.len().min(10)]);
        let missing: Vec<_> = want.difference(&seen).take(10).collect();
        let extra: Vec<_> = seen.difference(&want).take(10).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{} names read, missing {missing:?}, extra {extra:?}",
            seen.len()
        );
        // And with a small getdents buffer through ls (which also lists . and ..).
        let out = run(Command::new("ls").arg("-f").arg("-a").arg(dir));
        assert!(out.ok(), "{out}");
        assert_eq!(out.stdout.lines().count(), 5002, "ls -fa line count");
    };
    check(&dir);
    assert_eq!(fs::metadata(&dir).unwrap().nlink(), 2);
    m.umount();
    let m = env.mount();
    check(&m.join("many"));
    m.umount();
}

/// utimensat with explicit times, before and after 1970, with nanoseconds;
/// UTIME_OMIT / UTIME_NOW; all kept across a remount.
#[test]
fn timestamps_keep_nanoseconds_before_and_after_1970() {
    let _serial = serial();
    let env = Env::new("times");
    let m = env.mount();
    // (atime, mtime) as (seconds, nanoseconds) timespecs.
    let cases: [(&str, (i64, i64), (i64, i64)); 5] = [
        ("modern", (1_700_000_000, 1), (1_234_567_890, 987_654_321)),
        ("epoch", (0, 0), (0, 999_999_999)),
        ("pre1970-whole", (-1_000_000_000, 0), (-1, 0)),
        // 1969-12-31 23:59:59.25 and 1930-11-18 ...: what `touch -d` or
        // tar/rsync of an old file sets.
        ("pre1970-frac", (-1, 250_000_000), (-1_234_567_890, 123_456_789)),
        ("pre1970-ns", (-2, 1), (-86_400, 999_999_999)),
    ];
    for (name, a, mt) in cases {
        let p = m.join(name);
        fs::write(&p, name).unwrap();
        set_times(&p, a, mt);
    }
    let check = |dir: &Path, when: &str| {
        let mut wrong = Vec::new();
        for (name, a, mt) in cases {
            let md = fs::metadata(dir.join(name)).unwrap();
            let got = ((md.atime(), md.atime_nsec()), (md.mtime(), md.mtime_nsec()));
            if got != (a, mt) {
                wrong.push(format!("{name}: set atime {a:?} mtime {mt:?}, stat gives atime {:?} mtime {:?}", got.0, got.1));
            }
        }
        assert!(wrong.is_empty(), "{when}:\n{}", wrong.join("\n"));
    };
    check(m.path(), "right after utimensat");

    // UTIME_OMIT keeps, UTIME_NOW sets the current time.
    let p = m.join("modern");
    let c = cpath(&p);
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: valid path and two timespecs.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) }, 0);
    let md = fs::metadata(&p).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!((md.atime(), md.atime_nsec()), (1_700_000_000, 1), "UTIME_OMIT changed atime");
    assert!((md.mtime() - now).abs() < 10, "UTIME_NOW set mtime {} (now {now})", md.mtime());
    set_times(&p, (1_700_000_000, 1), (1_234_567_890, 987_654_321));
    m.umount();

    let m = env.mount();
    check(m.path(), "after remount");
    m.umount();
}

/// Random overwrites, extensions and truncations of two files at once,
/// mirrored on the local disk, with flushes happening meanwhile (by size and
/// by age): the mount always reads what the model says.
#[test]
fn random_writes_and_truncates_match_a_model() {
    let _serial = serial();
    let env = Env::new("model");
    let m = env.mount();
    fs::create_dir(env.path("model")).unwrap();
    let run_ops = |k: u64, ops: usize, pause_at: usize| {
        let (mp, lp) = (env.mnt.join(format!("f{k}")), env.path(&format!("model/f{k}")));
        let a = fs::OpenOptions::new().read(true).write(true).create(true).open(&mp).unwrap();
        let b = fs::OpenOptions::new().read(true).write(true).create(true).open(&lp).unwrap();
        let mut rng = Rng::new(0x30DE1 + k);
        let mut size = a.metadata().unwrap().len();
        if size == 0 {
            let d = gen(k, 24 << 20);
            a.write_all_at(&d, 0).unwrap();
            b.write_all_at(&d, 0).unwrap();
            size = d.len() as u64;
        }
        for i in 0..ops {
            if i == pause_at {
                std::thread::sleep(Duration::from_secs(6));
            }
            match rng.below(100) {
                0..=79 => {
                    let len = [1, 7, 4096, 1 + rng.below(3 << 20), 1 + rng.below(300_000)][rng.below(5) as usize];
                    let off = rng.below(size + (1 << 20));
                    let d = gen(rng.next_u64(), len as usize);
                    a.write_all_at(&d, off).unwrap();
                    b.write_all_at(&d, off).unwrap();
                    size = size.max(off + len);
                }
                80..=84 => {
                    let ns = size / 2 + rng.below(size / 2 + (2 << 20));
                    a.set_len(ns).unwrap();
                    b.set_len(ns).unwrap();
                    size = ns;
                }
                85..=89 => a.sync_data().unwrap(),
                _ => {
                    let off = rng.below(size + 1);
                    let len = rng.below(2 << 20) as usize;
                    let (mut x, mut y) = (vec![0u8; len], vec![0u8; len]);
                    let nx = a.read_at(&mut x, off).unwrap();
                    let ny = b.read_at(&mut y, off).unwrap();
                    assert!(
                        nx == ny && x[..nx] == y[..ny],
                        "file {k}, op {i}: read of {len} at {off} differs from the model"
                    );
                }
            }
        }
        assert_eq!(a.metadata().unwrap().len(), size);
    };
    std::thread::scope(|s| {
        let t = s.spawn(|| run_ops(1, 800, 400));
        run_ops(2, 800, 400);
        t.join().unwrap();
    });
    for k in 1..=2 {
        compare_files(&env.path(&format!("model/f{k}")), &m.join(&format!("f{k}"))).unwrap();
    }
    m.umount();
    let m = env.mount();
    for k in 1..=2 {
        compare_files(&env.path(&format!("model/f{k}")), &m.join(&format!("f{k}"))).expect("after remount");
    }
    // A second round on committed files.
    std::thread::scope(|s| {
        let t = s.spawn(|| run_ops(1, 300, usize::MAX));
        run_ops(2, 300, usize::MAX);
        t.join().unwrap();
    });
    m.umount();
    let m = env.mount();
    for k in 1..=2 {
        compare_files(&env.path(&format!("model/f{k}")), &m.join(&format!("f{k}"))).expect("after the second remount");
    }
    m.umount();
    env.assert_fsck_clean(|_| false);
}
