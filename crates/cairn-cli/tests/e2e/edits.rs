//! Metadata-only operations through a real mount: `cp` as a clone
//! (copy_file_range), rpwrite through the C ABI (libcairn.so, cairn.h),
//! `cairn insert/delete/replace`, `cairn clone` of a tree, and snapshots.

use crate::common::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn stored(env: &Env) -> f64 {
    env.stats()["stored_bytes"].as_f64().expect("stored_bytes")
}

#[test]
fn cp_inside_the_mount_is_a_clone_and_copies_on_write() {
    let _serial = serial();
    let env = Env::new("clone-cp");
    let m = env.mount();
    let (a, b) = (m.join("a"), m.join("b"));
    let data = gen(31, 48 << 20);
    fs::write(&a, &data).unwrap();
    let before = stored(&env);
    let out = run(Command::new("cp").arg(&a).arg(&b));
    assert!(out.ok(), "{out}");
    let after = stored(&env);
    assert_eq!(before, after, "cp of 48 MiB inside the mount stored new bytes");
    assert_eq!(fs::read(&b).unwrap(), data);
    // A write to the copy stores only the chunks it touches; the original
    // keeps its bytes.
    let out = sh(&format!("printf CHANGED | dd of={} bs=1 seek=20000000 conv=notrunc,fsync status=none", b.display()));
    assert!(out.ok(), "{out}");
    let grew = stored(&env) - after;
    assert!(grew < 9.0 * (1 << 20) as f64, "a 7-byte write to a clone stored {grew} bytes");
    let mut changed = data.clone();
    changed[20_000_000..20_000_007].copy_from_slice(b"CHANGED");
    assert_eq!(fs::read(&a).unwrap(), data);
    assert_eq!(fs::read(&b).unwrap(), changed);
    // Deleting the original frees nothing the copy needs.
    fs::remove_file(&a).unwrap();
    m.umount();
    cairn_ok([OsStr::new("gc"), env.vol.as_os_str()]);
    let m = env.mount();
    assert_eq!(fs::read(m.join("b")).unwrap(), changed);
    m.umount();
    env.assert_fsck_clean(|_| false);
}

const C_PROGRAM: &str = r#"
#include <cairn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *what) { fprintf(stderr, "%s: %s\n", what, strerror(errno)); return 1; }
static int expect_errno(const char *what, ssize_t r, int want) {
    if (r != -1 || errno != want) { fprintf(stderr, "%s: got %zd errno %d, want errno %d\n", what, r, errno, want); return 1; }
    return 0;
}

/* argv: FILE_IN_MOUNT DIR_IN_MOUNT FILE_OUTSIDE SNAPSHOT_FILE */
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) return fail("open");
    if (!cairn_is_cairn(fd)) { fprintf(stderr, "not cairn?\n"); return 1; }
    if (cairn_rpwrite(fd, "HELLO", 5, 10, 0) != 5) return fail("insert");          /* 0123456789HELLOabcdef */
    if (cairn_rpwrite(fd, "", 0, 0, 3) != 0) return fail("delete");               /* 3456789HELLOabcdef */
    if (cairn_rpwrite(fd, "xy", 2, 7, 5) != 2) return fail("replace");            /* 3456789xyabcdef */
    if (lseek(fd, 2, SEEK_SET) != 2) return fail("lseek");
    if (cairn_rwrite(fd, "++", 2, 0) != 2) return fail("rwrite");                 /* 34++56789xyabcdef */
    if (lseek(fd, 0, SEEK_CUR) != 4) { fprintf(stderr, "rwrite did not advance\n"); return 1; }
    if (cairn_rpwrite(fd, "END", 3, 17, 100) != 3) return fail("append");         /* ...cdefEND */
    int bad = 0;
    bad |= expect_errno("past EOF", cairn_rpwrite(fd, "x", 1, 1000, 0), EINVAL);
    int ro = open(argv[1], O_RDONLY);
    bad |= expect_errno("read-only fd", cairn_rpwrite(ro, "x", 1, 0, 0), EBADF);
    int dir = open(argv[2], O_RDONLY | O_DIRECTORY);
    bad |= expect_errno("directory", cairn_rpwrite(dir, "x", 1, 0, 0), EISDIR);
    int out = open(argv[3], O_RDWR);
    if (out < 0) return fail("open outside");
    bad |= expect_errno("outside a mount", cairn_rpwrite(out, "x", 1, 0, 0), ENOTTY);
    if (cairn_is_cairn(out)) { fprintf(stderr, "is_cairn outside?\n"); bad = 1; }
    bad |= expect_errno("snapshot (open for writing)", open(argv[4], O_RDWR), EROFS);
    int snap = open(argv[4], O_RDONLY);
    if (snap < 0) return fail("open snapshot");
    bad |= expect_errno("snapshot", cairn_rpwrite(snap, "x", 1, 0, 0), EROFS);
    return bad;
}
"#;

