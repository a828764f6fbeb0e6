//! Power cuts. The volume's own files (journal, packs, metadata) live on
//! `cairn-powercut`, a FUSE layer run by this test process that keeps every
//! write in memory until it is fsync'd and throws all of that away on a
//! cut, as a power failure of the host would (`kill -9` alone cannot show
//! these bugs: the host's page cache keeps what the daemon wrote).
//!
//! Each round: mount the volume with the real `cairn` daemon, check every
//! file that an earlier round saw fsync'd (content byte for byte, and that
//! fsync'd deletions and renames stuck), then write new files with fsync,
//! overwrite, append to, rename and delete older ones while a second thread
//! writes files it never fsyncs, let the flusher commit and retire journal
//! segments for a random while, and cut: `kill -9` of the daemon, then the
//! power. Every fifth round instead unmounts cleanly and cuts the power in
//! the middle of (or right after) `cairn gc`, which repacks. Every few
//! rounds and at the end `cairn fsck` must find nothing wrong.
//!
//! `CAIRN_POWERCUT_ROUNDS` sets the number of rounds (default 20 for the
//! test suite, half of that on the encrypted volume);
//! `scripts/soak-powercut.sh` runs 120 and more.

use crate::common::*;
use cairn_powercut::PowerCut;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A file as the model knows it: the concatenation of `gen(seed, len)`
/// pieces.
type Content = Vec<(u64, u64)>;

fn expected(c: &Content) -> Vec<u8> {
    let mut v = Vec::new();
    for &(seed, len) in c {
        v.extend_from_slice(&gen(seed, len as usize));
    }
    v
}

/// The power-cut layer plus the paths on it.
struct Lab {
    env: Env,
    backing: PathBuf,
    lower: PathBuf,
    pc: Option<PowerCut>,
    /// `--passphrase-file F` for every command of an encrypted volume.
    pass: Vec<std::ffi::OsString>,
}

impl Lab {
    fn new(name: &str) -> Lab {
        let env = Env::bare(name);
        let backing = env.path("backing");
        let lower = env.path("lower");
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&lower).unwrap();
        let pc = PowerCut::mount(&backing, &lower).unwrap_or_else(|e| panic!("mounting cairn-powercut at {}: {e}", lower.display()));
        Lab { env, backing, lower, pc: Some(pc), pass: Vec::new() }
    }

    /// `cairn init` of the volume (encrypted: passphrase in a file outside
    /// the power-cut layer).
    fn init(&mut self, encrypt: bool) {
        let mut args: Vec<std::ffi::OsString> = vec!["init".into(), self.vol().into()];
        if encrypt {
            let pf = self.env.path("passphrase");
            fs::write(&pf, "power cut passphrase\n").unwrap();
            self.pass = vec!["--passphrase-file".into(), pf.into()];
            args.push("--encrypt".into());
            args.extend(self.pass.iter().cloned());
        }
        cairn_ok(&args);
    }

    fn vol(&self) -> PathBuf {
        self.lower.join("vol")
    }

    /// The power cut: everything not fsync'd to the layer is gone, and the
    /// layer comes back with a fresh kernel cache.
    fn cut(&mut self) -> u64 {
        let pc = self.pc.take().expect("layer mounted");
        let dropped = pc.cut().unwrap_or_else(|e| panic!("cutting the power: {e}")).bytes_dropped_at_cut;
        self.pc = Some(PowerCut::mount(&self.backing, &self.lower).unwrap_or_else(|e| panic!("remounting cairn-powercut: {e}")));
        dropped
    }

    fn mount(&self) -> Mount {
        let extra: Vec<&str> = self.pass.iter().map(|a| a.to_str().unwrap()).collect();
        Mount::new(&self.vol(), &self.env.mnt, &extra).unwrap_or_else(|out| panic!("mount after a power cut failed: {out}"))
    }

    fn fsck(&self, read_data: bool) {
        // Packs uploaded by a flush or gc whose commit was cut are expected.
        assert_fsck_clean_at(&self.vol(), read_data, &self.pass, |w| w.contains("is in the backend but not in the metadata"));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if is_mounted(&self.env.mnt) {
            force_unmount(&self.env.mnt);
        }
        if let Some(pc) = self.pc.take() {
            let _ = pc.cut();
        }
    }
}

