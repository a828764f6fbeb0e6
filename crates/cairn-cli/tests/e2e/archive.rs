//! `cairn archive` through a real mount, checked with GNU tar, bsdtar and
//! Python's tarfile: round trips in every direction, `--align 4096`, and
//! hostile archives refused without leaving anything behind.

use crate::common::*;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Command;

fn stored(env: &Env) -> f64 {
    env.stats()["stored_bytes"].as_f64().expect("stored_bytes")
}

/// A tree with what tar must carry: nested dirs, empty and multi-chunk
/// files, a sparse file, a long name, a non-ASCII name, a symlink, a hard
/// link, a fifo, xattrs, odd modes and owners, nanosecond mtimes.
fn make_tree(dir: &Path) {
    let long = "l".repeat(180);
    let script = format!(
        "set -e; cd {d}; mkdir -p proj/sub/deeper proj/{long}; cd proj
         head -c 2500000 /dev/urandom > sub/big; : > empty; echo hello > sub/deeper/small
         truncate -s 30M sparse; printf data | dd of=sparse bs=1 seek=20000000 conv=notrunc status=none
         echo x > {long}/f; echo y > 'sub/ünïcødé'; ln -s sub/big link; ln sub/big hard; mkfifo pipe
         setfattr -n user.note -v 'a note' sub/deeper/small; chmod 2750 sub; chmod 604 empty
         chown 1234:5678 sub/big; touch -h -d '2003-04-05 06:07:08.123456789' sub/big link",
        d = dir.display()
    );
    let out = sh(&script);
    assert!(out.ok(), "{out}");
}

/// `diff -r` (content, symlink targets, structure) plus every entry's
/// mode, owner, size and mtime through `find -printf`.
fn assert_same_tree(a: &Path, b: &Path) {
    let out = sh(&format!("diff -r --no-dereference {} {} 2>&1 | grep -v 'is a fifo while'", a.display(), b.display()));
    assert!(out.stdout.trim().is_empty(), "trees differ:\n{}", out.stdout);
    let list = |p: &Path| {
        let out = sh(&format!("cd {} && find . -printf '%p %M %U %G %s %n %l\\n' | sort", p.display()));
        assert!(out.ok(), "{out}");
        out.stdout
    };
    assert_eq!(list(a), list(b), "attributes differ between {} and {}", a.display(), b.display());
    let mt = |p: &Path| sh(&format!("cd {} && find . ! -type d -printf '%p %T@\\n' | sort", p.display())).stdout;
    assert_eq!(mt(a), mt(b), "mtimes differ");
    let xa = |p: &Path| sh(&format!("cd {} && getfattr -R -d -m user . 2>/dev/null", p.display())).stdout;
    assert_eq!(xa(a), xa(b), "xattrs differ");
}

