//! The contract checks every metadata store must pass
//! (`docs/metadata-store.md`): [`CHECKS`] of the core traits on every
//! store, and [`SHARED_CHECKS`] of [`SharedVolume`] on every store that
//! offers it ([`MetaStore::shared`]). Each store's tests run them through
//! [`conformance_tests!`](crate::conformance_tests), so a new store is
//! proven the same way as the two there are.

use crate::*;
use std::collections::HashMap;

/// The page format of the suite: a page's bytes are the little-endian ids
/// of the chunks it references. A store under test must be opened with it.
pub struct TestCodec;

impl PageCodec for TestCodec {
    fn chunk_ids(&self, data: &[u8], out: &mut Vec<u64>) -> Result<()> {
        if data.len() % 8 != 0 {
            return Err(Error::corrupt("test page of a length not a multiple of 8"));
        }
        out.extend(data.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
        Ok(())
    }
}

/// A page of the suite's format referencing `chunks`.
pub fn test_page(key: i64, chunks: &[u64]) -> PageUpsert {
    PageUpsert { key, id: 0, data: chunks.iter().flat_map(|c| c.to_le_bytes()).collect(), chunks: chunks.to_vec() }
}

/// The checks of the core traits, by the name of their functions, in the
/// order [`run_all`] runs them: every store passes each.
/// [`conformance_tests!`](crate::conformance_tests) makes one `#[test]` of
/// each (and fails if its list and this one differ).
pub const CHECKS: &[&str] = &[
    "namespace",
    "entry_removal_checks_the_inode",
    "xattrs",
    "pages_and_reference_counts",
    "a_hash_is_claimed_once",
    "a_chunk_moves_only_from_its_pack",
    "bad_reference_counts_fail_whole",
    "rollback_leaves_nothing",
    "locking_writes",
    "shared_clock",
    "read_your_writes_and_sync",
    "ids_never_repeat",
    "journal_positions",
    "pack_tiers",
    "tier_pins_are_inherited",
    "restores",
];

/// The checks of [`SharedVolume`] (and of what offering it promises of
/// the core traits), run on every store that offers it, and only there.
pub const SHARED_CHECKS: &[&str] = &[
    "sessions",
    "expired_sessions_stay_lost",
    "maintenance_lock",
    "change_log",
    "open_files",
    "file_locks",
    "fencing",
    "content_versions",
    "journal_marks",
];

/// Runs one check (a name in [`CHECKS`] or [`SHARED_CHECKS`]); panics
/// with a message if the store breaks the contract (or, for a shared
/// check, offers no [`SharedVolume`]). `make` as for [`run_all`].
pub fn run_one(name: &str, make: &dyn Fn(bool) -> Box<dyn MetaStore>) {
    match name {
        "namespace" => namespace(&*make(true)),
        "entry_removal_checks_the_inode" => entry_removal_checks_the_inode(&*make(true)),
        "xattrs" => xattrs(&*make(true)),
        "pages_and_reference_counts" => pages_and_reference_counts(&*make(true)),
        "a_hash_is_claimed_once" => a_hash_is_claimed_once(&*make(true)),
        "a_chunk_moves_only_from_its_pack" => a_chunk_moves_only_from_its_pack(&*make(true)),
        "bad_reference_counts_fail_whole" => bad_reference_counts_fail_whole(&*make(true)),
        "rollback_leaves_nothing" => rollback_leaves_nothing(&*make(true)),
        "locking_writes" => locking_writes(&*make(true)),
        "shared_clock" => shared_clock(&*make(true)),
        "read_your_writes_and_sync" => read_your_writes_and_sync(&*make(true)),
        "ids_never_repeat" => ids_never_repeat(make),
        "journal_positions" => journal_positions(&*make(true)),
        "pack_tiers" => pack_tiers(&*make(true)),
        "tier_pins_are_inherited" => tier_pins_are_inherited(&*make(true)),
        "restores" => restores(&*make(true)),
        "sessions" => sessions(&*make(true)),
        "expired_sessions_stay_lost" => expired_sessions_stay_lost(&*make(true)),
        "maintenance_lock" => maintenance_lock(&*make(true)),
        "change_log" => change_log(&*make(true)),
        "open_files" => open_files(&*make(true)),
        "file_locks" => file_locks(&*make(true)),
        "fencing" => fencing(&*make(true)),
        "content_versions" => content_versions(&*make(true)),
        "journal_marks" => journal_marks(make),
        _ => panic!("no conformance check is named {name:?} (the names are conformance::CHECKS and SHARED_CHECKS)"),
    }
}

/// Runs every check of [`CHECKS`], and those of [`SHARED_CHECKS`] if the
/// store offers [`SharedVolume`]; panics with a message on the first
/// failure. Returns whether the shared checks ran.
/// `make(true)` makes a fresh, empty store (with the root directory, inode
/// 1) opened with [`TestCodec`]; `make(false)` reopens the store made last
/// (the caller has dropped it first, except for a shared store, which is
/// opened a second time as another machine).
/// A store's tests use [`conformance_tests!`](crate::conformance_tests)
/// instead, one test per check.
pub fn run_all(make: &dyn Fn(bool) -> Box<dyn MetaStore>) -> bool {
    for name in CHECKS {
        run_one(name, make);
    }
    let shared = make(true).shared().is_some();
    if shared {
        for name in SHARED_CHECKS {
            run_one(name, make);
        }
    }
    shared
}

/// The shared-volume capabilities of a store under a shared check.
fn sv(s: &dyn MetaStore) -> &dyn SharedVolume {
    s.shared().expect("a shared-volume check ran on a store that offers no SharedVolume (MetaStore::shared is None)")
}

/// Fencing and uploads (docs/shared-volume.md §7): a store with a session
/// records its uploads until the pack's row is inserted; once the session
/// is removed (another machine's cleanup), its writes, lock requests and
/// upload records fail with SessionLost and change nothing, and its
/// records stay listed for the grace only.
fn fencing(s: &dyn MetaStore) {
    let id = sv(s).open_session(&who("/fenced"), std::time::Duration::from_secs(60)).unwrap();
    let day = std::time::Duration::from_secs(86_400);
    let x = mk(s, ROOT_INO, b"before", FileKind::File);
    sv(s).begin_upload("packs/committed").unwrap();
    sv(s).begin_upload("packs/pending").unwrap();
    sv(s).begin_upload("packs/pending").unwrap(); // again (a retried statement): still one record
    assert_eq!(sv(s).uploads_in_flight(std::time::Duration::ZERO).unwrap(), ["packs/committed", "packs/pending"], "a live session's uploads");
    s.write_with(|tx| tx.insert_pack("packs/committed", 10, 1, 0)).unwrap();
    assert_eq!(sv(s).uploads_in_flight(std::time::Duration::ZERO).unwrap(), ["packs/pending"], "insert_pack did not drop its upload record");
    sv(s).begin_upload("packs/dropped").unwrap();
    sv(s).end_uploads(&["packs/dropped"]).unwrap();
    assert_eq!(sv(s).uploads_in_flight(day).unwrap(), ["packs/pending"]);
    let lock = LockRequest { ino: x, owner: LockOwner { session: id, owner: 7 }, style: LockStyle::Posix, kind: LockKind::Write, start: 0, end: LOCK_EOF, pid: 1 };
    assert_eq!(sv(s).set_lock(&lock).unwrap(), LockOutcome::Granted);
    // Another machine's cleanup removes the session (and its locks).
    assert!(sv(s).remove_session(id).unwrap());
    let e = mk_err(s, b"after");
    assert_eq!(e.kind(), ErrorKind::SessionLost, "a removed session's write committed: {e}");
    assert!(s.read_with(|r| r.lookup(ROOT_INO, b"after")).unwrap().is_none(), "a fenced write left a name");
    let e = s.write_with(|tx| tx.update_content(x, 5, 0, Timestamp(9), Timestamp(9), 0)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SessionLost, "{e}");
    assert_eq!(s.read_with(|r| r.get_inode(x)).unwrap().unwrap().attr.size, 0, "a fenced update_content changed the file");
    assert_eq!(sv(s).begin_upload("packs/late").unwrap_err().kind(), ErrorKind::SessionLost);
    assert_eq!(sv(s).set_lock(&lock).unwrap_err().kind(), ErrorKind::SessionLost, "a removed session took a lock again");
    assert!(sv(s).locks_on(x).unwrap().is_empty(), "a removed session's lock stayed");
    // Its records: kept for the grace, then dropped.
    assert_eq!(sv(s).uploads_in_flight(day).unwrap(), ["packs/pending"], "a gone session's upload record went before its grace");
    assert!(sv(s).uploads_in_flight(std::time::Duration::ZERO).unwrap().is_empty(), "a gone session's upload record outlived its grace");
    assert!(sv(s).uploads_in_flight(day).unwrap().is_empty(), "the record past its grace was listed but not deleted");
}

/// A create of `name` in the root that must fail: its error.
fn mk_err(s: &dyn MetaStore, name: &[u8]) -> Error {
    s.write_with(|tx| -> Result<()> {
        let ino = tx.alloc_ino()?;
        tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
        tx.insert_dentry(ROOT_INO, name, ino, FileKind::File)
    })
    .unwrap_err()
}

/// Content versions (`InodeRow::cver`, docs/shared-volume.md §3): a new
/// inode is at 0; every `update_content` raises it by exactly 1, and only
/// a committed one; attribute and name changes leave it.
fn content_versions(s: &dyn MetaStore) {
    let x = mk(s, ROOT_INO, b"cv", FileKind::File);
    let cver = || s.read_with(|r| r.get_inode(x)).unwrap().unwrap().cver;
    assert_eq!(cver(), 0, "a new inode's content version");
    s.write_with(|tx| tx.update_content(x, 10, 0, Timestamp(5), Timestamp(5), 1)).unwrap();
    assert_eq!(cver(), 1, "update_content did not raise the content version by 1");
    s.write_with(|tx| {
        tx.update_content(x, 20, 0, Timestamp(6), Timestamp(6), 2)?;
        assert_eq!(tx.get_inode(x)?.unwrap().cver, 2, "the transaction does not see its own raise");
        Err::<(), _>(Error::new(ErrorKind::Raced, "rolled back on purpose"))
    })
    .unwrap_err();
    assert_eq!(cver(), 1, "a rolled-back update_content raised the content version");
    let mut a = s.read_with(|r| r.get_inode(x)).unwrap().unwrap().attr;
    a.perm = 0o600;
    s.write_with(|tx| {
        tx.update_attr(&a)?;
        tx.set_nlink(x, 1, Timestamp(9))?;
        tx.touch_dir(ROOT_INO, Timestamp(9), 0)
    })
    .unwrap();
    assert_eq!(cver(), 1, "an attribute change raised the content version");
    s.write_with(|tx| {
        tx.update_content(x, 30, 0, Timestamp(7), Timestamp(7), 3)?;
        tx.update_content(x, 40, 0, Timestamp(8), Timestamp(8), 4)
    })
    .unwrap();
    assert_eq!(cver(), 3, "two update_content in one transaction raise it twice");
    assert_eq!(s.read_with(|r| r.all_inodes()).unwrap().iter().find(|r| r.attr.ino == x).unwrap().cver, 3, "all_inodes reads it too");
}

/// One `#[test]` per conformance check, so that the first failure hides
/// no other and each counts on its own, plus one that the lists are
/// complete and one that the store offers [`SharedVolume`] exactly when
/// its tests say so. `$maker` is an expression run at the start of each
/// test giving that test's `make` (a `Fn(bool) -> Box<dyn MetaStore>`, see
/// [`run_all`]). `core` runs [`CHECKS`]; `shared` runs [`SHARED_CHECKS`]
/// as well, and is what a store that offers [`SharedVolume`] must say
/// (its `offers_what_its_tests_say` test fails otherwise, and so does a
/// store that says `shared` but offers none).
/// ```ignore
/// mod contract {
///     cairn_meta::conformance_tests!(super::maker(); core);
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (@each $maker:expr; $($check:ident)*) => {
        $(
            #[test]
            fn $check() {
                let make = $maker;
                $crate::conformance::run_one(stringify!($check), &make);
            }
        )*
    };
    (@core $maker:expr) => {
        $crate::conformance_tests!(@each $maker;
            namespace entry_removal_checks_the_inode xattrs pages_and_reference_counts
            a_hash_is_claimed_once a_chunk_moves_only_from_its_pack bad_reference_counts_fail_whole rollback_leaves_nothing
            locking_writes shared_clock read_your_writes_and_sync ids_never_repeat journal_positions
            pack_tiers tier_pins_are_inherited restores);

        #[test]
        fn every_check_is_a_test() {
            let core: &[&str] = &[
                "namespace", "entry_removal_checks_the_inode", "xattrs", "pages_and_reference_counts",
                "a_hash_is_claimed_once", "a_chunk_moves_only_from_its_pack", "bad_reference_counts_fail_whole", "rollback_leaves_nothing",
                "locking_writes", "shared_clock", "read_your_writes_and_sync", "ids_never_repeat", "journal_positions",
                "pack_tiers", "tier_pins_are_inherited", "restores",
            ];
            let shared: &[&str] = &[
                "sessions", "expired_sessions_stay_lost", "maintenance_lock", "change_log", "open_files", "file_locks",
                "fencing", "content_versions", "journal_marks",
            ];
            assert_eq!(core, $crate::conformance::CHECKS, "conformance_tests! and conformance::CHECKS list different checks");
            assert_eq!(shared, $crate::conformance::SHARED_CHECKS, "conformance_tests! and conformance::SHARED_CHECKS list different checks");
        }
    };
    ($maker:expr; core) => {
        $crate::conformance_tests!(@core $maker);

        #[test]
        fn offers_what_its_tests_say() {
            let make = $maker;
            assert!(make(true).shared().is_none(), "this store offers SharedVolume, but its tests run only the core checks: say `shared` to conformance_tests!");
        }
    };
    ($maker:expr; shared) => {
        $crate::conformance_tests!(@core $maker);
        $crate::conformance_tests!(@each $maker;
            sessions expired_sessions_stay_lost maintenance_lock change_log open_files file_locks
            fencing content_versions journal_marks);

        #[test]
        fn offers_what_its_tests_say() {
            let make = $maker;
            assert!(make(true).shared().is_some(), "this store's tests run the shared-volume checks, but it offers no SharedVolume (MetaStore::shared is None)");
        }
    };
}