/// What every earlier round saw durable.
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Content>,
    /// Names whose deletion (or rename away) was fsync'd.
    gone: BTreeSet<String>,
}

impl Model {
    fn check(&self, dir: &Path) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, c) in &self.files {
            let p = dir.join(name);
            match fs::read(&p) {
                Ok(got) => {
                    let want = expected(c);
                    if got != want {
                        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
                        problems.push(format!("{name}: {} bytes, expected {} (first difference at byte {at})", got.len(), want.len()));
                    }
                }
                Err(e) => problems.push(format!("{name}: {e}")),
            }
        }
        for name in &self.gone {
            if dir.join(name).exists() {
                problems.push(format!("{name}: deleted (and the directory fsync'd), but back after the cut"));
            }
        }
        problems
    }
}

fn fsync_dir(p: &Path) {
    fs::File::open(p).unwrap().sync_all().unwrap();
}

fn write_new(p: &Path, c: &Content) {
    let mut f = fs::File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    for &(seed, len) in c {
        write_stream(&mut f, seed, len).unwrap();
    }
    f.sync_all().unwrap_or_else(|e| panic!("fsync {}: {e}", p.display()));
}

fn some_len(rng: &mut Rng) -> u64 {
    match rng.below(10) {
        0 => 0,
        1..=4 => rng.below(64 << 10) + 1,
        5..=8 => rng.below(1536 << 10) + 1,
        // Above the size at which fsync flushes into packs instead of the journal.
        _ => (16 << 20) + rng.below(4 << 20),
    }
}

/// Writes files it never fsyncs, until told to stop (or the daemon dies).
fn unsynced_writer(dir: PathBuf, round: u64, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rng = Rng::new(0xC0FFEE ^ round);
        let _ = fs::create_dir(&dir);
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let p = dir.join(format!("u{round}-{}", k % 6));
            let len = rng.below(2 << 20);
            let r = fs::File::create(&p).and_then(|mut f| {
                let mut left = len;
                let mut rng2 = Rng::new(rng.next_u64());
                let mut buf = vec![0u8; 256 << 10];
                while left > 0 && !stop.load(Ordering::Relaxed) {
                    let n = left.min(buf.len() as u64) as usize;
                    rng2.fill(&mut buf[..n]);
                    f.write_all(&buf[..n])?;
                    left -= n as u64;
                }
                Ok(())
            });
            if r.is_err() {
                return; // the daemon is gone
            }
            written.fetch_add(len, Ordering::Relaxed);
            k += 1;
        }
    })
}

/// One round of fsync'd changes, recorded in the model once durable.
fn synced_changes(dir: &Path, round: u64, rng: &mut Rng, model: &mut Model) {
    for i in 0..1 + rng.below(4) {
        let name = format!("r{round}-{i}");
        let c = vec![(rng.next_u64(), some_len(rng))];
        write_new(&dir.join(&name), &c);
        // The name is durable too: fsync of a new file's directory.
        fsync_dir(dir);
        model.gone.remove(&name);
        model.files.insert(name, c);
    }
    let names: Vec<String> = model.files.keys().cloned().collect();
    let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
    if names.len() > 2 && rng.below(3) == 0 {
        // Overwrite in place: the flush replaces committed extents.
        let name = pick(rng);
        let c = vec![(rng.next_u64(), some_len(rng))];
        write_new(&dir.join(&name), &c);
        model.files.insert(name, c);
    }
    if names.len() > 2 && rng.below(3) == 0 {
        // Append: the held-back tail of a growing file.
        let name = pick(rng);
        if let Some(c) = model.files.get_mut(&name) {
            let piece = (rng.next_u64(), rng.below(300 << 10) + 1);
            let mut f = fs::OpenOptions::new().append(true).open(dir.join(&name)).unwrap();
            write_stream(&mut f, piece.0, piece.1).unwrap();
            f.sync_all().unwrap();
            c.push(piece);
        }
    }
    // Deletions keep the model (checked in full every round) near 30 files.
    let deletions = if names.len() > 30 { 3 } else if names.len() > 6 && rng.below(4) == 0 { 1 } else { 0 };
    for _ in 0..deletions {
        let name = pick(rng);
        if model.files.remove(&name).is_some() {
            fs::remove_file(dir.join(&name)).unwrap();
            fsync_dir(dir);
            model.gone.insert(name);
        }
    }
    if names.len() > 3 && rng.below(4) == 0 {
        let from = pick(rng);
        if model.files.contains_key(&from) {
            let to = format!("m{round}");
            fs::rename(dir.join(&from), dir.join(&to)).unwrap();
            fsync_dir(dir);
            let c = model.files.remove(&from).unwrap();
            model.files.insert(to.clone(), c);
            model.gone.remove(&to);
            model.gone.insert(from);
        }
    }
}

