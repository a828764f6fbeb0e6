//! The contract checks every backend must pass. Each backend's tests call
//! [`run_all`] so that a new backend is proven the same way as the old ones.

use crate::{Backend, ErrorKind};

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