/// Journal positions (`docs/metadata-store.md` "Journal marks"): `jseq`
/// only grows and `max_jseq` follows it. A store that offers no
/// [`SharedVolume`] also answers as one process's store: content versions
/// stay 0, `mark_open` only says whether the inode exists, and no other
/// session has a file open.
fn journal_positions(s: &dyn MetaStore) {
    if let Some(v) = s.shared() {
        v.set_journal(0x0a0a_0a0a_0a0a_0a0a, false).unwrap();
    }
    let x = mk(s, ROOT_INO, b"x", FileKind::File);
    let row = |ino: Ino| s.read_with(|r| r.get_inode(ino)).unwrap().unwrap();
    s.write_with(|tx| tx.update_content(x, 10, 0, Timestamp(5), Timestamp(5), 6)).unwrap();
    s.write_with(|tx| tx.update_content(x, 10, 0, Timestamp(5), Timestamp(5), 4)).unwrap();
    assert_eq!(row(x).jseq, 6, "a journal position went back");
    assert_eq!(s.read_with(|r| r.max_jseq()).unwrap(), 6);
    assert_eq!(s.read_with(|r| r.all_inodes()).unwrap().iter().find(|r| r.attr.ino == x).unwrap().jseq, 6, "all_inodes reads the position too");
    if s.shared().is_none() {
        assert_eq!(row(x).cver, 0, "a store that keeps no content versions reports one");
        assert!(s.write_with(|tx| tx.mark_open(1, x, 1)).unwrap());
        assert!(!s.write_with(|tx| tx.mark_open(1, 999_999, 1)).unwrap(), "a missing inode was marked open");
        assert!(!s.read_with(|r| r.open_elsewhere(x, 1)).unwrap(), "a store one process writes says a file is open elsewhere");
    }
}

/// Journal marks per journal (`docs/metadata-store.md` "Journal marks"):
/// two machines' journals on one volume do not see each other's
/// positions, a new inode has no mark, marks go with their inode, and a
/// trim takes only its own journal's marks up to its bound.
fn journal_marks(make: &dyn Fn(bool) -> Box<dyn MetaStore>) {
    const A: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    const B: u64 = 0xb0b0_b0b0_b0b0_b0b0;
    let a = make(true);
    sv(&*a).set_journal(A, false).unwrap();
    let x = mk(&*a, ROOT_INO, b"x", FileKind::File);
    let jseq = |s: &dyn MetaStore, ino: Ino| s.read_with(|r| r.get_inode(ino)).unwrap().unwrap().jseq;
    let max = |s: &dyn MetaStore| s.read_with(|r| r.max_jseq()).unwrap();
    a.write_with(|tx| tx.update_content(x, 10, 0, Timestamp(5), Timestamp(5), 6)).unwrap();
    assert_eq!(jseq(&*a, x), 6);
    // Machine B: the same volume, its own journal, far ahead in it.
    let b = make(false);
    sv(&*b).set_journal(B, false).unwrap();
    assert_eq!(jseq(&*b, x), 0, "B sees A's position as its own");
    assert_eq!(max(&*b), 0, "max_jseq is not per journal");
    b.write_with(|tx| tx.update_content(x, 20, 0, Timestamp(7), Timestamp(7), 1030)).unwrap();
    assert_eq!(jseq(&*b, x), 1030);
    assert_eq!(jseq(&*a, x), 6, "B's commit at a high position changed A's mark: A would skip its own records after a crash");
    assert_eq!((max(&*a), max(&*b)), (6, 1030), "max_jseq is not per journal");
    assert_eq!(a.read_with(|r| r.get_inode(x)).unwrap().unwrap().attr.size, 20, "the content is one, whoever committed it");
    // A new inode has no mark in any journal.
    let y = b.write_with(|tx| -> Result<Ino> {
        let y = tx.alloc_ino()?;
        tx.insert_inode(&attr(y, FileKind::File), None, None, 2000)?;
        tx.insert_dentry(ROOT_INO, b"y", y, FileKind::File)?;
        Ok(y)
    })
    .unwrap();
    assert_eq!((jseq(&*a, y), jseq(&*b, y)), (0, 0), "a new inode got a mark");
    a.write_with(|tx| tx.update_content(y, 1, 0, Timestamp(8), Timestamp(8), 9)).unwrap();
    // A trim takes only its own journal's marks at or below its bound.
    assert_eq!(sv(&*a).trim_journal_marks(6).unwrap(), 1);
    assert_eq!((jseq(&*a, x), jseq(&*a, y), jseq(&*b, x)), (0, 9, 1030), "a trim went past its bound or its journal");
    // Marks go with their inode, in every journal.
    b.write_with(|tx| tx.update_content(y, 1, 0, Timestamp(8), Timestamp(8), 1040)).unwrap();
    b.write_with(|tx| {
        tx.delete_dentry(ROOT_INO, b"x", x)?;
        tx.delete_inode(x)?;
        tx.delete_dentry(ROOT_INO, b"y", y)?;
        tx.delete_inode(y)
    })
    .unwrap();
    assert_eq!((max(&*a), max(&*b)), (0, 0), "marks outlived their inode");
}

