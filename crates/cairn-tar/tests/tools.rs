//! Archives made by GNU tar and bsdtar, parsed and checked field by field
//! and byte by byte against the tree they were made from.

mod common;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_tar::{parse, Member, MemberKind, Parser};
use common::*;

struct Expect {
    /// mtimes carry nanoseconds (pax); otherwise whole seconds.
    precise_time: bool,
    /// uname/gname fields exist (not v7).
    names: bool,
    xattrs: bool,
    /// "sparse" (and "huge", if present) must come out as sparse maps.
    sparse_maps: bool,
}

fn rel(root: &Path, m: &Member) -> PathBuf {
    source_of(root, &m.path)
        .strip_prefix(root)
        .unwrap()
        .to_path_buf()
}

/// Parses `archive` and checks every member against the tree at `root`.
fn check_archive(root: &Path, archive: &Path, e: &Expect) -> Vec<Member> {
    let f = File::open(archive).unwrap();
    let len = f.metadata().unwrap().len();
    let members = parse(&f, len).unwrap_or_else(|err| panic!("{archive:?}: {err}"));
    // The streaming parser yields the same.
    let streamed: Vec<Member> = Parser::new(&f, len).map(Result::unwrap).collect();
    assert_eq!(members, streamed);

    let mut seen = BTreeSet::new();
    for m in &members {
        let src = source_of(root, &m.path);
        let meta = fs::symlink_metadata(&src).unwrap_or_else(|err| panic!("{:?}: {err}", src));
        let name = String::from_utf8_lossy(&m.path).into_owned();
        assert!(
            !m.path.ends_with(b"/") || m.path == b"/",
            "{name}: trailing slash kept"
        );
        assert!(m.header_offset % 512 == 0 && m.header_offset < len);
        seen.insert(rel(root, m));
        if m.kind == MemberKind::HardLink {
            let t = source_of(root, m.link_target.as_ref().unwrap());
            assert_eq!(
                fs::metadata(&t).unwrap().ino(),
                meta.ino(),
                "{name}: hard link target"
            );
            assert!(m.data.is_empty(), "{name}: hard link with data");
            continue;
        }
        assert_eq!(m.kind, kind_of(&meta), "{name}: kind");
        if m.kind != MemberKind::Symlink {
            assert_eq!(m.mode, meta.mode() & 0o7777, "{name}: mode");
        }
        assert_eq!(m.uid, u64::from(meta.uid()), "{name}: uid");
        assert_eq!(m.gid, u64::from(meta.gid()), "{name}: gid");
        let want = mtime_ns(&meta);
        if e.precise_time {
            assert_eq!(m.mtime_ns, want, "{name}: mtime");
        } else {
            assert_eq!(m.mtime_ns, meta.mtime() * 1_000_000_000, "{name}: mtime");
        }
        if e.names {
            assert_eq!(m.uname.as_deref(), Some(&b"root"[..]), "{name}: uname");
            assert_eq!(m.gname.as_deref(), Some(&b"root"[..]), "{name}: gname");
        } else {
            assert_eq!(m.uname, None);
        }
        match m.kind {
            MemberKind::File => check_data(&f, m, &src),
            MemberKind::Symlink => {
                let t = fs::read_link(&src).unwrap();
                assert_eq!(
                    m.link_target.as_deref(),
                    Some(t.as_os_str().as_bytes()),
                    "{name}: target"
                );
                assert!(m.data.is_empty() && m.size == 0);
            }
            _ => assert!(m.data.is_empty() && m.size == 0, "{name}: no data"),
        }
        if e.xattrs && m.kind != MemberKind::Symlink {
            assert_eq!(sorted_user(&m.xattrs), user_xattrs(&src), "{name}: xattrs");
        }
        if e.sparse_maps && (name.ends_with("sparse") || name.ends_with("huge")) {
            assert!(
                m.data.len() >= 2 && m.is_sparse(),
                "{name}: not a sparse map: {:?}",
                m.data
            );
        }
    }
    let all: BTreeSet<PathBuf> = walk(root).into_keys().collect();
    assert_eq!(seen, all, "members vs source tree");
    members
}

const FULL: TreeOpts = TreeOpts {
    long_names: true,
    split_name: true,
    fifo: true,
    xattrs: true,
    sparse: true,
    huge: true,
};

fn tree(dir: &Path, o: TreeOpts) -> PathBuf {
    let root = dir.join("src");
    build_tree(&root, o);
    root
}

fn gnu(dir: &Path, root: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    run(Command::new("tar")
        .args(args)
        .arg("-cf")
        .arg(&out)
        .arg("-C")
        .arg(root)
        .arg("."));
    out
}

fn bsd(dir: &Path, root: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    run(Command::new("bsdtar")
        .args(args)
        .arg("-cf")
        .arg(&out)
        .arg("-C")
        .arg(root)
        .arg("."));
    out
}

