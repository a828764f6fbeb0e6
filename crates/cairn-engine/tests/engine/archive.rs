//! Zero-copy tar archives inside a volume: create, extract, move/consume,
//! alignment, and refusals that leave nothing half-made.

use crate::common::*;
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;
use cairn_testing::ustar_header;

fn opts(align: Option<u64>, remove: bool) -> ArchiveOptions {
    ArchiveOptions { align, remove, caller: root() }
}

fn src(v: &Volume, path: &str) -> ArchiveSource {
    let (parent, entry) = v.resolve_parent(path.as_bytes()).unwrap();
    ArchiveSource { name: path.as_bytes().to_vec(), ino: v.resolve(path.as_bytes()).unwrap(), parent, entry }
}

/// A tree with every kind tar records: sizes 0 .. several chunks, a
/// symlink, a hard link, a fifo, xattrs, odd modes and nanosecond mtimes.
fn make_tree(v: &Volume) {
    let d = v.mkdir(ROOT_INO, b"proj", 0o750, root()).unwrap().ino;
    let sub = v.mkdir(d, b"sub", 0o700, root()).unwrap().ino;
    for (i, len) in [0usize, 1, 511, 512, 513, 100_000, 300_000].into_iter().enumerate() {
        let f = mkfile(v, if i % 2 == 0 { d } else { sub }, &format!("f{i}"), &random_bytes(i as u64 + 100, len));
        v.setattr(f, &SetAttr { perm: Some(0o640 + i as u32), uid: Some(1000 + i as u32), gid: Some(50), mtime: Some(SetTime::At(Timestamp(1_600_000_000_123_456_789 + i as i64))), ..Default::default() }).unwrap();
    }
    let f = v.resolve(b"proj/sub/f5").unwrap();
    v.link(f, d, b"hard").unwrap();
    v.setxattr(f, b"user.mime", b"text/plain", Default::default()).unwrap();
    v.symlink(d, b"ln", b"sub/f5", root()).unwrap();
    v.create(sub, b"pipe", FileKind::Fifo, 0o600, 0, root()).unwrap();
}

/// Every entry below `path`: (relative path, kind, perm, uid, gid, size, mtime, nlink, target or content).
fn snapshot_of(v: &Volume, path: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), v.resolve(path.as_bytes()).unwrap())];
    while let Some((rel, ino)) = stack.pop() {
        let a = v.getattr(ino).unwrap();
        let body = match a.kind {
            FileKind::File => format!("{:?}", blake(&read_all(v, ino))),
            FileKind::Symlink => String::from_utf8(v.readlink(ino).unwrap()).unwrap(),
            _ => String::new(),
        };
        let xattrs: Vec<(Vec<u8>, Vec<u8>)> = v.listxattr(ino).unwrap().into_iter().map(|n| { let val = v.getxattr(ino, &n).unwrap(); (n, val) }).collect();
        let mtime = if a.kind == FileKind::Dir { 0 } else { a.mtime.0 };
        out.push((rel.clone(), format!("{:?} {:o} {} {} {} {} {} {body} {xattrs:?}", a.kind, a.perm, a.uid, a.gid, if a.kind == FileKind::Dir { 0 } else { a.size }, mtime, a.nlink)));
        if a.kind == FileKind::Dir {
            for e in v.readdir(ino).unwrap() {
                let n = String::from_utf8(e.name.clone()).unwrap();
                if n != "." && n != ".." {
                    stack.push((format!("{rel}/{n}"), e.ino));
                }
            }
        }
    }
    out.sort();
    out
}

