//! 5. Kernel permission checks through the mount, as an unprivileged user
//! (`nobody`, uid/gid 65534, via setpriv), with exact errno values.

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

const NOBODY: (u32, u32) = (65534, 65534);

/// Each check prints "NAME RESULT" with RESULT = OK or the errno name.
const SCRIPT: &str = r#"
import errno, os, sys
mnt = sys.argv[2]
P = lambda *a: os.path.join(mnt, *a)
def t(name, f):
    try:
        f()
        print(name, "OK")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
def write_own():
    with open(P("sticky", "mine"), "wb") as f:
        f.write(b"written by nobody\n")
def create_delete_own():
    fd = os.open(P("sticky", "mine2"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.close(fd)
    os.unlink(P("sticky", "mine2"))
t("whoami", lambda: None if os.getuid() == 65534 and os.getgid() == 65534 and os.getgroups() == [] else os.abort())
t("create_in_root_dir", lambda: os.close(os.open(P("rootdir", "new"), os.O_CREAT | os.O_WRONLY, 0o644)))
t("mkdir_in_root_dir", lambda: os.mkdir(P("rootdir", "newdir")))
t("symlink_in_root_dir", lambda: os.symlink("x", P("rootdir", "newlink")))
t("unlink_in_root_dir", lambda: os.unlink(P("rootdir", "public")))
t("rename_in_root_dir", lambda: os.rename(P("rootdir", "public"), P("rootdir", "moved")))
t("read_0644", lambda: open(P("rootdir", "public"), "rb").read())
t("write_0644", lambda: open(P("rootdir", "public"), "r+b").close())
t("truncate_0644", lambda: os.truncate(P("rootdir", "public"), 0))
t("read_0600", lambda: open(P("secret"), "rb").read())
t("list_0700_dir", lambda: os.listdir(P("private")))
t("stat_in_0700_dir", lambda: os.stat(P("private", "inner")))
t("chmod_root_file", lambda: os.chmod(P("rootdir", "public"), 0o666))
t("chown_root_file", lambda: os.chown(P("rootdir", "public"), 65534, 65534))
t("chgrp_root_file", lambda: os.chown(P("rootdir", "public"), -1, 65534))
t("utime_explicit_root_file", lambda: os.utime(P("rootdir", "public"), (1, 1)))
t("utime_now_root_file", lambda: os.utime(P("rootdir", "public"), None))
t("setxattr_root_file", lambda: os.setxattr(P("rootdir", "public"), "user.x", b"1"))
t("sticky_unlink_root_file", lambda: os.unlink(P("sticky", "rootfile")))
t("sticky_rename_root_file", lambda: os.rename(P("sticky", "rootfile"), P("sticky", "stolen")))
t("sticky_write_own", write_own)
t("sticky_create_delete_own", create_delete_own)
t("chmod_own", lambda: os.chmod(P("sticky", "mine"), 0o640))
t("utime_explicit_own", lambda: os.utime(P("sticky", "mine"), (1000000000, 1000000000)))
t("chown_own_to_root", lambda: os.chown(P("sticky", "mine"), 0, 0))
"#;

#[test]
fn unprivileged_user_gets_exact_errnos() {
    let _serial = serial();
    let env = Env::new("perms");
    let m = env.mount();
    let mnt = m.path();
    fs::set_permissions(mnt, fs::Permissions::from_mode(0o755)).unwrap();
    assert_others_can_reach(mnt);
    let mk = |rel: &str, mode: u32, content: Option<&[u8]>| {
        let p = mnt.join(rel);
        match content {
            Some(c) => fs::write(&p, c).unwrap(),
            None => fs::create_dir(&p).unwrap(),
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    mk("rootdir", 0o755, None);
    mk("rootdir/public", 0o644, Some(b"public root data\n"));
    mk("secret", 0o600, Some(b"root only\n"));
    mk("private", 0o700, None);
    mk("private/inner", 0o644, Some(b"x"));
    mk("sticky", 0o1777, None);
    mk("sticky/rootfile", 0o666, Some(b"root's file in a sticky dir\n"));
    let public_before = fs::metadata(mnt.join("rootdir/public")).unwrap();
    // Root lists the private directory first, twice: the kernel then holds
    // its listing (FOPEN_CACHE_DIR), and nobody's listing below must still
    // be refused at the open, not served from that cache.
    for _ in 0..2 {
        assert_eq!(fs::read_dir(mnt.join("private")).unwrap().count(), 1);
    }

    let out = python(SCRIPT, &[mnt.as_os_str()], Some(NOBODY));
    assert!(out.ok(), "{out}");
    let want: &[(&str, &str)] = &[
        ("whoami", "OK"),
        ("create_in_root_dir", "EACCES"),
        ("mkdir_in_root_dir", "EACCES"),
        ("symlink_in_root_dir", "EACCES"),
        ("unlink_in_root_dir", "EACCES"),
        ("rename_in_root_dir", "EACCES"),
        ("read_0644", "OK"),
        ("write_0644", "EACCES"),
        ("truncate_0644", "EACCES"),
        ("read_0600", "EACCES"),
        ("list_0700_dir", "EACCES"),
        ("stat_in_0700_dir", "EACCES"),
        ("chmod_root_file", "EPERM"),
        ("chown_root_file", "EPERM"),
        ("chgrp_root_file", "EPERM"),
        ("utime_explicit_root_file", "EPERM"),
        ("utime_now_root_file", "EACCES"),
        ("setxattr_root_file", "EACCES"),
        // Linux: may_delete() -> check_sticky() fails with EPERM.
        ("sticky_unlink_root_file", "EPERM"),
        ("sticky_rename_root_file", "EPERM"),
        ("sticky_write_own", "OK"),
        ("sticky_create_delete_own", "OK"),
        ("chmod_own", "OK"),
        ("utime_explicit_own", "OK"),
        ("chown_own_to_root", "EPERM"),
    ];
    assert_outcomes(&out, want);

    // Root sees what nobody did, and nothing nobody was refused.
    assert_eq!(fs::read(mnt.join("sticky/mine")).unwrap(), b"written by nobody\n");
    let mine = fs::metadata(mnt.join("sticky/mine")).unwrap();
    assert_eq!(
        (mine.uid(), mine.gid(), mine.mode() & 0o7777, mine.mtime()),
        (65534, 65534, 0o640, 1_000_000_000)
    );
    assert!(!mnt.join("sticky/mine2").exists());
    assert_eq!(fs::read(mnt.join("sticky/rootfile")).unwrap(), b"root's file in a sticky dir\n");
    for gone in ["rootdir/new", "rootdir/newdir", "rootdir/newlink", "rootdir/moved", "sticky/stolen"] {
        assert!(fs::symlink_metadata(mnt.join(gone)).is_err(), "{gone} exists");
    }
    let public = fs::metadata(mnt.join("rootdir/public")).unwrap();
    assert_eq!(fs::read(mnt.join("rootdir/public")).unwrap(), b"public root data\n");
    assert_eq!(
        (public.mode(), public.uid(), public.gid(), public.mtime(), public.mtime_nsec()),
        (public_before.mode(), 0, 0, public_before.mtime(), public_before.mtime_nsec())
    );
    // The user's file persists with its owner.
    m.umount();
    let m = env.mount();
    let mine = fs::metadata(m.join("sticky/mine")).unwrap();
    assert_eq!((mine.uid(), mine.gid(), mine.len()), (65534, 65534, 18));
    m.umount();
}

/// Setuid/setgid bits are cleared as Linux clears them on ext4: by a write
/// or truncate from a user without CAP_FSETID (never by root's), and by any
/// chown of a non-directory; setgid without group execute (a locking mark)
/// and a directory's setgid stay. The mount asks the kernel to leave this
/// to the daemon (HANDLE_KILLPRIV_V2, which saves a getxattr round trip on
/// every write), so the daemon must get it right.
#[test]
fn setuid_and_setgid_bits_are_cleared_like_linux_does() {
    let _serial = serial();
    let env = Env::new("killpriv");
    let m = env.mount();
    assert_others_can_reach(m.path());
    let mode = |n: &str| fs::metadata(m.join(n)).unwrap().mode() & 0o7777;
    let make = |n: &str, perm: u32| {
        fs::write(m.join(n), b"content\n").unwrap();
        fs::set_permissions(m.join(n), fs::Permissions::from_mode(perm)).unwrap();
        assert_eq!(mode(n), perm, "{n} after chmod");
    };
    make("w", 0o6777);
    make("t", 0o4666);
    make("root_w", 0o6777);
    make("lockmark", 0o2666);
    make("chown_u", 0o4755);
    make("chown_g", 0o2755);
    fs::create_dir(m.join("dir")).unwrap();
    fs::set_permissions(m.join("dir"), fs::Permissions::from_mode(0o2777)).unwrap();

    const PY: &str = r#"
import os, sys
mnt = sys.argv[2]
with open(os.path.join(mnt, "w"), "ab") as f: f.write(b"by nobody\n")
with open(os.path.join(mnt, "lockmark"), "ab") as f: f.write(b"by nobody\n")
os.truncate(os.path.join(mnt, "t"), 3)
print("done")
"#;
    let out = python(PY, &[m.path().as_os_str()], Some(NOBODY));
    assert!(out.ok() && out.stdout.contains("done"), "nobody's writes failed:\n{}", out.text());
    fs::OpenOptions::new().append(true).open(m.join("root_w")).unwrap().write_all(b"by root\n").unwrap();
    lchown(&m.join("chown_u"), 1000, 1000);
    lchown(&m.join("chown_g"), 0, 1000);
    lchown(&m.join("dir"), 0, 1000);

    let got: BTreeMap<&str, u32> = ["w", "t", "root_w", "lockmark", "chown_u", "chown_g", "dir"].into_iter().map(|n| (n, mode(n))).collect();
    let want: BTreeMap<&str, u32> =
        [("w", 0o0777), ("t", 0o0666), ("root_w", 0o6777), ("lockmark", 0o2666), ("chown_u", 0o0755), ("chown_g", 0o0755), ("dir", 0o2777)].into_iter().collect();
    let show = |b: &BTreeMap<&str, u32>| b.iter().map(|(n, p)| format!("{n}={p:o}")).collect::<Vec<_>>().join(" ");
    assert_eq!(show(&got), show(&want));
    // The new content is all there.
    assert_eq!(fs::read(m.join("w")).unwrap(), b"content\nby nobody\n");
    assert_eq!(fs::read(m.join("t")).unwrap(), b"con");
    // And it lasts: the cleared bits were stored, not only reported.
    m.umount();
    let m = env.mount();
    assert_eq!(fs::metadata(m.join("w")).unwrap().mode() & 0o7777, 0o0777);
    assert_eq!(fs::metadata(m.join("chown_u")).unwrap().mode() & 0o7777, 0o0755);
}

/// The rpwrite ioctl's splice names its source by a descriptor the caller
/// opened for reading (a token from `IOC_SOURCE`), never by inode number:
/// `nobody` cannot copy a 0644 file out of root's 0700 directory into its
/// own file, and every name it can try for a source it did not open (an
/// inode number that exists, one that does not, a guessed token) fails the
/// same way, so nothing tells which inode numbers exist.
#[test]
fn rpwrite_source_must_be_a_descriptor_the_caller_opened() {
    const PY: &str = r#"
import errno, fcntl, os, struct, sys
mnt, secret_ino, missing_ino = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
P = lambda *a: os.path.join(mnt, *a)
RPWRITE, SOURCE, SIZE = 0xFFD0CA01, 0x8008CA02, 80 + 16 * 1024 - 128
def rpwrite(fd, nbyte, src, flags):
    req = bytearray(SIZE)
    struct.pack_into("<5Q2I", req, 0, 0, 0, nbyte, src, 0, flags, 0)
    fcntl.ioctl(fd, RPWRITE, req, True)
    # As libcairn does: the kernel keeps its own size under the writeback
    # cache, and takes the daemon's only from a truncate.
    size = struct.unpack_from("<Q", req, 48)[0]
    if os.fstat(fd).st_size != size:
        os.ftruncate(fd, size)
def t(name, f):
    try:
        f()
        print(name, "OK")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
t("open_secret", lambda: open(P("private", "inner"), "rb").close())
fd = os.open(P("sticky", "loot"), os.O_CREAT | os.O_RDWR, 0o600)
t("v1_existing_ino", lambda: rpwrite(fd, 100, secret_ino, 1))
t("v1_missing_ino", lambda: rpwrite(fd, 100, missing_ino, 1))
t("token_as_existing_ino", lambda: rpwrite(fd, 100, secret_ino, 2))
t("token_as_missing_ino", lambda: rpwrite(fd, 100, missing_ino, 2))
t("token_guessed", lambda: rpwrite(fd, 100, 0x123456789abcdef, 2))
# What it may do: splice from a file it opened for reading.
pub = os.open(P("rootdir", "public"), os.O_RDONLY)
tok = bytearray(8)
t("source_of_readable", lambda: fcntl.ioctl(pub, SOURCE, tok, True))
t("splice_opened_source", lambda: rpwrite(fd, 100, struct.unpack("<Q", tok)[0], 2))
wo = os.open(P("sticky", "loot"), os.O_WRONLY)
t("source_of_write_only", lambda: fcntl.ioctl(wo, SOURCE, bytearray(8), True))
os.close(pub)
# The kernel sends RELEASE after the last close without waiting for it
# (only fuseblk mounts wait), so the token dies a moment later, not at once.
import time
deadline = time.monotonic() + 10
while True:
    try:
        rpwrite(fd, 100, struct.unpack("<Q", tok)[0], 2)
    except OSError as e:
        print("token_after_close", errno.errorcode.get(e.errno, str(e.errno)))
        break
    if time.monotonic() > deadline:
        print("token_after_close OK")
        break
    time.sleep(0.01)
"#;
    let _serial = serial();
    let env = Env::new("rpsource");
    let m = env.mount();
    let mnt = m.path();
    fs::set_permissions(mnt, fs::Permissions::from_mode(0o755)).unwrap();
    assert_others_can_reach(mnt);
    fs::create_dir(mnt.join("private")).unwrap();
    fs::write(mnt.join("private/inner"), b"root's secret in a 0700 directory\n").unwrap();
    fs::set_permissions(mnt.join("private/inner"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(mnt.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir(mnt.join("rootdir")).unwrap();
    fs::write(mnt.join("rootdir/public"), b"public\n").unwrap();
    fs::create_dir(mnt.join("sticky")).unwrap();
    fs::set_permissions(mnt.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    let secret_ino = fs::metadata(mnt.join("private/inner")).unwrap().ino();
    let missing_ino = secret_ino + 1000;

    let (s, x) = (secret_ino.to_string(), missing_ino.to_string());
    let out = python(PY, &[mnt.as_os_str(), s.as_ref(), x.as_ref()], Some(NOBODY));
    assert!(out.ok(), "{out}");
    let want: &[(&str, &str)] = &[
        ("open_secret", "EACCES"),
        // Version 1's inode numbers are refused outright, existing or not.
        ("v1_existing_ino", "EINVAL"),
        ("v1_missing_ino", "EINVAL"),
        // Anything but a live token is EBADF, whatever it might name.
        ("token_as_existing_ino", "EBADF"),
        ("token_as_missing_ino", "EBADF"),
        ("token_guessed", "EBADF"),
        ("source_of_readable", "OK"),
        ("splice_opened_source", "OK"),
        ("source_of_write_only", "EBADF"),
        ("token_after_close", "EBADF"),
    ];
    assert_outcomes(&out, want);
    // Nobody's file holds the public file's bytes and nothing of the secret.
    assert_eq!(fs::read(mnt.join("sticky/loot")).unwrap(), b"public\n");
    m.umount();
}

/// Checks the `NAME OUTCOME` lines a script run as nobody printed against
/// `want`, listing every mismatch at once.
fn assert_outcomes(out: &Out, want: &[(&str, &str)]) {
    let got: BTreeMap<&str, &str> = out.stdout.lines().filter_map(|l| l.split_once(' ')).collect();
    let wrong: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(k) != Some(v))
        .map(|(k, v)| format!("{k}: expected {v}, got {}", got.get(k).unwrap_or(&"(nothing)")))
        .collect();
    assert!(wrong.is_empty(), "as nobody:\n{}\n{out}", wrong.join("\n"));
}

/// Everything under `dir` (and `dir`) that a group or other user may read,
/// write or enter, with its mode.
fn open_to_others(dir: &std::path::Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        if m.file_type().is_symlink() {
            continue;
        }
        if m.mode() & 0o077 != 0 {
            bad.push(format!("{} {:o}", p.display(), m.mode() & 0o7777));
        }
        if m.is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    bad
}

/// A volume's directory and a volume's cache directory hold every file's
/// content (journal, packs) and every name (meta.sqlite): they and all in
/// them are the owner's alone, whatever the umask, so another user can
/// neither read them nor take the volume lock and keep root from
/// mounting; a volume left open by an older version is closed at open,
/// with a warning.
#[test]
fn volume_and_cache_directories_are_private_to_their_owner() {
    const PY: &str = r#"
import errno, fcntl, os, sys
def t(name, f):
    try:
        f()
        print(name, "OK")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
def lock():
    fd = os.open(os.path.join(sys.argv[2], "lock"), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
t("list", lambda: os.listdir(sys.argv[2]))
t("lock", lock)
"#;
    let _serial = serial();
    // The most open umask there is: the modes must not come from it.
    // SAFETY: umask has no preconditions; children inherit it.
    let old_umask = unsafe { libc::umask(0) };
    struct Restore(libc::mode_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe { libc::umask(self.0) };
        }
    }
    let _restore = Restore(old_umask);

    let env = Env::new("private-vol");
    assert_eq!(fs::metadata(&env.vol).unwrap().mode() & 0o7777, 0o700, "a new volume directory");
    let m = env.mount();
    let mut f = fs::File::create(m.join("f")).unwrap();
    f.write_all(&gen(1, 3 << 20)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(open_to_others(&env.vol), Vec::<String>::new(), "open to others while mounted");
    let out = python(PY, &[env.vol.as_os_str()], Some(NOBODY));
    assert_eq!(out.stdout, "list EACCES\nlock EACCES\n", "{out}");
    m.umount();
    assert_eq!(open_to_others(&env.vol), Vec::<String>::new(), "open to others after the flush");

    // A volume directory from before: opened up to everyone. The next open
    // closes it and says so.
    fs::set_permissions(&env.vol, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(env.vol.join("lock"), fs::Permissions::from_mode(0o644)).unwrap();
    let m = env.mount();
    assert_eq!(fs::metadata(&env.vol).unwrap().mode() & 0o7777, 0o700, "an old volume directory after a mount");
    assert!(env.log().contains("had mode 0755"), "no warning in the log:\n{}", env.log());
    let out = python(PY, &[env.vol.as_os_str()], Some(NOBODY));
    assert_eq!(out.stdout, "list EACCES\nlock EACCES\n", "{out}");
    m.umount();

    // A volume elsewhere (an emulated tape): its --cache-dir likewise.
    std::env::set_var("CAIRN_TAPE_CLOCK", "virtual");
    let url = format!("tape-emu:{}", env.path("tape").display());
    let cache = env.path("cache");
    let cache_arg = cache.display().to_string();
    cairn_ok(["init", &url, "--cache-dir", &cache_arg]);
    let m = Mount::new(std::path::Path::new(&url), &env.mnt, &["--cache-dir", &cache_arg]).unwrap_or_else(|o| panic!("{o}"));
    fs::write(m.join("g"), gen(2, 2 << 20)).unwrap();
    assert_eq!(open_to_others(&cache), Vec::<String>::new(), "cache dir open to others while mounted");
    m.umount();
    assert_eq!(open_to_others(&cache), Vec::<String>::new(), "cache dir open to others after the flush");
}