/// A new pack is in the home tier since it was inserted (docs/tiers.md
/// §2); a move records its tier and date; a missing pack has none.
fn pack_tiers(s: &dyn MetaStore) {
    let before = Timestamp::now().0;
    let p = s.write_with(|tx| tx.insert_pack("packs/t1", 100, 1, 0)).unwrap();
    let after = Timestamp::now().0;
    let t = s.read_with(|r| r.pack_tier(p)).unwrap().expect("a new pack has a tier");
    assert_eq!(t.tier, TIER_HOME, "a new pack lives in the home tier");
    assert!(before <= t.since && t.since <= after, "tier_since {} is not the insert's time ({before}..{after})", t.since);
    assert!(s.write_with(|tx| tx.set_pack_tier(p, TIER_GLACIER, 12345)).unwrap());
    assert_eq!(s.read_with(|r| r.pack_tier(p)).unwrap(), Some(PackTier { tier: TIER_GLACIER, since: 12345 }));
    assert!(!s.write_with(|tx| tx.set_pack_tier(p + 1000, TIER_GLACIER, 1)).unwrap(), "a missing pack's tier was set");
    assert_eq!(s.read_with(|r| r.pack_tier(p + 1000)).unwrap(), None);
}

/// A new inode made by `create_node` in `parent`.
fn create(s: &dyn MetaStore, parent: Ino, name: &[u8], kind: FileKind) -> Ino {
    s.write_with(|tx| -> Result<Ino> {
        let ino = tx.alloc_ino()?;
        let mut a = attr(ino, kind);
        if kind == FileKind::Dir {
            a.nlink = 2;
        }
        tx.create_node(&NewNode { attr: &a, parent, name, target: None, jseq: 0, now: Timestamp(5), open: None })?;
        Ok(ino)
    })
    .expect("create_node")
}

/// Pins (docs/tiers.md §5): `set_tier_pin` reads back; a file or
/// directory made by `create_node` under a pinned directory takes the
/// pin, marked inherited, at any depth; under an unpinned one, none.
fn tier_pins_are_inherited(s: &dyn MetaStore) {
    if let Some(v) = s.shared() {
        v.set_journal(0x5eed, false).unwrap();
    }
    let pin = |ino| s.read_with(|r| r.tier_pin(ino)).unwrap();
    assert_eq!(pin(ROOT_INO), Some(PIN_AUTO));
    let plain = create(s, ROOT_INO, b"plain", FileKind::Dir);
    let cold = create(s, ROOT_INO, b"cold", FileKind::Dir);
    assert_eq!((pin(plain), pin(cold)), (Some(PIN_AUTO), Some(PIN_AUTO)));
    assert!(s.write_with(|tx| tx.set_tier_pin(cold, PIN_COLD)).unwrap());
    assert_eq!(pin(cold), Some(PIN_COLD));
    let f = create(s, cold, b"f", FileKind::File);
    let sub = create(s, cold, b"sub", FileKind::Dir);
    let deep = create(s, sub, b"deep", FileKind::File);
    let deeper = create(s, sub, b"deeper", FileKind::Dir);
    let deepest = create(s, deeper, b"x", FileKind::File);
    for (ino, what) in [(f, "a file"), (sub, "a directory"), (deep, "a file two levels down"), (deeper, "a directory two levels down"), (deepest, "a file three levels down")] {
        assert_eq!(pin(ino), Some(PIN_COLD | PIN_INHERITED), "{what} under a cold-pinned directory");
    }
    assert_eq!(pin(create(s, plain, b"g", FileKind::File)), Some(PIN_AUTO), "a file under an unpinned directory");
    // A pin set on an inherited one replaces it (no longer inherited).
    assert!(s.write_with(|tx| tx.set_tier_pin(sub, PIN_HOT)).unwrap());
    assert_eq!(pin(create(s, sub, b"h", FileKind::File)), Some(PIN_HOT | PIN_INHERITED));
    assert_eq!(pin(deep), Some(PIN_COLD | PIN_INHERITED), "a pin changes existing files only when set on them");
    assert!(!s.write_with(|tx| tx.set_tier_pin(9_999_999, PIN_HOT)).unwrap(), "a missing inode's pin was set");
    assert_eq!(pin(9_999_999), None);
    // The row reads the same through get_inode (nothing else moved).
    assert_eq!(s.read_with(|r| r.get_inode(f)).unwrap().unwrap().attr.kind, FileKind::File);
}

/// Restore rows (docs/tiers.md §6): one per pack; a second insert keeps
/// the first; listed by pack; deleted once.
fn restores(s: &dyn MetaStore) {
    let r1 = RestoreRow { pack: 7, class: TIER_GLACIER, requested_ns: 1_000, ready_estimate_ns: 5_000, expires_ns: None };
    let r2 = RestoreRow { pack: 3, class: TIER_DEEP_ARCHIVE, requested_ns: 2_000, ready_estimate_ns: 9_000, expires_ns: Some(99_000) };
    assert_eq!(s.read_with(|r| r.get_restore(7)).unwrap(), None);
    assert!(s.write_with(|tx| tx.insert_restore(&r1)).unwrap());
    assert!(s.write_with(|tx| tx.insert_restore(&r2)).unwrap());
    let again = RestoreRow { requested_ns: 50_000, ..r1.clone() };
    assert!(!s.write_with(|tx| tx.insert_restore(&again)).unwrap(), "a second restore of one pack was recorded");
    assert_eq!(s.read_with(|r| r.get_restore(7)).unwrap(), Some(r1.clone()), "the first restore's row changed");
    assert_eq!(s.read_with(|r| r.get_restore(3)).unwrap(), Some(r2.clone()));
    assert_eq!(s.read_with(|r| r.list_restores()).unwrap(), vec![r2.clone(), r1.clone()], "listed by pack");
    // A rolled-back insert leaves nothing.
    let r3 = RestoreRow { pack: 11, class: TIER_TAPE, requested_ns: 1, ready_estimate_ns: 2, expires_ns: None };
    let e = s.write_with(|tx| -> Result<()> {
        tx.insert_restore(&r3)?;
        Err(Error::invalid("roll back"))
    });
    assert!(e.is_err());
    assert_eq!(s.read_with(|r| r.get_restore(11)).unwrap(), None, "a rolled-back restore row stayed");
    assert!(s.write_with(|tx| tx.delete_restore(7)).unwrap());
    assert!(!s.write_with(|tx| tx.delete_restore(7)).unwrap(), "a restore row was deleted twice");
    assert_eq!(s.read_with(|r| r.list_restores()).unwrap(), vec![r2]);
}

fn attr(ino: Ino, kind: FileKind) -> Attr {
    let t = Timestamp(1_000_000_000);
    Attr { ino, kind, perm: 0o644, nlink: 1, uid: 7, gid: 8, rdev: 0, size: 0, blocks: 0, atime: t, mtime: t, ctime: t, btime: t }
}

/// A new inode named `name` in `parent`, in its own transaction.
fn mk(s: &dyn MetaStore, parent: Ino, name: &[u8], kind: FileKind) -> Ino {
    s.write_with(|tx| -> Result<Ino> {
        let ino = tx.alloc_ino()?;
        tx.insert_inode(&attr(ino, kind), (kind == FileKind::Dir).then_some(parent), None, 0)?;
        tx.insert_dentry(parent, name, ino, kind)?;
        Ok(ino)
    })
    .expect("create")
}

