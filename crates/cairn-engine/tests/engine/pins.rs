//! Tier pins and `tier status` (issue 53, docs/tiers.md §5): pins
//! inherited at create, `-r` on a tree, the owner-or-root rule through the
//! control socket, bytes by tier, the tier a new pack records, and an
//! old-schema volume that opens and reads. On the suite's metadata store
//! (`CAIRN_TEST_META=postgres` runs them on PostgreSQL).

use crate::common::*;
use cairn_engine::control::{self, Request};
use cairn_engine::*;
use std::path::Path;

fn mkdir(v: &Volume, parent: Ino, name: &str) -> Ino {
    v.mkdir(parent, name.as_bytes(), 0o755, root()).unwrap().ino
}

fn empty(v: &Volume, parent: Ino, name: &str) -> Ino {
    v.create(parent, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap().ino
}

/// A file or directory made under a pinned directory takes its pin,
/// marked inherited, at any depth (files, directories, symlinks); under
/// an unpinned one, none; a pin set later on a parent changes no
/// existing child.
#[test]
fn a_pin_is_inherited_at_create() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let cold = mkdir(&v, ROOT_INO, "cold");
    let before = empty(&v, cold, "before");
    assert_eq!(v.set_tier_pin(cold, TierPin::Cold, false).unwrap(), 1);
    assert_eq!(v.tier_pin(cold).unwrap(), (TierPin::Cold, false), "a pin set here is not inherited");
    let f = mkfile(&v, cold, "f", b"data");
    let sub = mkdir(&v, cold, "sub");
    let deep = mkfile(&v, sub, "deep", b"deeper");
    let deeper = mkdir(&v, sub, "deeper");
    let deepest = empty(&v, deeper, "x");
    let link = v.symlink(sub, b"l", b"deep", root()).unwrap().ino;
    for (ino, what) in [(f, "file"), (sub, "directory"), (deep, "file two levels down"), (deeper, "directory two levels down"), (deepest, "file three levels down"), (link, "symlink")] {
        assert_eq!(v.tier_pin(ino).unwrap(), (TierPin::Cold, true), "{what}");
    }
    assert_eq!(v.tier_pin(before).unwrap(), (TierPin::Auto, false), "a file made before the pin changed");
    let plain = mkdir(&v, ROOT_INO, "plain");
    assert_eq!(v.tier_pin(empty(&v, plain, "g")).unwrap(), (TierPin::Auto, false));
    // A pin set on a child replaces the inherited one for its own new children.
    v.set_tier_pin(sub, TierPin::Hot, false).unwrap();
    assert_eq!(v.tier_pin(empty(&v, sub, "h")).unwrap(), (TierPin::Hot, true));
    assert_eq!(v.tier_pin(deep).unwrap(), (TierPin::Cold, true));
    // The pins outlive a reopen.
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    assert_eq!(v.tier_pin(deepest).unwrap(), (TierPin::Cold, true));
    assert_eq!(v.tier_pin(sub).unwrap(), (TierPin::Hot, false));
    v.close().unwrap();
}

/// `-r` pins every inode of the tree (set, not inherited), and nothing
/// outside it; `auto -r` clears them.
#[test]
fn a_recursive_pin_covers_the_tree() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let t = mkdir(&v, ROOT_INO, "t");
    let a = mkdir(&v, t, "a");
    let b = mkdir(&v, a, "b");
    let mut inos = vec![t, a, b];
    for (i, dir) in [t, a, b, b].into_iter().enumerate() {
        inos.push(mkfile(&v, dir, &format!("f{i}"), &random_bytes(i as u64, 10_000)));
    }
    let outside = mkfile(&v, ROOT_INO, "outside", b"x");
    assert_eq!(v.set_tier_pin(t, TierPin::Warm, true).unwrap(), inos.len() as u64);
    for &ino in &inos {
        assert_eq!(v.tier_pin(ino).unwrap(), (TierPin::Warm, false), "inode {ino}");
    }
    assert_eq!(v.tier_pin(outside).unwrap(), (TierPin::Auto, false));
    assert_eq!(v.tier_pin(ROOT_INO).unwrap(), (TierPin::Auto, false));
    let s = v.tier_status(b"t", None).unwrap();
    assert_eq!(s.pinned.get("warm"), Some(&(inos.len() as u64)));
    assert_eq!(v.set_tier_pin(t, TierPin::Auto, true).unwrap(), inos.len() as u64);
    assert!(inos.iter().all(|&i| v.tier_pin(i).unwrap() == (TierPin::Auto, false)));
    // Without -r only the path itself.
    assert_eq!(v.set_tier_pin(t, TierPin::Cold, false).unwrap(), 1);
    assert_eq!(v.tier_pin(a).unwrap(), (TierPin::Auto, false));
    v.close().unwrap();
}

