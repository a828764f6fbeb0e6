//! Archives laid out from `write_header` + data + padding + END_OF_ARCHIVE:
//! GNU tar and bsdtar must list them silently and extract them exactly;
//! our own parser must read back what was written.

mod common;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use cairn_tar::{data_padding, parse, write_header, HeaderSpec, MemberKind, END_OF_ARCHIVE};
use common::*;

#[derive(Clone)]
struct Item {
    path: Vec<u8>,
    kind: MemberKind,
    link: Option<Vec<u8>>,
    mode: u32,
    uid: u64,
    gid: u64,
    uname: Option<Vec<u8>>,
    gname: Option<Vec<u8>>,
    mtime_ns: i64,
    data: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn item(path: &[u8], kind: MemberKind) -> Item {
    Item {
        path: path.to_vec(),
        kind,
        link: None,
        mode: if kind == MemberKind::Dir {
            0o755
        } else {
            0o644
        },
        uid: 0,
        gid: 0,
        uname: None,
        gname: None,
        mtime_ns: 1_700_000_000_000_000_000,
        data: Vec::new(),
        xattrs: Vec::new(),
    }
}

fn file(path: &[u8], data: Vec<u8>) -> Item {
    Item {
        data,
        ..item(path, MemberKind::File)
    }
}

fn link(path: &[u8], kind: MemberKind, target: &[u8]) -> Item {
    Item {
        link: Some(target.to_vec()),
        mode: 0o777,
        ..item(path, kind)
    }
}

fn items() -> Vec<Item> {
    let l1 = b"L".repeat(50);
    let l2 = [l1.clone(), b"/".to_vec(), b"M".repeat(70)].concat();
    let l3 = [l2.clone(), b"/".to_vec(), b"f".repeat(120)].concat();
    let p1 = b"p".repeat(100);
    let p2 = [p1.clone(), b"/".to_vec(), b"q".repeat(100)].concat();
    let p3 = [p2.clone(), b"/".to_vec(), b"r".repeat(100)].concat();
    vec![
        Item {
            mtime_ns: 1_000_000_000_500_000_000,
            xattrs: vec![(b"user.dir".to_vec(), b"d".to_vec())],
            ..item(b"dir", MemberKind::Dir)
        },
        Item {
            mtime_ns: 1_600_000_000_123_456_789,
            xattrs: vec![
                (b"user.a".to_vec(), b"1".to_vec()),
                (b"user.big".to_vec(), b"v".repeat(300)),
                (b"user.bin".to_vec(), b"\x00\xff=\n".to_vec()),
            ],
            ..file(b"dir/file.txt", bytes(1, 1000))
        },
        Item {
            mode: 0o600,
            mtime_ns: 1_234_567_890_000_000_000,
            ..file(b"dir/empty", Vec::new())
        },
        Item {
            mtime_ns: 1_500_000_000_250_000_000,
            ..link(b"dir/link", MemberKind::Symlink, b"file.txt")
        },
        file(b"exact", bytes(2, 512)),
        file(b"odd", bytes(3, 513)),
        Item {
            mode: 0o755,
            ..file(b"big", bytes(4, 70_000))
        },
        item(&l1, MemberKind::Dir),
        item(&l2, MemberKind::Dir),
        file(&l3, bytes(5, 3000)),
        item(&p1, MemberKind::Dir),
        item(&p2, MemberKind::Dir),
        file(&p3, bytes(6, 100)),
        item("héllo wörld".as_bytes(), MemberKind::Dir),
        file("héllo wörld/日本語.txt".as_bytes(), b"utf-8".to_vec()),
        file(b"bin\xff\xfename", b"not utf-8".to_vec()),
        link(b"longlink", MemberKind::Symlink, &b"t".repeat(200)),
        link(b"hard", MemberKind::HardLink, b"dir/file.txt"),
        Item {
            mode: 0o640,
            ..item(b"fifo", MemberKind::Fifo)
        },
        Item {
            uid: 3_000_000,
            gid: 1234,
            mode: 0o640,
            ..file(b"owned", b"big uid".to_vec())
        },
        Item {
            uid: 4321,
            gid: 4322,
            uname: Some(b"a_very_long_user_name_exceeding_32_bytes".to_vec()),
            gname: Some(b"nosuchgroup".to_vec()),
            ..file(b"named", b"names".to_vec())
        },
    ]
}

fn spec(it: &Item) -> HeaderSpec<'_> {
    HeaderSpec {
        path: &it.path,
        kind: it.kind,
        link_target: it.link.as_deref(),
        mode: it.mode,
        uid: it.uid,
        gid: it.gid,
        uname: it.uname.as_deref(),
        gname: it.gname.as_deref(),
        mtime_ns: it.mtime_ns,
        atime_ns: None,
        size: it.data.len() as u64,
        dev_major: 0,
        dev_minor: 0,
        xattrs: &it.xattrs,
    }
}

