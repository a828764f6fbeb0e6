//! A GNU-tar-made archive of ~1,000 files mounted for real and compared with
//! its source tree; the index is reused by a second mount and rebuilt when
//! the archive changes.

#[path = "../../cairn-tar/tests/common/mod.rs"]
mod common;

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_tarfs::{mount_archive, open_index, MountInfo, TarMountOptions, TarfsError};
use common::*;

/// A running mount; unmounted with `fusermount3 -u -z` if dropped early.
struct Mounted {
    mp: PathBuf,
    info: MountInfo,
    thread: Option<JoinHandle<Result<(), TarfsError>>>,
}

fn mount(archive: &Path, mp: &Path, index_dir: &Path) -> Mounted {
    let opts = TarMountOptions {
        index_dir: Some(index_dir.to_path_buf()),
        handle_signals: false,
        ..TarMountOptions::default()
    };
    let (tx, rx) = mpsc::channel();
    let (a, m) = (archive.to_path_buf(), mp.to_path_buf());
    let thread = std::thread::spawn(move || {
        mount_archive(&a, &m, &opts, |info| tx.send(info.clone()).unwrap())
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(info) => Mounted {
            mp: mp.to_path_buf(),
            info,
            thread: Some(thread),
        },
        Err(_) => panic!("mount did not come up: {:?}", thread.join()),
    }
}

impl Mounted {
    fn unmount(mut self) {
        run(Command::new("fusermount3").arg("-u").arg(&self.mp));
        let r = self.thread.take().unwrap().join().unwrap();
        r.unwrap();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mp)
                .status();
            let _ = t.join();
        }
    }
}

/// ~1,000 members: 20 directories of 50 files, symlinks, hard links, a
/// sparse file, xattrs, sub-second times, long and non-ASCII names.
fn build_source(root: &Path) {
    fs::create_dir_all(root.join("empty_dir")).unwrap();
    let mut n = 0u64;
    for d in 0..20 {
        let dir = root.join(format!("d{d:02}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..50 {
            n += 1;
            let p = dir.join(format!("f{f:03}"));
            fs::write(&p, bytes(n, ((n * 397) % 9000) as usize)).unwrap();
            if f % 10 == 3 {
                set_xattr(&p, b"user.n", n.to_string().as_bytes());
            }
            if f % 7 == 0 {
                fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .unwrap();
            }
            set_mtime(&p, 1_600_000_000_000_000_000 + n as i64 * 1_123_456_789);
        }
        if d > 0 {
            std::os::unix::fs::symlink(format!("../d{:02}/f000", d - 1), dir.join("prev")).unwrap();
        }
    }
    for i in 0..5 {
        fs::hard_link(
            root.join(format!("d00/f00{i}")),
            root.join(format!("d19/hard{i}")),
        )
        .unwrap();
    }
    let f = File::create(root.join("sparse")).unwrap();
    f.set_len(10 << 20).unwrap();
    f.write_all_at(&bytes(1, 5000), 0).unwrap();
    f.write_all_at(&bytes(2, 70_000), 5 << 20).unwrap();
    drop(f);
    let deep = root
        .join("a".repeat(100))
        .join("b".repeat(100))
        .join("c".repeat(100));
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("deep.txt"), b"deep").unwrap();
    fs::write(root.join("ünïcødé ✓"), b"name").unwrap();
    set_xattr(&root.join("d05"), b"user.dir", b"yes");
    for d in 0..20 {
        set_mtime(
            &root.join(format!("d{d:02}")),
            1_500_000_000_000_000_000 + d * 1_000_000_001,
        );
    }
}