#[test]
fn gnu_tar_gnu_format() {
    require_tool("tar");
    let t = tempfile::tempdir().unwrap();
    let root = tree(t.path(), FULL);
    let a = gnu(
        t.path(),
        &root,
        "gnu.tar",
        &["--format=gnu", "--xattrs", "-S"],
    );
    let ms = check_archive(
        &root,
        &a,
        &Expect {
            precise_time: true, // --xattrs makes GNU tar add pax headers with exact times
            names: true,
            xattrs: true,
            sparse_maps: true,
        },
    );
    let huge = ms.iter().find(|m| m.path.ends_with(b"huge")).unwrap();
    assert_eq!(huge.size, 9 * GIB);
}

#[test]
fn gnu_tar_gnu_format_without_pax() {
    require_tool("tar");
    let t = tempfile::tempdir().unwrap();
    let root = tree(
        t.path(),
        TreeOpts {
            xattrs: false,
            ..FULL
        },
    );
    let a = gnu(t.path(), &root, "gnu.tar", &["--format=gnu", "-S"]);
    check_archive(
        &root,
        &a,
        &Expect {
            precise_time: false,
            names: true,
            xattrs: false,
            sparse_maps: true,
        },
    );
}

#[test]
fn gnu_tar_posix_sparse_versions() {
    require_tool("tar");
    let t = tempfile::tempdir().unwrap();
    let root = tree(t.path(), FULL);
    let e = Expect {
        precise_time: true,
        names: true,
        xattrs: true,
        sparse_maps: true,
    };
    for v in ["0.0", "0.1", "1.0"] {
        let a = gnu(
            t.path(),
            &root,
            &format!("posix-{v}.tar"),
            &[
                "--format=posix",
                "--xattrs",
                "-S",
                &format!("--sparse-version={v}"),
            ],
        );
        let ms = check_archive(&root, &a, &e);
        let huge = ms.iter().find(|m| m.path.ends_with(b"huge")).unwrap();
        assert_eq!(huge.size, 9 * GIB, "sparse {v}");
        assert!(ms
            .iter()
            .all(|m| m.atime_ns.is_some() && m.ctime_ns.is_some()));
    }
    // Without -S, a pax archive of the non-huge tree.
    let t2 = tempfile::tempdir().unwrap();
    let root2 = tree(
        t2.path(),
        TreeOpts {
            huge: false,
            ..FULL
        },
    );
    let a = gnu(
        t2.path(),
        &root2,
        "posix.tar",
        &["--format=posix", "--xattrs"],
    );
    check_archive(
        &root2,
        &a,
        &Expect {
            sparse_maps: false,
            ..e
        },
    );
}

#[test]
fn gnu_tar_ustar_and_v7() {
    require_tool("tar");
    let t = tempfile::tempdir().unwrap();
    let root = tree(
        t.path(),
        TreeOpts {
            long_names: false,
            split_name: true,
            fifo: true,
            xattrs: false,
            sparse: true,
            huge: false,
        },
    );
    let a = gnu(t.path(), &root, "ustar.tar", &["--format=ustar"]);
    check_archive(
        &root,
        &a,
        &Expect {
            precise_time: false,
            names: true,
            xattrs: false,
            sparse_maps: false,
        },
    );

    let t = tempfile::tempdir().unwrap();
    let root = tree(
        t.path(),
        TreeOpts {
            long_names: false,
            split_name: false,
            fifo: false,
            xattrs: false,
            sparse: true,
            huge: false,
        },
    );
    let a = gnu(t.path(), &root, "v7.tar", &["--format=v7"]);
    check_archive(
        &root,
        &a,
        &Expect {
            precise_time: false,
            names: false,
            xattrs: false,
            sparse_maps: false,
        },
    );
}

#[test]
fn bsdtar_pax() {
    require_tool("bsdtar");
    let t = tempfile::tempdir().unwrap();
    let root = tree(t.path(), FULL);
    let a = bsd(t.path(), &root, "pax.tar", &["--format=pax"]);
    let ms = check_archive(
        &root,
        &a,
        &Expect {
            precise_time: true,
            names: true,
            xattrs: true,
            sparse_maps: true,
        },
    );
    assert_eq!(
        ms.iter().find(|m| m.path.ends_with(b"huge")).unwrap().size,
        9 * GIB
    );
}

#[test]
fn bsdtar_gnutar_and_ustar() {
    require_tool("bsdtar");
    let t = tempfile::tempdir().unwrap();
    let root = tree(
        t.path(),
        TreeOpts {
            xattrs: false,
            huge: false,
            ..FULL
        },
    );
    let a = bsd(t.path(), &root, "gnutar.tar", &["--format=gnutar"]);
    check_archive(
        &root,
        &a,
        &Expect {
            precise_time: false,
            names: true,
            xattrs: false,
            sparse_maps: false,
        },
    );

    let t = tempfile::tempdir().unwrap();
    let root = tree(
        t.path(),
        TreeOpts {
            long_names: false,
            split_name: true,
            fifo: true,
            xattrs: false,
            sparse: true,
            huge: false,
        },
    );
    let a = bsd(t.path(), &root, "ustar.tar", &["--format=ustar"]);
    check_archive(
        &root,
        &a,
        &Expect {
            precise_time: false,
            names: true,
            xattrs: false,
            sparse_maps: false,
        },
    );
}
