//! `cairn ... --meta URL`: a volume in a local directory whose metadata
//! lives in PostgreSQL (issue 26, docs/shared-volume.md §1), through the
//! real binary and real FUSE mounts, on a throwaway PostgreSQL cluster
//! (`cairn_testing::postgres::PgServer`): one per test process, started on
//! first use and stopped at exit; each test has a database of its own.
//! Without PostgreSQL's server binaries these tests fail, saying what to
//! install.

use crate::common::*;
use crate::roundtrip::{build_tree_with, check_copy};
use cairn_testing::postgres::PgServer;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

const MIB: u64 = 1 << 20;

/// The server, taken and stopped at exit (statics are never dropped).
static SERVER: Mutex<Option<PgServer>> = Mutex::new(None);

extern "C" fn stop_server() {
    if let Ok(mut s) = SERVER.lock() {
        drop(s.take());
    }
}

/// The URL of a new, empty database `name` on the process's server.
pub(crate) fn database(name: &str) -> String {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let pg = PgServer::start().unwrap_or_else(|e| panic!("starting a PostgreSQL server for the tests: {e}"));
        *SERVER.lock().unwrap() = Some(pg);
        // SAFETY: registers a plain function with no preconditions.
        unsafe { libc::atexit(stop_server) };
    });
    let s = SERVER.lock().unwrap();
    let pg = s.as_ref().unwrap();
    pg.create_database(name).unwrap();
    pg.url(name)
}

/// `cairn ARGS...` with `env` set.
fn cairn_env(args: &[&OsStr], env: &[(&str, &str)]) -> Out {
    run(Command::new(CAIRN).args(args).envs(env.iter().copied()))
}

fn os<'a>(v: &'a [&'a str]) -> Vec<&'a OsStr> {
    v.iter().map(OsStr::new).collect()
}

/// `cairn stats VOL --json EXTRA...`, which must succeed.
fn stats_json(vol: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args: Vec<&OsStr> = vec![OsStr::new("stats"), vol.as_os_str(), OsStr::new("--json")];
    args.extend(os(extra));
    let out = cairn(&args);
    assert!(out.ok(), "{out}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("stats JSON: {e}\n{out}"))
}

/// The regular files under `dir`, counted by inode (hard links once).
fn regular_files(dir: &Path, inodes: &mut std::collections::BTreeSet<u64>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    for e in fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            regular_files(&e.path(), inodes);
        } else if t.is_file() {
            inodes.insert(e.metadata().unwrap().ino());
        }
    }
    inodes.len() as u64
}

#[test]
fn a_volume_with_postgres_metadata_round_trips_through_fuse() {
    let _serial = serial();
    let url = database("roundtrip");
    let env = Env::with_init("pg-roundtrip", &["--meta", &url]);
    assert!(!env.vol.join("meta.sqlite").exists(), "no SQLite database beside PostgreSQL");
    let config = fs::read_to_string(env.vol.join("store/config")).unwrap();
    assert!(config.contains("\"meta\": \"postgres\"") && !config.contains("127.0.0.1"), "the config says where the metadata is, never the server: {config}");

    let src = env.path("src");
    build_tree_with(&src, 300, 4 * MIB);
    let m = env.mount_with(&["--meta", &url]);
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    // A mounted volume answers `stats` through its mount: no URL needed.
    let s = stats_json(&env.vol, &[]);
    assert!(s["files"].as_u64().unwrap() > 300, "{s}");
    m.umount();

    let m = env.mount_with(&["--meta", &url]);
    check_copy(&src, m.path(), "postgres metadata");
    m.umount();

    let url_arg = [OsString::from("--meta"), OsString::from(&url)];
    assert_fsck_clean_at(&env.vol, true, &url_arg, |_| false);
    let s = stats_json(&env.vol, &["--meta", &url]);
    assert_eq!(s["files"].as_u64(), Some(regular_files(&src, &mut Default::default())), "{s}");
    assert!(s["logical_bytes"].as_u64().unwrap() > 2 << 30, "the sparse file's size counts: {s}");
}

