//! 1. A mixed tree copied in with `cp -a` (and `rsync -aHAXS`), unmounted,
//! remounted and compared byte for byte and attribute for attribute.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SMALL_FILES: u64 = 3000;
const BIG: u64 = 200 << 20;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Where the sparse file has data: (offset, length, seed).
const SPARSE_DATA: [(u64, u64, u64); 3] = [(3 * MIB, MIB, 9001), (GIB + 12345, 2 * MIB, 9002), (2 * GIB - 5 * MIB, MIB, 9003)];
const SPARSE_SIZE: u64 = 2 * GIB;
/// The three names of one file.
const HARD3: [&str; 3] = ["hard/orig", "hard/second", "small/d0/third"];

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Builds the source tree on the local disk.
fn build_tree(src: &Path) {
    build_tree_with(src, SMALL_FILES, BIG);
}

/// The tree with `small_files` small files and three big files of about
/// `big` bytes (the cloud tests use a smaller one).
pub(crate) fn build_tree_with(src: &Path, small_files: u64, big: u64) {
    let mut rng = Rng::new(42);
    fs::create_dir(src).unwrap();

    // ~3,000 small files (0 B – 16 KiB) in 81 nested directories.
    let small = src.join("small");
    fs::create_dir(&small).unwrap();
    let mut dirs = vec![small.clone()];
    for a in 0..8 {
        let da = small.join(format!("d{a}"));
        fs::create_dir(&da).unwrap();
        dirs.push(da.clone());
        for b in 0..3 {
            let db = da.join(format!("e{b}"));
            fs::create_dir(&db).unwrap();
            dirs.push(db.clone());
            for c in 0..2 {
                let dc = db.join(format!("g{c}"));
                fs::create_dir(&dc).unwrap();
                dirs.push(dc);
            }
        }
    }
    for i in 0..small_files {
        // The first ten sit in small/ itself: links and xattrs name them.
        let dir = &dirs[if i < 10 { 0 } else { rng.below(dirs.len() as u64) as usize }];
        let len = if i % 50 == 0 { 0 } else { rng.below(16 * 1024 + 1) };
        let p = dir.join(format!("file{i:04}.dat"));
        write_random_file(&p, 1000 + i, len);
        if i % 7 == 0 {
            lchown(&p, 1000 + (i % 3) as u32, 1000 + (i % 5) as u32);
        }
        chmod(&p, [0o600, 0o644, 0o640, 0o755, 0o444][(i % 5) as usize]);
    }
    let long = "x".repeat(255);
    for (k, name) in ["with space and 'quote'", "ünïcødé-ファイル.txt", ".hidden", "-dash", long.as_str()]
        .iter()
        .enumerate()
    {
        write_random_file(&small.join(name), 5000 + k as u64, 100 * k as u64 + 1);
    }

    // Three ~200 MiB incompressible files.
    fs::create_dir(src.join("big")).unwrap();
    for k in 0..3u64 {
        write_random_file(&src.join(format!("big/big{k}.bin")), 7000 + k, big + k * 4099);
    }

    // A 2 GiB sparse file with data at three offsets, ending in a hole.
    let f = fs::File::create(src.join("sparse.img")).unwrap();
    for (off, len, seed) in SPARSE_DATA {
        f.write_all_at(&gen(seed, len as usize), off).unwrap();
    }
    f.set_len(SPARSE_SIZE).unwrap();
    drop(f);

    // Symlinks: relative, absolute, dangling, to a directory, long.
    let links = src.join("links");
    fs::create_dir(&links).unwrap();
    symlink("../small/file0001.dat", links.join("rel")).unwrap();
    symlink("/etc/passwd", links.join("abs")).unwrap();
    symlink("no/such/target", links.join("dangling")).unwrap();
    symlink("../small", links.join("dir")).unwrap();
    symlink("y".repeat(1000), links.join("long")).unwrap();
    lchown(&links.join("rel"), 1000, 1000);
    lchown(&links.join("dangling"), 1001, 1002);

    // Hard links: one file with three names (two directories), one empty
    // file with two.
    fs::create_dir(src.join("hard")).unwrap();
    write_random_file(&src.join(HARD3[0]), 6000, 100 * 1024);
    for name in &HARD3[1..] {
        fs::hard_link(src.join(HARD3[0]), src.join(name)).unwrap();
    }
    fs::File::create(src.join("hard/pair1")).unwrap();
    fs::hard_link(src.join("hard/pair1"), src.join("hard/pair2")).unwrap();
    lchown(&src.join(HARD3[0]), 1000, 1000);
    chmod(&src.join(HARD3[0]), 0o640);

    // Modes and owners (chown first: it clears set-id bits).
    let modes = src.join("modes");
    fs::create_dir(&modes).unwrap();
    let files: [(&str, u32, u32, u32); 6] = [
        ("m0600", 0o600, 1000, 1000),
        ("m0755", 0o755, 1001, 1002),
        ("m4755", 0o4755, 0, 1000),
        ("m2755", 0o2755, 1000, 1001),
        ("m0444", 0o444, 65534, 65534),
        ("m0000", 0o000, 0, 0),
    ];
    for (k, (name, mode, uid, gid)) in files.iter().enumerate() {
        let p = modes.join(name);
        write_random_file(&p, 8000 + k as u64, 1000 + k as u64);
        lchown(&p, *uid, *gid);
        chmod(&p, *mode);
    }
    let dirmodes: [(&str, u32, u32, u32); 3] = [
        ("sticky", 0o1777, 1000, 1000),
        ("private", 0o700, 65534, 65534),
        ("setgid-dir", 0o2775, 0, 1000),
    ];
    for (name, mode, uid, gid) in dirmodes {
        let p = modes.join(name);
        fs::create_dir(&p).unwrap();
        write_random_file(&p.join("inside"), 8100, 333);
        lchown(&p, uid, gid);
        chmod(&p, mode);
    }
    let fifo = cpath(&modes.join("fifo"));
    // SAFETY: valid path string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);

    // xattrs on files and directories.
    set_xattr(&src.join(HARD3[0]), "user.comment", b"hello, cairn");
    set_xattr(&src.join(HARD3[0]), "user.empty", b"");
    set_xattr(&src.join(HARD3[0]), "user.binary", &gen(77, 256));
    set_xattr(&src.join("small/file0002.dat"), "user.big", &gen(78, 4000));
    set_xattr(&src.join("small/d1"), "user.dir", b"directory attribute");
    set_xattr(&modes.join("sticky"), "user.tag", b"sticky");
    set_xattr(&modes.join("m4755"), "user.suid", b"yes");
    set_xattr(&src.join("big/big0.bin"), "user.size", b"200M");
    for k in 0..20 {
        set_xattr(&modes.join("m0600"), &format!("user.k{k:02}"), format!("value {k}").as_bytes());
    }

    // Past times with nanoseconds on everything, children before parents.
    fn stamp(p: &Path, rng: &mut Rng) {
        let md = fs::symlink_metadata(p).unwrap();
        if md.is_dir() {
            let mut names: Vec<_> = fs::read_dir(p).unwrap().map(|e| e.unwrap().path()).collect();
            names.sort();
            for c in names {
                stamp(&c, rng);
            }
        }
        let ns = match rng.below(10) {
            0 => 0,
            1 => 999_999_999,
            _ => rng.below(1_000_000_000) as i64,
        };
        let mtime = 1_000_000_000 + rng.below(600_000_000) as i64;
        set_times(p, (mtime + 1000, 123_456_789), (mtime, ns));
    }
    stamp(src, &mut rng);
}