fn blake(b: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

#[test]
fn create_then_extract_is_identical_and_copies_no_data() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    make_tree(&v);
    v.flush_now().unwrap();
    let before = stored_pack_bytes(d.path());
    let rep = v.archive_create(&[src(&v, "proj")], ROOT_INO, b"proj.tar", opts(None, false)).unwrap();
    assert_eq!(rep.members, 12, "{rep:?}");
    let grew = stored_pack_bytes(d.path()) - before;
    assert!(grew < 64 << 10, "creating the archive stored {grew} bytes");
    // The bytes are a valid tar whose members hold the files' bytes.
    let tar = read_all(&v, rep.ino);
    assert_eq!(tar.len() as u64, rep.archive_bytes);
    let members = cairn_tar::parse(&tar, tar.len() as u64).unwrap();
    assert_eq!(members.len(), 12);
    // `proj/hard` comes first in name order: it carries the data, f5 links to it.
    let f5 = members.iter().find(|m| m.path == b"proj/hard").unwrap();
    assert_eq!(f5.kind, cairn_tar::MemberKind::File);
    let r = f5.data[0];
    assert_eq!(&tar[r.archive_offset as usize..(r.archive_offset + r.len) as usize], &read_all(&v, v.resolve(b"proj/sub/f5").unwrap())[..]);
    let link = members.iter().find(|m| m.path == b"proj/sub/f5").unwrap();
    assert_eq!((link.kind, link.link_target.as_deref()), (cairn_tar::MemberKind::HardLink, Some(&b"proj/hard"[..])));
    // Extract elsewhere: the same tree.
    let before = stored_pack_bytes(d.path());
    let out = v.mkdir(ROOT_INO, b"out", 0o755, root()).unwrap().ino;
    let rep2 = v.archive_extract(rep.ino, out, b"x", None, root()).unwrap();
    assert_eq!(stored_pack_bytes(d.path()), before, "extracting stored data");
    assert_eq!(rep2.members, 12);
    assert_eq!(snapshot_of(&v, "proj"), snapshot_of(&v, "out/x/proj"));
    assert!(maintenance::fsck(&v, true, &NoProgress).unwrap().errors.is_empty());
}

#[test]
fn aligned_members_start_on_4096_and_move_consume_round_trip() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    make_tree(&v);
    let want = snapshot_of(&v, "proj");
    let rep = v.archive_create(&[src(&v, "proj")], ROOT_INO, b"a.tar", opts(Some(4096), true)).unwrap();
    assert!(v.resolve(b"proj").is_err(), "the sources were moved into the archive");
    let tar = read_all(&v, rep.ino);
    for m in cairn_tar::parse(&tar, tar.len() as u64).unwrap() {
        if let Some(r) = m.data.first() {
            assert_eq!(r.archive_offset % 4096, 0, "{:?} data at {}", String::from_utf8_lossy(&m.path), r.archive_offset);
        }
    }
    let a = v.resolve(b"a.tar").unwrap();
    v.archive_extract(a, ROOT_INO, b"back", Some((ROOT_INO, b"a.tar".to_vec())), root()).unwrap();
    assert!(v.resolve(b"a.tar").is_err(), "the archive was consumed");
    assert_eq!(snapshot_of(&v, "back/proj"), want);
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    assert_eq!(snapshot_of(&v, "back/proj"), want);
    maintenance::gc(&v, 0.5, &NoProgress).unwrap();
    assert_eq!(snapshot_of(&v, "back/proj"), want);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

