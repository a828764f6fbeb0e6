//! 7. Refusals: clear message, non-zero exit, no mount or daemon left, and
//! nothing stored lost.

use crate::common::*;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;

/// After a refused mount: nothing mounted at `mnt`, no daemon for it.
fn assert_no_mount(vol: &Path, mnt: &Path) {
    assert!(!is_mounted(mnt), "{} is mounted after a refused mount", mnt.display());
    assert_no_mount_process(vol, mnt);
}

fn assert_no_mount_process(vol: &Path, mnt: &Path) {
    // The refusing child may still be exiting when `cairn mount` returns.
    let start = std::time::Instant::now();
    while daemon_pid(vol, mnt).is_some() && start.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(daemon_pid(vol, mnt), None, "a daemon still runs 5 s after a refused mount");
}

fn refused(vol: &Path, mnt: &Path, extra: &[&str]) -> Out {
    match Mount::new(vol, mnt, extra) {
        Ok(m) => {
            drop(m);
            panic!("cairn mount {} {} {extra:?} succeeded, expected a refusal", vol.display(), mnt.display());
        }
        Err(out) => {
            assert_ne!(out.code, Some(0));
            assert!(!out.stderr.contains("panicked"), "a refusal must not be a panic: {out}");
            assert_no_mount(vol, mnt);
            out
        }
    }
}

#[test]
fn mount_on_missing_mountpoint() {
    let _serial = serial();
    let env = Env::new("err-missing-mnt");
    let missing = env.path("no-such-dir");
    let out = refused(&env.vol, &missing, &[]);
    assert!(
        out.stderr.contains(missing.to_str().unwrap()) && out.stderr.contains("does not exist"),
        "message should name the missing mountpoint: {out}"
    );
    // The volume was not left locked.
    env.mount().umount();
}

#[test]
fn mount_on_an_already_mounted_mountpoint() {
    let _serial = serial();
    let env = Env::new("err-busy-mnt");
    let m = env.mount();
    fs::write(m.join("keep"), b"first mount").unwrap();
    // Another volume on the same mountpoint.
    let other = env.path("vol2");
    cairn_ok([OsStr::new("init"), other.as_os_str()]);
    let out = match Mount::new(&other, &env.mnt, &[]) {
        Ok(_) => panic!("a second mount on a busy mountpoint succeeded"),
        Err(out) => out,
    };
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains(env.mnt.to_str().unwrap()) && out.stderr.contains("already mounted"),
        "message: {out}"
    );
    assert_no_mount_process(&other, &env.mnt);
    // The same volume at a second mountpoint: the volume is in use.
    let mnt2 = env.path("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let out = refused(&env.vol, &mnt2, &[]);
    assert!(out.stderr.contains("in use"), "message: {out}");
    // The first mount is untouched.
    assert!(is_mounted(&env.mnt));
    assert_eq!(fs::read(m.join("keep")).unwrap(), b"first mount");
    m.umount();
}

#[test]
fn mount_of_a_non_volume() {
    let _serial = serial();
    let env = Env::bare("err-not-volume");
    let empty = env.path("empty");
    fs::create_dir(&empty).unwrap();
    fs::write(empty.join("some-file"), b"not a volume").unwrap();
    for dir in [empty.clone(), env.path("does-not-exist")] {
        let out = refused(&dir, &env.mnt, &[]);
        assert!(
            out.stderr.contains("is not a Cairn volume") && out.stderr.contains(dir.to_str().unwrap()),
            "message: {out}"
        );
    }
    assert_eq!(fs::read(empty.join("some-file")).unwrap(), b"not a volume");
    assert_eq!(fs::read_dir(&empty).unwrap().count(), 1, "a refused mount wrote into the directory");
}