#[test]
fn a_postgres_volume_without_the_url_is_refused_saying_what_to_add() {
    let _serial = serial();
    let url = database("without");
    let env = Env::with_init("pg-without", &["--meta", &url]);
    let out = cairn([OsStr::new("mount"), env.vol.as_os_str(), env.mnt.as_os_str()]);
    assert!(!out.ok(), "{out}");
    assert!(out.stderr.contains("metadata in PostgreSQL") && out.stderr.contains("add --meta postgres://USER@HOST/DB"), "{out}");
    assert!(!is_mounted(&env.mnt), "nothing mounted");
    for cmd in ["fsck", "stats", "gc"] {
        let out = cairn([OsStr::new(cmd), env.vol.as_os_str()]);
        assert!(!out.ok() && out.stderr.contains("add --meta postgres://USER@HOST/DB"), "{cmd}: {out}");
    }

    // The other way round: --meta on a volume whose metadata is in SQLite.
    let plain = Env::new("pg-sqlite");
    let out = cairn([OsStr::new("mount"), plain.vol.as_os_str(), plain.mnt.as_os_str(), OsStr::new("--meta"), OsStr::new(&url)]);
    assert!(!out.ok() && out.stderr.contains("SQLite") && out.stderr.contains("leave out --meta"), "{out}");
    assert!(!is_mounted(&plain.mnt), "nothing mounted");
    let out = cairn([OsStr::new("fsck"), plain.vol.as_os_str(), OsStr::new("--meta"), OsStr::new(&url)]);
    assert!(!out.ok() && out.stderr.contains("leave out --meta"), "{out}");
    // CAIRN_META is a default only: a volume in SQLite ignores it.
    let out = cairn_env(&[OsStr::new("fsck"), plain.vol.as_os_str()], &[("CAIRN_META", &url)]);
    assert!(out.ok(), "CAIRN_META set, SQLite volume: {out}");
}

#[test]
fn a_url_with_a_password_is_refused_and_never_echoed() {
    let _serial = serial();
    let url = database("password");
    let secret = "hunter2-very-secret";
    let with_password = url.replacen("postgres@", &format!("postgres:{secret}@"), 1);
    assert_ne!(with_password, url);
    let as_param = format!("{url}?password={secret}");
    let env = Env::bare("pg-password");
    let check = |out: &Out, what: &str| {
        assert!(!out.ok(), "{what}: {out}");
        assert!(out.stderr.contains("PGPASSWORD") && out.stderr.contains("pgpass") && out.stderr.contains("PGPASSFILE"), "{what}: {out}");
        assert!(!out.text().contains(secret), "{what}: the password is echoed: {out}");
    };
    for u in [&with_password, &as_param] {
        let out = cairn([OsStr::new("init"), env.vol.as_os_str(), OsStr::new("--meta"), OsStr::new(u)]);
        check(&out, "init --meta");
        assert!(!env.vol.exists(), "a refused init leaves nothing");
        let out = cairn_env(&[OsStr::new("init"), env.vol.as_os_str()], &[("CAIRN_META", u)]);
        check(&out, "init with CAIRN_META");
        assert!(out.stderr.contains("CAIRN_META"), "names where the URL came from: {out}");
        assert!(!env.vol.exists(), "a refused init leaves nothing");
    }
    // An existing volume: mount and the maintenance commands refuse it too,
    // before anything (the log included) sees it.
    cairn_ok([OsStr::new("init"), env.vol.as_os_str(), OsStr::new("--meta"), OsStr::new(&url)]);
    let out = cairn([OsStr::new("mount"), env.vol.as_os_str(), env.mnt.as_os_str(), OsStr::new("--meta"), OsStr::new(&with_password)]);
    check(&out, "mount --meta");
    assert!(!is_mounted(&env.mnt), "nothing mounted");
    for cmd in ["fsck", "stats", "gc", "cost"] {
        let out = cairn([OsStr::new(cmd), env.vol.as_os_str(), OsStr::new("--meta"), OsStr::new(&with_password)]);
        check(&out, cmd);
    }
    assert!(!env.log().contains(secret), "the log has the password");
}