fn libcairn_dir() -> PathBuf {
    let dir = Path::new(CAIRN).parent().unwrap().to_path_buf();
    assert!(
        dir.join("libcairn.so").exists(),
        "{}/libcairn.so is missing: build it with `cargo build --release -p cairn-client` (scripts/test.sh does)",
        dir.display()
    );
    dir
}

#[test]
fn rpwrite_through_the_c_abi() {
    let _serial = serial();
    let env = Env::new("rpwrite-c");
    let lib = libcairn_dir();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cairn-client/include");
    let src = env.path("t.c");
    let exe = env.path("t");
    fs::write(&src, C_PROGRAM).unwrap();
    let out = run(Command::new("cc").arg("-Wall").arg("-Werror").arg("-I").arg(&include).arg(&src).arg("-o").arg(&exe).arg("-L").arg(&lib).arg("-lcairn"));
    assert!(out.ok(), "compiling against cairn.h: {out}");
    let outside = env.path("outside.txt");
    fs::write(&outside, b"plain ext4 file").unwrap();
    let m = env.mount();
    fs::write(m.join("f"), b"0123456789abcdef").unwrap();
    fs::create_dir(m.join("d")).unwrap();
    cairn_ok([OsStr::new("snapshot"), OsStr::new("create"), OsStr::new("s"), OsStr::new("--mount"), m.path().as_os_str()]);
    let snap_file = m.join(".snapshots/s/f");
    let out = run(Command::new(&exe).arg(m.join("f")).arg(m.join("d")).arg(&outside).arg(&snap_file).env("LD_LIBRARY_PATH", &lib));
    assert!(out.ok(), "the C program failed: {out}");
    assert_eq!(fs::read(m.join("f")).unwrap(), b"34++56789xyabcdefEND");
    assert_eq!(fs::read(&snap_file).unwrap(), b"0123456789abcdef", "the snapshot changed");
    assert_eq!(fs::read(&outside).unwrap(), b"plain ext4 file");
    m.umount();
    let m = env.mount();
    assert_eq!(fs::read(m.join("f")).unwrap(), b"34++56789xyabcdefEND", "after remount");
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn insert_delete_replace_from_the_command_line() {
    let _serial = serial();
    let env = Env::new("rpwrite-cli");
    let m = env.mount();
    let f = m.join("f");
    let mut model = gen(41, 20 << 20);
    fs::write(&f, &model).unwrap();
    // Small bytes from stdin (inline), at the middle.
    let out = sh(&format!("printf 'inserted' | {CAIRN} insert {} 10M", f.display()));
    assert!(out.ok(), "{out}");
    model.splice(10 << 20..10 << 20, b"inserted".iter().copied());
    assert_eq!(fs::read(&f).unwrap(), model);
    // 3 MiB from a file outside the mount: staged in a scratch file, spliced in.
    let ext = env.path("ext.bin");
    let ext_data = gen(42, 3 << 20);
    fs::write(&ext, &ext_data).unwrap();
    cairn_ok([OsStr::new("replace"), f.as_os_str(), OsStr::new("1000"), OsStr::new("5000"), OsStr::new("--from"), ext.as_os_str()]);
    model.splice(1000..6000, ext_data.iter().copied());
    assert_eq!(fs::read(&f).unwrap(), model);
    assert!(
        fs::read_dir(m.path()).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with(".cairn-")),
        "a scratch file was left behind"
    );
    // From a file in the same mount: shared, not stored again.
    let inside = m.join("inside.bin");
    fs::write(&inside, gen(43, 8 << 20)).unwrap();
    let before = stored(&env);
    cairn_ok([OsStr::new("insert"), f.as_os_str(), OsStr::new("0"), OsStr::new("--from"), inside.as_os_str()]);
    model.splice(0..0, gen(43, 8 << 20));
    let grew = stored(&env) - before;
    assert!(grew < 12.0 * (1 << 20) as f64, "an 8 MiB zero-copy insert stored {grew} bytes");
    cairn_ok([OsStr::new("delete"), f.as_os_str(), OsStr::new("4M"), OsStr::new("8M")]);
    model.drain(4 << 20..12 << 20);
    assert_eq!(fs::read(&f).unwrap(), model);
    // Errors: clear messages, exit 1, nothing changed.
    let out = cairn([OsStr::new("delete"), f.as_os_str(), OsStr::new("1G"), OsStr::new("1")]);
    assert!(!out.ok() && out.stderr.contains("past the end"), "{out}");
    let out = cairn([OsStr::new("delete"), ext.as_os_str(), OsStr::new("0"), OsStr::new("1")]);
    assert!(!out.ok() && out.stderr.contains("not inside a Cairn mount"), "{out}");
    let out = cairn([OsStr::new("delete"), m.path().as_os_str(), OsStr::new("0"), OsStr::new("1")]);
    assert!(!out.ok() && out.stderr.contains("directory"), "{out}");
    assert_eq!(fs::read(&f).unwrap(), model);
    m.umount();
    let m = env.mount();
    assert_eq!(fs::read(m.join("f")).unwrap(), model);
    m.umount();
    env.assert_fsck_clean(|_| false);
}