#[test]
fn unknown_config_version_is_refused() {
    let _serial = serial();
    let env = Env::new("err-version");
    let m = env.mount();
    fs::write(m.join("data"), b"precious").unwrap();
    m.umount();
    let cfg_path = env.vol.join("store/config");
    let original = fs::read_to_string(&cfg_path).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&original).unwrap();
    assert_eq!(cfg["version"], 1);
    cfg["version"] = 99.into();
    fs::write(&cfg_path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();

    let out = refused(&env.vol, &env.mnt, &[]);
    assert!(out.stderr.contains("version 99"), "message should name the version: {out}");
    for cmd in ["fsck", "stats"] {
        let out = cairn([OsStr::new(cmd), env.vol.as_os_str()]);
        assert!(!out.ok() && out.stderr.contains("version 99"), "{cmd} of a version-99 volume: {out}");
    }
    // Nothing was touched: restoring the config brings the volume back.
    assert_eq!(fs::read_to_string(&cfg_path).unwrap(), serde_json::to_string_pretty(&cfg).unwrap());
    fs::write(&cfg_path, original).unwrap();
    let m = env.mount();
    assert_eq!(fs::read(m.join("data")).unwrap(), b"precious");
    m.umount();
}

#[test]
fn encrypted_volume_needs_the_right_passphrase() {
    let _serial = serial();
    let env = Env::bare("err-passphrase");
    let right = env.path("right.pass");
    let wrong = env.path("wrong.pass");
    fs::write(&right, "correct horse battery staple\n").unwrap();
    fs::write(&wrong, "incorrect horse\n").unwrap();
    let out = cairn_ok([
        OsStr::new("init"),
        env.vol.as_os_str(),
        OsStr::new("--encrypt"),
        OsStr::new("--passphrase-file"),
        right.as_os_str(),
    ]);
    assert!(out.stdout.contains("encrypted"), "{out}");

    let wrong_arg = wrong.to_str().unwrap();
    let out = refused(&env.vol, &env.mnt, &["--passphrase-file", wrong_arg]);
    assert!(out.stderr.contains("wrong passphrase"), "message: {out}");
    let out = cairn([OsStr::new("fsck"), env.vol.as_os_str(), OsStr::new("--passphrase-file"), wrong.as_os_str()]);
    assert!(!out.ok() && out.stderr.contains("wrong passphrase"), "fsck with a wrong passphrase: {out}");

    let right_arg = right.to_str().unwrap();
    let m = env.mount_with(&["--passphrase-file", right_arg]);
    let data = gen(91, 3 << 20);
    fs::write(m.join("secret"), &data).unwrap();
    m.umount();
    // The plaintext is nowhere in the packs.
    for p in env.packs() {
        let bytes = fs::read(&p).unwrap();
        assert!(
            !bytes.windows(64).any(|w| w == &data[1 << 20..(1 << 20) + 64]),
            "plaintext found in {}",
            p.display()
        );
    }
    let m = env.mount_with(&["--passphrase-file", right_arg]);
    assert!(fs::read(m.join("secret")).unwrap() == data);
    m.umount();
    let (out, rep) = {
        let out = cairn([
            OsStr::new("fsck"),
            env.vol.as_os_str(),
            OsStr::new("--read-data"),
            OsStr::new("--json"),
            OsStr::new("--passphrase-file"),
            right.as_os_str(),
        ]);
        let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
        (out, rep)
    };
    assert!(out.ok() && rep["errors"].as_array().unwrap().is_empty(), "{out}");
}

#[test]
fn fsck_of_a_mounted_volume_says_in_use() {
    let _serial = serial();
    let env = Env::new("err-fsck-mounted");
    let m = env.mount();
    fs::write(m.join("f"), b"data").unwrap();
    for args in [vec!["fsck"], vec!["fsck", "--read-data"], vec!["gc"]] {
        let mut a: Vec<&OsStr> = vec![OsStr::new(args[0]), env.vol.as_os_str()];
        a.extend(args[1..].iter().map(OsStr::new));
        let out = cairn(&a);
        assert!(!out.ok(), "{args:?} of a mounted volume succeeded: {out}");
        assert!(out.stderr.contains("in use"), "{args:?} message: {out}");
    }
    // The mount did not notice.
    assert_eq!(fs::read(m.join("f")).unwrap(), b"data");
    m.umount();
    env.assert_fsck_clean(|_| false);
}