#[derive(Default)]
struct LinkMap {
    /// source inode -> (names, inode in the copy of each name)
    groups: BTreeMap<u64, Vec<(PathBuf, u64)>>,
}

/// Compares `src` and `dst` recursively; every difference becomes a line.
fn compare_trees(src: &Path, dst: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut links = LinkMap::default();
    walk(src, dst, Path::new(""), &mut problems, &mut links);
    // Hard-link structure: names of one source inode share one inode in the
    // copy, and different source inodes do not.
    let mut owner: BTreeMap<u64, u64> = BTreeMap::new();
    for (sino, names) in &links.groups {
        let dinos: BTreeSet<u64> = names.iter().map(|(_, i)| *i).collect();
        if dinos.len() != 1 {
            problems.push(format!(
                "hard links {:?}: inodes {:?} in the copy, expected one",
                names.iter().map(|(p, _)| p).collect::<Vec<_>>(),
                dinos
            ));
        }
        for d in dinos {
            if let Some(prev) = owner.insert(d, *sino) {
                problems.push(format!("inode {d} in the copy stands for two source inodes {prev} and {sino}"));
            }
        }
    }
    problems
}

fn walk(s: &Path, d: &Path, rel: &Path, problems: &mut Vec<String>, links: &mut LinkMap) {
    let sm = fs::symlink_metadata(s).unwrap();
    let dm = match fs::symlink_metadata(d) {
        Ok(m) => m,
        Err(e) => return problems.push(format!("{}: {e}", rel.display())),
    };
    let mut diff = |what: &str, a: String, b: String| {
        if a != b {
            problems.push(format!("{}: {what} {a} in the source, {b} in the copy", rel.display()));
        }
    };
    diff("mode", format!("{:o}", sm.mode()), format!("{:o}", dm.mode()));
    diff("uid", sm.uid().to_string(), dm.uid().to_string());
    diff("gid", sm.gid().to_string(), dm.gid().to_string());
    diff(
        "mtime",
        format!("{}.{:09}", sm.mtime(), sm.mtime_nsec()),
        format!("{}.{:09}", dm.mtime(), dm.mtime_nsec()),
    );
    if !sm.is_symlink() {
        diff("nlink", sm.nlink().to_string(), dm.nlink().to_string());
    }
    if sm.file_type().is_dir() != dm.file_type().is_dir() || sm.file_type().is_symlink() != dm.file_type().is_symlink() {
        return problems.push(format!("{}: file type differs", rel.display()));
    }
    if sm.is_file() || sm.is_symlink() {
        diff("size", sm.len().to_string(), dm.len().to_string());
    }
    if !sm.is_symlink() {
        match (xattrs(s), xattrs(d)) {
            (Ok(a), Ok(b)) => {
                let user = |v: Vec<(Vec<u8>, Vec<u8>)>| v.into_iter().filter(|(n, _)| n.starts_with(b"user.")).collect::<Vec<_>>();
                let (a, b) = (user(a), user(b));
                if a != b {
                    let names = |v: &[(Vec<u8>, Vec<u8>)]| {
                        v.iter()
                            .map(|(n, x)| format!("{}={}B", String::from_utf8_lossy(n), x.len()))
                            .collect::<Vec<_>>()
                    };
                    problems.push(format!("{}: xattrs {:?} in the source, {:?} in the copy", rel.display(), names(&a), names(&b)));
                }
            }
            (a, b) => problems.push(format!("{}: listxattr {:?} / {:?}", rel.display(), a.err(), b.err())),
        }
    }
    if sm.is_symlink() {
        let (a, b) = (fs::read_link(s).unwrap(), fs::read_link(d));
        match b {
            Ok(b) if a == b => {}
            b => problems.push(format!("{}: symlink target {a:?} in the source, {b:?} in the copy", rel.display())),
        }
    } else if sm.is_file() {
        if sm.nlink() > 1 {
            links.groups.entry(sm.ino()).or_default().push((rel.to_path_buf(), dm.ino()));
        }
        if let Err(e) = compare_files(s, d) {
            problems.push(e);
        }
    } else if sm.is_dir() {
        let names = |p: &Path| -> Result<BTreeSet<std::ffi::OsString>, String> {
            fs::read_dir(p)
                .map_err(|e| format!("readdir {}: {e}", p.display()))?
                .map(|e| e.map(|e| e.file_name()).map_err(|e| format!("readdir {}: {e}", p.display())))
                .collect()
        };
        let a = names(s).unwrap();
        let b = match names(d) {
            Ok(b) => b,
            Err(e) => return problems.push(e),
        };
        for extra in b.difference(&a) {
            problems.push(format!("{}: unexpected entry {extra:?} in the copy", rel.display()));
        }
        for name in &a {
            if !b.contains(name) {
                problems.push(format!("{}: entry {name:?} missing in the copy", rel.display()));
                continue;
            }
            walk(&s.join(name), &d.join(name), &rel.join(name), problems, links);
        }
    }
}

