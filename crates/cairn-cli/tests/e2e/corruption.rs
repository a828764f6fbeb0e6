//! 4. One flipped byte in a pack: reading the file in it gives EIO and the
//! log names the pack; other files keep working; fsck names the pack.

use crate::common::*;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

const LEN: u64 = 6 << 20;

#[test]
fn flipped_byte_in_a_pack_gives_eio_and_is_named() {
    let _serial = serial();
    let env = Env::new("corrupt");
    assert!(env.packs().is_empty());

    // A and B in separate flushes, hence separate packs.
    let m = env.mount();
    write_random_file(&m.join("a.bin"), 0xA, LEN);
    m.umount();
    let packs_a = env.packs();
    assert!(!packs_a.is_empty(), "no pack written for A");
    let m = env.mount();
    write_random_file(&m.join("b.bin"), 0xB, LEN);
    m.umount();
    let packs_b = env.packs();
    let new: Vec<&PathBuf> = packs_b.iter().filter(|p| !packs_a.contains(p)).collect();
    assert!(!new.is_empty(), "no new pack for B: {packs_b:?}");
    assert!(
        packs_a.iter().all(|p| packs_b.contains(p)),
        "A's packs changed when B was written: {packs_a:?} -> {packs_b:?}"
    );

    // Flip one byte in the middle of A's (largest) pack.
    let pack = packs_a.iter().max_by_key(|p| fs::metadata(p).unwrap().len()).unwrap();
    let name = pack.file_name().unwrap().to_str().unwrap().to_string();
    let size = fs::metadata(pack).unwrap().len();
    let f = fs::OpenOptions::new().read(true).write(true).open(pack).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, size / 2).unwrap();
    f.write_all_at(&[b[0] ^ 0x01], size / 2).unwrap();
    f.sync_all().unwrap();
    drop(f);
    eprintln!(
        "corruption: flipped byte {} of {size} in pack {name} (A's packs {}, B's {})",
        size / 2,
        packs_a.len(),
        new.len()
    );

    let m = env.mount();
    let log_before = env.log().len();
    match fs::read(m.join("a.bin")) {
        Ok(data) => panic!(
            "reading A through a corrupt pack returned {} bytes (equal to the original: {})",
            data.len(),
            data == gen(0xA, LEN as usize)
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "reading A: {e}"),
    }
    let log = env.log()[log_before..].to_string();
    assert!(log.contains(&name), "cairn.log does not name pack {name}; new log lines:\n{log}");
    check_stream(&m.join("b.bin"), 0xB, LEN, true).expect("B (in an intact pack) must read back");
    m.umount();

    let out = cairn([std::ffi::OsStr::new("fsck"), env.vol.as_os_str(), std::ffi::OsStr::new("--read-data")]);
    assert_eq!(out.code, Some(1), "fsck --read-data of a corrupt volume must exit 1: {out}");
    assert!(out.stdout.contains(&name), "fsck does not name pack {name}: {out}");
    let (_, rep) = env.fsck(true);
    let errors = rep["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| e.as_str().unwrap_or("").contains(&name)),
        "fsck --json errors do not name {name}: {rep}"
    );
}

/// A pack cut in half (its index gone): EIO naming the pack, the rest of
/// the volume keeps working, fsck names the pack.
#[test]
fn truncated_pack_gives_eio_and_is_named() {
    let _serial = serial();
    let env = Env::new("truncated-pack");
    let m = env.mount();
    write_random_file(&m.join("a.bin"), 0xA1, LEN);
    m.umount();
    let packs = env.packs();
    assert!(!packs.is_empty());
    let pack = packs.iter().max_by_key(|p| fs::metadata(p).unwrap().len()).unwrap();
    let name = pack.file_name().unwrap().to_str().unwrap().to_string();
    let size = fs::metadata(pack).unwrap().len();
    fs::OpenOptions::new().write(true).open(pack).unwrap().set_len(size / 2).unwrap();

    let m = env.mount();
    let log_before = env.log().len();
    let e = fs::read(m.join("a.bin")).map(|d| d.len()).expect_err("reading a file whose pack is truncated");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "reading A: {e}");
    let log = env.log()[log_before..].to_string();
    assert!(log.contains(&name), "cairn.log does not name pack {name}; new log lines:\n{log}");
    assert_eq!(fs::metadata(m.join("a.bin")).unwrap().len(), LEN, "stat still works");
    write_random_file(&m.join("c.bin"), 0xC1, LEN);
    check_stream(&m.join("c.bin"), 0xC1, LEN, true).expect("a new file on the damaged volume");
    m.umount();

    let out = cairn([std::ffi::OsStr::new("fsck"), env.vol.as_os_str(), std::ffi::OsStr::new("--read-data")]);
    assert_eq!(out.code, Some(1), "fsck --read-data with a truncated pack must exit 1: {out}");
    assert!(out.stdout.contains(&name), "fsck does not name pack {name}: {out}");
    assert!(!out.text().contains("panicked"), "{out}");
}