#[test]
fn cairn_meta_in_the_environment_works_as_the_flag() {
    let _serial = serial();
    let url = database("environment");
    let env = Env::bare("pg-environment");
    let e = [("CAIRN_META", url.as_str())];
    let out = cairn_env(&[OsStr::new("init"), env.vol.as_os_str()], &e);
    assert!(out.ok() && out.stdout.contains("metadata in PostgreSQL"), "{out}");
    assert!(!env.vol.join("meta.sqlite").exists(), "CAIRN_META made a PostgreSQL volume");
    let m = Mount::new_with_env(&env.vol, &env.mnt, &[], &e).unwrap_or_else(|o| panic!("mount with CAIRN_META: {o}"));
    fs::create_dir_all(m.join("a/b/c")).unwrap();
    write_random_file(&m.join("a/b/c/data"), 77, 3 * MIB + 17);
    fs::write(m.join("a/note"), b"hello from postgres").unwrap();
    m.umount();
    let m = Mount::new_with_env(&env.vol, &env.mnt, &[], &e).unwrap_or_else(|o| panic!("remount with CAIRN_META: {o}"));
    check_stream(&m.join("a/b/c/data"), 77, 3 * MIB + 17, true).unwrap();
    assert_eq!(fs::read(m.join("a/note")).unwrap(), b"hello from postgres");
    m.umount();
    let out = cairn_env(&[OsStr::new("fsck"), env.vol.as_os_str(), OsStr::new("--json"), OsStr::new("--read-data")], &e);
    let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|err| panic!("{err}: {out}"));
    assert!(out.ok() && rep["errors"].as_array().unwrap().is_empty(), "{out}");
    // --meta wins over CAIRN_META.
    let out = cairn_env(&[OsStr::new("stats"), env.vol.as_os_str(), OsStr::new("--json"), OsStr::new("--meta"), OsStr::new(&url)], &[("CAIRN_META", "postgres://nobody@127.0.0.1:1/nothing")]);
    assert!(out.ok(), "{out}");
}

#[test]
fn gc_with_postgres_metadata_frees_deleted_data() {
    let _serial = serial();
    let url = database("gc");
    let env = Env::with_init("pg-gc", &["--meta", &url, "--pack-size", "1M"]);
    let m = env.mount_with(&["--meta", &url]);
    for i in 0..6 {
        write_random_file(&m.join(&format!("f{i}")), 100 + i, 2 * MIB);
    }
    m.umount();
    let before = env.packs().len();
    let m = env.mount_with(&["--meta", &url]);
    for i in 0..4 {
        fs::remove_file(m.join(&format!("f{i}"))).unwrap();
    }
    m.umount();
    // Within the chunk grace (15 minutes by default) gc leaves the dead
    // chunks alone and says so.
    let out = cairn_ok([OsStr::new("gc"), env.vol.as_os_str(), OsStr::new("--meta"), OsStr::new(&url)]);
    assert!(out.stdout.contains("packs left for a later gc") && out.stdout.contains("--chunk-grace"), "{out}");
    assert_eq!(env.packs().len(), before, "gc within the grace deleted packs");
    let out = cairn_ok([OsStr::new("gc"), env.vol.as_os_str(), OsStr::new("--json"), OsStr::new("--meta"), OsStr::new(&url), OsStr::new("--chunk-grace"), OsStr::new("0")]);
    let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(rep["chunks_deleted"].as_u64().unwrap() > 0 && rep["packs_deleted"].as_u64().unwrap() > 0 && rep["packs_settling"] == 0, "{out}");
    assert!(env.packs().len() < before, "gc deleted packs: {} before, {} after", before, env.packs().len());
    let url_arg = [OsString::from("--meta"), OsString::from(&url)];
    assert_fsck_clean_at(&env.vol, true, &url_arg, |_| false);
    let m = env.mount_with(&["--meta", &url]);
    for i in 4..6 {
        check_stream(&m.join(&format!("f{i}")), 100 + i, 2 * MIB, true).unwrap();
    }
    m.umount();
}

/// `psql -d DB -c SQL` on the process's server (started by [`database`]).
pub(crate) fn psql(db: &str, sql: &str) -> String {
    let s = SERVER.lock().unwrap();
    let pg = s.as_ref().expect("no PostgreSQL server yet: call database() first");
    pg.psql(db, sql).unwrap_or_else(|e| panic!("psql {sql}: {e}"))
}