#[test]
fn create_extract_and_gnu_tar_and_bsdtar_agree() {
    let _serial = serial();
    let env = Env::new("archive");
    let m = env.mount();
    make_tree(m.path());
    let before = stored(&env);
    let out = run(Command::new(CAIRN).current_dir(m.path()).args(["archive", "create", "proj.tar", "proj", "--align", "4096"]));
    assert!(out.ok(), "{out}");
    assert!(stored(&env) - before < 200_000.0, "archive create stored member data");
    // GNU tar and bsdtar list it without a word on stderr.
    for tool in [&["tar", "tvf"][..], &["bsdtar", "tvf"][..]] {
        let out = run(Command::new(tool[0]).args(&tool[1..]).arg(m.join("proj.tar")));
        assert!(out.ok() && out.stderr.is_empty(), "{out}");
        assert!(out.stdout.contains("proj/sub/big") && out.stdout.contains("link to"), "{out}");
    }
    // Every member's data starts on 4096 (Python's own tar reader says where).
    let py = r#"
import sys, tarfile
with tarfile.open(sys.argv[-1]) as t:
    bad = [(m.name, m.offset_data) for m in t.getmembers() if m.isreg() and m.size and m.offset_data % 4096]
    n = sum(1 for m in t.getmembers() if m.isreg() and m.size)
print(n, bad)
sys.exit(1 if bad or n < 4 else 0)
"#;
    let out = python(py, &[m.join("proj.tar").as_os_str()], None);
    assert!(out.ok(), "alignment: {out}");
    // GNU tar (and bsdtar) extract it outside: identical.
    for (tool, dir) in [("tar --xattrs --xattrs-include=user.* -xpf", "gnu-out"), ("bsdtar -xpf", "bsd-out")] {
        let d = env.path(dir);
        fs::create_dir(&d).unwrap();
        let out = sh(&format!("cd {} && {tool} {}", d.display(), m.join("proj.tar").display()));
        assert!(out.ok() && out.stderr.is_empty(), "{tool}: {out}");
        assert_same_tree(&m.join("proj"), &d.join("proj"));
    }
    // Zero-copy extract inside: identical, nothing stored.
    let before = stored(&env);
    let out = run(Command::new(CAIRN).current_dir(m.path()).args(["archive", "extract", "proj.tar", "x"]));
    assert!(out.ok(), "{out}");
    assert!(stored(&env) - before < 1.0, "zero-copy extract stored data");
    assert_same_tree(&m.join("proj"), &m.join("x/proj"));
    // Archives GNU tar and bsdtar wrote, in every format, extract zero-copy.
    let formats = [
        ("tar --format=gnu -Scf", "gnu"),
        ("tar --format=posix --xattrs -Scf", "posix"),
        ("tar --format=ustar -cf", "ustar"),
        ("bsdtar --format=pax -cf", "bsdpax"),
        ("bsdtar --format=gnutar -cf", "bsdgnu"),
    ];
    for (cmd, name) in formats {
        let tarf = m.join(&format!("{name}.tar"));
        let out = sh(&format!("cd {} && {cmd} {} proj 2>&1 | grep -v 'file name is too long' ; true", m.path().display(), tarf.display()));
        assert!(out.ok(), "{out}");
        if name == "ustar" {
            continue; // ustar cannot hold the 180-byte directory name: covered by the others
        }
        let out = cairn(["archive", "extract"].map(OsStr::new).into_iter().chain([tarf.as_os_str(), m.join(&format!("{name}-x")).as_os_str()]));
        assert!(out.ok(), "{name}: {out}");
        let dest = m.join(&format!("{name}-x/proj"));
        if name == "posix" || name == "bsdpax" {
            assert_same_tree(&m.join("proj"), &dest);
        } else {
            // gnu formats carry no xattrs: compare the rest.
            let out = sh(&format!("diff -r --no-dereference {} {} 2>&1 | grep -v 'is a fifo while'", m.join("proj").display(), dest.display()));
            assert!(out.stdout.trim().is_empty(), "{name}: {}", out.stdout);
        }
    }
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn import_move_consume_and_hostile_archives() {
    let _serial = serial();
    let env = Env::new("archive-import");
    let src = env.path("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let outside = env.path("outside.tar");
    let out = sh(&format!("cd {} && tar --format=posix --xattrs -Scf {} proj", src.display(), outside.display()));
    assert!(out.ok(), "{out}");
    let m = env.mount();
    let out = cairn([OsStr::new("archive"), OsStr::new("import"), outside.as_os_str(), m.join("imp").as_os_str()]);
    assert!(out.ok(), "{out}");
    assert_same_tree(&src.join("proj"), &m.join("imp/proj"));
    assert!(fs::read_dir(m.path()).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with(".cairn-")), "import left its copy");
    // bsdtar likewise.
    let bsd = env.path("bsd.tar");
    let out = sh(&format!("cd {} && bsdtar --format=pax -cf {} proj", src.display(), bsd.display()));
    assert!(out.ok(), "{out}");
    let out = cairn([OsStr::new("archive"), OsStr::new("import"), bsd.as_os_str(), m.join("bsdimp").as_os_str()]);
    assert!(out.ok(), "{out}");
    assert_same_tree(&src.join("proj"), &m.join("bsdimp/proj"));
    // Move into an archive and consume it back.
    let out = run(Command::new(CAIRN).current_dir(m.path()).args(["archive", "create", "--move", "-C", "imp", "moved.tar", "proj"]));
    assert!(out.ok(), "{out}");
    assert!(!m.join("imp/proj").exists(), "--move left the sources");
    let out = run(Command::new(CAIRN).current_dir(m.path()).args(["archive", "extract", "--consume", "moved.tar", "back"]));
    assert!(out.ok(), "{out}");
    assert!(!m.join("moved.tar").exists(), "--consume left the archive");
    assert_same_tree(&src.join("proj"), &m.join("back/proj"));
    // Hostile archives: refused with a reason, nothing created.
    let py = r#"
import io, sys, tarfile
def add(t, name, data=b"x", kind=tarfile.REGTYPE, link=""):
    i = tarfile.TarInfo(name); i.type = kind; i.linkname = link; i.size = len(data) if kind == tarfile.REGTYPE else 0
    t.addfile(i, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
cases = {
  "dotdot": [("ok", b"1"), ("../evil", b"2")],
  "absolute": [("/tmp/evil", b"2")],
  "symlink": [("a", b"", tarfile.SYMTYPE, "/etc"), ("a/passwd", b"2")],
}
for name, members in cases.items():
    with tarfile.open(f"{sys.argv[-1]}/{name}.tar", "w", format=tarfile.PAX_FORMAT) as t:
        for m in members: add(t, *m)
"#;
    let out = python(py, &[m.path().as_os_str()], None);
    assert!(out.ok(), "{out}");
    fs::create_dir(m.join("dest")).unwrap();
    for (name, why) in [("dotdot", ".."), ("absolute", "absolute"), ("symlink", "not a directory")] {
        let out = cairn([OsStr::new("archive"), OsStr::new("extract"), m.join(&format!("{name}.tar")).as_os_str(), m.join("dest").as_os_str()]);
        assert!(!out.ok() && out.stderr.contains(why), "{name}: {out}");
        assert_eq!(fs::read_dir(m.join("dest")).unwrap().count(), 0, "{name}: something was extracted");
    }
    assert!(!Path::new("/tmp/evil").exists());
    // A truncated archive and DEST holding a name.
    let half = fs::metadata(&outside).unwrap().len() / 2 + 77;
    let out = sh(&format!("head -c {half} {} > {}", outside.display(), m.join("cut.tar").display()));
    assert!(out.ok(), "{out}");
    let out = cairn([OsStr::new("archive"), OsStr::new("extract"), m.join("cut.tar").as_os_str(), m.join("cutx").as_os_str()]);
    assert!(!out.ok() && !m.join("cutx").exists() && out.stderr.contains("tar"), "truncated archive: {out}");
    // (back/ already holds proj from the consume above)
    let out = cairn([OsStr::new("archive"), OsStr::new("import"), outside.as_os_str(), m.join("back").as_os_str()]);
    assert!(!out.ok() && out.stderr.contains("already holds"), "{out}");
    assert!(fs::read_dir(m.path()).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with(".cairn-")), "a failed import left its copy");
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn archive_mount_shows_a_tar_inside_the_volume_and_reuses_its_index() {
    let _serial = serial();
    let env = Env::new("archive-mount");
    let m = env.mount();
    make_tree(m.path());
    let out = run(Command::new(CAIRN).current_dir(m.path()).args(["archive", "create", "proj.tar", "proj"]));
    assert!(out.ok(), "{out}");
    let cache = env.path("cache");
    let tm = env.path("tarmnt");
    fs::create_dir(&tm).unwrap();
    let mount = || {
        let out = run(Command::new(CAIRN).env("XDG_CACHE_HOME", &cache).args(["archive", "mount"]).arg(m.join("proj.tar")).arg(&tm));
        assert!(out.ok(), "{out}");
    };
    let umount = || {
        let out = cairn([OsStr::new("umount"), tm.as_os_str()]);
        assert!(out.ok(), "{out}");
    };
    mount();
    let out = sh(&format!("diff -r --no-dereference {} {} 2>&1 | grep -v 'is a fifo while'", m.join("proj").display(), tm.join("proj").display()));
    assert!(out.stdout.trim().is_empty(), "the tar mount differs:\n{}", out.stdout);
    let out = sh(&format!("LC_ALL=C touch {}/proj/new", tm.display()));
    assert!(!out.ok() && out.stderr.contains("Read-only file system"), "{out}");
    umount();
    let index: Vec<_> = fs::read_dir(cache.join("cairn/tar-index")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(index.len(), 1, "{index:?}");
    let stamp = fs::metadata(&index[0]).unwrap().modified().unwrap();
    mount();
    assert_eq!(fs::read(tm.join("proj/sub/big")).unwrap(), fs::read(m.join("proj/sub/big")).unwrap());
    umount();
    assert_eq!(fs::metadata(&index[0]).unwrap().modified().unwrap(), stamp, "the second mount rebuilt the index");
    m.umount();
}
