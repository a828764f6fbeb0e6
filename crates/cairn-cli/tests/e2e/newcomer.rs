//! What a newcomer runs into (issue 25, "A newcomer's frictions"): a
//! volume and its mountpoint name each other in every command, a second
//! mount names the first, a mount over files says so, a delete past the
//! end is refused as an insert past it is, a user who cannot mount for
//! everyone is told about --private, logs to a file carry no colour codes,
//! and `cairn status` shows where metrics are served.

use crate::common::*;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Command;

/// Unmounts `mnt` when dropped, whatever a failed assertion left.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        if is_mounted(self.0) {
            let _ = cairn([OsStr::new("umount"), self.0.as_os_str()]);
            force_unmount(self.0);
        }
    }
}

#[test]
fn a_mountpoint_names_its_volume_and_a_volume_its_mount() {
    let _serial = serial();
    let env = Env::new("names");
    let m = env.mount();
    write_random_file(&m.join("f"), 1, 3 << 20);
    let (vol, mnt) = (env.vol.to_str().unwrap(), env.mnt.to_str().unwrap());

    // stats by mountpoint is stats of the volume mounted there.
    let by_mnt: serde_json::Value = serde_json::from_str(&cairn_ok(["stats", mnt, "--json"]).stdout).unwrap();
    let by_vol: serde_json::Value = serde_json::from_str(&cairn_ok(["stats", vol, "--json"]).stdout).unwrap();
    assert_eq!(by_mnt["files"], 1, "{by_mnt}");
    assert_eq!(by_mnt["logical_bytes"], by_vol["logical_bytes"]);
    // top by volume is top of its mount.
    let top = cairn_ok(["top", vol, "--once", "--interval", "0.2"]);
    assert!(top.stdout.contains("fuse ops"), "{top}");
    // fsck and gc need the volume to themselves and say where it is mounted.
    for cmd in ["fsck", "gc"] {
        for arg in [vol, mnt] {
            let out = cairn([cmd, arg]);
            assert_eq!(out.code, Some(1), "{out}");
            assert!(out.stderr.contains(&format!("is mounted at {mnt}")) && out.stderr.contains("cairn umount"), "{out}");
        }
    }
    // A second mount of the volume names the first.
    let other = env.path("other");
    fs::create_dir(&other).unwrap();
    let _guard = Unmount(&other);
    let out = cairn(["mount", vol, other.to_str().unwrap()]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains(&format!("already mounted at {mnt}")), "{out}");
    assert!(!is_mounted(&other));
    // umount by volume.
    let out = cairn_ok(["umount", vol]);
    assert!(!is_mounted(&env.mnt), "{out}");
    std::mem::forget(m);
    env.assert_fsck_clean(|_| false);
}

#[test]
fn mounting_over_files_says_they_are_hidden_and_they_come_back() {
    let _serial = serial();
    let env = Env::new("nonempty");
    fs::write(env.mnt.join("underneath"), b"still here").unwrap();
    let _guard = Unmount(&env.mnt);
    let out = cairn_ok([OsStr::new("mount"), env.vol.as_os_str(), env.mnt.as_os_str()]);
    assert!(out.stderr.contains("is not empty") && out.stderr.contains("its 1 entry is hidden"), "{out}");
    assert!(!env.mnt.join("underneath").exists(), "the mount does not cover the directory");
    cairn_ok([OsStr::new("umount"), env.mnt.as_os_str()]);
    assert_eq!(fs::read(env.mnt.join("underneath")).unwrap(), b"still here");
    // An empty mountpoint: no warning.
    fs::remove_file(env.mnt.join("underneath")).unwrap();
    let out = cairn_ok([OsStr::new("mount"), env.vol.as_os_str(), env.mnt.as_os_str()]);
    assert!(!out.stderr.contains("not empty"), "{out}");
    cairn_ok([OsStr::new("umount"), env.mnt.as_os_str()]);
}