fn namespace(s: &dyn MetaStore) {
    if let Some(v) = s.shared() {
        v.set_journal(0x5eed, false).unwrap();
    }
    let root = s.read_with(|r| r.get_inode(ROOT_INO)).unwrap().expect("a fresh store has the root directory");
    assert_eq!(root.attr.kind, FileKind::Dir);
    assert!(s.read_with(|r| r.dir_is_empty(ROOT_INO)).unwrap());
    let d = mk(s, ROOT_INO, b"dir", FileKind::Dir);
    let f = mk(s, d, b"b", FileKind::File);
    let g = mk(s, d, b"a", FileKind::File);
    assert_eq!(s.read_with(|r| r.lookup(d, b"b")).unwrap(), Some((f, FileKind::File)));
    assert_eq!(s.read_with(|r| r.lookup(d, b"zz")).unwrap(), None);
    let names: Vec<(Vec<u8>, Ino, FileKind)> = s.read_with(|r| r.list_dir(d)).unwrap();
    assert_eq!(names, vec![(b"a".to_vec(), g, FileKind::File), (b"b".to_vec(), f, FileKind::File)], "list_dir sorts by name");
    assert!(!s.read_with(|r| r.dir_is_empty(d)).unwrap());
    let row = s.read_with(|r| r.get_inode(f)).unwrap().unwrap();
    assert_eq!((row.attr.uid, row.attr.gid, row.attr.perm, row.attr.nlink), (7, 8, 0o644, 1));
    // A taken name is refused, and the refusal changes nothing.
    let e = s.write_with(|tx| tx.insert_dentry(d, b"a", f, FileKind::File)).expect_err("a taken name was accepted");
    assert_eq!(e.kind(), ErrorKind::Exists, "{e}");
    assert_eq!(s.read_with(|r| r.lookup(d, b"a")).unwrap(), Some((g, FileKind::File)));
    // Attribute and content updates read back.
    s.write_with(|tx| {
        let mut a = tx.get_inode(f)?.unwrap().attr;
        a.perm = 0o600;
        a.nlink = 2;
        tx.update_attr(&a)?;
        tx.update_content(f, 12345, 4096, Timestamp(5), Timestamp(6), 9)?;
        tx.update_content(f, 12345, 4096, Timestamp(5), Timestamp(6), 3)?;
        tx.touch_dir(d, Timestamp(77), 1)
    })
    .unwrap();
    let row = s.read_with(|r| r.get_inode(f)).unwrap().unwrap();
    assert_eq!((row.attr.perm, row.attr.nlink, row.attr.size, row.data_bytes, row.jseq), (0o600, 2, 12345, 4096, 9), "jseq only grows");
    let dir = s.read_with(|r| r.get_inode(d)).unwrap().unwrap();
    assert_eq!((dir.attr.mtime, dir.attr.nlink, dir.parent), (Timestamp(77), 2, Some(ROOT_INO)));
    s.write_with(|tx| tx.delete_inode(g)).unwrap();
    assert!(s.read_with(|r| r.get_inode(g)).unwrap().is_none());
    // A path step in one query (read_one) answers what the three queries
    // answer: an entry whose inode went, a missing name, a file as the
    // parent, a missing parent.
    let one = |p: Ino, n: &[u8]| s.read_one_with(|r| r.lookup_inode(p, n)).unwrap();
    let three = |p: Ino, n: &[u8]| {
        s.read_with(|r| -> Result<(Option<InodeRow>, Option<InodeRow>)> {
            let Some(pr) = r.get_inode(p)? else { return Ok((None, None)) };
            let c = match r.lookup(p, n)? {
                Some((i, _)) => r.get_inode(i)?,
                None => None,
            };
            Ok((Some(pr), c))
        })
        .unwrap()
    };
    for (p, n) in [(d, &b"b"[..]), (d, b"a"), (d, b"zz"), (f, b"x"), (ROOT_INO, b"dir"), (9_999_999, b"b")] {
        assert_eq!(one(p, n), three(p, n), "lookup_inode({p}, {:?})", String::from_utf8_lossy(n));
    }
    let (pr, c) = one(d, b"b");
    assert_eq!((pr.map(|r| r.attr.ino), c.map(|r| r.attr.ino)), (Some(d), Some(f)));
    assert_eq!(one(ROOT_INO, b"dir").1.unwrap().attr.size, 4096, "a directory's size as get_inode shows it");
    assert!(one(d, b"a").1.is_none(), "an entry whose inode is gone names nothing");
    assert!(one(9_999_999, b"b").0.is_none());
    // read_one refuses a second query rather than answer from two
    // snapshots (a store without its own single-query path runs both).
    let two = s.read_one_with(|r| -> Result<Option<InodeRow>> {
        r.get_inode(d)?;
        r.get_inode(f)
    });
    if let Err(e) = two {
        assert!(e.to_string().contains("second query"), "{e}");
    }
}

fn entry_removal_checks_the_inode(s: &dyn MetaStore) {
    let f = mk(s, ROOT_INO, b"n", FileKind::File);
    let other = f + 1000;
    let removed = s.write_with(|tx| tx.delete_dentry(ROOT_INO, b"n", other)).unwrap();
    assert!(!removed, "an entry naming another inode was removed");
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"n")).unwrap(), Some((f, FileKind::File)));
    assert!(!s.write_with(|tx| tx.delete_dentry(ROOT_INO, b"missing", f)).unwrap());
    assert!(s.write_with(|tx| tx.delete_dentry(ROOT_INO, b"n", f)).unwrap());
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"n")).unwrap(), None);
}

fn xattrs(s: &dyn MetaStore) {
    let f = mk(s, ROOT_INO, b"x", FileKind::File);
    let g = mk(s, ROOT_INO, b"y", FileKind::File);
    s.write_with(|tx| {
        tx.set_xattr(f, b"user.b", b"2")?;
        tx.set_xattr(f, b"user.a", b"1")?;
        tx.set_xattr(f, b"user.a", b"one")
    })
    .unwrap();
    assert_eq!(s.read_with(|r| r.get_xattr(f, b"user.a")).unwrap(), Some(b"one".to_vec()), "set replaces");
    assert_eq!(s.read_with(|r| r.list_xattrs(f)).unwrap(), vec![b"user.a".to_vec(), b"user.b".to_vec()]);
    s.write_with(|tx| tx.copy_xattrs(f, g)).unwrap();
    assert_eq!(s.read_with(|r| r.get_xattr(g, b"user.b")).unwrap(), Some(b"2".to_vec()));
    assert!(s.write_with(|tx| tx.remove_xattr(f, b"user.b")).unwrap());
    assert!(!s.write_with(|tx| tx.remove_xattr(f, b"user.b")).unwrap());
    assert_eq!(s.read_with(|r| r.get_xattr(f, b"user.b")).unwrap(), None);
    s.write_with(|tx| tx.delete_inode(g)).unwrap();
    assert!(s.read_with(|r| r.list_xattrs(g)).unwrap().is_empty(), "an inode's xattrs outlived it");
}

/// Three chunks of 100 stored bytes in one pack, no references.
fn chunks(s: &dyn MetaStore) -> u64 {
    s.write_with(|tx| -> Result<u64> {
        let p = tx.insert_pack("packs/conformance", 300, 3, 300)?;
        for id in 1..=3u64 {
            let mut hash = [0u8; 32];
            hash[0] = id as u8;
            tx.insert_chunk(&ChunkRow { id, hash, pack: p, offset: id * 100, stored_len: 100, raw_len: 200, flags: 0, refs: 0, zero_since: None })?;
        }
        Ok(p)
    })
    .unwrap()
}

fn refs(s: &dyn MetaStore) -> Vec<i64> {
    (1..=3).map(|id| s.read_with(|r| r.chunk_by_id(id)).unwrap().expect("chunk").refs).collect()
}

fn dead(s: &dyn MetaStore) -> u64 {
    s.read_with(|r| r.pack_bytes()).unwrap().1
}

fn pages_and_reference_counts(s: &dyn MetaStore) {
    let p = chunks(s);
    assert_eq!(s.read_with(|r| r.pack_name(p)).unwrap(), "packs/conformance");
    assert!(s.read_with(|r| r.pack_exists("packs/conformance")).unwrap());
    let mut h2 = [0u8; 32];
    h2[0] = 2;
    assert_eq!(s.read_with(|r| r.chunk_by_hash(&h2)).unwrap().map(|c| c.id), Some(2));
    let a = mk(s, ROOT_INO, b"a", FileKind::File);
    let b = mk(s, ROOT_INO, b"b", FileKind::File);
    let ids = s
        .write_with(|tx| tx.save_pages(a, &PageEdits { upserts: vec![test_page(0, &[1, 2, 2]), test_page(1, &[3])], ..Default::default() }))
        .unwrap();
    assert_eq!(ids.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1], "new page ids by key");
    assert_eq!(refs(s), vec![1, 2, 1], "saving pages counts their chunk references");
    assert!((1..=3).all(|id| s.read_with(|r| r.chunk_by_id(id)).unwrap().unwrap().zero_since.is_none()), "a referenced chunk kept a zero date");
    assert_eq!(dead(s), 0, "referenced chunks are no longer dead bytes");
    let pages = s.read_with(|r| r.load_pages(a)).unwrap();
    assert_eq!(pages.iter().map(|p| (p.key, p.id, p.data.clone())).collect::<Vec<_>>(), vec![(0, ids[0].1, test_page(0, &[1, 2, 2]).data), (1, ids[1].1, test_page(1, &[3]).data)]);
    // A clone shares the pages: no chunk reference changes.
    s.write_with(|tx| tx.share_pages(a, b)).unwrap();
    assert_eq!(refs(s), vec![1, 2, 1]);
    assert!(s.read_with(|r| r.page_links(b)).unwrap().iter().all(|l| l.refs == 2));
    // `a` rewrites key 1 and drops its old page: still linked from `b`.
    s.write_with(|tx| {
        tx.save_pages(a, &PageEdits { upserts: vec![test_page(1, &[1])], dropped: vec![(ids[1].1, vec![3])], ..Default::default() }).map(|_| ())
    })
    .unwrap();
    assert_eq!(refs(s), vec![2, 2, 1], "a page still linked elsewhere keeps its references");
    s.write_with(|tx| tx.release_pages(b)).unwrap();
    assert_eq!(refs(s), vec![2, 2, 0], "the last link of a page releases its references");
    assert_eq!(dead(s), 100);
    s.write_with(|tx| tx.release_pages(a)).unwrap();
    assert_eq!(refs(s), vec![0, 0, 0]);
    assert_eq!(dead(s), 300);
    zero_dates(s, &[1, 2, 3]);
    assert!(s.read_with(|r| r.all_pages()).unwrap().is_empty(), "pages outlived their links");
    assert_eq!(s.write_with(|tx| tx.delete_pack(p)).unwrap(), 3);
    assert!(s.read_with(|r| r.all_packs()).unwrap().is_empty());
}