/// Sends `req` to the socket as user `uid` (this thread's effective uid
/// only: the raw setresuid changes one thread's credentials, which
/// SO_PEERCRED reports at connect).
fn call_as(uid: u32, sock: &Path, req: Request) -> Result<Option<serde_json::Value>> {
    let sock = sock.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: a plain system call on this thread's credentials; the
        // thread ends after the call.
        let rc = unsafe { libc::syscall(libc::SYS_setresgid, -1i64, uid as i64, -1i64) + libc::syscall(libc::SYS_setresuid, -1i64, uid as i64, -1i64) };
        assert_eq!(rc, 0, "setresuid({uid}) on the test thread failed: {}", std::io::Error::last_os_error());
        control::call(&sock, &req)
    })
    .join()
    .unwrap()
}

/// Through the mount's control socket, a pin needs the owner of every
/// inode it changes, or root, as chmod does: another user gets EPERM and
/// nothing is pinned (a tree with one inode of another user's included);
/// the owner and root may.
#[test]
fn a_pin_through_the_control_socket_needs_the_owner() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test changes a thread's user to call the control socket as another user, and needs root (the test suite runs as root)");
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let user = Caller { uid: 4242, gid: 4242 };
    let mine = v.mkdir(ROOT_INO, b"mine", 0o755, user).unwrap().ino;
    let f = v.create(mine, b"f", FileKind::File, 0o644, 0, user).unwrap().ino;
    let roots = empty(&v, mine, "roots"); // root's file in the user's directory
    let theirs = empty(&v, ROOT_INO, "theirs");
    let sock = control::socket_path(d.path());
    let server = control::serve(&v, &sock).unwrap();
    // The socket is the mounter's (0600, in a 0700 directory): open it
    // to the test's other user.
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let set = |path: &str, pin: TierPin, recursive: bool| Request::TierSet { path: path.as_bytes().to_vec(), pin, recursive };

    let e = call_as(4242, &sock, set("theirs", TierPin::Cold, false)).expect_err("another user's file was pinned");
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    assert!(e.to_string().contains("owner"), "{e}");
    assert_eq!(v.tier_pin(theirs).unwrap(), (TierPin::Auto, false));
    // A tree with one inode of another user's: refused whole.
    let e = call_as(4242, &sock, set("mine", TierPin::Cold, true)).expect_err("a tree with root's file was pinned");
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    for ino in [mine, f, roots] {
        assert_eq!(v.tier_pin(ino).unwrap(), (TierPin::Auto, false), "inode {ino} was pinned by a refused request");
    }
    // The owner may pin its own file; root may pin anything.
    let r = call_as(4242, &sock, set("mine/f", TierPin::Hot, false)).unwrap().unwrap();
    assert_eq!(r["pinned"], 1);
    assert_eq!(v.tier_pin(f).unwrap(), (TierPin::Hot, false));
    let r = call_as(0, &sock, set("mine", TierPin::Cold, true)).unwrap().unwrap();
    assert_eq!(r["pinned"], 3);
    assert_eq!(v.tier_pin(roots).unwrap(), (TierPin::Cold, false));
    // Status through the socket reads the pin back.
    let s: TierStatus = serde_json::from_value(call_as(0, &sock, Request::TierStatus { path: b"mine".to_vec() }).unwrap().unwrap()).unwrap();
    assert_eq!((s.pin, s.inherited, s.kind.as_str()), (TierPin::Cold, false, "dir"));
    drop(server);
    v.close().unwrap();
}