/// Every path of `src` has the same type, mode, size, mtime, owner, link
/// count, symlink target and xattrs under `mnt`; contents compared by diff.
fn compare_trees(src: &Path, mnt: &Path) {
    let out = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(src)
        .arg(mnt)
        .output()
        .unwrap_or_else(|e| panic!("this test needs diff (apt-get install -y diffutils): {e}"));
    assert!(
        out.status.success(),
        "diff -r: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let a = walk(src);
    let b = walk(mnt);
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let mut inos = std::collections::HashMap::new();
    for (rel, m) in &a {
        let n = &b[rel];
        let name = rel.display();
        assert_eq!(kind_of(m), kind_of(n), "{name}: kind");
        if !m.file_type().is_symlink() {
            assert_eq!(m.mode(), n.mode(), "{name}: mode");
            assert_eq!(
                user_xattrs(&src.join(rel)),
                user_xattrs(&mnt.join(rel)),
                "{name}: xattrs"
            );
        }
        if m.is_file() {
            assert_eq!(m.len(), n.len(), "{name}: size");
        }
        assert_eq!(mtime_ns(m), mtime_ns(n), "{name}: mtime");
        assert_eq!((m.uid(), m.gid()), (n.uid(), n.gid()), "{name}: owner");
        assert_eq!(m.nlink(), n.nlink(), "{name}: nlink");
        if m.file_type().is_symlink() {
            assert_eq!(
                fs::read_link(src.join(rel)).unwrap(),
                fs::read_link(mnt.join(rel)).unwrap()
            );
        }
        // Hard links: one inode per source inode.
        let prev = inos.insert(m.ino(), n.ino());
        assert!(prev.is_none_or(|p| p == n.ino()), "{name}: hard link split");
    }
    let sparse = fs::metadata(mnt.join("sparse")).unwrap();
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "sparse file reports its holes"
    );
}

#[test]
fn mount_compare_remount_rebuild() {
    require_tool("tar");
    require_fuse();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    build_source(&src);
    let archive = t.path().join("a.tar");
    run(Command::new("tar")
        .args(["--format=posix", "--xattrs", "-S", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("."));
    // A later member of the same path replaces the earlier one.
    fs::write(src.join("d01/f001"), b"second version").unwrap();
    set_mtime(&src.join("d01/f001"), 1_650_000_000_000_000_000);
    run(Command::new("tar")
        .args(["--format=posix", "-rf"])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("./d01/f001"));

    let mp = t.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let idx = t.path().join("index");

    let m = mount(&archive, &mp, &idx);
    assert!(m.info.index.rebuilt.is_some());
    assert!(m.info.index.members > 1000, "{}", m.info.index.members);
    assert_eq!(m.info.skipped, 0);
    compare_trees(&src, &mp);
    let e = fs::write(mp.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let e = fs::remove_file(mp.join("d00/f001")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    m.unmount();

    // Second mount: the index is loaded, not rebuilt.
    let index_file = idx.join(
        fs::read_dir(&idx)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .file_name(),
    );
    let before = fs::metadata(&index_file).unwrap();
    let m = mount(&archive, &mp, &idx);
    assert!(m.info.index.rebuilt.is_none(), "{:?}", m.info.index.rebuilt);
    assert_eq!(m.info.index.path, index_file);
    let after = fs::metadata(&index_file).unwrap();
    assert_eq!(
        (before.ino(), mtime_ns(&before)),
        (after.ino(), mtime_ns(&after))
    );
    compare_trees(&src, &mp);
    m.unmount();

    // A modified archive is re-indexed.
    let root_mtime = mtime_ns(&fs::metadata(&src).unwrap());
    fs::write(src.join("added.txt"), b"appended later").unwrap();
    // The archive's "./" member keeps the root's old time.
    set_mtime(&src, root_mtime);
    run(Command::new("tar")
        .args(["--format=posix", "-rf"])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("./added.txt"));
    let m = mount(&archive, &mp, &idx);
    assert!(m.info.index.rebuilt.is_some());
    assert_eq!(fs::read(mp.join("added.txt")).unwrap(), b"appended later");
    compare_trees(&src, &mp);
    m.unmount();
    assert_eq!(
        fs::read_dir(&idx).unwrap().count(),
        1,
        "temporary index files left behind"
    );
}

#[test]
fn index_validation() {
    require_tool("tar");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), bytes(1, 3000)).unwrap();
    fs::write(src.join("b"), bytes(2, 100)).unwrap();
    let archive = t.path().join("x.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("."));
    let idx = t.path().join("idx");

    let (m1, i1) = open_index(&archive, Some(&idx)).unwrap();
    assert_eq!(i1.rebuilt.as_deref(), Some("no index yet"));
    let (m2, i2) = open_index(&archive, Some(&idx)).unwrap();
    assert!(i2.rebuilt.is_none());
    assert_eq!(m1, m2);

    // Same size, same mtime, different bytes in the last 64 KiB.
    let meta = fs::metadata(&archive).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&archive).unwrap();
    let a = &m1.iter().find(|m| m.path.ends_with(b"/a")).unwrap().data[0];
    f.write_all_at(b"Z", a.archive_offset + 10).unwrap();
    drop(f);
    set_mtime(&archive, mtime_ns(&meta));
    let (_, i3) = open_index(&archive, Some(&idx)).unwrap();
    assert_eq!(
        i3.rebuilt.as_deref(),
        Some("the archive's contents changed")
    );

    // A new mtime alone.
    set_mtime(&archive, 1_000_000_000_000_000_000);
    let (_, i4) = open_index(&archive, Some(&idx)).unwrap();
    assert_eq!(i4.rebuilt.as_deref(), Some("the archive's mtime changed"));

    // A damaged index file.
    fs::write(&i4.path, b"not a database").unwrap();
    let (m5, i5) = open_index(&archive, Some(&idx)).unwrap();
    assert!(
        i5.rebuilt
            .as_deref()
            .unwrap()
            .starts_with("index unreadable"),
        "{:?}",
        i5.rebuilt
    );
    assert_eq!(m5.len(), m1.len());

    // A corrupt archive: the parse error, with its offset.
    let f = fs::OpenOptions::new().write(true).open(&archive).unwrap();
    f.write_all_at(b"\x01", 148).unwrap();
    drop(f);
    let e = open_index(&archive, Some(&idx)).unwrap_err();
    assert!(
        e.to_string().contains("checksum") && e.to_string().contains("offset 0"),
        "{e}"
    );
}

fn is_mounted(mp: &Path) -> bool {
    let mp = fs::canonicalize(mp).unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
}

/// Not a test: the child process of `sigterm_unmounts`, which runs it by
/// name with `--ignored` (ignored, so the suite neither runs it nor counts
/// it as a pass). Mounts with signal handling on and serves until a signal
/// unmounts it.
#[test]
#[ignore = "not a test: the child process sigterm_unmounts starts"]
fn signal_child() {
    let var = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!("{k} is not set: signal_child is the child process of sigterm_unmounts, not a test of its own")
        })
    };
    let (archive, mp, idx) = (
        var("CAIRN_TARFS_CHILD_ARCHIVE"),
        var("CAIRN_TARFS_CHILD_MP"),
        var("CAIRN_TARFS_CHILD_IDX"),
    );
    let opts = TarMountOptions {
        index_dir: Some(idx.into()),
        handle_signals: true,
        ..TarMountOptions::default()
    };
    mount_archive(Path::new(&archive), Path::new(&mp), &opts, |_| {
        println!("READY")
    })
    .unwrap();
    println!("UNMOUNTED");
}

