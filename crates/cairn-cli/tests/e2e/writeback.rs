//! The kernel's writeback cache (on by default): bytes a process has
//! written but not closed or fsync'd live in the kernel, not in the daemon.
//! Everything that changes or copies a file behind the kernel's back
//! (rpwrite, clone, snapshots, archives) must see them, the kernel must
//! learn the sizes those operations make, and unmounting must not drop
//! them. `--no-writeback-cache` sends every write(2) to the daemon at once.

use crate::common::*;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

fn cairn_with_stdin(args: &[&OsStr], stdin: &[u8]) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning cairn");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let o = child.wait_with_output().unwrap();
    Out {
        what: format!("cairn {args:?} < {} bytes", stdin.len()),
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn read_all(f: &mut fs::File) -> Vec<u8> {
    let mut v = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

#[test]
fn edits_see_bytes_the_kernel_still_holds_and_the_kernel_sees_their_sizes() {
    let _serial = serial();
    let env = Env::new("wb-edit");
    let m = env.mount();
    let p = m.join("f");
    let mut model = gen(71, 300_000);
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    // Written and left open: without the push, the daemon would edit a
    // shorter (here: empty) file.
    f.write_all(&model).unwrap();

    // Insert 3 bytes at 5 (a new process, like any user of `cairn insert`).
    let out = cairn_with_stdin(&[OsStr::new("insert"), p.as_os_str(), OsStr::new("5")], b"XYZ");
    assert!(out.ok(), "{out}");
    model.splice(5..5, b"XYZ".iter().copied());
    assert_eq!(f.metadata().unwrap().len(), model.len() as u64, "fstat size after an insert into cached bytes");
    assert_eq!(fs::metadata(&p).unwrap().len(), model.len() as u64, "stat size after an insert");
    assert!(read_all(&mut f) == model, "content after an insert into bytes the kernel held");

    // More cached writes, then a delete that shrinks the file: the kernel
    // must not keep serving the old tail from its pages or its size.
    f.seek(SeekFrom::Start(1000)).unwrap();
    f.write_all(b"cached-again").unwrap();
    model[1000..1012].copy_from_slice(b"cached-again");
    let out = cairn([OsStr::new("delete"), p.as_os_str(), OsStr::new("990"), OsStr::new("100000")]);
    assert!(out.ok(), "{out}");
    model.drain(990..100_990);
    assert_eq!(f.metadata().unwrap().len(), model.len() as u64, "fstat size after a delete");
    assert!(read_all(&mut f) == model, "content after a delete");

    // The descriptor keeps working: an append lands at the new end.
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"tail").unwrap();
    model.extend_from_slice(b"tail");
    drop(f);
    assert!(fs::read(&p).unwrap() == model);
    m.umount();
    let m = env.mount();
    assert!(fs::read(m.join("f")).unwrap() == model, "content after a remount");
    m.umount();
    env.assert_fsck_clean(|_| false);
}

/// A process that keeps one file open and appends to it on command, and
/// never runs another program: closing a descriptor (which an exec does
/// for close-on-exec ones) would push the kernel's cached bytes itself.
struct Writer {
    child: std::process::Child,
    to: std::process::ChildStdin,
    from: std::io::BufReader<std::process::ChildStdout>,
}

impl Writer {
    const SCRIPT: &'static str = r#"
import sys
f = open(sys.argv[1], "wb", buffering=0)
for line in sys.stdin:
    n, byte = line.split()
    f.write(bytes([int(byte)]) * int(n))
    print("ok", flush=True)
"#;

    fn open(path: &std::path::Path) -> Writer {
        let mut child = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(Self::SCRIPT)
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let to = child.stdin.take().unwrap();
        let from = std::io::BufReader::new(child.stdout.take().unwrap());
        Writer { child, to, from }
    }

    /// Appends `n` copies of `byte`; returns once write(2) returned.
    fn append(&mut self, n: usize, byte: u8) {
        use std::io::BufRead;
        writeln!(self.to, "{n} {byte}").unwrap();
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok", "the writer failed");
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bytes_of(runs: &[(usize, u8)]) -> Vec<u8> {
    runs.iter().flat_map(|&(n, b)| std::iter::repeat_n(b, n)).collect()
}

#[test]
fn clone_snapshot_and_archive_see_bytes_the_kernel_still_holds() {
    let _serial = serial();
    let env = Env::new("wb-copy");
    let m = env.mount();
    let mut w = Writer::open(&m.join("src"));
    let mut runs = vec![(20_000, b'a')];
    w.append(20_000, b'a'); // small: stays in the kernel until pushed

    let out = cairn([OsStr::new("clone"), m.join("src").as_os_str(), m.join("dst").as_os_str()]);
    assert!(out.ok(), "{out}");
    assert!(fs::read(m.join("dst")).unwrap() == bytes_of(&runs), "the clone lacks bytes the kernel held");

    w.append(300, b'b');
    runs.push((300, b'b'));
    let out = cairn([OsStr::new("snapshot"), OsStr::new("create"), OsStr::new("s1"), OsStr::new("-m"), m.path().as_os_str()]);
    assert!(out.ok(), "{out}");
    let snap = m.join(&format!("{}/s1/src", cairn_engine::SNAPSHOT_DIR));
    assert!(fs::read(&snap).unwrap() == bytes_of(&runs), "the snapshot lacks bytes the kernel held");

    w.append(7, b'c');
    runs.push((7, b'c'));
    let out = cairn([OsStr::new("archive"), OsStr::new("create"), m.join("a.tar").as_os_str(), m.join("src").as_os_str()]);
    assert!(out.ok(), "{out}");
    drop(w);
    let out = run(Command::new("tar").arg("-xOf").arg(m.join("a.tar")));
    assert!(out.ok(), "{out}");
    assert!(out.stdout.as_bytes() == bytes_of(&runs), "the archived file lacks bytes the kernel held ({} bytes)", out.stdout.len());
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn mapped_writes_survive_a_plain_umount() {
    let _serial = serial();
    let env = Env::new("wb-mmap");
    let m = env.mount();
    let p = m.join("mapped");
    let len = 1 << 20;
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    f.set_len(len as u64).unwrap();
    // SAFETY: a shared writable mapping of a file we own, unmapped below.
    unsafe {
        let a = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(a, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let s = std::slice::from_raw_parts_mut(a.cast::<u8>(), len);
        s[..5].copy_from_slice(b"first");
        s[len - 4..].copy_from_slice(b"last");
        assert_eq!(libc::munmap(a, len), 0);
    }
    drop(f);
    // umount(8), not `cairn umount`: what a system's shutdown does.
    let out = run(Command::new("umount").arg(m.path()));
    assert!(out.ok(), "{out}");
    if let Some(pid) = m.pid {
        assert!(wait_dead(pid, std::time::Duration::from_secs(60)), "daemon still running after umount");
    }
    drop(m); // nothing left to unmount
    let m = env.mount();
    let got = fs::read(m.join("mapped")).unwrap();
    assert_eq!(&got[..5], b"first");
    assert_eq!(&got[len - 4..], b"last");
    m.umount();
}

#[test]
fn without_the_writeback_cache_an_unclosed_write_survives_kill_9() {
    let _serial = serial();
    let env = Env::new("wb-off");
    let mut m = env.mount_with(&["--no-writeback-cache"]);
    assert!(env.log().contains("writeback_cache=false"), "the daemon did not turn the cache off:\n{}", env.log());
    let mut f = fs::File::create(m.join("f")).unwrap();
    // The name is made durable (an unsynced create may die with the daemon:
    // group commit); the bytes are not.
    fs::File::open(m.path()).unwrap().sync_all().unwrap();
    f.write_all(b"journaled at write(2)").unwrap();
    // Neither closed nor fsync'd: only the daemon's journal has it.
    m.kill9();
    drop(f);
    m.detach();
    let m = env.mount();
    assert_eq!(fs::read(m.join("f")).unwrap(), b"journaled at write(2)");
    let ino = fs::metadata(m.join("f")).unwrap().ino();
    assert!(ino > 1);
    m.umount();
}
