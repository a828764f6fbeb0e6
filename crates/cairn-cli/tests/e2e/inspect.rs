//! `cairn info`, `cairn warmup` and `cairn stats DIR` through the binary
//! on a mounted volume in a local directory.

use crate::common::*;
use std::ffi::OsStr;

fn json(args: &[&OsStr]) -> serde_json::Value {
    let out = cairn_ok(args);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{out}"))
}

#[test]
fn info_warmup_and_tree_stats_on_a_local_volume() {
    let _serial = serial();
    let env = Env::new("inspect");
    let m = env.mount();
    std::fs::create_dir(m.join("a")).unwrap();
    std::fs::create_dir(m.join("b")).unwrap();
    write_random_file(&m.join("a/x"), 11, 3 << 20);
    write_random_file(&m.join("b/y"), 11, 3 << 20);
    write_random_file(&m.join("a/z"), 12, 1 << 20);
    let (a, x, z) = (m.join("a"), m.join("a/x"), m.join("a/z"));

    // The tree: x's chunks are shared with b/y, z's are the tree's alone.
    let s = json(&[OsStr::new("stats"), a.as_os_str(), OsStr::new("--json")]);
    assert_eq!((s["files"].as_u64(), s["directories"].as_u64()), (Some(2), Some(1)), "{s}");
    assert_eq!(s["logical_bytes"].as_u64(), Some(4 << 20), "{s}");
    assert_eq!(s["shared_bytes"].as_u64(), Some(3 << 20), "{s}");
    assert_eq!(s["exclusive_bytes"].as_u64(), Some(1 << 20), "{s}");
    let out = cairn_ok([OsStr::new("stats"), a.as_os_str()]);
    assert!(out.stdout.contains("exclusive") && out.stdout.contains("1.00 MiB") && out.stdout.contains("3.00 MiB"), "{out}");
    // The volume itself still answers with the whole-volume stats.
    assert_eq!(env.stats()["files"].as_u64(), Some(3));

    // info: every chunk of x has two references and is in a local pack.
    let i = json(&[OsStr::new("info"), x.as_os_str(), OsStr::new("--json")]);
    assert_eq!(i["size"].as_u64(), Some(3 << 20), "{i}");
    let runs = i["runs"].as_array().unwrap();
    assert!(!runs.is_empty());
    for r in runs {
        assert_eq!((r["refs"].as_u64(), r["place"].as_str()), (Some(2), Some("local")), "{r}");
        let pack = r["pack"].as_str().unwrap();
        assert!(env.packs().iter().any(|p| p.to_string_lossy().ends_with(pack)), "{pack} is no pack file in {:?}", env.packs());
    }
    let out = cairn_ok([OsStr::new("info"), z.as_os_str()]);
    assert!(out.stdout.contains("1.00 MiB exclusive") && out.stdout.contains("local"), "{out}");
    let out = cairn_ok([OsStr::new("info"), a.as_os_str()]);
    assert!(out.stdout.contains("2 entries"), "{out}");

    // warmup on a volume in a local directory reads its packs once.
    let w = json(&[OsStr::new("warmup"), a.as_os_str(), OsStr::new("--json")]);
    assert_eq!((w["local"].as_bool(), w["files"].as_u64()), (Some(true), Some(2)), "{w}");
    assert!(w["fetched_bytes"].as_u64().unwrap() >= 4 << 20 && w["reads"].as_u64().unwrap() > 0, "{w}");
    let out = cairn_ok([OsStr::new("warmup"), x.as_os_str(), z.as_os_str()]);
    assert!(out.stdout.contains("page cache"), "{out}");
    // `tape recall` is the same command.
    let r = json(&[OsStr::new("tape"), OsStr::new("recall"), x.as_os_str(), OsStr::new("--json")]);
    assert_eq!(r["files"].as_u64(), Some(1), "{r}");

    // Errors say what is wrong and exit non-zero.
    let out = cairn([OsStr::new("info"), m.join("a/missing").as_os_str()]);
    assert!(!out.ok() && out.stderr.contains("missing"), "{out}");
    let out = cairn([OsStr::new("info"), env.vol.as_os_str()]);
    assert!(!out.ok() && out.stderr.contains("mount"), "{out}");
    let out = cairn([OsStr::new("warmup"), m.join("nothing").as_os_str()]);
    assert!(!out.ok(), "{out}");
    m.umount();
}