/// A tar holding `members` (path, kind, link target, data), built with the
/// header writer: it records whatever it is given, hostile names included.
fn hostile_tar(members: &[(&[u8], cairn_tar::MemberKind, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, kind, target, data) in members {
        let spec = cairn_tar::HeaderSpec {
            path, kind: *kind, link_target: target.map(|t| t.as_bytes()), mode: 0o644, uid: 0, gid: 0,
            uname: None, gname: None, mtime_ns: 0, atime_ns: None, size: data.len() as u64, dev_major: 0, dev_minor: 0, xattrs: &[],
        };
        out.extend(cairn_tar::write_header(&spec, out.len() as u64, None));
        out.extend_from_slice(data);
        out.resize(out.len() + cairn_tar::data_padding(data.len() as u64) as usize, 0);
    }
    out.extend_from_slice(&cairn_tar::END_OF_ARCHIVE);
    out
}

#[test]
fn bad_archives_are_refused_and_nothing_is_made() {
    use cairn_tar::MemberKind::*;
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let dest = v.mkdir(ROOT_INO, b"dest", 0o755, root()).unwrap().ino;
    mkfile(&v, dest, "taken", b"mine");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dotdot", hostile_tar(&[(b"ok", File, None, b"x"), (b"../evil", File, None, b"x")])),
        ("absolute", hostile_tar(&[(b"/etc/evil", File, None, b"x")])),
        ("symlink trick", hostile_tar(&[(b"a", Symlink, Some("/etc"), b""), (b"a/passwd", File, None, b"x")])),
        ("taken name", hostile_tar(&[(b"new", File, None, b"x"), (b"taken", File, None, b"theirs")])),
        ("hard link outside", hostile_tar(&[(b"h", HardLink, Some("../../etc/shadow"), b"")])),
        ("not utf-8", hostile_tar(&[(b"bad\xff", File, None, b"x")])),
    ];
    for (what, bytes) in cases {
        let f = mkfile(&v, ROOT_INO, "t.tar", &bytes);
        let e = v.archive_extract(f, ROOT_INO, b"dest", None, root());
        let msg = e.expect_err(what).to_string();
        eprintln!("{what}: {msg}");
        let want = match what {
            "dotdot" | "hard link outside" => "..",
            "absolute" => "absolute",
            "symlink trick" => "not a directory",
            "taken name" => "already holds",
            _ => "UTF-8",
        };
        assert!(msg.contains(want), "{what}: {msg}");
        let names: Vec<Vec<u8>> = v.readdir(dest).unwrap().into_iter().map(|e| e.name).filter(|n| n != b"." && n != b"..").collect();
        assert_eq!(names, vec![b"taken".to_vec()], "{what}: DEST changed");
        assert_eq!(read_all(&v, v.resolve(b"dest/taken").unwrap()), b"mine");
        v.unlink(ROOT_INO, b"t.tar").unwrap();
    }
    // Truncated and corrupted archives: an error naming the problem.
    let good = hostile_tar(&[(b"a", File, None, &random_bytes(1, 5000))]);
    let f = mkfile(&v, ROOT_INO, "cut.tar", &good[..3000]);
    let e = v.archive_extract(f, ROOT_INO, b"o1", None, root()).unwrap_err();
    assert!(e.to_string().contains("tar"), "{e}");
    let mut bad = good.clone();
    bad[148] ^= 1; // checksum field
    let f = mkfile(&v, ROOT_INO, "sum.tar", &bad);
    assert!(v.archive_extract(f, ROOT_INO, b"o2", None, root()).is_err());
    assert!(v.resolve(b"o1").is_err() && v.resolve(b"o2").is_err(), "a failed extract left a directory");
    assert!(maintenance::fsck(&v, true, &NoProgress).unwrap().errors.is_empty());
}

/// Reads a volume file for the tar parser.
struct VolReader<'a>(&'a Volume, Ino);

impl cairn_tar::ReadAt for VolReader<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let got = self.0.read(self.1, offset, buf.len() as u32).map_err(|e| std::io::Error::other(e.to_string()))?;
        buf[..got.len()].copy_from_slice(&got);
        Ok(got.len())
    }
}

#[test]
fn members_over_8_gib_use_pax_sizes_and_stay_sparse() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let dir = v.mkdir(ROOT_INO, b"big", 0o755, root()).unwrap().ino;
    let f = v.create(dir, b"huge", FileKind::File, 0o644, 0, root()).unwrap().ino;
    let size = 9u64 << 30;
    v.setattr(f, &SetAttr { size: Some(size), ..Default::default() }).unwrap();
    v.write(f, size - 5, b"tail!").unwrap();
    let rep = v.archive_create(&[src(&v, "big")], ROOT_INO, b"big.tar", opts(None, false)).unwrap();
    let members = cairn_tar::parse(&VolReader(&v, rep.ino), rep.archive_bytes).unwrap();
    let m = members.iter().find(|m| m.path == b"big/huge").unwrap();
    assert_eq!(m.size, size);
    // The 8-GiB-plus ustar size field cannot hold it: a pax record does.
    let hdr = v.read(rep.ino, m.header_offset, 1024).unwrap();
    assert_eq!(hdr[156], b'x', "a pax extended header comes first");
    assert!(String::from_utf8_lossy(&hdr[512..1024]).contains(&format!("size={size}")));
    v.archive_extract(rep.ino, ROOT_INO, b"out", None, root()).unwrap();
    let x = v.resolve(b"out/big/huge").unwrap();
    let a = v.getattr(x).unwrap();
    assert_eq!(a.size, size);
    assert!(a.blocks * 512 < 1 << 20, "the extracted copy is not sparse: {} blocks", a.blocks);
    assert_eq!(v.read(x, size - 5, 5).unwrap(), b"tail!");
    assert!(maintenance::fsck(&v, false, &NoProgress).unwrap().errors.is_empty());
}

