//! The contract checks every backend must pass. Each backend's tests call
//! [`run_all`] so that a new backend is proven the same way as the old ones.

use crate::{Backend, ErrorKind, ObjectState, RestoreSpeed, RestoreState, StorageClass};

/// Runs every check; panics with a message on the first failure.
pub fn run_all(b: &dyn Backend) {
    put_get_roundtrip(b);
    ranged_reads(b);
    missing_objects(b);
    overwrite_and_delete(b);
    create_only_if_absent(b);
    conditional_updates(b);
    errors_name_their_object(b);
    listing(b);
    invalid_names(b);
    storage_classes(b);
}

/// The storage-class part of the contract (docs/tiers.md §6): a store
/// without classes refuses another class and a restore with
/// `Unsupported` and stores nothing; a store with them refuses a GET of an
/// archived object with `Archived` until a restore, then serves the same
/// bytes.
fn storage_classes(b: &dyn Backend) {
    b.put_in_class("conf/class-std", b"standard", StorageClass::Standard).expect("put in the standard class");
    assert_eq!(b.get("conf/class-std").unwrap(), b"standard");
    assert_eq!(b.restore_state("conf/class-std").unwrap(), ObjectState::STANDARD);
    assert_eq!(b.restore_state("conf/class-nope").unwrap_err().kind(), ErrorKind::NotFound);
    b.delete("conf/class-cold").unwrap();
    let data: Vec<u8> = (0..5_000u32).map(|i| (i * 13 % 251) as u8).collect();
    match b.put_in_class("conf/class-cold", &data, StorageClass::Glacier) {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "a store without classes must say so: {e}");
            assert_eq!(b.get("conf/class-cold").unwrap_err().kind(), ErrorKind::NotFound, "a refused class stored the object");
            assert_eq!(b.restore("conf/class-std", 1, RestoreSpeed::Standard).unwrap_err().kind(), ErrorKind::Unsupported);
        }
        Ok(()) => {
            let st = b.restore_state("conf/class-cold").expect("restore_state");
            assert_eq!(st, ObjectState { class: StorageClass::Glacier, restore: RestoreState::None });
            assert!(!st.readable());
            for e in [b.get("conf/class-cold").unwrap_err(), b.get_range("conf/class-cold", 10, 100).unwrap_err(), b.get_ranges("conf/class-cold", &[(0, 5), (5, 5)]).unwrap_err()] {
                assert_eq!(e.kind(), ErrorKind::Archived, "a GET of an archived object: {e}");
                assert_eq!(e.object(), Some("conf/class-cold"));
            }
            assert_eq!(b.size("conf/class-cold").unwrap(), data.len() as u64, "a HEAD of an archived object works");
            b.restore("conf/class-cold", 1, RestoreSpeed::Standard).expect("restore");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            loop {
                let st = b.restore_state("conf/class-cold").unwrap();
                assert_eq!(st.class, StorageClass::Glacier, "a restore keeps the class");
                if st.readable() {
                    assert!(matches!(st.restore, RestoreState::Ready { .. }), "{st:?}");
                    break;
                }
                assert_eq!(st.restore, RestoreState::Ongoing);
                assert!(std::time::Instant::now() < deadline, "the restore did not complete in 120 s");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            b.restore("conf/class-cold", 1, RestoreSpeed::Standard).expect("a second restore of a restored object succeeds");
            assert_eq!(b.get("conf/class-cold").unwrap(), data, "restored bytes");
            assert_eq!(b.get_range("conf/class-cold", 10, 100).unwrap(), &data[10..110]);
            // A standard object has nothing to restore.
            assert!(b.restore("conf/class-std", 1, RestoreSpeed::Standard).is_err());
            // Put back in the standard class, it reads at once.
            b.put_in_class("conf/class-cold", &data, StorageClass::Standard).unwrap();
            assert!(b.restore_state("conf/class-cold").unwrap().readable());
        }
    }
}

fn put_get_roundtrip(b: &dyn Backend) {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    b.put("conf/rt", &data).expect("put");
    assert_eq!(b.get("conf/rt").expect("get"), data);
    assert_eq!(b.size("conf/rt").expect("size"), data.len() as u64);
    b.put("conf/empty", b"").expect("put empty");
    assert_eq!(b.get("conf/empty").expect("get empty"), b"");
}

fn ranged_reads(b: &dyn Backend) {
    b.put("conf/range", b"0123456789").unwrap();
    assert_eq!(b.get_range("conf/range", 0, 10).unwrap(), b"0123456789");
    assert_eq!(b.get_range("conf/range", 3, 4).unwrap(), b"3456");
    assert_eq!(b.get_range("conf/range", 10, 0).unwrap(), b"");
    assert_eq!(b.get_ranges("conf/range", &[(2, 3), (5, 0), (5, 4)]).unwrap(), vec![b"234".to_vec(), Vec::new(), b"5678".to_vec()]);
    assert!(b.get_ranges("conf/range", &[]).unwrap().is_empty());
    assert_eq!(b.get_ranges("conf/range", &[(0, 2), (3, 1)]).unwrap_err().kind(), ErrorKind::Permanent, "ranges with a gap are refused");
    assert!(b.get_ranges("conf/range", &[(6, 2), (8, 5)]).is_err(), "ranges past the end must fail");
    let e = b.get_range("conf/range", 8, 5).expect_err("read past end must fail");
    assert_eq!(e.kind(), ErrorKind::OutOfRange);
}

