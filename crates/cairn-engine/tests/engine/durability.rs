//! The write-ordering rules of `docs/format.md` ("Order of writes") seen
//! from inside the engine: whenever something that may hold the only
//! durable copy of data is deleted, the metadata that replaces it has
//! passed the barrier. (The power-cut tests in `crates/cairn-powercut`
//! check the same rules against a file system that really loses unsynced
//! writes.)

use crate::common::*;
use cairn_engine::*;

fn segments(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("journal")).unwrap().count()
}

/// Rule 1: a background flush round that retires journal segments has made
/// its commit durable first; a round that retires nothing syncs nothing.
#[test]
fn retired_segments_imply_durable_metadata() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = Volume::load(d.path(), OpenOptions { flush_age: std::time::Duration::from_secs(3600), ..Default::default() }).unwrap();
    // A file kept open: its writes are not due, so the round below commits
    // nothing of it and its segment stays.
    let held = v.create(ROOT_INO, b"held", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(held).unwrap();
    v.write(held, 0, &random_bytes(1, 100_000)).unwrap();
    let data = random_bytes(2, 300_000);
    let f = mkfile(&v, ROOT_INO, "f", &data);
    v.fsync(f, false).unwrap();
    assert!(v.metadata_is_durable());
    let before = segments(d.path());
    assert!(before >= 1, "the writes are journaled");

    // A namespace change commits (not yet durable) ...
    v.create(ROOT_INO, b"other", FileKind::File, 0o644, 0, root()).unwrap();
    assert!(!v.metadata_is_durable(), "a commit is not durable before the barrier");
    // ... and a round that flushes `f` but cannot retire the segment it
    // shares with `held`'s pending writes (same shard or not) leaves the
    // metadata as it is only when nothing was deleted.
    // (Closed files wait for their age, an hour here: the round is asked
    // for this file.)
    let r = v.flush_file_now(f).unwrap();
    assert_eq!(r.files, 1, "the closed file is flushed");
    let after = segments(d.path());
    if after < before {
        assert!(v.metadata_is_durable(), "segments deleted ({before} -> {after}) before the commit was durable");
    } else {
        assert!(!v.metadata_is_durable(), "no segment went, so no barrier was needed");
    }

    // Now the held file is closed and flushed too: every segment goes, and
    // only after the barrier.
    v.release(held).unwrap();
    v.create(ROOT_INO, b"third", FileKind::File, 0o644, 0, root()).unwrap();
    assert!(!v.metadata_is_durable());
    let r = v.flush_file_now(held).unwrap();
    assert_eq!(r.files, 1);
    assert_eq!(segments(d.path()), 0, "all records are committed: the journal is empty");
    assert!(v.metadata_is_durable(), "segments were deleted before the commit was durable");
    assert_eq!(read_all(&v, f), data);
}

/// Rules 1 and 3 for gc: after gc returns, nothing it deleted is still
/// needed, and its commit is durable.
#[test]
fn gc_commit_is_durable_before_packs_go() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let keep = random_bytes(3, 400_000);
    let k = mkfile(&v, ROOT_INO, "keep", &keep);
    mkfile(&v, ROOT_INO, "drop", &random_bytes(4, 400_000));
    v.flush_now().unwrap();
    v.unlink(ROOT_INO, b"drop").unwrap();
    let rep = maintenance::gc(&v, 0.9, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_deleted >= 1, "{rep:?}");
    assert!(v.metadata_is_durable(), "gc returned with its commit not durable");
    assert_eq!(read_all(&v, k), keep);
}

/// Rule 5: a control-socket command has made its change durable when it
/// replies.
#[test]
fn control_commands_reply_after_the_barrier() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    mkfile(&v, ROOT_INO, "src", &random_bytes(5, 200_000));
    v.sync().unwrap();
    let sock = d.path().join("ctl.sock");
    let _server = control::serve(&v, &sock).unwrap();
    let out = control::call(&sock, &control::Request::Clone { src: b"/src".to_vec(), dst: b"/dst".to_vec() }).unwrap();
    assert!(out.is_some());
    assert!(v.metadata_is_durable(), "clone replied before its commit was durable");
    control::call(&sock, &control::Request::SnapshotCreate { name: "s1".into() }).unwrap();
    assert!(v.metadata_is_durable(), "snapshot create replied before its commit was durable");
}

