//! FUSE over io_uring (`--fuse-uring`, the vendored fuser's transport in
//! `third_party/fuser/src/uring.rs`): with the kernel's support switched on
//! the requests are served from the rings, with the same results as over
//! /dev/fuse; without it the mount says so and serves over /dev/fuse.

use crate::common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

const KNOB: &str = "/sys/module/fuse/parameters/enable_uring";

/// Sets the fuse module's `enable_uring` and puts the old value back on drop.
struct UringKnob(String);

impl UringKnob {
    fn set(on: bool) -> UringKnob {
        let before = fs::read_to_string(KNOB).unwrap_or_else(|e| {
            panic!("{KNOB}: {e}: this kernel has no FUSE over io_uring (CONFIG_FUSE_IO_URING, Linux 6.14+), which the test needs")
        });
        fs::write(KNOB, if on { "Y" } else { "N" }).unwrap_or_else(|e| panic!("writing {KNOB} (as root): {e}"));
        UringKnob(before.trim().to_string())
    }
}

impl Drop for UringKnob {
    fn drop(&mut self) {
        let _ = fs::write(KNOB, &self.0);
    }
}

/// Voluntary context switches of the daemon's threads whose name starts
/// with `prefix`, and how many such threads there are: a thread that waits
/// for its next request switches out once per wait.
fn switches(pid: i32, prefix: &str) -> (u64, usize) {
    let mut total = 0;
    let mut n = 0;
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        n += 1;
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    (total, n)
}

/// Files, directories, links, renames, truncation, fsync and a large file
/// (larger than one request's payload), written under `m`; returns what
/// each path must hold.
fn workload(m: &Path) -> Vec<(String, Vec<u8>)> {
    let mut want = Vec::new();
    fs::create_dir_all(m.join("d/e")).unwrap();
    for i in 0..300 {
        let name = format!("d/f{i:03}");
        let body = format!("file {i}\n").into_bytes();
        fs::write(m.join(&name), &body).unwrap();
        want.push((name, body));
    }
    let big = gen(5, 3 << 20);
    let mut f = fs::File::create(m.join("d/e/big")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    want.push(("d/e/big".into(), big));
    fs::rename(m.join("d/f000"), m.join("d/e/moved")).unwrap();
    want.retain(|(n, _)| n != "d/f000");
    want.push(("d/e/moved".into(), b"file 0\n".to_vec()));
    fs::remove_file(m.join("d/f001")).unwrap();
    want.retain(|(n, _)| n != "d/f001");
    let f = fs::OpenOptions::new().write(true).open(m.join("d/f002")).unwrap();
    f.set_len(3).unwrap();
    want.iter_mut().find(|(n, _)| n == "d/f002").unwrap().1.truncate(3);
    symlink("e/big", m.join("d/link")).unwrap();
    want
}

fn check(m: &Path, want: &[(String, Vec<u8>)], when: &str) {
    for (name, body) in want {
        let got = fs::read(m.join(name)).unwrap_or_else(|e| panic!("{when}: reading {name}: {e}"));
        assert!(got == *body, "{when}: {name} holds {} bytes, not the {} written", got.len(), body.len());
    }
    assert_eq!(fs::read_link(m.join("d/link")).unwrap(), Path::new("e/big"), "{when}: symlink target");
    assert_eq!(fs::metadata(m.join("d/link")).unwrap().len(), 3 << 20, "{when}: stat through the symlink");
    let names = fs::read_dir(m.join("d")).unwrap().count();
    assert_eq!(names, 298 + 2, "{when}: entries in d (298 files, e, link)");
    assert!(!m.join("d/f001").exists() && !m.join("d/f000").exists(), "{when}: removed and renamed names are gone");
}

#[test]
fn a_mount_over_io_uring_serves_from_its_rings_with_the_results_of_dev_fuse() {
    let _serial = serial();
    let _knob = UringKnob::set(true);
    let env = Env::new("uring");
    let m = env.mount_with(&["--fuse-uring"]);
    let pid = daemon_pid(&env.vol, &env.mnt).expect("the daemon");
    let cpus = std::thread::available_parallelism().unwrap().get();
    // The mount answers before every ring thread has started and named
    // itself (a loaded machine showed one of two): give them a moment.
    let started = std::time::Instant::now();
    let (ring0, rings) = loop {
        let (ring0, rings) = switches(pid, "fuser-uring-");
        if rings >= cpus || started.elapsed() > std::time::Duration::from_secs(10) {
            break (ring0, rings);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(rings >= cpus, "one ring thread or more per CPU queue: {rings} threads for {cpus} CPUs");
    let (dev0, _) = switches(pid, "fuser-0");

    let want = workload(&env.mnt);
    check(&env.mnt, &want, "over io_uring");

    let (ring1, _) = switches(pid, "fuser-uring-");
    let (dev1, _) = switches(pid, "fuser-0");
    let (ring, dev) = (ring1 - ring0, dev1 - dev0);
    assert!(ring >= 300, "the ring threads served the workload: {ring} waits for requests over the rings");
    assert!(ring > 5 * dev, "requests went to the rings, not /dev/fuse: {ring} ring waits, {dev} /dev/fuse waits");
    let ino = fs::metadata(env.mnt.join("d/e/big")).unwrap().ino();
    m.umount();

    // The same volume over /dev/fuse: the same bytes and inode.
    let m = env.mount();
    check(&env.mnt, &want, "over /dev/fuse after a remount");
    assert_eq!(fs::metadata(env.mnt.join("d/e/big")).unwrap().ino(), ino);
    assert_eq!(switches(daemon_pid(&env.vol, &env.mnt).unwrap(), "fuser-uring-").1, 0, "no ring threads without --fuse-uring");
    m.umount();
    env.assert_fsck_clean(|_| false);
}

#[test]
fn without_the_kernels_support_the_mount_says_so_and_serves_over_dev_fuse() {
    let _serial = serial();
    let _knob = UringKnob::set(false);
    let env = Env::new("uring-off");
    let m = env.mount_with(&["--fuse-uring"]);
    let pid = daemon_pid(&env.vol, &env.mnt).expect("the daemon");
    let want = workload(&env.mnt);
    check(&env.mnt, &want, "with enable_uring off");
    assert_eq!(switches(pid, "fuser-uring-").1, 0, "no ring threads when the kernel does not offer io_uring");
    m.umount();
    assert!(env.log().contains("does not offer it"), "the log says why: {}", env.log());
}