/// Lays out the archive; returns it and each member's data offset.
fn build(items: &[Item], align: Option<u64>) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    let mut offsets = Vec::new();
    for it in items {
        let s = spec(it);
        let h = write_header(&s, out.len() as u64, align);
        assert_eq!(h.len() % 512, 0);
        out.extend_from_slice(&h);
        offsets.push(out.len() as u64);
        assert_eq!(
            s.data_len(),
            if it.kind == MemberKind::File {
                it.data.len() as u64
            } else {
                0
            }
        );
        out.extend_from_slice(&it.data[..s.data_len() as usize]);
        out.resize(out.len() + data_padding(s.data_len()) as usize, 0);
    }
    out.extend_from_slice(&END_OF_ARCHIVE);
    (out, offsets)
}

fn list_silently(tool: &str, archive: &Path) -> String {
    let out = Command::new(tool)
        .arg("-tvf")
        .arg(archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool} -tvf failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{tool} -tvf wrote to stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks an extracted tree against the items.
fn check_extracted(dir: &Path, items: &[Item], tool: &str) {
    for it in items {
        let p = dir.join(OsStr::from_bytes(&it.path));
        let name = format!("{tool}: {}", String::from_utf8_lossy(&it.path));
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        match it.kind {
            MemberKind::HardLink => {
                let t = dir.join(OsStr::from_bytes(it.link.as_ref().unwrap()));
                assert_eq!(m.ino(), fs::metadata(t).unwrap().ino(), "{name}: hard link");
                continue;
            }
            MemberKind::Symlink => {
                assert!(m.file_type().is_symlink(), "{name}");
                assert_eq!(
                    fs::read_link(&p).unwrap().as_os_str().as_bytes(),
                    &it.link.as_ref().unwrap()[..]
                );
            }
            MemberKind::Dir => assert!(m.is_dir(), "{name}"),
            MemberKind::Fifo => assert!(m.file_type().is_fifo(), "{name}"),
            MemberKind::File => {
                assert!(m.is_file(), "{name}");
                assert!(fs::read(&p).unwrap() == it.data, "{name}: contents");
            }
            _ => unreachable!(),
        }
        if it.kind != MemberKind::Symlink {
            assert_eq!(m.mode() & 0o7777, it.mode, "{name}: mode");
            assert_eq!(user_xattrs(&p), sorted_user(&it.xattrs), "{name}: xattrs");
        }
        assert_eq!(mtime_ns(&m), it.mtime_ns, "{name}: mtime");
        assert_eq!(
            (u64::from(m.uid()), u64::from(m.gid())),
            (it.uid, it.gid),
            "{name}: owner"
        );
    }
}

fn roundtrip(align: Option<u64>) {
    let items = items();
    let (bytes_, offsets) = build(&items, align);
    // Our own parser reads back exactly what was written.
    let ms = parse(&bytes_[..], bytes_.len() as u64).unwrap();
    assert_eq!(ms.len(), items.len());
    for ((m, it), off) in ms.iter().zip(&items).zip(&offsets) {
        assert_eq!(m.path, it.path);
        assert_eq!(m.kind, it.kind);
        assert_eq!(m.link_target, it.link);
        assert_eq!(m.mode, it.mode);
        assert_eq!((m.uid, m.gid), (it.uid, it.gid));
        assert_eq!(m.uname, it.uname);
        assert_eq!(m.gname, it.gname);
        assert_eq!(
            m.mtime_ns,
            it.mtime_ns,
            "{:?}",
            String::from_utf8_lossy(&it.path)
        );
        assert_eq!(m.xattrs, it.xattrs);
        if it.kind == MemberKind::File {
            assert_eq!(m.size, it.data.len() as u64);
            let mut got = Vec::new();
            for r in &m.data {
                assert_eq!(r.archive_offset, *off);
                got.extend_from_slice(
                    &bytes_[r.archive_offset as usize..(r.archive_offset + r.len) as usize],
                );
            }
            assert!(got == it.data);
        }
        if let Some(a) = align {
            assert_eq!(
                off % a,
                0,
                "{:?}: data not aligned",
                String::from_utf8_lossy(&it.path)
            );
        }
    }
    require_tool("tar");
    require_tool("bsdtar");
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a.tar");
    fs::write(&a, &bytes_).unwrap();
    let gnu_list = list_silently("tar", &a);
    let bsd_list = list_silently("bsdtar", &a);
    assert_eq!(gnu_list.lines().count(), items.len(), "{gnu_list}");
    assert_eq!(bsd_list.lines().count(), items.len(), "{bsd_list}");
    assert!(gnu_list.contains("日本語.txt") && gnu_list.contains(&"r".repeat(100)));

    let x1 = t.path().join("gnu");
    fs::create_dir(&x1).unwrap();
    let out = run(Command::new("tar")
        .arg("--xattrs")
        .arg("--xattrs-include=*")
        .arg("-xf")
        .arg(&a)
        .arg("-C")
        .arg(&x1));
    assert!(
        out.stderr.is_empty(),
        "tar -x: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_extracted(&x1, &items, "GNU tar");

    let x2 = t.path().join("bsd");
    fs::create_dir(&x2).unwrap();
    let out = run(Command::new("bsdtar")
        .arg("-xpf")
        .arg(&a)
        .arg("-C")
        .arg(&x2));
    assert!(
        out.stderr.is_empty(),
        "bsdtar -x: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_extracted(&x2, &items, "bsdtar");
}

#[test]
fn write_roundtrip_plain() {
    roundtrip(None);
}

#[test]
fn write_roundtrip_aligned_4096() {
    roundtrip(Some(4096));
}

#[test]
fn write_roundtrip_aligned_64k() {
    roundtrip(Some(65536));
}

#[test]
fn alignment_from_any_block_position() {
    let it = file(b"x", vec![1]);
    for pos in (0..64).map(|i| i * 512) {
        for a in [512u64, 1024, 4096, 1 << 20] {
            let h = write_header(&spec(&it), pos, Some(a));
            assert_eq!((pos + h.len() as u64) % a, 0, "pos {pos} align {a}");
            // No more than one alignment unit of padding beyond the minimum.
            assert!(h.len() as u64 <= a + 3 * 512);
        }
    }
    // A plain, already aligned header stays plain.
    assert_eq!(write_header(&spec(&it), 3584, Some(4096)).len(), 512);
    // Alignment that is not a power of two ≥ 512 is ignored.
    assert_eq!(write_header(&spec(&it), 0, Some(1000)).len(), 512);
}

/// A member of 9 GiB (its data a hole in a sparse archive file): both tools
/// list it with its size and the member after it, and we parse it back.
#[test]
fn huge_member() {
    for align in [None, Some(4096)] {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("huge.tar");
        let size = 9 * GIB + 123;
        let mut f = File::create(&a).unwrap();
        let big = Item {
            mtime_ns: 1_700_000_000_000_000_000,
            ..file(b"huge", Vec::new())
        };
        let mut s = spec(&big);
        s.size = size;
        let h = write_header(&s, 0, align);
        f.write_all(&h).unwrap();
        let after_pos = h.len() as u64 + size + data_padding(size);
        let small = file(b"after.txt", b"after the hole".to_vec());
        let h2 = write_header(&spec(&small), after_pos, align);
        f.set_len(after_pos).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&h2, after_pos).unwrap();
        let mut tail = small.data.clone();
        tail.resize(tail.len() + data_padding(tail.len() as u64) as usize, 0);
        tail.extend_from_slice(&END_OF_ARCHIVE);
        f.write_all_at(&tail, after_pos + h2.len() as u64).unwrap();
        drop(f);

        let f = File::open(&a).unwrap();
        let ms = parse(&f, f.metadata().unwrap().len()).unwrap();
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[0].size, size);
        assert_eq!(ms[0].data[0].archive_offset, h.len() as u64);
        assert_eq!(ms[1].path, b"after.txt");
        if let Some(al) = align {
            assert_eq!(ms[0].data[0].archive_offset % al, 0);
            assert_eq!(ms[1].data[0].archive_offset % al, 0);
        }
        for tool in ["tar", "bsdtar"] {
            require_tool(tool);
            let l = list_silently(tool, &a);
            assert!(l.contains(&size.to_string()), "{tool}: {l}");
            assert!(l.contains("after.txt"), "{tool}: {l}");
        }
    }
}

/// Times before 1970 round-trip through our own parser (pax decimal, as
/// POSIX reads it). Not extracted with the tools: GNU tar warns about
/// "implausibly old" times, and both GNU tar and bsdtar read "-86400.5" as
/// -86400 s + 0.5 s, unlike POSIX (and unlike what GNU tar itself writes).
#[test]
fn negative_times_parse_back() {
    for ns in [
        -86_400_500_000_000i64,
        -1,
        -1_000_000_000,
        -5_000_000_000_000,
    ] {
        let it = Item {
            mtime_ns: ns,
            ..file(b"old", b"before 1970".to_vec())
        };
        let (a, _) = build(&[it], None);
        let ms = parse(&a[..], a.len() as u64).unwrap();
        assert_eq!(ms[0].mtime_ns, ns);
    }
}