/// SIGTERM to a serving process unmounts cleanly and the process exits 0,
/// also while a file is open on the mount (lazy detach).
#[test]
fn sigterm_unmounts() {
    require_tool("tar");
    require_fuse();
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"hello").unwrap();
    let archive = t.path().join("s.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("."));
    for busy in [false, true] {
        let mp = t.path().join(format!("mnt{busy}"));
        fs::create_dir(&mp).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "signal_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CAIRN_TARFS_CHILD_ARCHIVE", &archive)
            .env("CAIRN_TARFS_CHILD_MP", &mp)
            .env("CAIRN_TARFS_CHILD_IDX", t.path().join("idx"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut waited = 0;
        while !is_mounted(&mp) {
            std::thread::sleep(Duration::from_millis(50));
            waited += 1;
            if waited > 1200 {
                let _ = child.kill();
                panic!("child never mounted");
            }
        }
        let open = busy.then(|| File::open(mp.join("f")).unwrap());
        assert_eq!(fs::read(mp.join("f")).unwrap(), b"hello");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        // Busy: detached at once, served until the last open file closes.
        let mut waited = 0;
        while is_mounted(&mp) {
            std::thread::sleep(Duration::from_millis(50));
            waited += 1;
            assert!(
                waited < 400,
                "still mounted 20 s after SIGTERM (busy: {busy})"
            );
        }
        drop(open);
        let status = child.wait().unwrap();
        let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
        assert!(status.success(), "child: {status:?} {out}");
        assert!(out.contains("READY") && out.contains("UNMOUNTED"), "{out}");
        assert!(!is_mounted(&mp), "still mounted (busy: {busy})");
    }
}