/// Mode, owner, group, links, size and mtime (ns) of `p` itself, and its
/// symlink target if it is one.
fn stat_line(p: &Path) -> String {
    let out = run(Command::new("stat").arg("-c").arg("%A %u %g %h %s %y").arg(p));
    assert!(out.ok(), "{out}");
    let target = fs::read_link(p).map(|t| t.display().to_string()).unwrap_or_default();
    format!("{} {target}", out.stdout.trim())
}

#[test]
fn clone_tree_and_snapshots_from_the_command_line() {
    let _serial = serial();
    let env = Env::new("clone-snap");
    let m = env.mount();
    let t = m.join("tree");
    let setup = format!(
        "set -e; cd {}; mkdir -p tree/sub; head -c 3000000 /dev/urandom > tree/sub/big; echo small > tree/small;
         ln tree/sub/big tree/hard; ln -s sub/big tree/link; chmod 4750 tree/small; chown 1000:100 tree/small;
         touch -d '2001-02-03 04:05:06.123456789' tree/sub/big; setfattr -n user.k -v val tree/small",
        m.path().display()
    );
    let out = sh(&setup);
    assert!(out.ok(), "{out}");
    let before = stored(&env);
    cairn_ok([OsStr::new("clone"), t.as_os_str(), m.join("copy").as_os_str()]);
    assert_eq!(stored(&env), before, "a tree clone stored data");
    for rel in ["sub/big", "small", "hard", "link", "sub"] {
        assert_eq!(stat_line(&t.join(rel)), stat_line(&m.join("copy").join(rel)), "{rel}");
    }
    let (a, b) = (fs::metadata(m.join("copy/sub/big")).unwrap(), fs::metadata(m.join("copy/hard")).unwrap());
    assert_eq!(a.ino(), b.ino(), "hard links stay hard links");
    let out = sh(&format!("getfattr --only-values -n user.k {}", m.join("copy/small").display()));
    assert_eq!(out.stdout, "val", "{out}");
    let out = cairn([OsStr::new("clone"), t.as_os_str(), m.join("copy").as_os_str()]);
    assert!(!out.ok() && out.stderr.contains("exists"), "{out}");

    // Snapshots: frozen content, read-only, listed, survive gc.
    let mnt = m.path().as_os_str().to_owned();
    cairn_ok([OsStr::new("snapshot"), OsStr::new("create"), OsStr::new("monday"), OsStr::new("-m"), &mnt]);
    let big = fs::read(t.join("sub/big")).unwrap();
    fs::write(t.join("sub/big"), b"overwritten").unwrap();
    fs::remove_file(t.join("small")).unwrap();
    fs::remove_dir_all(m.join("copy")).unwrap();
    let snap = m.join(".snapshots/monday/tree");
    assert_eq!(fs::read(snap.join("sub/big")).unwrap(), big);
    assert_eq!(fs::read(snap.join("small")).unwrap(), b"small\n");
    for script in ["echo x > {S}/small", "rm {S}/small", "mkdir {S}/new", "touch {S}/small", "mv {S}/small {M}/stolen", "rmdir {M}/.snapshots"] {
        let cmd = script.replace("{S}", &snap.display().to_string()).replace("{M}", &m.path().display().to_string());
        let out = sh(&format!("LC_ALL=C {cmd}"));
        assert!(!out.ok() && out.stderr.contains("Read-only file system"), "`{cmd}` was not refused with EROFS: {out}");
    }
    let out = cairn_ok([OsStr::new("snapshot"), OsStr::new("list"), OsStr::new("-m"), &mnt]);
    assert!(out.stdout.starts_with("monday\t"), "{out}");
    m.umount();
    cairn_ok([OsStr::new("gc"), env.vol.as_os_str()]);
    let m = env.mount();
    let snap = m.join(".snapshots/monday/tree");
    assert_eq!(fs::read(snap.join("sub/big")).unwrap(), big, "after gc and remount");
    assert_eq!(fs::read(m.join("tree/sub/big")).unwrap(), b"overwritten");
    cairn_ok([OsStr::new("snapshot"), OsStr::new("delete"), OsStr::new("monday"), OsStr::new("-m"), &mnt]);
    assert!(!snap.exists());
    let out = cairn_ok([OsStr::new("snapshot"), OsStr::new("list"), OsStr::new("-m"), &mnt]);
    assert_eq!(out.stdout, "");
    m.umount();
    let s0 = env.stats()["stored_bytes"].as_f64().unwrap();
    cairn_ok([OsStr::new("gc"), env.vol.as_os_str()]);
    let s1 = env.stats()["stored_bytes"].as_f64().unwrap();
    assert!(s1 < s0 - 2.0e6, "deleting the snapshot let gc free nothing ({s0} -> {s1})");
    env.assert_fsck_clean(|_| false);
}