/// A store many machines share (one that keeps open files) dates each
/// chunk's last reference on its own clock, for the collector's grace; a
/// store one process writes keeps no date.
fn zero_dates(s: &dyn MetaStore, ids: &[u64]) {
    let now = s.clock_secs().unwrap();
    for &id in ids {
        let z = s.read_with(|r| r.chunk_by_id(id)).unwrap().expect("chunk").zero_since;
        if s.shared().is_some() {
            let z = z.unwrap_or_else(|| panic!("chunk #{id} reached zero references undated"));
            assert!((now - 5..=now).contains(&z), "chunk #{id} dated {z}, the store's clock reads {now}");
        } else {
            assert_eq!(z, None, "chunk #{id}");
        }
    }
}

/// Two writers storing the same new chunk: the first claims the hash, the
/// second learns it lost (Raced) and nothing of its transaction stays.
fn a_hash_is_claimed_once(s: &dyn MetaStore) {
    let p = chunks(s);
    let mut hash = [0u8; 32];
    hash[0] = 2; // chunk 2's
    let e = s
        .write_with(|tx| {
            tx.insert_pack("packs/loser", 100, 1, 100)?;
            tx.insert_chunk(&ChunkRow { id: 9, hash, pack: p, offset: 0, stored_len: 100, raw_len: 200, flags: 0, refs: 0, zero_since: None })
        })
        .expect_err("a hash was claimed twice");
    assert_eq!(e.kind(), ErrorKind::Raced, "{e}");
    assert_eq!(s.read_with(|r| r.chunk_by_hash(&hash)).unwrap().map(|c| c.id), Some(2), "the winner's row changed");
    assert!(s.read_with(|r| r.chunk_by_id(9)).unwrap().is_none(), "the loser's row stayed");
    assert_eq!(s.read_with(|r| r.all_packs()).unwrap().len(), 1, "the loser's pack row stayed");
}

/// Two movers of one chunk (a cleaner stalled past its lease and the one
/// that took over, or a cleaner and a flush absorbing its held pack): the
/// first move wins, the second learns it lost (Raced) and nothing of its
/// transaction stays, so no row names a copy the winner may delete.
fn a_chunk_moves_only_from_its_pack(s: &dyn MetaStore) {
    let p = chunks(s);
    let q = s.write_with(|tx| tx.insert_pack("packs/first-mover", 100, 1, 0)).unwrap();
    s.write_with(|tx| tx.relocate_chunk(1, p, q, 7)).unwrap();
    let row = s.read_with(|r| r.chunk_by_id(1)).unwrap().expect("chunk 1");
    assert_eq!((row.pack, row.offset), (q, 7), "the move did not land");
    let e = s
        .write_with(|tx| {
            let late = tx.insert_pack("packs/late-mover", 100, 1, 0)?;
            tx.relocate_chunk(1, p, late, 0)
        })
        .expect_err("a chunk was moved out of a pack it had already left");
    assert_eq!(e.kind(), ErrorKind::Raced, "{e}");
    let row = s.read_with(|r| r.chunk_by_id(1)).unwrap().expect("chunk 1");
    assert_eq!((row.pack, row.offset), (q, 7), "the losing move changed the row");
    assert!(!s.read_with(|r| r.pack_exists("packs/late-mover")).unwrap(), "the losing mover's pack row stayed");
    let e = s.write_with(|tx| tx.relocate_chunk(77, p, q, 0)).expect_err("a chunk that does not exist was moved");
    assert_eq!(e.kind(), ErrorKind::Raced, "{e}");
}

fn bad_reference_counts_fail_whole(s: &dyn MetaStore) {
    chunks(s);
    let a = mk(s, ROOT_INO, b"a", FileKind::File);
    let e = s
        .write_with(|tx| {
            tx.save_pages(a, &PageEdits { upserts: vec![test_page(0, &[1])], ..Default::default() })?;
            tx.add_chunk_refs(&HashMap::from([(2, -1)]))
        })
        .expect_err("a count below zero was accepted");
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    let e = s.write_with(|tx| tx.save_pages(a, &PageEdits { upserts: vec![test_page(0, &[99])], ..Default::default() })).expect_err("an unknown chunk was referenced");
    // A store many machines share can only lose a chunk to another
    // machine's collector: the writer lost a race and stores the chunk
    // again. Alone, a missing chunk is corruption.
    let shared = s.shared().is_some();
    assert_eq!(e.kind(), if shared { ErrorKind::Raced } else { ErrorKind::Corrupt }, "{e}");
    assert_eq!(refs(s), vec![0, 0, 0], "a failed transaction changed counts");
    assert!(s.read_with(|r| r.load_pages(a)).unwrap().is_empty(), "a failed transaction left pages");
}

fn rollback_leaves_nothing(s: &dyn MetaStore) {
    let before = s.read_with(|r| r.count_inodes()).unwrap();
    let e = s
        .write_with(|tx| -> Result<()> {
            let ino = tx.alloc_ino()?;
            tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
            tx.insert_dentry(ROOT_INO, b"gone", ino, FileKind::File)?;
            tx.set_info("gone", 1)?;
            tx.insert_pack("packs/gone", 1, 1, 0)?;
            Err(Error::new(ErrorKind::Permission, "refused by the closure"))
        })
        .expect_err("the closure's error was lost");
    assert_eq!((e.kind(), e.message()), (ErrorKind::Permission, "refused by the closure"), "the closure's error comes back unchanged");
    assert_eq!(s.read_with(|r| r.count_inodes()).unwrap(), before);
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"gone")).unwrap(), None);
    assert_eq!(s.read_with(|r| r.get_info("gone")).unwrap(), None);
    assert!(!s.read_with(|r| r.pack_exists("packs/gone")).unwrap());
    // A failing operation inside (a taken name) rolls back the rest too.
    mk(s, ROOT_INO, b"taken", FileKind::File);
    let r = s.write_with(|tx| {
        tx.set_info("half", 1)?;
        tx.insert_dentry(ROOT_INO, b"taken", 1, FileKind::Dir)
    });
    assert!(r.is_err());
    assert_eq!(s.read_with(|r| r.get_info("half")).unwrap(), None, "half a transaction stayed");
}

/// `write_locking` is a write like any other to its caller: it commits
/// all or nothing, locks rows that exist or not, sees what it changed, and
/// a failed statement inside it (a taken name) rolls everything back.
fn locking_writes(s: &dyn MetaStore) {
    let dir = mk(s, ROOT_INO, b"d", FileKind::Dir);
    let f = s
        .write_locking_with(&[dir, ROOT_INO, dir], &[], true, |tx| -> Result<Ino> {
            tx.lock_inodes(&[dir, 999_999])?;
            let ino = tx.alloc_ino()?;
            tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
            tx.insert_dentry(dir, b"f", ino, FileKind::File)?;
            tx.touch_dir(dir, Timestamp(5), 0)?;
            assert_eq!(tx.lookup(dir, b"f")?, Some((ino, FileKind::File)), "a locking write does not see its own entry");
            Ok(ino)
        })
        .unwrap();
    assert_eq!(s.read_with(|r| r.lookup(dir, b"f")).unwrap(), Some((f, FileKind::File)));
    assert_eq!(s.read_with(|r| r.get_inode(dir)).unwrap().unwrap().attr.mtime, Timestamp(5));
    // Entries named up front: the reads before any change answer what is
    // committed (a store may answer them from its BEGIN round trip), the
    // reads after a change see the change.
    s.write_locking_with(&[dir], &[(dir, b"f"), (dir, b"g")], false, |tx| -> Result<()> {
        assert_eq!(tx.lookup(dir, b"g")?, None);
        assert_eq!(tx.lookup(dir, b"f")?, Some((f, FileKind::File)));
        let (p, c) = tx.lookup_inode(dir, b"f")?;
        assert_eq!((p.map(|r| r.attr.ino), c.map(|r| r.attr.ino)), (Some(dir), Some(f)));
        assert_eq!(tx.lookup_inode(dir, b"g")?.1, None);
        assert_eq!(tx.get_inode(dir)?.unwrap().attr.mtime, Timestamp(5));
        assert_eq!(tx.lock_inode(f)?.map(|r| r.attr.ino), Some(f));
        tx.insert_dentry(dir, b"g", f, FileKind::File)?;
        tx.touch_dir(dir, Timestamp(6), 0)?;
        assert_eq!(tx.lookup(dir, b"g")?, Some((f, FileKind::File)), "a read after a change missed it");
        assert_eq!(tx.get_inode(dir)?.unwrap().attr.mtime, Timestamp(6), "a read after a change missed it");
        assert!(tx.delete_dentry(dir, b"g", f)?);
        Err(Error::new(ErrorKind::Exists, "roll back"))
    })
    .expect_err("rolled back");
    assert_eq!(s.read_with(|r| r.lookup(dir, b"g")).unwrap(), None);
    // A name any local user may choose, quotes, backslashes and bytes that
    // are not UTF-8 included, is locked, looked up and removed as it is
    // (PostgreSQL sends the names of the BEGIN round trip as hex).
    let odd: &[u8] = b"it's \\x'; DROP TABLE inodes; --\xff\x01";
    s.write_locking_with(&[dir], &[(dir, odd)], false, |tx| -> Result<()> {
        assert_eq!(tx.lookup(dir, odd)?, None);
        tx.insert_dentry(dir, odd, f, FileKind::File)
    })
    .unwrap();
    s.write_locking_with(&[dir], &[(dir, odd)], false, |tx| -> Result<()> {
        assert_eq!(tx.lookup(dir, odd)?, Some((f, FileKind::File)), "an odd name was not found by the entry lock's lookup");
        assert_eq!(tx.lookup_inode(dir, odd)?.1.map(|r| r.attr.ino), Some(f));
        assert!(tx.delete_dentry(dir, odd, f)?);
        Ok(())
    })
    .unwrap();
    assert_eq!(s.read_with(|r| r.lookup(dir, odd)).unwrap(), None);
    assert!(s.read_with(|r| r.count_inodes()).unwrap() > 0, "the inodes table is still there");
    let r = s.write_locking_with(&[dir], &[], false, |tx| {
        tx.set_info("half-locked", 1)?;
        tx.insert_dentry(dir, b"f", 1, FileKind::Dir)
    });
    assert_eq!(r.expect_err("a taken name was inserted").kind(), ErrorKind::Exists);
    assert_eq!(s.read_with(|r| r.get_info("half-locked")).unwrap(), None, "half a locking transaction stayed");
    // lock_inode answers the row; unlink_entry removes a name only while it
    // names the inode given, and touches the directory.
    s.write_locking_with(&[dir], &[], false, |tx| -> Result<()> {
        assert_eq!(tx.lock_inode(f)?.map(|r| r.attr.ino), Some(f));
        assert_eq!(tx.lock_inode(999_999)?, None);
        assert!(!tx.unlink_entry(dir, b"f", f + 1, Timestamp(7), 0)?, "a name was removed for another inode");
        assert!(tx.unlink_entry(dir, b"f", f, Timestamp(8), -1)?);
        Ok(())
    })
    .unwrap();
    assert_eq!(s.read_with(|r| r.lookup(dir, b"f")).unwrap(), None);
    let d = s.read_with(|r| r.get_inode(dir)).unwrap().unwrap().attr;
    assert_eq!((d.mtime, d.ctime), (Timestamp(8), Timestamp(8)));
}

