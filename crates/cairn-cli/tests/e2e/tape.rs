//! Volumes on an emulated tape through real mounts of the `cairn` binary
//! (the drive on a virtual clock, so positioning costs no test time): a
//! mixed tree mounts from the tape alone; `kill -9` after fsyncs, then
//! `cairn tape recover`, loses no fsync'd byte; a tree written with a CDP
//! mirror mounts from the tape alone once the mirror is deleted; `cairn
//! tape recall` fills a fresh machine's cache from the tape in one pass; a
//! tape reclaimed to a second one mounts from the second alone.

use crate::cloud::{expected, fsync_files};
use crate::common::*;
use crate::roundtrip::{build_tree_with, check_copy};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

struct Tape {
    env: Env,
    url: String,
    pass: PathBuf,
}

impl Tape {
    fn new(name: &str) -> Tape {
        // Children inherit it: every `cairn` of these tests runs the
        // emulated drive on a virtual clock.
        std::env::set_var("CAIRN_TAPE_CLOCK", "virtual");
        let env = Env::bare(name);
        let url = format!("tape-emu:{}", env.path("tape").display());
        let pass = env.path("pass");
        fs::write(&pass, "correct horse battery staple\n").unwrap();
        let t = Tape { env, url, pass };
        cairn_ok(["init", &t.url, "--cache-dir", &t.dir("a").display().to_string(), "--pack-size", "8M", "--encrypt", "--passphrase-file", &t.pass.display().to_string()]);
        t
    }

    fn dir(&self, machine: &str) -> PathBuf {
        self.env.path(&format!("cache-{machine}"))
    }

    fn args(&self, machine: &str) -> Vec<String> {
        vec!["--cache-dir".into(), self.dir(machine).display().to_string(), "--passphrase-file".into(), self.pass.display().to_string()]
    }

    fn try_mount(&self, machine: &str) -> Result<Mount, Out> {
        self.try_mount_with(machine, &[])
    }