/// On a volume in a local directory every chunk is in the home tier:
/// the bytes `tier status` shows for a file and for a tree equal the
/// files' sizes (no dedup, no holes here), and the stored bytes are the
/// chunks'. A pack recorded in another tier moves its bytes there, and a
/// restore row of one of the tree's packs is shown.
#[test]
fn tier_status_counts_the_bytes_of_each_tier() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let t = mkdir(&v, ROOT_INO, "t");
    let sub = mkdir(&v, t, "sub");
    let sizes = [300_000usize, 123_457, 1, 0, 2_000_000];
    let mut total = 0u64;
    for (i, n) in sizes.iter().enumerate() {
        mkfile(&v, if i % 2 == 0 { t } else { sub }, &format!("f{i}"), &random_bytes(100 + i as u64, *n));
        total += *n as u64;
    }
    let s = v.tier_status(b"t", Some(root())).unwrap();
    assert_eq!((s.files, s.file_bytes, s.kind.as_str(), s.home.as_str()), (sizes.len() as u64, total, "dir", "local"));
    assert_eq!(s.tiers.len(), 1, "{s:?}");
    let home = &s.tiers[0];
    assert_eq!((home.tier.as_str(), home.class.as_str(), home.bytes), ("home", "local", total));
    assert!(home.stored_bytes > 0 && home.chunks > 0 && home.packs > 0, "{home:?}");
    let one = v.tier_status(b"t/f0", None).unwrap();
    assert_eq!((one.files, one.file_bytes, one.tiers[0].bytes), (1, 300_000, 300_000));
    assert_eq!(v.tier_status(b"t", None).unwrap(), s, "the caller-free status differs");
    v.close().unwrap();
    drop(v);
    // One pack of the tree recorded as in GLACIER, with a restore asked.
    meta_sql(d.path(), "UPDATE packs SET tier = 4 WHERE id = (SELECT MIN(id) FROM packs)");
    meta_sql(d.path(), "INSERT INTO restores(pack, class, requested_ns, ready_estimate_ns, expires_ns) SELECT MIN(id), 4, 1000, 2000, NULL FROM packs");
    let v = open(d.path());
    let s2 = v.tier_status(b"t", None).unwrap();
    assert_eq!(s2.tiers.len(), 2, "{s2:?}");
    assert_eq!((s2.tiers[0].tier.as_str(), s2.tiers[1].tier.as_str(), s2.tiers[1].class.as_str()), ("home", "GLACIER", "GLACIER"));
    assert_eq!(s2.tiers[0].bytes + s2.tiers[1].bytes, total);
    assert!(s2.tiers[1].bytes > 0 && s2.tiers[1].packs == 1, "{s2:?}");
    assert_eq!(s2.restores.len(), 1, "{s2:?}");
    assert_eq!((s2.restores[0].class.as_str(), s2.restores[0].ready_estimate_ns), ("GLACIER", 2000));
    v.close().unwrap();
}

/// Every pack the flusher writes records the home tier, since the time of
/// its commit (`packs.tier`, `packs.tier_since`).
#[test]
fn a_new_pack_records_the_home_tier_and_when() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let before = Timestamp::now().0;
    let v = open(d.path());
    mkfile(&v, ROOT_INO, "f", &random_bytes(9, 3_000_000));
    v.sync().unwrap();
    let after = Timestamp::now().0;
    v.close().unwrap();
    drop(v);
    // Rows outside [before, after] or not in the home tier, and all rows.
    let q = format!("SELECT COUNT(*) FILTER (WHERE tier <> 0 OR tier_since < {before} OR tier_since > {after}), COUNT(*) FROM packs");
    let (bad, all) = meta_counts(d.path(), &q);
    assert!(all > 0, "no packs were written");
    assert_eq!(bad, 0, "{bad} of {all} packs do not record the home tier since their commit");
}