/// A journal on a small file system that fills up: the writer gets ENOSPC
/// (not EIO), every write acknowledged before stays, and once a flush has
/// moved the data into packs the journal has room again. Needs root (it
/// mounts a 1 MiB tmpfs under the volume's journal).
#[test]
fn full_journal_disk_gives_enospc_and_loses_nothing() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts a tmpfs and needs root (the test suite runs as root)");
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let jdir = d.path().join("journal");
    let st = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m"]).arg("cairn-test-full").arg(&jdir).status().unwrap();
    assert!(st.success(), "mount -t tmpfs failed");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Unmount(jdir.clone());

    let v = Volume::load(d.path(), OpenOptions { flush_age: std::time::Duration::from_secs(3600), ..Default::default() }).unwrap();
    let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(f).unwrap();
    let piece = 100_000usize;
    let mut acked = Vec::new();
    let err = loop {
        let data = random_bytes(acked.len() as u64 + 77, piece);
        match v.write(f, acked.len() as u64, &data) {
            Ok(n) => {
                assert_eq!(n as usize, piece);
                acked.extend_from_slice(&data);
            }
            Err(e) => break e,
        }
        assert!(acked.len() < 4 << 20, "a 1 MiB journal took 4 MiB without an error");
    };
    assert_eq!((err.kind(), err.errno()), (ErrorKind::NoSpace, libc::ENOSPC), "{err}");
    assert!(!acked.is_empty());
    v.fsync(f, false).unwrap();
    assert_eq!(read_all(&v, f), acked, "what was acknowledged reads back");
    // A flush moves the data into packs (on the big disk) and frees the journal.
    v.flush_now().unwrap();
    let more = random_bytes(999, piece);
    v.write(f, acked.len() as u64, &more).unwrap();
    acked.extend_from_slice(&more);
    v.fsync(f, false).unwrap();
    v.release(f).unwrap();
    v.simulate_crash();
    let v = open(d.path());
    assert_eq!(read_all(&v, v.resolve(b"f").unwrap()), acked, "after a crash");
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// An encrypted volume keeps no file content in the clear on the local
/// disk: not in the journal (records are sealed), not in packs, not in the
/// metadata. Checked while the data is only in the journal, after a crash
/// and replay, and after the flush; the content reads back each time.
#[test]
fn encrypted_volume_journal_holds_no_plaintext() {
    let d = tempfile::tempdir().unwrap();
    let pass = zeroize::Zeroizing::new(b"correct horse".to_vec());
    init(d.path(), &InitOptions { passphrase: Some(pass.clone()), kdf: Some(KdfParams { m_kib: 1024, t: 1, p: 1 }), chunker: small_chunks(), ..Default::default() }).unwrap();
    let marker = b"CAIRN-MARKER-7f3a9c-this-must-never-reach-the-disk-in-the-clear";
    let mut data = Vec::new();
    while data.len() < 300_000 {
        data.extend_from_slice(marker);
        data.extend_from_slice(&random_bytes(data.len() as u64, 100));
    }
    let opts = || OpenOptions { passphrase: Some(pass.clone()), flush_age: std::time::Duration::from_secs(3600), ..Default::default() };
    let v = Volume::load(d.path(), opts()).unwrap();
    let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(f).unwrap();
    v.write(f, 0, &data[..200_000]).unwrap();
    v.write(f, 200_000, &data[200_000..]).unwrap();
    v.fsync(f, false).unwrap();
    // The data lives only in the journal now, and reads through it.
    assert!(std::fs::read_dir(d.path().join("journal")).unwrap().count() > 0);
    assert_eq!(read_all(&v, f), data);
    assert_eq!(v.read(f, 199_990, 20).unwrap(), &data[199_990..200_010], "a read across two sealed records");
    assert_eq!(files_containing(d.path(), marker), Vec::<std::path::PathBuf>::new(), "plaintext on disk while journaled");
    v.simulate_crash();

    let v = Volume::load(d.path(), OpenOptions { flush_age: std::time::Duration::from_secs(3600), ..opts() }).unwrap();
    let f = v.resolve(b"f").unwrap();
    assert_eq!(read_all(&v, f), data, "after a crash, replayed from sealed records");
    v.close().unwrap();
    drop(v);
    assert_eq!(files_containing(d.path(), marker), Vec::<std::path::PathBuf>::new(), "plaintext on disk after the flush");
    // Unencrypted, the same content is plainly visible in the journal: the
    // search above can find it.
    let u = tempfile::tempdir().unwrap();
    init_small(u.path());
    let v = Volume::load(u.path(), OpenOptions { flush_age: std::time::Duration::from_secs(3600), ..Default::default() }).unwrap();
    let f = mkfile(&v, ROOT_INO, "f", &data);
    v.fsync(f, false).unwrap();
    assert!(!files_containing(&u.path().join("journal"), marker).is_empty(), "the check cannot see plaintext");
    v.simulate_crash();
}