#[test]
fn a_delete_past_the_end_is_refused_as_an_insert_past_it_is() {
    let _serial = serial();
    let env = Env::new("delete-end");
    let m = env.mount();
    let f = m.join("f");
    fs::write(&f, gen(7, 100)).unwrap();
    let fs_ = f.to_str().unwrap();
    let out = cairn(["insert", fs_, "101", "--from", "/dev/null"]);
    assert_eq!(out.code, Some(1), "{out}");
    for (off, len) in [("50", "51"), ("100", "1"), ("200", "1")] {
        let out = cairn(["delete", fs_, off, len]);
        assert_eq!(out.code, Some(1), "{out}");
        assert!(out.stderr.contains("past the end of the file (100 bytes)"), "{out}");
        assert_eq!(fs::read(&f).unwrap(), gen(7, 100), "a refused delete changed the file");
    }
    let out = cairn(["replace", fs_, "90", "20", "--from", "/dev/null"]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("at most 10 bytes there"), "{out}");
    // Inside the file it works.
    cairn_ok(["delete", fs_, "50", "50"]);
    assert_eq!(fs::read(&f).unwrap(), gen(7, 100)[..50]);
    m.umount();
}

#[test]
fn a_user_who_cannot_mount_is_told_why_and_what_to_do() {
    let _serial = serial();
    let conf = fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    assert!(
        !conf.lines().any(|l| l.trim() == "user_allow_other"),
        "this test needs /etc/fuse.conf without user_allow_other (Debian's default): it checks what a user is told when allow_other is not allowed"
    );
    let env = Env::new("nonroot");
    // In a mount namespace of its own, /dev/fuse is replaced by a node
    // nobody may open, then by one everybody may (Debian's 0666): the
    // first refusal names /dev/fuse, the second allow_other and --private.
    let script = |mode: &str| {
        format!(
            "set -e; d=$(mktemp -d); mknod $d/fuse c 10 229; chmod {mode} $d/fuse; mount --bind $d/fuse /dev/fuse; \
             setpriv --reuid=65534 --regid=65534 --clear-groups {CAIRN} mount {} {}; echo unreachable",
            env.vol.display(),
            env.mnt.display()
        )
    };
    let out = run(Command::new("unshare").args(["-m", "--propagation", "private", "bash", "-c", &script("600")]));
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("cannot open /dev/fuse") && out.stderr.contains("0666"), "{out}");
    let out = run(Command::new("unshare").args(["-m", "--propagation", "private", "bash", "-c", &script("666")]));
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("user_allow_other") && out.stderr.contains("--private"), "{out}");
    assert!(!is_mounted(&env.mnt));
}

#[test]
fn logs_to_a_file_carry_no_colour_codes_and_status_shows_metrics() {
    let _serial = serial();
    let env = Env::new("plain-logs");
    // stderr is a pipe here: a file, not a terminal. A bucket that does not
    // answer makes the retries log warnings before the error.
    let out = cairn(["stats", "s3://b/p", "--endpoint", "http://127.0.0.1:9", "--cache-dir", env.path("cache").to_str().unwrap()]);
    assert!(out.stderr.contains("WARN"), "no log lines to check: {out}");
    assert!(!out.stderr.contains('\x1b'), "colour codes in a log that is not a terminal: {out:?}", out = out.stderr);
    let m = env.mount_with(&["--metrics", "127.0.0.1:0"]);
    let status = cairn_ok(["status"]);
    let line = status.stdout.lines().find(|l| l.trim_start().starts_with("metrics http://127.0.0.1:")).unwrap_or_else(|| panic!("no metrics line: {status}"));
    let port: u16 = line.trim().trim_start_matches("metrics http://127.0.0.1:").trim_end_matches("/metrics").parse().unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_ne!(port, 0, "the port 0 asked for, not the one picked: {line}");
    let body = run(Command::new("curl").arg("-sf").arg(format!("http://127.0.0.1:{port}/metrics")));
    assert!(body.ok() && body.stdout.contains("cairn_"), "{body}");
    m.umount();
}