/// `cairn tier set|status` through a mount of a volume in a local
/// directory, then on the unmounted volume: a pin set on a directory is
/// inherited by what is made in it through the kernel (a directory and
/// files below it), `-r` pins the tree, and every byte is in the home
/// tier: the file bytes status shows are the files' sizes.
#[test]
fn tier_set_and_status_through_a_mount_and_unmounted() {
    let _serial = serial();
    let env = Env::new("tier");
    let m = env.mount();
    let cold = m.join("cold");
    std::fs::create_dir(&cold).unwrap();
    let out = cairn_ok([OsStr::new("tier"), OsStr::new("set"), cold.as_os_str(), OsStr::new("cold")]);
    assert!(out.stdout.contains("pinned cold (1 inode)") && out.stdout.contains("packs move when the tier planner runs"), "{out}");
    std::fs::create_dir(m.join("cold/sub")).unwrap();
    write_random_file(&m.join("cold/sub/f"), 21, 3 << 20);
    write_random_file(&m.join("cold/g"), 22, 1 << 20);
    let f = json(&[OsStr::new("tier"), OsStr::new("status"), m.join("cold/sub/f").as_os_str(), OsStr::new("--json")]);
    assert_eq!((f["pin"].as_str(), f["inherited"].as_bool(), f["kind"].as_str()), (Some("cold"), Some(true), Some("file")), "{f}");
    assert_eq!((f["files"].as_u64(), f["file_bytes"].as_u64()), (Some(1), Some(3 << 20)), "{f}");
    let t = &f["tiers"][0];
    assert_eq!((t["tier"].as_str(), t["class"].as_str(), t["bytes"].as_u64()), (Some("home"), Some("local"), Some(3 << 20)), "{f}");
    assert_eq!(f["tiers"].as_array().unwrap().len(), 1, "{f}");
    let d = json(&[OsStr::new("tier"), OsStr::new("status"), cold.as_os_str(), OsStr::new("--json")]);
    assert_eq!((d["pin"].as_str(), d["inherited"].as_bool()), (Some("cold"), Some(false)), "{d}");
    assert_eq!((d["files"].as_u64(), d["file_bytes"].as_u64(), d["pinned"]["cold"].as_u64()), (Some(2), Some(4 << 20), Some(4)), "{d}");
    assert_eq!(d["tiers"][0]["bytes"].as_u64(), Some(4 << 20), "{d}");
    let out = cairn_ok([OsStr::new("tier"), OsStr::new("status"), cold.as_os_str()]);
    assert!(out.stdout.contains("pin cold") && out.stdout.contains("4.00 MiB") && out.stdout.contains("home"), "{out}");
    let out = cairn_ok([OsStr::new("tier"), OsStr::new("set"), cold.as_os_str(), OsStr::new("hot"), OsStr::new("-r")]);
    assert!(out.stdout.contains("(4 inodes)"), "{out}");
    let out = cairn([OsStr::new("tier"), OsStr::new("set"), cold.as_os_str(), OsStr::new("lukewarm")]);
    assert!(!out.ok() && out.stderr.contains("no pin"), "{out}");
    let out = cairn([OsStr::new("tier"), OsStr::new("status"), m.join("missing").as_os_str()]);
    assert!(!out.ok() && out.stderr.contains("missing"), "{out}");
    m.umount();
    // The unmounted volume: paths from its root.
    let d = json(&[OsStr::new("tier"), OsStr::new("status"), OsStr::new("--volume"), env.vol.as_os_str(), OsStr::new("/cold"), OsStr::new("--json")]);
    assert_eq!((d["pin"].as_str(), d["pinned"]["hot"].as_u64(), d["file_bytes"].as_u64()), (Some("hot"), Some(4), Some(4 << 20)), "{d}");
    cairn_ok([OsStr::new("tier"), OsStr::new("set"), OsStr::new("--volume"), env.vol.as_os_str(), OsStr::new("/cold/g"), OsStr::new("auto")]);
    let g = json(&[OsStr::new("tier"), OsStr::new("status"), OsStr::new("--volume"), env.vol.as_os_str(), OsStr::new("cold/g"), OsStr::new("--json")]);
    assert_eq!((g["pin"].as_str(), g["file_bytes"].as_u64()), (Some("auto"), Some(1 << 20)), "{g}");
}