/// A sealed journal record altered on disk (checksum fixed up, so only the
/// authentication can tell) is reported as corruption, never served.
#[test]
fn altered_sealed_journal_record_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let pass = zeroize::Zeroizing::new(b"pw".to_vec());
    init(d.path(), &InitOptions { passphrase: Some(pass.clone()), kdf: Some(KdfParams { m_kib: 1024, t: 1, p: 1 }), chunker: small_chunks(), ..Default::default() }).unwrap();
    let opts = || OpenOptions { passphrase: Some(pass.clone()), flush_age: std::time::Duration::from_secs(3600), ..Default::default() };
    let v = Volume::load(d.path(), opts()).unwrap();
    let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(f).unwrap();
    v.write(f, 0, &random_bytes(11, 5000)).unwrap();
    v.fsync(f, false).unwrap();
    v.simulate_crash();
    let seg = std::fs::read_dir(d.path().join("journal")).unwrap().flatten().find(|e| e.metadata().unwrap().len() > 0).unwrap().path();
    let mut bytes = std::fs::read(&seg).unwrap();
    assert_eq!(bytes[5] & 1, 1, "the write record is sealed");
    bytes[48 + 12 + 100] ^= 0x40; // a ciphertext byte
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[..44]);
    crc.update(&bytes[48..]);
    bytes[44..48].copy_from_slice(&crc.finalize().to_le_bytes());
    std::fs::write(&seg, &bytes).unwrap();
    // The open replays the record; the flush at open cannot read it, logs
    // that and keeps it in the journal; a read of it is refused.
    let v = Volume::load(d.path(), opts()).unwrap();
    let f = v.resolve(b"f").unwrap();
    let e = v.read(f, 0, 5000).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("fails authentication"), "{e}");
}

/// Group commit (docs/design.md "Metadata store"): namespace changes nobody
/// synced die with the process, but an fsync of a file, or of a directory,
/// commits and syncs every change made before it. The window is an hour
/// here, so only the fsyncs can have committed anything.
#[test]
fn an_fsync_makes_every_earlier_namespace_change_survive_a_crash() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let opts = || OpenOptions { group_commit: std::time::Duration::from_secs(3600), ..Default::default() };
    let v = Volume::load(d.path(), opts()).unwrap();
    let dir = v.mkdir(ROOT_INO, b"d", 0o755, root()).unwrap().ino;
    let mut files = Vec::new();
    for i in 0..10u64 {
        files.push(mkfile(&v, dir, &format!("a{i}"), &random_bytes(i, 10_000 + i as usize)));
    }
    v.rename(dir, b"a0", dir, b"renamed", RenameFlags::default()).unwrap();
    // One file's fsync covers the creates, writes and the rename before it.
    v.open(files[9]).unwrap();
    v.fsync(files[9], false).unwrap();
    v.release(files[9]).unwrap();
    // A directory's fsync (what FUSE's fsyncdir calls) does too.
    mkfile(&v, dir, "b", b"made before the directory's fsync");
    v.fsync(dir, false).unwrap();
    // Nobody syncs these: the crash takes them.
    mkfile(&v, dir, "lost", b"never synced");
    v.unlink(dir, b"a1").unwrap();
    v.simulate_crash();

    let v = Volume::load(d.path(), opts()).unwrap();
    let dir = v.resolve(b"d").unwrap();
    let mut names: Vec<Vec<u8>> = v.readdir(dir).unwrap().into_iter().map(|e| e.name).filter(|n| n != b"." && n != b"..").collect();
    names.sort();
    let mut want: Vec<Vec<u8>> = (1..10).map(|i| format!("a{i}").into_bytes()).collect();
    want.push(b"b".to_vec());
    want.push(b"renamed".to_vec());
    want.sort();
    assert_eq!(names, want, "the directory after the crash");
    for i in 1..10u64 {
        let ino = v.resolve(format!("d/a{i}").as_bytes()).unwrap();
        assert_eq!(read_all(&v, ino), random_bytes(i, 10_000 + i as usize), "a{i}");
    }
    assert_eq!(read_all(&v, v.resolve(b"d/renamed").unwrap()), random_bytes(0, 10_000));
    assert_eq!(read_all(&v, v.resolve(b"d/b").unwrap()), b"made before the directory's fsync");
    v.close().unwrap();
}