fn rounds(default: u64) -> u64 {
    std::env::var("CAIRN_POWERCUT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
fn fsynced_data_survives_power_cuts() {
    power_cuts("powercut", false, rounds(20));
}

/// The same on an encrypted volume, whose journal records are sealed.
#[test]
fn fsynced_data_survives_power_cuts_encrypted() {
    power_cuts("powercut-enc", true, rounds(20) / 2);
}

fn power_cuts(name: &str, encrypt: bool, n: u64) {
    let _serial = serial();
    let mut lab = Lab::new(name);
    lab.init(encrypt);
    // `cairn init` is durable when it returns (rule 6).
    lab.cut();
    let mut model = Model::default();
    let seed = std::env::var("CAIRN_POWERCUT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9C0D);
    let mut rng = Rng::new(seed ^ encrypt as u64);
    let start = Instant::now();
    let (mut gc_rounds, mut gc_cut_mid) = (0, 0);
    for round in 0..n {
        let mut m = lab.mount();
        let dir = m.join("data");
        if round == 0 {
            fs::create_dir(&dir).unwrap();
            fsync_dir(m.path());
        }
        let problems = model.check(&dir);
        assert!(problems.is_empty(), "round {round} (seed {seed}): fsync'd data lost at the last power cut:\n{}", problems.join("\n"));
        // What was written but never fsync'd may be anything, but must read.
        if let Ok(rd) = fs::read_dir(m.join("junk")) {
            for e in rd.flatten() {
                if let Err(err) = fs::read(e.path()) {
                    panic!("round {round}: reading {} (not fsync'd) after a power cut: {err}", e.path().display());
                }
            }
        }

        let stop = Arc::new(AtomicBool::new(false));
        let junk = Arc::new(AtomicU64::new(0));
        let bg = unsynced_writer(m.join("junk"), round, stop.clone(), junk.clone());
        synced_changes(&dir, round, &mut rng, &mut model);
        // Closed files are due: the flusher commits them within half a
        // second and retires the journal segments they lived in.
        std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));

        if round % 5 == 4 {
            stop.store(true, Ordering::Relaxed);
            bg.join().unwrap();
            m.umount();
            // gc, cut at a random moment (or just after it finished).
            let mut gc = Command::new(CAIRN)
                .args([OsStr::new("gc"), lab.vol().as_os_str(), OsStr::new("--repack-below"), OsStr::new("0.9")])
                .args(&lab.pass)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(rng.below(600)));
            gc_rounds += 1;
            if gc.try_wait().unwrap().is_none() {
                gc_cut_mid += 1;
                let _ = gc.kill();
            }
            let _ = gc.wait();
        } else {
            m.kill9();
            stop.store(true, Ordering::Relaxed);
            bg.join().unwrap();
            m.detach();
        }
        let dropped = lab.cut();
        eprintln!(
            "{name} round {round}: {} files in the model, {} KiB unsynced written, {} KiB dropped by the cut",
            model.files.len(),
            junk.load(Ordering::Relaxed) >> 10,
            dropped >> 10
        );
        if round % 4 == 3 {
            lab.fsck(false);
        }
    }
    let m = lab.mount();
    let problems = model.check(&m.join("data"));
    assert!(problems.is_empty(), "after the last power cut (seed {seed}):\n{}", problems.join("\n"));
    m.umount();
    lab.fsck(true);
    eprintln!(
        "{name}: {n} rounds in {:.0?}, {gc_rounds} with gc ({gc_cut_mid} cut mid-gc, the others just after it): no fsync'd byte lost, fsck clean",
        start.elapsed()
    );
}