fn missing_objects(b: &dyn Backend) {
    assert_eq!(b.get("conf/nope").unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(b.get_range("conf/nope", 0, 1).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(b.size("conf/nope").unwrap_err().kind(), ErrorKind::NotFound);
}

fn overwrite_and_delete(b: &dyn Backend) {
    b.put("conf/ow", b"first").unwrap();
    b.put("conf/ow", b"second!").unwrap();
    assert_eq!(b.get("conf/ow").unwrap(), b"second!");
    b.delete("conf/ow").unwrap();
    assert_eq!(b.get("conf/ow").unwrap_err().kind(), ErrorKind::NotFound);
    b.delete("conf/ow").expect("deleting a missing object succeeds");
}

fn create_only_if_absent(b: &dyn Backend) {
    b.delete("conf/once").unwrap();
    b.put_if_absent("conf/once", b"first").expect("create of an absent object");
    let e = b.put_if_absent("conf/once", b"second").expect_err("a second create must fail");
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert_eq!(b.get("conf/once").unwrap(), b"first", "a refused create changed the object");
    // Of several racing creates exactly one wins.
    b.delete("conf/race").unwrap();
    let wins = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u8).map(|i| s.spawn(move || b.put_if_absent("conf/race", &[i; 64]).is_ok())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).filter(|won| *won).count()
    });
    assert_eq!(wins, 1, "{wins} racing creates succeeded");
    assert_eq!(b.get("conf/race").unwrap().len(), 64);
}

fn conditional_updates(b: &dyn Backend) {
    if !b.conditional_updates() {
        assert_eq!(b.put_if_match("conf/cas", b"x", "t").unwrap_err().kind(), ErrorKind::Permanent, "an unsupported update must say so");
        return;
    }
    b.delete("conf/cas").unwrap();
    assert_eq!(b.get_tagged("conf/cas").unwrap_err().kind(), ErrorKind::NotFound);
    b.put_if_absent("conf/cas", b"one").unwrap();
    let (data, t1) = b.get_tagged("conf/cas").expect("get_tagged");
    assert_eq!(data, b"one");
    let t2 = b.put_if_match("conf/cas", b"two", &t1).expect("an update from the current tag");
    assert_ne!(t1, t2, "the tag did not change with the object");
    assert_eq!(b.get_tagged("conf/cas").unwrap(), (b"two".to_vec(), t2.clone()), "put_if_match must return the new tag");
    // A stale tag is refused and changes nothing.
    let e = b.put_if_match("conf/cas", b"three", &t1).expect_err("an update from a stale tag must fail");
    assert_eq!(e.kind(), ErrorKind::Changed, "{e}");
    assert_eq!(b.get("conf/cas").unwrap(), b"two");
    // A plain put replaces the tag too.
    b.put("conf/cas", b"four").unwrap();
    assert_eq!(b.put_if_match("conf/cas", b"five", &t2).unwrap_err().kind(), ErrorKind::Changed);
    // A deleted object is not updated (nor recreated).
    let (_, t4) = b.get_tagged("conf/cas").unwrap();
    b.delete("conf/cas").unwrap();
    assert_eq!(b.put_if_match("conf/cas", b"six", &t4).unwrap_err().kind(), ErrorKind::Changed);
    assert_eq!(b.get("conf/cas").unwrap_err().kind(), ErrorKind::NotFound, "an update recreated a deleted object");
    // Of racing updates from the same tag exactly one wins.
    b.put("conf/cas", b"base").unwrap();
    let (_, t) = b.get_tagged("conf/cas").unwrap();
    let t = &t;
    let wins = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u8).map(|i| s.spawn(move || b.put_if_match("conf/cas", &[i; 16], t).is_ok())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).filter(|won| *won).count()
    });
    assert_eq!(wins, 1, "{wins} racing updates from one tag succeeded");
}

fn errors_name_their_object(b: &dyn Backend) {
    let e = b.get("conf/absent-object").unwrap_err();
    assert_eq!(e.object(), Some("conf/absent-object"), "a NotFound error does not name its object: {e}");
    b.put("conf/short", b"abc").unwrap();
    let e = b.get_range("conf/short", 2, 5).unwrap_err();
    assert_eq!(e.object(), Some("conf/short"), "an OutOfRange error does not name its object: {e}");
}

fn listing(b: &dyn Backend) {
    for n in ["lst/a/1", "lst/a/2", "lst/b/1", "lstx"] {
        b.put(n, n.as_bytes()).unwrap();
    }
    let mut names: Vec<_> = b.list("lst/a/").unwrap().into_iter().map(|o| (o.name, o.size)).collect();
    names.sort();
    assert_eq!(names, vec![("lst/a/1".to_string(), 7), ("lst/a/2".to_string(), 7)]);
    let mut all: Vec<_> = b.list("lst").unwrap().into_iter().map(|o| o.name).collect();
    all.sort();
    assert_eq!(all, vec!["lst/a/1", "lst/a/2", "lst/b/1", "lstx"]);
}

fn invalid_names(b: &dyn Backend) {
    for n in ["", "/abs", "a//b", "../x", "a/./b", "sp ace"] {
        assert_eq!(b.put(n, b"x").unwrap_err().kind(), ErrorKind::InvalidName, "name {n:?}");
    }
}