/// Where each record of a journal segment starts (and the segment's end),
/// walking the record headers of docs/format.md "Journal".
fn record_starts(seg: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pos = 0;
    while pos + 48 <= seg.len() {
        starts.push(pos);
        let len = u32::from_le_bytes(seg[pos + 40..pos + 44].try_into().unwrap()) as usize;
        let dlen = match seg[pos + 4] {
            1 if seg[pos + 5] & 1 == 1 => len + 28,
            1 => len,
            _ => 0,
        };
        pos += 48 + dlen;
    }
    assert_eq!(pos, seg.len(), "the segment ends with a whole record");
    starts.push(pos);
    starts
}

/// One changed byte in a record in the middle of a journal segment, with
/// fsync'd records after it: the open refuses, naming the segment and the
/// offset, and deletes nothing; a salvaging open replays every record that
/// verifies (the later fsync'd writes read back byte for byte), keeps a copy
/// of the segment, and then the volume opens normally. Unencrypted and
/// encrypted (sealed records).
#[test]
fn damaged_journal_record_stops_the_open_and_salvage_keeps_later_records() {
    for encrypted in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let pass = zeroize::Zeroizing::new(b"pw".to_vec());
        let passphrase = encrypted.then(|| pass.clone());
        init(d.path(), &InitOptions { passphrase: passphrase.clone(), kdf: Some(KdfParams { m_kib: 1024, t: 1, p: 1 }), chunker: small_chunks(), ..Default::default() }).unwrap();
        let opts = |salvage_journal| OpenOptions { passphrase: passphrase.clone(), flush_age: std::time::Duration::from_secs(3600), salvage_journal, ..Default::default() };
        let v = Volume::load(d.path(), opts(false)).unwrap();
        let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
        v.open(f).unwrap();
        // Five writes, each acknowledged durable.
        let parts: Vec<Vec<u8>> = (0..5).map(|i| random_bytes(40 + i, 10_000)).collect();
        for (i, p) in parts.iter().enumerate() {
            v.write(f, i as u64 * 10_000, p).unwrap();
            v.fsync(f, false).unwrap();
        }
        v.simulate_crash();
        let jdir = d.path().join("journal");
        let segs: Vec<_> = std::fs::read_dir(&jdir).unwrap().flatten().map(|e| e.path()).filter(|p| std::fs::metadata(p).unwrap().len() > 0).collect();
        assert_eq!(segs.len(), 1, "{segs:?}");
        let seg = &segs[0];
        let mut bytes = std::fs::read(seg).unwrap();
        let starts = record_starts(&bytes);
        assert_eq!(starts.len(), 6, "five records: {starts:?}");
        assert_eq!(bytes[5] & 1, encrypted as u8, "sealed iff encrypted");
        // A byte in the data of the third write.
        bytes[starts[2] + 48 + 5000] ^= 0x10;
        std::fs::write(seg, &bytes).unwrap();

        let e = Volume::load(d.path(), opts(false)).err().expect("a damaged journal must stop the open");
        let msg = e.to_string();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{msg}");
        let name = seg.file_name().unwrap().to_str().unwrap();
        assert!(msg.contains(name) && msg.contains(&format!("record at byte {}", starts[2])), "the error names the segment and the offset: {msg}");
        assert!(msg.contains("salvage-journal"), "{msg}");
        assert_eq!(std::fs::read(seg).unwrap(), bytes, "the segment was changed or deleted");
        assert!(!d.path().join("journal-damaged").exists());
        // The damage is reported without opening the volume.
        let found = cairn_engine::journal::check_dir(&jdir).unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].contains(name), "{found:?}");

        // Salvage: the intact records are replayed and flushed.
        let v = Volume::load(d.path(), opts(true)).unwrap();
        let f = v.resolve(b"f").unwrap();
        let got = read_all(&v, f);
        assert_eq!(got.len(), 50_000, "the last fsync'd write was lost");
        for (i, p) in parts.iter().enumerate() {
            let have = &got[i * 10_000..(i + 1) * 10_000];
            if i == 2 {
                assert!(have.iter().all(|b| *b == 0), "the damaged record's bytes were replayed");
            } else {
                assert!(have == &p[..], "write {i} (encrypted {encrypted}) differs after salvage");
            }
        }
        v.close().unwrap();
        drop(v);
        let kept = d.path().join("journal-damaged").join(name);
        assert_eq!(std::fs::read(&kept).unwrap(), bytes, "the evidence is the damaged segment as found");
        // The volume opens normally now, with the same content.
        let v = Volume::load(d.path(), opts(false)).unwrap();
        assert_eq!(read_all(&v, v.resolve(b"f").unwrap()), got);
        assert!(cairn_engine::journal::check_dir(&jdir).unwrap().is_empty());
        v.close().unwrap();
    }
}