/// `cairn insert --from -` stages a large stdin in a scratch file beside
/// the target; a SIGTERM (or SIGINT) while it waits for more input must not
/// leave that file in the mount.
#[test]
fn insert_from_stdin_killed_leaves_no_scratch_file() {
    use std::io::Write;
    use std::process::Stdio;
    let _serial = serial();
    let env = Env::new("insert-sigterm");
    let m = env.mount();
    let f = m.join("f");
    fs::write(&f, b"0123456789").unwrap();
    let scratch = |m: &Mount| -> Vec<String> {
        fs::read_dir(m.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".cairn-"))
            .collect()
    };
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut cmd = Command::new(CAIRN);
        // The child starts with the signal's default action, as from a
        // terminal: a runner started in the background by a non-interactive
        // shell ignores SIGINT, the child would inherit that, and cairn
        // rightly leaves an ignored signal ignored (the test then hung).
        // SAFETY: signal() is async-signal-safe, as pre_exec requires.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                libc::signal(sig, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = cmd
            .args([OsStr::new("insert"), f.as_os_str(), OsStr::new("5"), OsStr::new("--from"), OsStr::new("-")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // More than fits inline: the command starts a scratch file and keeps
        // reading, as the pipe stays open.
        stdin.write_all(&gen(7, 1 << 20)).unwrap();
        stdin.flush().unwrap();
        let t = std::time::Instant::now();
        while scratch(&m).is_empty() {
            assert!(t.elapsed() < std::time::Duration::from_secs(20), "no scratch file appeared");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let status = child.wait().unwrap();
        drop(stdin);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(sig), "the command should die of the signal: {status:?}");
        assert_eq!(scratch(&m), Vec::<String>::new(), "signal {sig} left a scratch file in the mount");
        assert_eq!(fs::read(&f).unwrap(), b"0123456789", "an interrupted insert changed the file");
    }
    m.umount();
    env.assert_fsck_clean(|_| false);
}