/// Compares one copy and checks the things the issue names explicitly.
pub(crate) fn check_copy(src: &Path, copy: &Path, how: &str) {
    let t = Instant::now();
    let problems = compare_trees(src, copy);
    assert!(
        problems.is_empty(),
        "{how}: {} differences after remount, first ones:\n{}",
        problems.len(),
        problems.iter().take(60).cloned().collect::<Vec<_>>().join("\n")
    );
    // The three names of one file are one inode in the mount.
    let inos: Vec<(u64, u64)> = HARD3
        .iter()
        .map(|n| fs::metadata(copy.join(n)).map(|m| (m.ino(), m.nlink())).unwrap())
        .collect();
    assert!(inos.iter().all(|x| *x == (inos[0].0, 3)), "{how}: hard links (ino, nlink) = {inos:?}");
    // The sparse file stays sparse.
    let m = fs::metadata(copy.join("sparse.img")).unwrap();
    assert_eq!(m.len(), SPARSE_SIZE, "{how}: sparse file size");
    assert!(
        m.blocks() * 512 < 64 * MIB,
        "{how}: sparse file of {} bytes uses {} bytes of blocks",
        m.len(),
        m.blocks() * 512
    );
    // Symlinks resolve inside the mount (relative) and as written (absolute).
    assert_eq!(
        fs::read(copy.join("links/rel")).unwrap(),
        fs::read(src.join("small/file0001.dat")).unwrap(),
        "{how}: reading through links/rel"
    );
    eprintln!("roundtrip: compared {how} copy in {:.1?}", t.elapsed());
}