/// A closed file waits for its age, not for the next round (issue 27): one
/// deleted before then is never chunked, hashed or packed, and its journal
/// records go with it. fsync still makes it durable meanwhile.
#[test]
fn a_closed_file_deleted_before_its_flush_age_is_never_packed() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = Volume::load(d.path(), OpenOptions { flush_age: std::time::Duration::from_secs(3600), ..Default::default() }).unwrap();
    let data = random_bytes(5, 200_000);
    let f = mkfile(&v, ROOT_INO, "short-lived", &data);
    v.fsync(f, false).unwrap();
    assert!(v.metadata_is_durable());
    assert_eq!(v.flush_due().unwrap().files, 0, "closed but young: not due");
    assert_eq!(read_all(&v, f), data, "read from the journal meanwhile");
    v.unlink(ROOT_INO, b"short-lived").unwrap();
    v.flush_now().unwrap();
    assert_eq!(stored_pack_bytes(d.path()), 0, "the deleted file's bytes never reached a pack");
    assert_eq!(segments(d.path()), 0, "its journal records were retired");
    v.close().unwrap();
}

/// Issue 50: a damaged last record (its magic altered after it was fsync'd)
/// falls under the torn-tail rule and is dropped on replay, but not
/// silently: `journal::check_tails` (what `cairn fsck` reports before the
/// open) names the segment and the offset and calls it damage, not a torn
/// write; the open logs it the same way and keeps a copy of the segment.
#[test]
fn a_damaged_last_record_is_reported_not_dropped_silently() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let quiet = || OpenOptions { flush_age: std::time::Duration::from_secs(3600), ..opts() };
    let v = Volume::load(d.path(), quiet()).unwrap();
    let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(f).unwrap();
    for i in 0..3u64 {
        v.write(f, i * 10_000, &random_bytes(70 + i, 10_000)).unwrap();
        v.fsync(f, false).unwrap();
    }
    v.simulate_crash();
    let jdir = d.path().join("journal");
    let seg = std::fs::read_dir(&jdir).unwrap().flatten().map(|e| e.path()).find(|p| std::fs::metadata(p).unwrap().len() > 0).expect("a segment");
    let mut bytes = std::fs::read(&seg).unwrap();
    let starts = record_starts(&bytes);
    let last = *starts.iter().rev().nth(1).unwrap();
    bytes[last] ^= 0xFF;
    std::fs::write(&seg, &bytes).unwrap();
    let tails = cairn_engine::journal::check_tails(&jdir).unwrap();
    assert_eq!(tails.len(), 1, "{tails:?}");
    let (line, damaged) = &tails[0];
    let name = seg.file_name().unwrap().to_str().unwrap();
    assert!(*damaged, "called a torn write: {line}");
    assert!(line.contains(name) && line.contains(&format!("at byte {last}")) && line.contains("magic"), "{line}");
    // The open still replays the intact records (as before) and keeps the
    // evidence.
    let v = Volume::load(d.path(), quiet()).unwrap();
    let got = read_all(&v, v.resolve(b"f").unwrap());
    assert_eq!(got.len(), 20_000);
    v.close().unwrap();
    assert!(d.path().join("journal-damaged").join(name).exists(), "no copy of the damaged segment kept");
}