    fn try_mount_with(&self, machine: &str, extra: &[&str]) -> Result<Mount, Out> {
        let mut a = self.args(machine);
        a.extend(extra.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Mount::new(Path::new(&self.url), &self.env.mnt, &a)
    }

    fn mount(&self, machine: &str) -> Mount {
        self.try_mount(machine).unwrap_or_else(|out| panic!("mount failed: {out}"))
    }
}

/// A mixed tree written through a mount, unmounted, mounted from the tape
/// alone on a fresh directory: byte for byte and attribute for attribute;
/// fsck reads every blob back from the tape.
#[test]
fn a_mixed_tree_mounts_from_the_tape_alone() {
    let _serial = serial();
    let t = Tape::new("tape-tree");
    let src = t.env.path("src");
    build_tree_with(&src, 300, 6 * MIB);
    let m = t.mount("a");
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    m.umount();
    let info = cairn_ok(["tape", "info", &t.url, "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info.stdout).unwrap();
    assert!(info["live_bytes"].as_u64().unwrap() > 6 * MIB, "{info}");
    fs::remove_dir_all(t.dir("a")).unwrap();
    let m = t.mount("b");
    check_copy(&src, m.path(), "from the tape");
    m.umount();
    let mut a = vec!["fsck".to_string(), t.url.clone(), "--read-data".into(), "--json".into()];
    a.extend(t.args("b"));
    let out = cairn(&a);
    let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(out.ok() && rep["errors"].as_array().unwrap().is_empty(), "{out}");
}

/// kill -9 of the daemon after fsyncs, with an unsynced file being written
/// to the tape: the tape has no catalog at its end, mounting says to run
/// recover, and after `cairn tape recover` every fsync'd file is intact on
/// a machine with only the tape.
#[test]
fn kill9_then_recover_loses_no_fsynced_byte() {
    let _serial = serial();
    let t = Tape::new("tape-kill");
    let mut m = t.mount("a");
    let out = fsync_files(m.path(), 8, 3 * MIB, 700);
    assert!(out.ok(), "{out}");
    // Closed, so flushed to the tape after the last catalog, erasing it.
    fs::write(m.join("unsynced"), gen(9, 20 * MIB as usize)).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    m.kill9();
    m.detach();
    let err = t.try_mount("b").err().expect("a tape without its catalog must not mount");
    assert!(err.stderr.contains("recover"), "{err}");
    let out = cairn_ok(["tape", "recover", &t.url]);
    assert!(out.stdout.contains("recovered"), "{out}");
    let m = t.mount("b");
    for i in 0..8 {
        let got = fs::read(m.join(&format!("f{i}"))).unwrap_or_else(|e| panic!("f{i}: {e}"));
        assert!(got == expected(700, i, 3 * MIB), "f{i} differs after kill -9 and recover");
    }
    m.umount();
}

/// `--fsync-on-close`: a file written with open/write/close is on the tape
/// when `close` returns. The power is cut right after it (the daemon
/// killed, the emulated drive set to lose what its buffer holds, the
/// machine's disk gone): a fresh machine mounts the tape without a
/// recover and reads the file byte for byte. The same close without the
/// option returns before the tape has the file, and the power cut then
/// loses it: the test tells the two apart.
#[test]
fn close_waits_for_the_tape_with_fsync_on_close() {
    let _serial = serial();
    let t = Tape::new("tape-close");
    let params = t.env.path("tape").join("params.json");
    let p = fs::read_to_string(&params).unwrap();
    assert!(p.contains("\"host-crash\""), "{p}");
    fs::write(&params, p.replace("\"host-crash\"", "\"power-loss\"")).unwrap();
    let data = gen(11, 24 * MIB as usize);
    let mut m = t.try_mount_with("a", &["--fsync-on-close"]).unwrap_or_else(|o| panic!("mount: {o}"));
    fs::write(m.join("closed"), &data).unwrap();
    m.kill9();
    m.detach();
    fs::remove_dir_all(t.dir("a")).unwrap();
    let m = t.try_mount("b").unwrap_or_else(|o| panic!("the tape must mount as it was at the close: {o}"));
    assert!(fs::read(m.join("closed")).unwrap() == data, "the closed file differs on the tape");
    m.umount();

    // Without the option: close returns with the file in the journal.
    let mut m = t.mount("c");
    fs::write(m.join("late"), gen(12, 24 * MIB as usize)).unwrap();
    m.kill9();
    m.detach();
    fs::remove_dir_all(t.dir("c")).unwrap();
    match t.try_mount("d") {
        Ok(m) => {
            assert!(!m.join("late").exists(), "without --fsync-on-close the power cut should have lost the file");
            assert!(fs::read(m.join("closed")).unwrap() == data);
            m.umount();
        }
        Err(out) => assert!(out.stderr.contains("recover"), "{out}"),
    }
}

/// Four writers at different speeds (one streaming flat out, three
/// pausing between writes of different sizes) into one tape mount: every
/// file reads back identical from the tape alone.
#[test]
fn four_writers_of_different_speeds_read_back_identical() {
    let _serial = serial();
    let t = Tape::new("tape-writers");
    let m = t.mount("a");
    let script = r#"
import os, sys, threading, time
mnt = sys.argv[2]
errors = []
def writer(i, size, piece, pause):
    try:
        data = bytes((j * 31 + i * 7 + (j >> 12)) % 251 for j in range(size))
        with open(os.path.join(mnt, f"w{i}"), "wb") as f:
            for o in range(0, size, piece):
                f.write(data[o:o + piece])
                if pause:
                    time.sleep(pause)
    except Exception as e:
        errors.append(f"w{i}: {e!r}")
ts = [threading.Thread(target=writer, args=a) for a in [(0, 12 << 20, 1 << 20, 0), (1, 6 << 20, 64 << 10, 0.002), (2, 9 << 20, 256 << 10, 0.01), (3, 3 << 20, 4096, 0.0005)]]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    sys.exit("; ".join(errors))
"#;
    let out = python(script, &[m.path().as_os_str()], None);
    assert!(out.ok(), "{out}");
    let expect = |i: usize, size: usize| -> Vec<u8> { (0..size).map(|j| ((j * 31 + i * 7 + (j >> 12)) % 251) as u8).collect() };
    let sizes = [12usize << 20, 6 << 20, 9 << 20, 3 << 20];
    m.umount();
    let m = t.mount("b");
    for (i, &size) in sizes.iter().enumerate() {
        let got = fs::read(m.join(&format!("w{i}"))).unwrap();
        assert!(got == expect(i, size), "w{i} differs after the round trip through the tape");
    }
    m.umount();
}

/// CDP (`--mirror`): a tree copied in through a mount that mirrors lands in
/// the mirror directory too (sealed: no plaintext); a remount from the same
/// directory remembers the mirror and reads from it; once the mirror is
/// deleted that directory refuses to mount and says what to do, and a fresh
/// directory mounts the tree from the tape alone, byte for byte.
#[test]
fn a_mirrored_tree_mounts_from_the_tape_alone_once_the_mirror_is_gone() {
    let _serial = serial();
    let t = Tape::new("tape-mirror");
    let src = t.env.path("src");
    build_tree_with(&src, 200, 4 * MIB);
    let mirror = t.env.path("mirror");
    let ms = mirror.display().to_string();

    // Only a tape has a mirror.
    let plain = t.env.path("plain");
    cairn_ok(["init", &plain.display().to_string()]);
    let out = cairn(["mount", &plain.display().to_string(), &t.env.mnt.display().to_string(), "--mirror", &ms]);
    assert!(!out.ok() && out.stderr.contains("volumes on a tape"), "{out}");

    let m = t.try_mount_with("a", &["--mirror", &ms]).unwrap_or_else(|out| panic!("mount --mirror failed: {out}"));
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    m.umount();
    assert!(mirror.join("mirror.json").exists(), "no marker in the mirror");
    let packs: u64 = walk(&mirror.join("packs")).iter().map(|p| fs::metadata(p).unwrap().len()).sum();
    assert!(packs > 4 * MIB, "the mirror holds {packs} bytes of packs");
    let big = fs::read(src.join("big/big0.bin")).unwrap();
    for p in walk(&mirror) {
        let bytes = fs::read(&p).unwrap();
        assert!(!bytes.windows(64).any(|w| w == &big[4096..4160]), "plaintext in {}", p.display());
    }

    // Remembered: the same directory mirrors without being told.
    let m = t.mount("a");
    check_copy(&src, m.path(), "through the mirror");
    m.umount();
    let log = fs::read_to_string(t.dir("a").join("cairn.log")).unwrap_or_default();
    assert!(log.matches("mirroring to").count() >= 2, "the second mount did not mirror:\n{log}");

    fs::remove_dir_all(&mirror).unwrap();
    let err = t.try_mount("a").err().expect("the remembered mirror has gone");
    assert!(err.stderr.contains("--no-mirror"), "{err}");
    let m = t.mount("b");
    check_copy(&src, m.path(), "from the tape alone");
    m.umount();
    assert!(!mirror.exists(), "a mount without --mirror made the mirror");
}

/// `cairn tape recall` on a machine with only the tape: a directory's
/// files come into the cache (report in JSON), a second recall of two of
/// them finds them cached, the files read back byte for byte, `cairn
/// stats` shows what the tape holds, and a path in no mount is an error.
#[test]
fn recall_fills_the_cache_of_a_new_machine() {
    let _serial = serial();
    let t = Tape::new("tape-recall");
    let m = t.mount("a");
    fs::create_dir(m.join("d")).unwrap();
    for i in 0..5u64 {
        fs::write(m.join(&format!("d/f{i}")), gen(40 + i, 3 * MIB as usize)).unwrap();
    }
    fs::write(m.join("other"), gen(50, MIB as usize)).unwrap();
    m.umount();

    let m = t.mount("b");
    // A tape mount serves FUSE with 32 threads by default, so that many
    // reads reach the drive at once and are put in tape order.
    let log = fs::read_to_string(t.dir("b").join("cairn.log")).unwrap();
    assert!(log.contains("threads=32"), "{log}");
    let d = m.join("d").display().to_string();
    let out = cairn_ok(["tape", "recall", &d, "--json"]);
    let r: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(r["files"], 5, "{r}");
    assert!(r["fetched_bytes"].as_u64().unwrap() >= 15 * MIB && r["reads"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["cached_bytes"], 0, "{r}");
    let out = cairn_ok(["tape", "recall", &m.join("d/f0").display().to_string(), &m.join("d/f1").display().to_string()]);
    assert!(out.stdout.contains("recalled 2 files") && out.stdout.contains(", 0 B read in 0 reads"), "{out}");
    for i in 0..5u64 {
        assert!(fs::read(m.join(&format!("d/f{i}"))).unwrap() == gen(40 + i, 3 * MIB as usize), "d/f{i} differs");
    }
    let mut a = vec!["stats".to_string(), t.url.clone(), "--json".into()];
    a.extend(t.args("b"));
    let out = cairn(&a);
    let s: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(s["medium"]["live_bytes"].as_u64().unwrap() > 16 * MIB, "{s}");
    assert!(s["medium"]["dead_bytes"].is_u64(), "{s}");
    let out = cairn(["tape", "recall", &t.env.path("src").display().to_string()]);
    assert!(!out.ok() && out.stderr.contains("not inside a Cairn mount"), "{out}");
    m.umount();
}

/// `cairn tape reclaim`: a tree copied in through a mount; the tape's live
/// objects copied to a second tape (created with the first one's drive
/// parameters) mount on a fresh directory byte for byte, with no dead
/// bytes; the first tape's directory refuses the second; reclaiming onto a
/// tape that now holds a volume is refused.
#[test]
fn a_reclaimed_tape_mounts_from_the_new_tape_alone() {
    let _serial = serial();
    let t = Tape::new("tape-reclaim");
    let src = t.env.path("src");
    build_tree_with(&src, 150, 4 * MIB);
    let m = t.mount("a");
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    m.umount();
    let info = |url: &str| -> serde_json::Value { serde_json::from_str(&cairn_ok(["tape", "info", url, "--json"]).stdout).unwrap() };
    let before = info(&t.url);

    let dst = format!("tape-emu:{}", t.env.path("tape2").display());
    let out = cairn_ok(["tape", "reclaim", &t.url, &dst, "--json"]);
    let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(rep["report"]["bytes"], before["live_bytes"], "{out}");
    assert_eq!(rep["report"]["dead_bytes_left"], before["dead_bytes"], "{out}");
    let after = info(&dst);
    assert_eq!((&after["live_bytes"], &after["dead_bytes"], &after["objects"]), (&before["live_bytes"], &serde_json::json!(0), &before["objects"]), "{after}");
    assert_eq!(fs::read(t.env.path("tape2/params.json")).unwrap(), fs::read(t.env.path("tape/params.json")).unwrap());
    assert_eq!(info(&t.url)["live_bytes"], before["live_bytes"], "the source changed");

    let out = cairn(["tape", "reclaim", &t.url, &dst]);
    assert!(!out.ok() && out.stderr.contains("already holds Cairn tape volume"), "{out}");

    let a: Vec<String> = t.args("a");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let err = Mount::new(Path::new(&dst), &t.env.mnt, &a).err().expect("the first tape's directory must refuse the second tape");
    assert!(err.stderr.contains("choose another --cache-dir"), "{err}");
    let b: Vec<String> = t.args("b");
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let m = Mount::new(Path::new(&dst), &t.env.mnt, &b).unwrap_or_else(|out| panic!("mount of the reclaimed tape failed: {out}"));
    check_copy(&src, m.path(), "from the reclaimed tape");
    m.umount();
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

/// `cairn tape info` names the volume by the id `cairn init` printed, says
/// how much room is left, and answers for a mounted tape through its mount.
#[test]
fn tape_info_names_the_volume_init_made_and_works_while_mounted() {
    let _serial = serial();
    std::env::set_var("CAIRN_TAPE_CLOCK", "virtual");
    let env = Env::bare("tape-info");
    let url = format!("tape-emu:{}", env.path("tape").display());
    let dir = env.path("cache");
    let init = cairn_ok(["init", &url, "--cache-dir", dir.to_str().unwrap(), "--pack-size", "8M"]);
    let id = init.stdout.split_whitespace().nth(2).unwrap_or_else(|| panic!("{init}")).to_string();
    let info = cairn_ok(["tape", "info", &url]);
    assert!(info.stdout.contains(&format!("volume      {id}")), "{info}\ninit said: {init}");
    assert!(info.stdout.contains("capacity") && info.stdout.contains("left"), "{info}");
    let json: serde_json::Value = serde_json::from_str(&cairn_ok(["tape", "info", &url, "--json"]).stdout).unwrap();
    assert_eq!(json["volume_id"], id.as_str(), "{json}");
    let free_before = json["free_bytes"].as_u64().unwrap();
    let m = Mount::new(Path::new(&url), &env.mnt, &["--cache-dir", dir.to_str().unwrap()]).unwrap_or_else(|o| panic!("{o}"));
    write_random_file(&m.join("f"), 5, 20 * MIB);
    cairn_ok(["stats", m.path().to_str().unwrap()]);
    let info = cairn_ok(["tape", "info", &url]);
    assert!(info.stdout.contains("mounted at") && info.stdout.contains(&format!("volume      {id}")), "{info}");
    m.umount();
    let json: serde_json::Value = serde_json::from_str(&cairn_ok(["tape", "info", &url, "--json"]).stdout).unwrap();
    assert!(json["free_bytes"].as_u64().unwrap() + 20 * MIB <= free_before, "{json} (before: {free_before})");
}