/// The store's clock is a real clock in seconds since the epoch (after
/// 2025) that does not run backwards between two calls.
fn shared_clock(s: &dyn MetaStore) {
    let a = s.clock_secs().unwrap();
    let b = s.clock_secs().unwrap();
    assert!(a > 1_735_689_600, "clock_secs {a} is before 2025");
    assert!(b >= a && b - a < 5, "clock_secs went from {a} to {b}");
}

fn read_your_writes_and_sync(s: &dyn MetaStore) {
    for i in 0..20 {
        s.write_with(|tx| tx.set_info(&format!("k{i}"), i)).unwrap();
        assert_eq!(s.read_with(|r| r.get_info(&format!("k{i}"))).unwrap(), Some(i), "a returned write is not seen by the next read");
        assert_eq!(s.read_many_with(|r| r.get_info(&format!("k{i}"))).unwrap(), Some(i));
    }
    s.sync().unwrap();
    assert!(s.is_durable(), "sync did not make every returned change durable");
}

fn ids_never_repeat(make: &dyn Fn(bool) -> Box<dyn MetaStore>) {
    let s = make(true);
    let mut seen = std::collections::HashSet::new();
    seen.insert(ROOT_INO);
    let mut last = 0;
    for i in 0..50 {
        let ino = mk(&*s, ROOT_INO, format!("f{i}").as_bytes(), FileKind::File);
        assert!(seen.insert(ino), "inode number {ino} handed out twice");
        last = last.max(ino);
    }
    // A number handed out in a rolled-back transaction is not handed out
    // again (checked by `seen` below).
    let _ = s.write_with(|tx| -> Result<()> {
        seen.insert(tx.alloc_ino()?);
        Err(Error::invalid("roll back"))
    });
    // The newest inodes go; their numbers still never come back.
    s.write_with(|tx| {
        for i in 40..50 {
            let (ino, _) = tx.lookup(ROOT_INO, format!("f{i}").as_bytes())?.unwrap();
            tx.delete_dentry(ROOT_INO, format!("f{i}").as_bytes(), ino)?;
            tx.delete_inode(ino)?;
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    let p1 = s.write_with(|tx| tx.insert_pack("packs/p1", 1, 1, 0)).unwrap();
    // Chunk ids: distinct, and a committed one never comes again.
    let c1 = s.alloc_chunk_id().unwrap();
    let c2 = s.alloc_chunk_id().unwrap();
    assert_ne!(c1, c2, "a chunk id was handed out twice");
    s.write_with(|tx| tx.insert_chunk(&ChunkRow { id: c2, hash: [9; 32], pack: p1, offset: 0, stored_len: 1, raw_len: 1, flags: 0, refs: 0, zero_since: None })).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = make(false);
    for i in 0..20 {
        let ino = mk(&*s, ROOT_INO, format!("g{i}").as_bytes(), FileKind::File);
        assert!(ino > last && seen.insert(ino), "inode number {ino} handed out again after a reopen");
    }
    let p2 = s.write_with(|tx| tx.insert_pack("packs/p2", 1, 1, 0)).unwrap();
    assert_ne!(p1, p2, "a pack id was handed out twice");
    let c3 = s.alloc_chunk_id().unwrap();
    assert!(c3 > c2, "chunk id {c3} handed out again after a reopen (committed: {c2})");
    // Session ids too (a store that offers SharedVolume): a reopened store
    // never hands out one seen before.
    if s.shared().is_none() {
        return;
    }
    let first: Vec<u64> = (0..3).map(|_| sv(&*s).open_session(&who("a"), Duration::from_secs(30)).unwrap()).collect();
    s.sync().unwrap();
    drop(s);
    let s = make(false);
    for _ in 0..3 {
        let id = sv(&*s).open_session(&who("b"), Duration::from_secs(30)).unwrap();
        assert!(!first.contains(&id) && id > *first.iter().max().unwrap(), "session id {id} handed out again after a reopen (before: {first:?})");
    }
}

use std::time::Duration;

/// A session of the suite's, mounted at `mount`.
pub fn who(mount: &str) -> SessionInfo {
    SessionInfo { host: "host-1".into(), pid: 4242, mount: mount.into(), version: "0.test".into() }
}

fn sessions(s: &dyn MetaStore) {
    assert!(sv(s).sessions().unwrap().is_empty(), "a fresh store has sessions");
    let a = sv(s).open_session(&who("/mnt/a"), Duration::from_secs(30)).unwrap();
    let b = sv(s).open_session(&SessionInfo { host: "host-2".into(), pid: 7, mount: "/mnt/b".into(), version: "9.9".into() }, Duration::from_secs(30)).unwrap();
    assert_ne!(a, b, "two sessions got one id");
    let rows = sv(s).sessions().unwrap();
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), { let mut v = vec![a, b]; v.sort(); v }, "sessions by id");
    let ra = rows.iter().find(|r| r.id == a).unwrap();
    assert_eq!((ra.host.as_str(), ra.pid, ra.mount.as_str(), ra.version.as_str(), ra.expired), ("host-1", 4242, "/mnt/a", "0.test", false));
    let rb = rows.iter().find(|r| r.id == b).unwrap();
    assert_eq!((rb.host.as_str(), rb.pid, rb.mount.as_str(), rb.version.as_str()), ("host-2", 7, "/mnt/b", "9.9"));
    let left = ra.expires.0 - ra.started.0;
    assert!(left > 25_000_000_000 && left <= 31_000_000_000, "a 30 s session expires {left} ns after it started");
    assert!(sv(s).expired_sessions().unwrap().is_empty(), "live sessions listed as expired");
    // Renewal moves the expiry forward.
    sv(s).renew_session(a, Duration::from_secs(300)).unwrap();
    let ra2 = sv(s).sessions().unwrap().into_iter().find(|r| r.id == a).unwrap();
    assert!(ra2.expires.0 - ra.expires.0 > 200_000_000_000, "a renewal with 300 s did not move the expiry ({:?} -> {:?})", ra.expires, ra2.expires);
    // A closed session is gone and cannot be renewed.
    sv(s).close_session(b).unwrap();
    sv(s).close_session(b).unwrap();
    assert_eq!(sv(s).sessions().unwrap().iter().map(|r| r.id).collect::<Vec<_>>(), vec![a]);
    let e = sv(s).renew_session(b, Duration::from_secs(30)).expect_err("a closed session was renewed");
    assert_eq!(e.kind(), ErrorKind::SessionLost, "{e}");
    assert!(sv(s).sessions().unwrap().iter().all(|r| r.id != b), "renewing a closed session brought it back");
    assert!(!sv(s).remove_session(b).unwrap(), "a closed session was removed again");
    assert!(sv(s).remove_session(a).unwrap());
    assert!(sv(s).sessions().unwrap().is_empty());
}

/// A session past its expiry cannot be renewed (the mount must stop
/// writing), shows as expired, and is listed for the cleaner.
fn expired_sessions_stay_lost(s: &dyn MetaStore) {
    let short = sv(s).open_session(&who("/mnt/short"), Duration::from_secs(1)).unwrap();
    let long = sv(s).open_session(&who("/mnt/long"), Duration::from_secs(60)).unwrap();
    sv(s).renew_session(short, Duration::from_secs(1)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let e = sv(s).renew_session(short, Duration::from_secs(60)).expect_err("an expired session was renewed");
    assert_eq!(e.kind(), ErrorKind::SessionLost, "{e}");
    // Not even a second try brings it back.
    assert_eq!(sv(s).renew_session(short, Duration::from_secs(60)).unwrap_err().kind(), ErrorKind::SessionLost);
    let rows = sv(s).sessions().unwrap();
    assert!(rows.iter().find(|r| r.id == short).expect("an expired session vanished before the cleaner removed it").expired);
    assert!(!rows.iter().find(|r| r.id == long).unwrap().expired);
    assert_eq!(sv(s).expired_sessions().unwrap().iter().map(|r| r.id).collect::<Vec<_>>(), vec![short]);
    assert!(sv(s).remove_session(short).unwrap());
    assert!(sv(s).expired_sessions().unwrap().is_empty());
    let again = sv(s).open_session(&who("/mnt/short"), Duration::from_secs(1)).unwrap();
    assert!(again != short && again != long, "a session id came again");
}

fn maintenance_lock(s: &dyn MetaStore) {
    let mut g = sv(s).try_maintenance().unwrap().expect("nobody holds the maintenance lock of a fresh store");
    assert!(g.still_held());
    assert!(sv(s).try_maintenance().unwrap().is_none(), "a second maintenance guard was granted while the first lives");
    drop(g);
    let g = sv(s).try_maintenance().unwrap().expect("the maintenance lock was not granted again after its guard dropped");
    assert!(sv(s).try_maintenance().unwrap().is_none());
    drop(g);
}

/// A shared store logs every change of an inode or an entry once per
/// transaction, in the same transaction.
fn change_log(s: &dyn MetaStore) {
    assert!(sv(s).subscribe().unwrap().is_some(), "a shared store offers no feed of commit notices");
    let before = sv(s).last_change_seq().unwrap();
    let d = mk(s, ROOT_INO, b"d", FileKind::Dir);
    let what = |after: u64| -> Vec<Changed> { sv(s).changes_since(after, 1000).unwrap().into_iter().map(|c| c.what).collect() };
    let mut got = what(before);
    got.sort();
    assert_eq!(got, vec![Changed::Inode(ROOT_INO), Changed::Entry { parent: ROOT_INO, name: b"d".to_vec() }], "the change rows of a create");
    let all = sv(s).changes_since(before, 1000).unwrap();
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "changes come in ascending seq");
    let last = sv(s).last_change_seq().unwrap();
    assert_eq!(last, all.last().unwrap().seq);
    // A create in `d`, its attributes touched twice: each change once.
    let f = s
        .write_with(|tx| -> Result<Ino> {
            let ino = tx.alloc_ino()?;
            tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
            tx.insert_dentry(d, b"f", ino, FileKind::File)?;
            tx.touch_dir(d, Timestamp(5), 0)?;
            tx.touch_dir(d, Timestamp(6), 0)?;
            tx.set_xattr(ino, b"user.x", b"1")?;
            tx.set_xattr(ino, b"user.y", b"1")?;
            Ok(ino)
        })
        .unwrap();
    let mut got = what(last);
    got.sort();
    assert_eq!(got, vec![Changed::Inode(d), Changed::Inode(f), Changed::Entry { parent: d, name: b"f".to_vec() }], "one row per change per transaction");
    // A limit cuts the list; the rest follows.
    let first = sv(s).changes_since(last, 1).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(sv(s).changes_since(first[0].seq, 10).unwrap().len(), 2);
    // A rolled-back closure logs nothing; neither does a refused name or
    // an entry removal that removed nothing; a read logs nothing.
    let last = sv(s).last_change_seq().unwrap();
    let _ = s.write_with(|tx| -> Result<()> {
        tx.touch_dir(d, Timestamp(7), 0)?;
        tx.set_xattr(f, b"user.z", b"1")?;
        Err(Error::invalid("roll back"))
    });
    assert!(s.write_with(|tx| tx.insert_dentry(d, b"f", f, FileKind::File)).is_err());
    assert!(!s.write_with(|tx| tx.delete_dentry(d, b"f", f + 1)).unwrap());
    s.read_with(|r| r.get_inode(f)).unwrap();
    s.write_with(|tx| tx.set_info("no-inode-change", 1)).unwrap();
    assert_eq!(what(last), vec![], "changes logged for transactions that changed no inode or entry");
    // Each operation that changes an inode or an entry logs it.
    let one = |f: &mut dyn FnMut(&dyn MetaTx) -> Result<()>| -> Vec<Changed> {
        let last = sv(s).last_change_seq().unwrap();
        s.write(f).unwrap();
        let mut v = what(last);
        v.sort();
        v
    };
    let t = Timestamp(9);
    let i = |x: Ino| vec![Changed::Inode(x)];
    assert_eq!(one(&mut |tx| { let mut a = tx.get_inode(f)?.unwrap().attr; a.perm = 0o600; tx.update_attr(&a) }), i(f), "update_attr");
    assert_eq!(one(&mut |tx| tx.update_content(f, 10, 10, t, t, 1)), i(f), "update_content");
    assert_eq!(one(&mut |tx| tx.set_nlink(f, 1, t)), i(f), "set_nlink");
    assert_eq!(one(&mut |tx| tx.fix_nlink(f, 1)), i(f), "fix_nlink");
    assert_eq!(one(&mut |tx| tx.set_parent(f, d)), i(f), "set_parent");
    assert_eq!(one(&mut |tx| tx.set_btime(f, t)), i(f), "set_btime");
    assert_eq!(one(&mut |tx| tx.set_flags(f, 0)), i(f), "set_flags");
    assert_eq!(one(&mut |tx| tx.remove_xattr(f, b"user.x").map(|_| ())), i(f), "remove_xattr");
    assert_eq!(one(&mut |tx| tx.save_pages(f, &PageEdits::default()).map(|_| ())), i(f), "save_pages");
    let g = mk(s, ROOT_INO, b"g", FileKind::File);
    assert_eq!(one(&mut |tx| tx.share_pages(f, g)), i(g), "share_pages");
    assert_eq!(one(&mut |tx| tx.release_pages(g)), i(g), "release_pages");
    assert_eq!(
        one(&mut |tx| tx.delete_dentry(ROOT_INO, b"g", g).map(|_| ())),
        vec![Changed::Inode(ROOT_INO), Changed::Entry { parent: ROOT_INO, name: b"g".to_vec() }],
        "delete_dentry"
    );
    assert_eq!(one(&mut |tx| tx.delete_inode(g)), i(g), "delete_inode");
    // Trimming: nothing is younger than an hour ago; everything but the
    // newest row (which keeps `last_change_seq`) is older than now.
    let last = sv(s).last_change_seq().unwrap();
    let n = sv(s).changes_since(0, 100_000).unwrap().len() as u64;
    assert_eq!(sv(s).trim_changes(Duration::from_secs(3600)).unwrap(), 0, "young changes were trimmed");
    assert_eq!(sv(s).changes_trimmed_through().unwrap(), 0, "nothing was trimmed yet");
    std::thread::sleep(Duration::from_millis(20));
    let second_last = sv(s).changes_since(0, 100_000).unwrap().iter().rev().nth(1).unwrap().seq;
    assert_eq!(sv(s).trim_changes(Duration::ZERO).unwrap(), n - 1);
    assert_eq!(sv(s).changes_since(0, 100).unwrap().iter().map(|c| c.seq).collect::<Vec<_>>(), vec![last]);
    assert_eq!(sv(s).last_change_seq().unwrap(), last, "trimming moved last_change_seq back");
    assert_eq!(sv(s).changes_trimmed_through().unwrap(), second_last, "the highest seq trimmed");
    assert_eq!(sv(s).trim_changes(Duration::ZERO).unwrap(), 0);
    assert_eq!(sv(s).changes_trimmed_through().unwrap(), second_last, "an empty trim moved the mark");
}

/// The open-file registry of a store many machines share
/// (`docs/metadata-store.md` "Open files"): a nameless inode some session
/// has open is no orphan, and is open elsewhere for every other session; a
/// close under an older generation leaves a newer open; a removed or closed
/// session's rows go with it, and so do a deleted inode's.
fn open_files(s: &dyn MetaStore) {
    let f = mk(s, ROOT_INO, b"f", FileKind::File);
    // Another machine's session first: this store's own (the last it
    // opened, which fences its writes) is `a`, which stays.
    let b = sv(s).open_session(&who("/mnt/b"), Duration::from_secs(30)).unwrap();
    let a = sv(s).open_session(&who("/mnt/a"), Duration::from_secs(30)).unwrap();
    let g = mk(s, ROOT_INO, b"g", FileKind::File);
    assert!(s.write_with(|tx| tx.mark_open(a, f, 1)).unwrap());
    assert!(s.write_with(|tx| tx.mark_open(b, g, 1)).unwrap());
    let unlink = |name: &[u8], ino: Ino| {
        s.write_with(|tx| {
            assert!(tx.delete_dentry(ROOT_INO, name, ino)?);
            tx.set_nlink(ino, 0, Timestamp(9))
        })
        .unwrap()
    };
    unlink(b"f", f);
    unlink(b"g", g);
    let orphans = || s.read_with(|r| r.orphan_inodes()).unwrap();
    assert!(orphans().is_empty(), "nameless inodes open in a session listed as orphans: {:?}", orphans());
    let elsewhere = |ino: Ino, me: u64| s.read_with(|r| r.open_elsewhere(ino, me)).unwrap();
    assert!(elsewhere(f, b) && !elsewhere(f, a), "f is open in session {a} only");
    // A close under an older generation leaves the newer open.
    assert!(s.write_with(|tx| tx.mark_open(a, f, 2)).unwrap());
    s.write_with(|tx| tx.mark_closed(a, &[(f, 1)])).unwrap();
    assert!(orphans().is_empty() && elsewhere(f, b), "a stale close removed a newer open");
    s.write_with(|tx| tx.mark_closed(a, &[(f, 2)])).unwrap();
    assert_eq!(orphans(), vec![f], "a closed file stayed open");
    // A removed session's rows go with it.
    assert!(sv(s).remove_session(b).unwrap());
    assert_eq!(orphans(), vec![f, g], "a removed session kept its open files");
    // A deleted inode cannot be opened, and takes its rows along.
    s.write_with(|tx| tx.delete_inode(f)).unwrap();
    assert!(!s.write_with(|tx| tx.mark_open(a, f, 3)).unwrap(), "a freed inode was marked open");
    assert!(s.write_with(|tx| tx.mark_open(a, g, 4)).unwrap());
    s.write_with(|tx| tx.delete_inode(g)).unwrap();
    let h = mk(s, ROOT_INO, b"h", FileKind::File);
    assert!(s.write_with(|tx| tx.mark_open(a, h, 5)).unwrap());
    assert!(!elsewhere(g, 0), "a deleted inode kept its open rows");
    // So does a closed session's.
    assert!(elsewhere(h, 0));
    sv(s).close_session(a).unwrap();
    assert!(!elsewhere(h, 0), "a closed session kept its open files");
    // A session that is gone cannot open files: its row would never go.
    let e = s.write_with(|tx| tx.mark_open(a, h, 6)).expect_err("a closed session registered an open file");
    assert_eq!(e.kind(), ErrorKind::SessionLost, "{e}");
    assert!(!elsewhere(h, 0));
}

/// File locks (`docs/metadata-store.md` "Locks"): POSIX ranges of one
/// owner split and merge, a read conflicts only with another owner's
/// write, a write with any other owner's lock; flock locks are separate;
/// a close drops an owner's locks, a removed session all of its own.
fn file_locks(s: &dyn MetaStore) {
    use LockKind::*;
    let f = mk(s, ROOT_INO, b"locked", FileKind::File);
    let sa = sv(s).open_session(&who("/mnt/a"), Duration::from_secs(60)).unwrap();
    let sb = sv(s).open_session(&who("/mnt/b"), Duration::from_secs(60)).unwrap();
    let a = LockOwner { session: sa, owner: 0xdead_beef_0000_0001 };
    let b = LockOwner { session: sb, owner: 0xdead_beef_0000_0001 };
    let rq = |o: LockOwner, style: LockStyle, kind: LockKind, start: u64, end: u64| LockRequest { ino: f, owner: o, style, kind, start, end, pid: if o == a { 100 } else { 200 } };
    let px = |o, kind, start, end| rq(o, LockStyle::Posix, kind, start, end);
    let set = |r: LockRequest| sv(s).set_lock(&r).unwrap();
    let mine = |o: LockOwner, style: LockStyle| -> Vec<(LockKind, u64, u64)> {
        sv(s).locks_on(f).unwrap().into_iter().filter(|l| l.owner == o && l.style == style).map(|l| (l.kind, l.start, l.end)).collect()
    };
    assert_eq!(set(px(a, Write, 0, 99)), LockOutcome::Granted);
    assert_eq!(set(px(a, Write, 0, 99)), LockOutcome::Granted, "the same request again");
    match set(px(b, Read, 50, 60)) {
        LockOutcome::Conflict(h) => assert_eq!((h.owner, h.kind, h.start, h.end, h.pid), (a, Write, 0, 99, 100), "the holder named"),
        g => panic!("a read over another owner's write was {g:?}"),
    }
    assert_eq!(sv(s).test_lock(&px(b, Read, 99, 99)).unwrap().map(|h| h.owner), Some(a), "F_GETLK missed the holder");
    assert_eq!(sv(s).test_lock(&px(b, Write, 100, LOCK_EOF)).unwrap(), None);
    assert_eq!(sv(s).test_lock(&px(a, Write, 0, 10)).unwrap(), None, "an owner conflicts with itself");
    assert_eq!(set(px(b, Read, 100, LOCK_EOF)), LockOutcome::Granted, "a disjoint range");
    // Two readers share; a write over a read of another owner conflicts.
    assert_eq!(set(px(a, Read, 200, 299)), LockOutcome::Granted, "two read locks conflicted");
    assert!(matches!(set(px(a, Write, 250, 250)), LockOutcome::Conflict(h) if h.owner == b), "a write over another's read was granted");
    // Unlocking the middle of a range splits it; a downgrade too.
    assert_eq!(set(px(a, Unlock, 40, 59)), LockOutcome::Granted);
    assert_eq!(mine(a, LockStyle::Posix), vec![(Write, 0, 39), (Write, 60, 99), (Read, 200, 299)]);
    assert_eq!(set(px(b, Read, 45, 55)), LockOutcome::Granted, "a range the holder unlocked stayed locked");
    assert_eq!(set(px(a, Read, 10, 19)), LockOutcome::Granted);
    assert_eq!(mine(a, LockStyle::Posix), vec![(Write, 0, 9), (Read, 10, 19), (Write, 20, 39), (Write, 60, 99), (Read, 200, 299)]);
    // Touching ranges of one kind merge.
    assert_eq!(set(px(a, Write, 10, 44)), LockOutcome::Granted);
    assert_eq!(mine(a, LockStyle::Posix), vec![(Write, 0, 44), (Write, 60, 99), (Read, 200, 299)]);
    // flock is whole-file and apart from POSIX locks.
    assert_eq!(set(rq(b, LockStyle::Flock, Write, 7, 7)), LockOutcome::Granted, "flock conflicted with POSIX locks");
    assert_eq!(mine(b, LockStyle::Flock), vec![(Write, 0, LOCK_EOF)]);
    assert!(matches!(set(rq(a, LockStyle::Flock, Read, 0, 0)), LockOutcome::Conflict(h) if h.owner == b && h.style == LockStyle::Flock));
    assert_eq!(set(rq(b, LockStyle::Flock, Read, 0, 0)), LockOutcome::Granted, "a downgrade");
    assert_eq!(set(rq(a, LockStyle::Flock, Read, 0, 0)), LockOutcome::Granted, "two shared flocks");
    // Many inodes in one question: the same rows, each with its inode.
    let g = mk(s, ROOT_INO, b"locked2", FileKind::File);
    assert_eq!(set(LockRequest { ino: g, ..px(b, Write, 5, 9) }), LockOutcome::Granted);
    let mut want: Vec<(Ino, LockRow)> = sv(s).locks_on(f).unwrap().into_iter().map(|l| (f, l)).collect();
    want.extend(sv(s).locks_on(g).unwrap().into_iter().map(|l| (g, l)));
    let mut got = sv(s).locks_on_many(&[g, f, 999_999]).unwrap();
    let key = |x: &(Ino, LockRow)| (x.0, x.1.owner, x.1.style == LockStyle::Flock, x.1.start);
    got.sort_by_key(key);
    want.sort_by_key(key);
    assert_eq!(got, want, "locks_on_many differs from locks_on");
    assert_eq!(sv(s).release_locks(g, b, LockStyle::Posix).unwrap(), 1);
    // A close drops the owner's POSIX locks, not its flock nor others'.
    assert_eq!(sv(s).release_locks(f, a, LockStyle::Posix).unwrap(), 3);
    assert!(mine(a, LockStyle::Posix).is_empty());
    assert_eq!(mine(a, LockStyle::Flock).len(), 1);
    assert_eq!(set(px(b, Write, 0, 44)), LockOutcome::Granted, "a closed owner's range stayed locked");
    assert_eq!(sv(s).release_locks(f, a, LockStyle::Flock).unwrap(), 1);
    // The same owner number on another session is another owner.
    assert!(matches!(set(px(a, Write, 0, 0)), LockOutcome::Conflict(h) if h.owner == b));
    // A removed (expired, cleaned) session leaves no lock behind.
    assert!(sv(s).remove_session(sb).unwrap());
    assert!(sv(s).locks_on(f).unwrap().is_empty(), "a removed session's locks stayed: {:?}", sv(s).locks_on(f).unwrap());
    assert_eq!(set(px(a, Write, 0, LOCK_EOF)), LockOutcome::Granted);
    assert_eq!(sv(s).release_session_locks(sa).unwrap(), 1);
    assert_eq!(set(px(a, Write, 0, 0)), LockOutcome::Granted);
    sv(s).close_session(sa).unwrap();
    assert!(sv(s).locks_on(f).unwrap().is_empty(), "a closed session's locks stayed");
}