/// A hostile metadata database: DEST's directory entry names an inode row
/// that is gone. Extraction reports corruption; it does not panic.
#[test]
fn extract_into_a_dangling_entry_reports_corruption() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    mkfile(&v, ROOT_INO, "m", &random_bytes(9, 5000));
    v.archive_create(&[src(&v, "m")], ROOT_INO, b"a.tar", opts(None, false)).unwrap();
    let dest = v.mkdir(ROOT_INO, b"dest", 0o755, root()).unwrap().ino;
    v.close().unwrap();
    drop(v);
    meta_sql(d.path(), &format!("DELETE FROM inodes WHERE ino = {dest}"));
    let v = open(d.path());
    let a = v.resolve(b"a.tar").unwrap();
    let e = v.archive_extract(a, ROOT_INO, b"dest", None, root()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn names_and_xattrs_past_linux_limits_are_refused_and_nothing_is_made() {
    use cairn_tar::MemberKind::*;
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let x300 = [b"top/".to_vec(), vec![b'x'; 300]].concat();
    let x2000 = [b"top/".to_vec(), vec![b'y'; 2000]].concat();
    // A 10 MiB GNU long name (a directory, as the report's was).
    let mut gnu = ustar_header(b"././@LongLink", b'L', 10 << 20).to_vec();
    gnu.extend(b"d/".repeat(5 << 20));
    gnu.extend(ustar_header(b"short/", b'5', 0));
    gnu.extend_from_slice(&cairn_tar::END_OF_ARCHIVE);
    let with_xattr = |name: &[u8], value: Vec<u8>| {
        let x = vec![(name.to_vec(), value)];
        let spec = cairn_tar::HeaderSpec {
            path: b"has-xattr", kind: File, link_target: None, mode: 0o644, uid: 0, gid: 0,
            uname: None, gname: None, mtime_ns: 0, atime_ns: None, size: 0, dev_major: 0, dev_minor: 0, xattrs: &x,
        };
        let mut out = hostile_tar(&[(b"first", File, None, b"x")]);
        out.truncate(out.len() - cairn_tar::END_OF_ARCHIVE.len());
        out.extend(cairn_tar::write_header(&spec, out.len() as u64, None));
        out.extend_from_slice(&cairn_tar::END_OF_ARCHIVE);
        out
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("300-byte name", hostile_tar(&[(b"ok", File, None, b"x"), (&x300, File, None, b"x")]), "component of 300 bytes"),
        ("2000-byte name", hostile_tar(&[(&x2000, Dir, None, b"")]), "component of 2000 bytes"),
        ("10 MiB GNU long name", gnu, "GNU long name"),
        ("big xattr", with_xattr(b"user.big", vec![7; (64 << 10) + 1]), "member \"has-xattr\""),
        ("long xattr name", with_xattr(&[b"user.".to_vec(), vec![b'n'; 300]].concat(), b"v".to_vec()), "member \"has-xattr\""),
    ];
    for (what, bytes, want) in cases {
        let f = mkfile(&v, ROOT_INO, "t.tar", &bytes);
        let msg = v.archive_extract(f, ROOT_INO, b"dest", None, root()).expect_err(what).to_string();
        eprintln!("{what}: {msg}");
        assert!(msg.contains(want), "{what}: {msg}");
        assert!(msg.len() < 1000, "{what}: a {} byte message", msg.len());
        assert!(v.resolve(b"dest").is_err(), "{what}: a refused extract made something");
        v.unlink(ROOT_INO, b"t.tar").unwrap();
    }
    // At the limits: extracted, and read back whole.
    let n255 = [b"top/".to_vec(), vec![b'z'; 255]].concat();
    let ok = with_xattr(b"user.big", vec![7; 64 << 10]);
    let mut ok2 = hostile_tar(&[(&n255, File, None, b"edge")]);
    ok2.truncate(ok2.len() - cairn_tar::END_OF_ARCHIVE.len());
    ok2.extend_from_slice(&ok[..ok.len()]);
    let f = mkfile(&v, ROOT_INO, "t.tar", &ok2);
    v.archive_extract(f, ROOT_INO, b"dest", None, root()).unwrap();
    let i = v.resolve(&[b"dest/".to_vec(), n255].concat()).unwrap();
    assert_eq!(read_all(&v, i), b"edge");
    let i = v.resolve(b"dest/has-xattr").unwrap();
    assert_eq!(v.getxattr(i, b"user.big").unwrap(), vec![7; 64 << 10]);
    assert!(maintenance::fsck(&v, true, &NoProgress).unwrap().errors.is_empty());
}