/// Two counts a query answers on the (closed) volume's metadata.
fn meta_counts(dir: &Path, sql: &str) -> (i64, i64) {
    if meta_url().is_some() {
        let (_, _, _, cfg) = read_config(dir).unwrap();
        let out = pg_query(&format!("SET search_path TO cairn_{}; {sql}", cfg.volume_id));
        let v: Vec<i64> = out.split('|').map(|x| x.trim().parse().unwrap()).collect();
        (v[0], v[1])
    } else {
        let c = rusqlite::Connection::open(dir.join("meta.sqlite")).unwrap();
        c.query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
    }
}

/// A volume whose metadata is of the schema before tiers (its new
/// columns and table dropped, its version set back) opens, is upgraded,
/// reads its file byte for byte, and its pins and status work.
#[test]
fn a_volume_of_the_previous_schema_opens_and_reads() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let data = random_bytes(77, 500_000);
    let dir = mkdir(&v, ROOT_INO, "d");
    let f = mkfile(&v, dir, "f", &data);
    v.close().unwrap();
    drop(v);
    let old = if meta_url().is_some() { 7 } else { 2 };
    meta_sql(
        d.path(),
        &format!(
            "ALTER TABLE packs DROP COLUMN tier_since; ALTER TABLE packs DROP COLUMN tier; ALTER TABLE inodes DROP COLUMN tier_pin; DROP TABLE restores;
             UPDATE info SET value = {old} WHERE key = 'schema'"
        ),
    );
    let v = open(d.path());
    assert_eq!(read_all(&v, f), data, "the file changed across the upgrade");
    assert_eq!(v.tier_pin(f).unwrap(), (TierPin::Auto, false));
    let s = v.tier_status(b"d", None).unwrap();
    assert_eq!((s.tiers.len(), s.tiers[0].bytes), (1, data.len() as u64));
    v.set_tier_pin(dir, TierPin::Cold, false).unwrap();
    assert_eq!(v.tier_pin(empty(&v, dir, "new")).unwrap(), (TierPin::Cold, true));
    v.close().unwrap();
}

/// A volume in a bucket whose database is of schema 2 (before tiers) is
/// upgraded at its read-write open and ships a base next (a session's
/// patchset holds rows, not columns or tables), so that another machine
/// starting from the bucket has the new schema and the pins set after.
#[test]
fn a_bucket_volume_upgraded_from_schema_2_ships_a_base() {
    use crate::cloud::{init_in, open_in, opts};
    use cairn_backend::Backend;
    use cairn_engine::cache::disk::Durability;
    use cairn_engine::cloud::versions;
    use std::sync::Arc;
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(cairn_testing::MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    {
        let c = rusqlite::Connection::open(a.path().join("meta.sqlite")).unwrap();
        c.execute_batch(
            "ALTER TABLE packs DROP COLUMN tier_since; ALTER TABLE packs DROP COLUMN tier; ALTER TABLE inodes DROP COLUMN tier_pin; DROP TABLE restores;
             UPDATE info SET value = 2 WHERE key = 'schema'",
        )
        .unwrap();
    }
    let mut o = opts(&bucket, Durability::Local);
    o.cloud.meta_interval = std::time::Duration::from_secs(3600);
    let v = Volume::load(a.path(), o).unwrap();
    let dir = mkdir(&v, ROOT_INO, "d");
    v.set_tier_pin(dir, TierPin::Cold, false).unwrap();
    v.close().unwrap();
    drop(v);
    let all = versions::list(bucket.as_ref()).unwrap();
    assert_eq!(all.last().unwrap().kind, versions::Kind::Base, "{all:?}");
    let b = tempfile::tempdir().unwrap();
    let v = open_in(b.path(), &bucket, Durability::Local);
    assert_eq!(v.tier_pin(v.lookup(ROOT_INO, b"d").unwrap().ino).unwrap(), (TierPin::Cold, false));
    v.close().unwrap();
}