#[test]
fn mixed_tree_round_trip() {
    cairn_testing::require_tool("rsync");
    let _serial = serial();
    let env = Env::new("roundtrip");
    let src = env.path("src");
    let t = Instant::now();
    build_tree(&src);
    let sm = fs::metadata(src.join("sparse.img")).unwrap();
    assert!(
        sm.blocks() * 512 < 64 * MIB,
        "the source file system did not keep sparse.img sparse; cannot test"
    );
    eprintln!("roundtrip: built the source tree in {:.1?}", t.elapsed());

    let m = env.mount();
    let t = Instant::now();
    let out = run(Command::new("cp").arg("-a").arg(&src).arg(m.join("cp")));
    assert!(out.ok(), "cp -a into the mount: {out}");
    eprintln!("roundtrip: cp -a in {:.1?}", t.elapsed());
    let t = Instant::now();
    // -A: the source has no extended ACLs, so rsync sets none (Cairn
    // refuses system.* xattrs by design); -S keeps sparse.img sparse.
    let out = run(Command::new("rsync")
        .arg("-aHAXS")
        .arg("--numeric-ids")
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", m.join("rsync").display())));
    assert!(out.ok(), "rsync -aHAXS into the mount: {out}");
    eprintln!("roundtrip: rsync -aHAXS in {:.1?}", t.elapsed());
    m.umount();

    let m = env.mount();
    check_copy(&src, &m.join("cp"), "cp -a");
    check_copy(&src, &m.join("rsync"), "rsync -aHAXS");
    m.umount();

    let t = Instant::now();
    let rep = env.assert_fsck_clean(|_| false);
    eprintln!("roundtrip: fsck --read-data in {:.1?}: {rep}", t.elapsed());
}

/// The checker itself must see every kind of difference it claims to check
/// (local disk only, no mount).
#[test]
fn compare_trees_catches_differences() {
    let env = Env::bare("compare-selftest");
    let (src, dst) = (env.path("src"), env.path("dst"));
    fs::create_dir_all(src.join("d")).unwrap();
    for (name, seed) in [("a", 1), ("b", 2), ("c", 3), ("e", 4)] {
        write_random_file(&src.join(name), seed, 5000);
    }
    fs::hard_link(src.join("a"), src.join("d/a2")).unwrap();
    fs::hard_link(src.join("e"), src.join("d/e2")).unwrap();
    symlink("a", src.join("l")).unwrap();
    set_xattr(&src.join("b"), "user.x", b"1");
    set_times(&src.join("c"), (1, 0), (1_000_000_000, 5));
    assert!(run(Command::new("cp").arg("-a").arg(&src).arg(&dst)).ok());
    assert_eq!(compare_trees(&src, &dst), Vec::<String>::new(), "cp -a copy on the local disk");

    // One difference of each kind.
    fs::OpenOptions::new()
        .write(true)
        .open(dst.join("a"))
        .unwrap()
        .write_all_at(b"!", 4000)
        .unwrap();
    set_xattr(&dst.join("b"), "user.x", b"2");
    set_times(&dst.join("c"), (1, 0), (1_000_000_000, 6));
    fs::remove_file(dst.join("d/e2")).unwrap();
    fs::copy(dst.join("e"), dst.join("d/e2")).unwrap();
    set_times(
        &dst.join("d"),
        (1, 0),
        (fs::metadata(src.join("d")).unwrap().mtime(), fs::metadata(src.join("d")).unwrap().mtime_nsec()),
    );
    fs::remove_file(dst.join("l")).unwrap();
    symlink("b", dst.join("l")).unwrap();
    chmod(&dst.join("a"), 0o600);
    lchown(&dst.join("b"), 1000, 0);
    fs::write(dst.join("extra"), b"").unwrap();
    let p = compare_trees(&src, &dst).join("\n");
    for want in [
        "differ at byte 4000",
        "b: xattrs",
        "c: mtime 1000000000.000000005",
        "d/e2: nlink 2",
        "hard links",
        "l: symlink target",
        "a: mode",
        "b: uid",
        "unexpected entry \"extra\"",
    ] {
        assert!(p.contains(want), "the checker missed {want:?}; it reported:\n{p}");
    }
}