/// Issue 50: the raw rpwrite ioctl (as `cairn.h` documents it for programs
/// that cannot link libcairn, so without the library's `ftruncate`): after
/// an insert, `fstat` shows the new size and an `O_APPEND` write lands after
/// the moved bytes instead of over them ("XYZhelmore"); after a replace that
/// grows the file in the middle, the same. The daemon tells the kernel
/// itself.
#[test]
fn raw_rpwrite_ioctl_then_append_keeps_every_byte() {
    use cairn::ioctl::{Rpwrite, IOC_RPWRITE};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let _serial = serial();
    let env = Env::new("raw-rpwrite");
    let m = env.mount();
    let p = m.join("f");
    fs::write(&p, b"hello\n").unwrap();
    let mut f = fs::OpenOptions::new().read(true).append(true).open(&p).unwrap();
    let rpwrite = |f: &fs::File, offset: u64, mbyte: u64, data: &[u8]| {
        let mut r = Rpwrite::new();
        r.offset = offset;
        r.mbyte = mbyte;
        r.nbyte = data.len() as u64;
        r.data[..data.len()].copy_from_slice(data);
        // SAFETY: IOC_RPWRITE's size is that of Rpwrite, which outlives the call.
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), IOC_RPWRITE as _, &mut *r as *mut Rpwrite) };
        assert_eq!(rc, 0, "ioctl: {}", std::io::Error::last_os_error());
        r.new_size
    };
    assert_eq!(rpwrite(&f, 0, 0, b"XYZ"), 9);
    assert_eq!(f.metadata().unwrap().len(), 9, "fstat after the ioctl shows the old size");
    assert_eq!(fs::metadata(&p).unwrap().len(), 9, "stat after the ioctl shows the old size");
    f.write_all(b"more").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"XYZhello\nmore", "the append went over moved bytes");
    // A replace in the middle that grows the file by 5 bytes.
    assert_eq!(rpwrite(&f, 3, 2, b"HEEEEE"), 17);
    f.write_all(b"!").unwrap();
    drop(f);
    assert_eq!(fs::read(&p).unwrap(), b"XYZHEEEEEllo\nmore!");
    m.umount();
    let m = env.mount();
    assert_eq!(fs::read(m.join("f")).unwrap(), b"XYZHEEEEEllo\nmore!");
    m.umount();
}

/// Issue 52: an rpwrite ioctl runs on a worker, not on the one thread that
/// reads the mount's requests from the kernel. While a splice whose source
/// is still in the journal is made (the ioctl flushes 128 MiB into chunks
/// first, which takes a good part of a second), another process's creates
/// are answered. Before, the reader thread made the edit itself and every
/// other request of the mount waited for it (at most the one create already
/// being served finished inside the ioctl's time).
#[test]
fn other_requests_are_answered_while_an_rpwrite_runs() {
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    let _serial = serial();
    let env = Env::new("rpwrite-worker");
    let m = env.mount();
    let data = gen(41, 8 << 20);
    fs::write(m.join("f"), &data).unwrap();
    fs::create_dir(m.join("c")).unwrap();
    // Creates in a loop, each answered by the daemon (a new name each time).
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let creator = {
        let (stop, done, dir) = (stop.clone(), done.clone(), m.join("c"));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                fs::OpenOptions::new().write(true).create_new(true).open(dir.join(format!("n{i}"))).unwrap();
                done.lock().unwrap().push(Instant::now());
                i += 1;
            }
        })
    };
    while done.lock().unwrap().len() < 3 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let big = gen(43, 128 << 20);
    fs::write(m.join("src"), &big).unwrap();
    let f = fs::OpenOptions::new().read(true).write(true).open(m.join("f")).unwrap();
    let src = fs::File::open(m.join("src")).unwrap();
    let t0 = Instant::now();
    let out = cairn::rpsplice(f.as_fd(), 4 << 20, 0, src.as_fd(), 0, big.len() as u64).expect("rpsplice");
    let t1 = Instant::now();
    stop.store(true, Ordering::Relaxed);
    creator.join().unwrap();
    let inside = done.lock().unwrap().iter().filter(|t| **t > t0 && **t < t1).count();
    assert!(inside >= 3, "{inside} creates were answered during the {:?} the rpwrite took: the edit held the mount's requests", t1 - t0);
    assert_eq!(out.new_size, data.len() as u64 + big.len() as u64);
    drop((f, src));
    let mut want = data[..4 << 20].to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(&data[4 << 20..]);
    assert!(fs::read(m.join("f")).unwrap() == want, "the file after the splice differs");
    m.umount();
    let m = env.mount();
    assert!(fs::read(m.join("f")).unwrap() == want, "the file after the splice differs after a remount");
    m.umount();
}
