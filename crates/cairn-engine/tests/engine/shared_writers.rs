//! Several machines writing one volume at once (issue 26,
//! docs/shared-volume.md): a bucket volume whose metadata is in
//! PostgreSQL, each "machine" a cache directory of its own, all open
//! read-write in this process at the same time.

use crate::common::*;
use crate::pg_bucket::{fresh_url, fsck_clean, mount_elsewhere, pg_init_cloud, pg_opts};
use cairn_engine::cloud::CloudOptions;
use cairn_engine::maintenance;
use cairn_engine::*;
use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// `n` machines of a new volume, all read-write.
fn machines(what: &str, n: usize, opts: impl Fn() -> OpenOptions) -> (tempfile::TempDir, String, VolumeConfig, Vec<Arc<Volume>>) {
    let tmp = tempfile::tempdir().unwrap();
    let url = fresh_url(what);
    let cfg = pg_init_cloud(&tmp.path().join("m0"), &url);
    let mut vols = vec![Volume::load(&tmp.path().join("m0"), opts()).unwrap()];
    for i in 1..n {
        vols.push(mount_elsewhere(&tmp.path().join(format!("m{i}")), &url, opts()));
    }
    (tmp, url, cfg, vols)
}

/// Unmounts every machine, then fsck (reading every byte) from `machine`'s
/// directory.
fn unmount_all_then_fsck(tmp: &tempfile::TempDir, vols: Vec<Arc<Volume>>, machine: &str) {
    for v in &vols {
        v.close().unwrap();
    }
    drop(vols);
    let v = Volume::load(&tmp.path().join(machine), pg_opts()).unwrap();
    fsck_clean(&v);
    v.close().unwrap();
}

fn names(v: &Volume, dir: Ino) -> BTreeSet<String> {
    v.readdir(dir).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).filter(|n| n != "." && n != "..").collect()
}

/// Three machines at once create the same 150 names and 150 of their own
/// in one directory: every name exists once, each shared name was won by
/// exactly one machine (the others got EEXIST), and all three list the
/// same 600 entries. Then each writes its own files, closes them, and the
/// others read them byte for byte.
#[test]
fn three_machines_create_in_one_directory_at_once() {
    let (tmp, _url, _cfg, vols) = machines("three", 3, pg_opts);
    let dir = vols[0].mkdir(ROOT_INO, b"common", 0o755, root()).unwrap().ino;
    let start = Arc::new(Barrier::new(vols.len()));
    let won: Vec<(Vec<String>, Vec<(String, Ino)>)> = std::thread::scope(|s| {
        let hs: Vec<_> = vols
            .iter()
            .enumerate()
            .map(|(m, v)| {
                let start = start.clone();
                s.spawn(move || {
                    start.wait();
                    let (mut shared, mut own) = (Vec::new(), Vec::new());
                    for i in 0..150 {
                        let name = format!("same{i}");
                        match v.create(dir, name.as_bytes(), FileKind::File, 0o644, 0, root()) {
                            Ok(_) => shared.push(name),
                            Err(e) => assert_eq!(e.kind(), ErrorKind::Exists, "machine {m} creating {name}: {e}"),
                        }
                        let name = format!("m{m}-{i}");
                        let a = v.create(dir, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap_or_else(|e| panic!("machine {m} creating {name}: {e}"));
                        own.push((name, a.ino));
                    }
                    (shared, own)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut winners: Vec<String> = won.iter().flat_map(|(s, _)| s.iter().cloned()).collect();
    winners.sort();
    let want_shared: Vec<String> = {
        let mut w: Vec<String> = (0..150).map(|i| format!("same{i}")).collect();
        w.sort();
        w
    };
    assert_eq!(winners, want_shared, "each shared name is created by exactly one machine");
    let mut want: BTreeSet<String> = want_shared.into_iter().collect();
    for m in 0..3 {
        want.extend((0..150).map(|i| format!("m{m}-{i}")));
    }
    for (m, v) in vols.iter().enumerate() {
        assert_eq!(names(v, dir), want, "machine {m} lists another directory");
    }
    // Each machine writes its own files and closes them (a close commits
    // on a shared volume); every other machine then reads them.
    let mut written = Vec::new();
    for (m, (v, (_, own))) in vols.iter().zip(&won).enumerate() {
        for (i, (name, ino)) in own.iter().enumerate().step_by(10) {
            let data = random_bytes((m * 1000 + i) as u64, 5_000 + i * 997);
            v.open(*ino).unwrap();
            v.write(*ino, 0, &data).unwrap();
            v.close_commit(*ino).unwrap();
            v.release(*ino).unwrap();
            written.push((name.clone(), data));
        }
    }
    for (m, v) in vols.iter().enumerate() {
        for (name, data) in &written {
            let ino = v.lookup(dir, name.as_bytes()).unwrap().ino;
            assert!(&read_all(v, ino) == data, "machine {m} reads {name} wrong");
        }
    }
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// Two machines write the same 6 MiB into files of their own at the same
/// time, again and again (new bytes each round): whichever claims a chunk
/// first wins, the other learns it lost (its round fails `Raced` and is
/// prepared again, counted in `flush_rounds_raced`) and references the
/// winner's chunk. The rounds go on until a lost race has been seen (a
/// bounded number of them): a run in which every round happened not to
/// race proves nothing of the retry. Every file reads back on both, the
/// volume's referenced chunks hold each round's data once, and fsck reads
/// every byte cleanly.
#[test]
fn two_machines_storing_the_same_data_at_once_store_it_once() {
    const MIN_ROUNDS: usize = 3;
    const MAX_ROUNDS: usize = 30;
    let (tmp, _url, _cfg, vols) = machines("dedup", 2, pg_opts);
    let raced = || vols.iter().map(|v| v.metrics_snapshot().flush_rounds_raced).sum::<u64>();
    let start = Barrier::new(2);
    let mut written: Vec<(Vec<Ino>, Vec<u8>)> = Vec::new();
    for round in 0..MAX_ROUNDS {
        if round >= MIN_ROUNDS && raced() > 0 {
            break;
        }
        let data = random_bytes(77 + round as u64, 6 << 20);
        let inos: Vec<Ino> = std::thread::scope(|s| {
            let hs: Vec<_> = vols
                .iter()
                .enumerate()
                .map(|(m, v)| {
                    let (start, data) = (&start, &data);
                    s.spawn(move || {
                        let a = v.create(ROOT_INO, format!("m{m}-r{round}").as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
                        v.open(a.ino).unwrap();
                        start.wait();
                        for (i, piece) in data.chunks(256 << 10).enumerate() {
                            v.write(a.ino, (i << 18) as u64, piece).unwrap();
                        }
                        v.close_commit(a.ino).unwrap_or_else(|e| panic!("machine {m} round {round}: {e}"));
                        v.release(a.ino).unwrap();
                        a.ino
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        written.push((inos, data));
    }
    let rounds = written.len() as u64;
    eprintln!("{rounds} rounds, {} flush rounds raced and were prepared again", raced());
    assert!(raced() > 0, "in {rounds} rounds of two machines storing the same bytes at once, no flush round ever lost a chunk to the other: the retry was never reached");
    for v in &vols {
        for (inos, data) in &written {
            for ino in inos {
                assert!(&read_all(v, *ino) == data, "inode {ino} differs");
            }
        }
    }
    let st = maintenance::stats(&vols[0]).unwrap();
    assert_eq!(st.data_bytes, rounds * 2 * (6 << 20), "{st:?}");
    assert_eq!(st.unique_bytes, rounds * (6 << 20), "each round's data, written on two machines at once, is once in the volume: {st:?}");
    unmount_all_then_fsck(&tmp, vols, "m0");
}

/// A mount whose session another machine removed (as the cleanup of an
/// expired session does) finds out at its next heartbeat, says
/// `session_lost`, refuses changes, and never registers again by itself;
/// the other machine goes on writing.
#[test]
fn a_mount_whose_session_is_gone_refuses_changes() {
    let fast = || OpenOptions { cloud: CloudOptions { lease_renew: Duration::from_millis(200), ..pg_opts().cloud }, ..pg_opts() };
    let (_tmp, _url, cfg, vols) = machines("session", 2, fast);
    let (a, b) = (&vols[0], &vols[1]);
    let ida = *a.cloud().unwrap().session.get().expect("a read-write mount holds a session");
    let idb = *b.cloud().unwrap().session.get().unwrap();
    assert_ne!(ida, idb);
    let store = meta::Meta::open(meta::Location::Url { url: crate::postgres::url(), volume_id: &cfg.volume_id }, meta::Meta::options()).unwrap();
    let live: Vec<u64> = store.need_shared().unwrap().sessions().unwrap().iter().map(|s| s.id).collect();
    assert!(live.contains(&ida) && live.contains(&idb), "{live:?}");
    assert!(store.need_shared().unwrap().remove_session(ida).unwrap());
    let t = Instant::now();
    while a.status().health != "session_lost" {
        assert!(t.elapsed() < Duration::from_secs(10), "still {:?}", a.status());
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = a.create(ROOT_INO, b"after", FileKind::File, 0o644, 0, root()).unwrap_err();
    assert_eq!(e.errno(), libc::EROFS, "{e}");
    assert!(a.status().problems.iter().any(|p| p.what == "session"), "{:?}", a.status());
    mkfile(b, ROOT_INO, "b-goes-on", b"still writing");
    std::thread::sleep(Duration::from_millis(600));
    let live: Vec<u64> = store.need_shared().unwrap().sessions().unwrap().iter().map(|s| s.id).collect();
    assert!(!live.contains(&ida) && live.contains(&idb), "the lost session came back, or the live one went: {live:?}");
    assert!(a.close().is_err(), "the unmount of a mount that lost its session says so");
    b.close().unwrap();
    assert!(store.need_shared().unwrap().sessions().unwrap().is_empty(), "an unmount ends its session");
}

/// A rename storm: three machines at once move twelve directories into
/// one another at random, 150 moves each, many of which would make loops
/// (refused: EINVAL) or name a directory another machine just moved away
/// (ENOENT). At the end every machine walks the same tree from the root:
/// each directory is reached exactly once (no loop, nothing cut off), and
/// fsck is clean.
#[test]
fn a_rename_storm_from_three_machines_leaves_one_tree() {
    let (tmp, _url, _cfg, vols) = machines("storm", 3, pg_opts);
    const N: usize = 12;
    let dirs: Vec<Ino> = (0..N).map(|i| vols[0].mkdir(ROOT_INO, format!("d{i}").as_bytes(), 0o755, root()).unwrap().ino).collect();
    let start = Arc::new(Barrier::new(vols.len()));
    let outcomes: Vec<[u32; 3]> = std::thread::scope(|s| {
        let hs: Vec<_> = vols
            .iter()
            .enumerate()
            .map(|(m, v)| {
                let (start, dirs) = (start.clone(), &dirs);
                s.spawn(move || {
                    let mut x = 0x9E37_79B9u64 * (m as u64 + 1);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let mut out = [0u32; 3]; // moved, refused as a loop, moved away meanwhile
                    start.wait();
                    for _ in 0..150 {
                        let (i, j) = (next() as usize % N, next() as usize % (N + 1));
                        let name = format!("d{i}");
                        // Where d{i} is now (the root or one of the dirs).
                        let parent = std::iter::once(ROOT_INO).chain(dirs.iter().copied()).find(|&p| v.lookup(p, name.as_bytes()).is_ok());
                        let Some(parent) = parent else {
                            out[2] += 1; // between its old and new parent's rows for this reader
                            continue;
                        };
                        let to = if j == N { ROOT_INO } else { dirs[j] };
                        match v.rename(parent, name.as_bytes(), to, name.as_bytes(), RenameFlags::default()) {
                            Ok(()) => out[0] += 1,
                            Err(e) if e.kind() == ErrorKind::Invalid => out[1] += 1,
                            Err(e) if e.kind() == ErrorKind::NotFound => out[2] += 1,
                            Err(e) => panic!("machine {m}: moving {name} from {parent} into {to}: {e}"),
                        }
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("rename storm: (moved, refused as loops, moved away meanwhile) per machine: {outcomes:?}");
    assert!(outcomes.iter().all(|o| o[0] > 0), "a machine moved nothing: {outcomes:?}");
    assert!(outcomes.iter().map(|o| o[1]).sum::<u32>() > 0, "no move would have made a loop: the storm tested nothing");
    for (m, v) in vols.iter().enumerate() {
        let mut seen = BTreeSet::new();
        let mut stack = vec![ROOT_INO];
        while let Some(d) = stack.pop() {
            for e in v.readdir(d).unwrap() {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                assert!(seen.insert(e.ino), "machine {m}: directory {} reached twice", e.ino);
                stack.push(e.ino);
            }
        }
        assert_eq!(seen, dirs.iter().copied().collect::<BTreeSet<_>>(), "machine {m}: not every directory hangs from the root");
    }
    unmount_all_then_fsck(&tmp, vols, "m2");
}

/// One machine crashes (as kill -9: no unmount, no last heartbeat) while
/// another writes on. The other keeps working; once the crashed session is
/// past its lifetime, the other's cleaner (holding the maintenance lock)
/// removes it and only it, and frees the file it held open whose name the
/// other removed; when the crashed machine's directory mounts again, its
/// fsync'd file and its acknowledged but unflushed write are there (its
/// journal replayed) under a new session.
#[test]
fn a_crashed_machines_session_is_cleaned_and_its_data_survives() {
    let fast = || {
        let o = pg_opts();
        OpenOptions {
            cloud: CloudOptions { session_ttl: Duration::from_secs(1), lease_renew: Duration::from_millis(100), gc_interval: Some(Duration::from_millis(200)), ..o.cloud.clone() },
            ..o
        }
    };
    let (tmp, _url, cfg, mut vols) = machines("crash", 2, fast);
    let a = vols.remove(0);
    let b = &vols[0];
    let ida = *a.cloud().unwrap().session.get().unwrap();
    let synced = random_bytes(91, 300_000);
    let f = mkfile(&a, ROOT_INO, "synced", &synced);
    a.fsync(f, false).unwrap();
    let late = random_bytes(92, 70_000);
    let l = a.create(ROOT_INO, b"late", FileKind::File, 0o644, 0, root()).unwrap().ino;
    a.open(l).unwrap();
    a.write(l, 0, &late).unwrap();
    // A file A holds open when B removes its name: it outlives the name
    // while A lives, and goes with A's session.
    let held = mkfile(&a, ROOT_INO, "held", &random_bytes(93, 200_000));
    a.open(held).unwrap();
    b.unlink(ROOT_INO, b"held").unwrap();
    assert_eq!(b.getattr(held).unwrap().nlink, 0, "a file open on another machine was freed by an unlink");
    a.simulate_crash();

    let store = meta::Meta::open(meta::Location::Url { url: crate::postgres::url(), volume_id: &cfg.volume_id }, meta::Meta::options()).unwrap();
    let t = Instant::now();
    let mut i = 0;
    while store.need_shared().unwrap().sessions().unwrap().iter().any(|s| s.id == ida) {
        assert!(t.elapsed() < Duration::from_secs(15), "the crashed session was never cleaned up");
        // B goes on writing meanwhile.
        mkfile(b, ROOT_INO, &format!("b{i}"), &random_bytes(100 + i, 5_000));
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    // Only the expired session went: the live one renewed by its heartbeat
    // stays, however often the cleaner ran meanwhile.
    let idb = *b.cloud().unwrap().session.get().unwrap();
    assert!(store.need_shared().unwrap().sessions().unwrap().iter().any(|s| s.id == idb), "the live session was removed too");
    assert_eq!(b.status().health, "ok", "{:?}", b.status());
    assert_eq!(read_all(b, b.resolve(b"synced").unwrap()), synced, "the crashed machine's fsync'd file, read on the other");
    // The cleanup freed the nameless file the dead session held open.
    assert_eq!(b.getattr(held).expect_err("the crashed machine's unlinked open file outlived its session").kind(), ErrorKind::NotFound);
    // B unmounts (its background threads stop before the close returns;
    // a bare drop let the fsck below find the directory still in use).
    b.close().unwrap();
    drop(vols);

    let a = Volume::load(&tmp.path().join("m0"), fast()).unwrap();
    let again = *a.cloud().unwrap().session.get().unwrap();
    assert_ne!(again, ida, "a new session, not the crashed one brought back");
    assert_eq!(read_all(&a, a.resolve(b"synced").unwrap()), synced);
    assert_eq!(read_all(&a, a.resolve(b"late").unwrap()), late, "the acknowledged write replayed from the crashed machine's journal");
    a.close().unwrap();
    drop(a);
    unmount_all_then_fsck(&tmp, Vec::new(), "m1");
}

/// POSIX across machines: a file open on B keeps its bytes when A removes
/// its last name, even after gc and the trash prune ran; B's last close
/// frees it. A file nobody has open is freed by the unlink itself.
#[test]
fn a_file_open_on_one_machine_outlives_its_unlink_on_another() {
    let (tmp, _url, _cfg, vols) = machines("open-unlinked", 2, pg_opts);
    let (a, b) = (&vols[0], &vols[1]);
    let data = random_bytes(94, 3 << 20);
    let f = mkfile(a, ROOT_INO, "f", &data);
    let other = mkfile(a, ROOT_INO, "other", &random_bytes(95, 100_000));
    a.sync().unwrap();
    assert_eq!(b.resolve(b"f").unwrap(), f);
    // B opens it and has read nothing yet: its cache directory has none
    // of the packs, every byte it reads later comes from the bucket.
    b.open(f).unwrap();

    a.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(a.getattr(f).unwrap().nlink, 0, "freed while open on another machine");
    // Nothing collects its bytes meanwhile: gc, then the trash pruned at
    // once.
    maintenance::gc(a, 0.0, &maintenance::NoProgress).unwrap();
    a.prune_trash_older_than(Duration::ZERO);
    assert!(read_all(b, f) == data, "a file open on B lost bytes when A unlinked it");
    // Another machine's cleaner does not take it either.
    maintenance::clean_up_sessions(a).unwrap();
    assert_eq!(a.getattr(f).unwrap().nlink, 0);

    b.release(f).unwrap();
    assert_eq!(a.getattr(f).expect_err("the last close did not free the unlinked file").kind(), ErrorKind::NotFound);
    // The common case: nobody has it open, the unlink frees it.
    a.unlink(ROOT_INO, b"other").unwrap();
    assert_eq!(b.getattr(other).expect_err("an unlinked file nobody had open stayed").kind(), ErrorKind::NotFound);
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// One machine replaces and deletes files made of a few blobs, so their
/// chunks die and come back by deduplication, while another runs gc
/// (repacking half-dead packs) as fast as it can. A pack gc planned as
/// dead whose chunk the writer referenced again before gc's commit is kept
/// (not an error that throws the round away); every file reads back and
/// fsck reads every byte.
#[test]
fn gc_on_one_machine_while_another_revives_its_chunks() {
    let (tmp, _url, _cfg, vols) = machines("gcrace", 2, pg_opts);
    let (w, g) = (&vols[0], &vols[1]);
    let blobs: Vec<Vec<u8>> = (0..3).map(|i| random_bytes(300 + i, 150_000)).collect();
    let mut model: std::collections::HashMap<usize, Vec<u8>> = Default::default();
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Packs gc kept because a chunk it had planned as dead came back.
    let kept_so_far = std::sync::atomic::AtomicU64::new(0);
    // At least MIN_WRITES, and on until gc has kept a pack (the race the
    // test is about), at most MAX_WRITES.
    const MIN_WRITES: usize = 60;
    const MAX_WRITES: usize = 1200;
    let (passes, kept, writes) = std::thread::scope(|s| {
        let collector = s.spawn(|| {
            let mut passes = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let r = maintenance::gc(g, 0.5, &maintenance::NoProgress).unwrap_or_else(|e| panic!("gc pass {passes} beside a writer: {e}"));
                kept_so_far.fetch_add(r.packs_kept, std::sync::atomic::Ordering::SeqCst);
                passes += 1;
            }
            passes
        });
        let mut writes = 0;
        for i in 0..MAX_WRITES {
            if i >= MIN_WRITES && kept_so_far.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                break;
            }
            writes += 1;
            let slot = i % 4;
            let name = format!("f{slot}");
            if model.remove(&slot).is_some() {
                w.unlink(ROOT_INO, name.as_bytes()).unwrap();
                w.sync().unwrap();
            }
            let mut data = random_bytes(1000 + i as u64, 40);
            data.extend_from_slice(&blobs[(i * 7 / 3) % blobs.len()]);
            let a = w.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
            w.open(a.ino).unwrap();
            w.write(a.ino, 0, &data).unwrap();
            w.close_commit(a.ino).unwrap_or_else(|e| panic!("write {i}: {e}"));
            w.release(a.ino).unwrap();
            model.insert(slot, data);
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let passes = collector.join().unwrap();
        (passes, kept_so_far.load(std::sync::atomic::Ordering::SeqCst), writes)
    });
    assert!(passes > 1, "gc ran only {passes} times beside the writer");
    assert!(kept > 0, "in {writes} writes beside {passes} gc passes, gc never kept a pack whose chunk came back: the race was never reached");
    for v in &vols {
        for (slot, data) in &model {
            let ino = v.lookup(ROOT_INO, format!("f{slot}").as_bytes()).unwrap().ino;
            assert!(&read_all(v, ino) == data, "f{slot} differs after {passes} gc passes ({kept} packs kept)");
        }
    }
    eprintln!("{writes} writes, {passes} gc passes, {kept} packs kept");
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// The chunk grace (docs/shared-volume.md §7): chunks whose last
/// reference went less than the grace ago stay, with their pack, through
/// gc on another machine, so a writer that stores the same bytes again
/// references them instead of uploading them anew; once the grace is
/// over, gc deletes them. Without the grace (0) the same gc deletes the
/// pack at once and the writer uploads the bytes again.
#[test]
fn a_chunk_that_died_within_the_grace_is_kept_for_a_writer_that_finds_it() {
    let grace = Duration::from_secs(3);
    let (tmp, url, _cfg, vols) = machines("grace", 2, || OpenOptions { chunk_grace: Some(grace), ..pg_opts() });
    let (a, b) = (&vols[0], &vols[1]);
    let bucket = crate::pg_bucket::bucket_of(&url);
    let packs = || bucket.list("packs/").unwrap().len();
    let data = random_bytes(71, 3 << 20);
    mkfile(a, ROOT_INO, "f", &data);
    a.sync().unwrap();
    a.unlink(ROOT_INO, b"f").unwrap();
    a.sync().unwrap();
    let before = packs();

    let rep = maintenance::gc(b, 0.0, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_settling > 0 && rep.packs_deleted == 0, "gc within the grace: {rep:?}");
    // gc puts the packs it drops in the trash (they leave `packs/` only at
    // the prune): an empty trash is what says it dropped none.
    assert!(bucket.list(cairn_engine::cloud::TRASH_PREFIX).unwrap().is_empty(), "gc within the grace put packs in the trash");
    // The same bytes again, on the machine that ran gc: found by hash and
    // referenced, nothing uploaded.
    let g = mkfile(b, ROOT_INO, "g", &data);
    b.sync().unwrap();
    assert_eq!(packs(), before, "the writer uploaded chunks the grace kept for it");
    assert!(read_all(a, g) == data);

    // Dead again; past the grace gc takes them.
    b.unlink(ROOT_INO, b"g").unwrap();
    b.sync().unwrap();
    std::thread::sleep(grace + Duration::from_millis(1100)); // the store's clock counts whole seconds
    let rep = maintenance::gc(a, 0.0, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_deleted > 0 && rep.packs_settling == 0, "gc after the grace: {rep:?}");
    assert!(!bucket.list(cairn_engine::cloud::TRASH_PREFIX).unwrap().is_empty(), "gc after the grace left the trash empty");
    unmount_all_then_fsck(&tmp, vols, "m1");

    // Without the grace the pack goes at once and the bytes are uploaded again.
    let (tmp, url, _cfg, vols) = machines("nograce", 1, pg_opts);
    let v = &vols[0];
    let bucket = crate::pg_bucket::bucket_of(&url);
    mkfile(v, ROOT_INO, "f", &data);
    v.sync().unwrap();
    v.unlink(ROOT_INO, b"f").unwrap();
    v.sync().unwrap();
    let rep = maintenance::gc(v, 0.0, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_deleted > 0 && rep.packs_settling == 0, "gc without a grace: {rep:?}");
    let after_gc = bucket.list("packs/").unwrap().len();
    mkfile(v, ROOT_INO, "g", &data);
    v.sync().unwrap();
    assert!(bucket.list("packs/").unwrap().len() > after_gc, "without the grace the bytes had to be uploaded again");
    unmount_all_then_fsck(&tmp, vols, "m0");
}

/// An open on one machine racing the unlink of the same files on another:
/// each open either finds the file gone (NotFound) or keeps every byte
/// through the unlink, never an open that succeeded on an inode the
/// unlink freed (the unlink asks whether anyone has the file open, the
/// open checks that the inode still exists: without a lock between the
/// two each can miss the other).
#[test]
fn opens_racing_unlinks_on_another_machine_keep_what_they_opened() {
    // Rounds of 40 files until both outcomes have been seen (an open that
    // won and one that lost), at most MAX_ROUNDS.
    const MAX_ROUNDS: u64 = 20;
    let (tmp, _url, _cfg, vols) = machines("open-race", 2, pg_opts);
    let (a, b) = (&vols[0], &vols[1]);
    let (mut won, mut lost, mut rounds) = (0, 0, 0);
    while (won == 0 || lost == 0) && rounds < MAX_ROUNDS {
        let files: Vec<(Ino, Vec<u8>)> = (0..40u64).map(|i| {
            let data = random_bytes(500 + 100 * rounds + i, 20_000 + i as usize);
            (mkfile(a, ROOT_INO, &format!("r{rounds}-f{i}"), &data), data)
        }).collect();
        a.sync().unwrap();
        let start = Barrier::new(2);
        let opened: Vec<usize> = std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..files.len() {
                    start.wait();
                    // Staggered, so the race falls either way.
                    std::thread::sleep(Duration::from_micros(40 * (i as u64 % 8)));
                    a.unlink(ROOT_INO, format!("r{rounds}-f{i}").as_bytes()).unwrap();
                }
            });
            let mut opened = Vec::new();
            for (i, (ino, _)) in files.iter().enumerate() {
                start.wait();
                match b.open(*ino) {
                    Ok(_) => opened.push(i),
                    Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "open of r{rounds}-f{i}: {e}"),
                }
            }
            opened
        });
        for &i in &opened {
            let (ino, data) = &files[i];
            assert!(&read_all(b, *ino) == data, "r{rounds}-f{i}, opened on B while A unlinked it, lost bytes ({} of {} opened)", opened.len(), files.len());
            b.release(*ino).unwrap();
        }
        for (ino, _) in &files {
            assert_eq!(a.getattr(*ino).expect_err("an unlinked file outlived its last close").kind(), ErrorKind::NotFound);
        }
        won += opened.len();
        lost += files.len() - opened.len();
        rounds += 1;
    }
    eprintln!("{rounds} rounds: {won} opens before their unlink, {lost} after");
    assert!(won > 0 && lost > 0, "in {rounds} rounds {won} opens won the race and {lost} lost it: both outcomes must have happened for the test to test");
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// A mount remembers where each chunk it read lies. Another machine's gc
/// moves them (repacking packs half dead) and deletes the old packs once
/// the trash's grace is over; a read that then misses the first mount's
/// small caches finds the old pack gone, asks the metadata again, and reads
/// every byte.
#[test]
fn a_read_after_another_machine_moved_the_chunks_finds_them() {
    let small = || {
        let mut o = pg_opts();
        o.cache_bytes = 4096;
        o.cloud.cache_bytes = 1 << 20;
        o.cloud.cache_block = 64 << 10;
        o
    };
    let (tmp, _url, _cfg, vols) = machines("moved", 2, small);
    let (a, b) = (&vols[0], &vols[1]);
    let mut data = random_bytes(61, 3 << 20);
    let f = mkfile(a, ROOT_INO, "f", &data);
    a.sync().unwrap();
    assert!(read_all(b, f) == data, "B's first read");
    // Every other 256 KiB rewritten: every pack of f is half dead.
    a.open(f).unwrap();
    for (i, at) in (0..data.len()).step_by(512 << 10).enumerate() {
        let piece = random_bytes(70 + i as u64, 256 << 10);
        a.write(f, at as u64, &piece).unwrap();
        data[at..at + piece.len()].copy_from_slice(&piece);
    }
    a.close_commit(f).unwrap();
    a.release(f).unwrap();
    let rep = maintenance::gc(a, 1.0, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_repacked > 0, "{rep:?}");
    a.prune_trash_older_than(Duration::ZERO);
    // B's open reads the change log first: the extent map it had is gone.
    assert!(!b.open(f).unwrap().keep_cache, "B's open did not see A's rewrite");
    assert!(read_all(b, f) == data, "B's read after A's gc moved the chunks and deleted the old packs");
    b.release(f).unwrap();
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// Issue 49: two machines write different ranges of one file that has a
/// clone, both having opened it before either closes. A writes 1 MiB at
/// offset 0, B 1 MiB at 4 MiB of the 8 MiB file; A commits first, so B's
/// in-memory base is stale when it flushes. B's flush finds the file's
/// content version moved, re-bases (reloads the committed extent map and
/// lays its own dirty range over it) and commits: both ranges are in the
/// file, the clone made before the writes reads its original bytes, and
/// fsck is clean after every machine unmounts. Before the re-base, B's
/// commit dropped a page the clone still shared (the clone read EIO) and
/// A's range was lost.
#[test]
fn two_machines_writing_one_cloned_file_keep_both_ranges_and_the_clone() {
    let (tmp, _url, cfg, vols) = machines("writers", 2, pg_opts);
    let (a, b) = (&vols[0], &vols[1]);
    let store = meta::Meta::open(meta::Location::Url { url: crate::postgres::url(), volume_id: &cfg.volume_id }, meta::Meta::options()).unwrap();
    let orig = random_bytes(4901, 8 << 20);
    let f = mkfile(a, ROOT_INO, "f", &orig);
    a.fsync(f, false).unwrap();
    let c = a.create(ROOT_INO, b"clone", FileKind::File, 0o644, 0, root()).unwrap().ino;
    assert_eq!(a.clone_range(f, 0, c, 0, orig.len() as u64).unwrap(), orig.len() as u64);
    a.fsync(c, false).unwrap();
    let pages = store.read(|r| Ok(r.page_links(f)?)).unwrap();
    assert!(pages.iter().any(|p| p.refs >= 2), "the clone shares no page of the file: {pages:?}");

    // Both open before either writes or closes.
    let fb = b.resolve(b"f").unwrap();
    assert_eq!(fb, f);
    a.open(f).unwrap();
    b.open(f).unwrap();
    let wa = random_bytes(4902, 1 << 20);
    let wb = random_bytes(4903, 1 << 20);
    a.write(f, 0, &wa).unwrap();
    b.write(f, 4 << 20, &wb).unwrap();
    a.fsync(f, false).unwrap();
    a.close_commit(f).unwrap();
    a.release(f).unwrap();
    let before = b.metrics_snapshot().flush_rebases;
    b.fsync(f, false).unwrap();
    b.close_commit(f).unwrap();
    b.release(f).unwrap();
    assert!(b.metrics_snapshot().flush_rebases > before, "B's flush never re-based on A's commit");

    let mut want = orig.clone();
    want[..1 << 20].copy_from_slice(&wa);
    want[4 << 20..5 << 20].copy_from_slice(&wb);
    for (m, v) in [("A", a), ("B", b)] {
        v.catch_up(f).unwrap();
        assert!(read_all(v, c) == orig, "machine {m}: the clone changed");
        assert!(read_all(v, f) == want, "machine {m}: the file does not hold both ranges");
    }
    unmount_all_then_fsck(&tmp, vols, "m0");
    let v = Volume::load(&tmp.path().join("m1"), pg_opts()).unwrap();
    assert!(read_all(&v, v.resolve(b"clone").unwrap()) == orig, "the clone after a remount");
    assert!(read_all(&v, v.resolve(b"f").unwrap()) == want, "the file after a remount");
    v.close().unwrap();
}

/// Issue 49, fencing: machine A stalls (its heartbeats frozen, as under
/// SIGSTOP or a paused VM) between a flush's pack upload and its commit,
/// longer than its session's lifetime, while machine B runs gc. First,
/// while A's session lives, B's gc leaves A's uploaded, uncommitted pack
/// alone (it is recorded as uploading) and A's commit then goes through.
/// Then A stalls for good: B's gc removes A's expired session (A's lock
/// passes to B) and reclaims A's upload as an orphan, the trash is pruned
/// at once, and when A thaws its commit is fenced: the fsync answers EIO,
/// nothing names the deleted pack, A's later lock request fails. Every
/// fsync'd byte of both machines reads back, A's unacknowledged bytes
/// come back from its journal at its remount, and fsck is clean. Before
/// fencing, gc trashed the live upload and the thawed commit named a
/// deleted pack (the file read EIO, fsck failed).
#[test]
fn a_stalled_machines_commit_is_fenced_after_its_session_is_cleaned() {
    let fast = || {
        let o = pg_opts();
        OpenOptions {
            // No background round takes the files before the test holds
            // its commit.
            flush_age: Duration::from_secs(3600),
            cloud: CloudOptions { session_ttl: Duration::from_secs(1), lease_renew: Duration::from_millis(100), ..o.cloud.clone() },
            ..o
        }
    };
    let (tmp, _url, cfg, vols) = machines("stall", 2, fast);
    let (a, b) = (vols[0].clone(), vols[1].clone());
    let store = meta::Meta::open(meta::Location::Url { url: crate::postgres::url(), volume_id: &cfg.volume_id }, meta::Meta::options()).unwrap();
    let ida = a.lock_session().unwrap();
    let a_synced = random_bytes(4911, 300_000);
    let fa = mkfile(&a, ROOT_INO, "a-synced", &a_synced);
    a.fsync(fa, false).unwrap();
    let b_synced = random_bytes(4912, 300_000);
    let fb = mkfile(&b, ROOT_INO, "b-synced", &b_synced);
    b.fsync(fb, false).unwrap();

    // A live flush's upload survives gc and the trash prune on B.
    let live = random_bytes(4913, 400_000);
    let fl = mkfile(&a, ROOT_INO, "live", &live);
    let trashed = Arc::new(std::sync::Mutex::new(0u64));
    {
        let (b, trashed) = (b.clone(), trashed.clone());
        a.hold_next_flush_commit(move || {
            let rep = maintenance::gc(&b, 0.0, &maintenance::NoProgress).unwrap();
            *trashed.lock().unwrap() = rep.orphans_deleted;
            b.prune_trash_older_than(Duration::ZERO);
        });
    }
    a.fsync(fl, false).unwrap();
    assert_eq!(*trashed.lock().unwrap(), 0, "gc took a live machine's uploaded, uncommitted pack for an orphan");
    b.catch_up(fl).unwrap();
    assert!(read_all(&b, fl) == live, "a file whose pack gc took while its commit was under way");

    // A holds a lock, then stalls past its session between upload and commit.
    let locked = b.resolve(b"b-synced").unwrap();
    assert_eq!(a.set_lock(locked, 1, LockStyle::Posix, LockKind::Write, 0, LOCK_EOF, 11).unwrap(), LockOutcome::Granted);
    assert!(matches!(b.set_lock(locked, 2, LockStyle::Posix, LockKind::Write, 0, LOCK_EOF, 22).unwrap(), LockOutcome::Conflict(_)));
    let late = random_bytes(4914, 400_000);
    let fs = mkfile(&a, ROOT_INO, "stalled", &late);
    {
        let (a2, b, store) = (a.clone(), b.clone(), meta::Meta::open(meta::Location::Url { url: crate::postgres::url(), volume_id: &cfg.volume_id }, meta::Meta::options()).unwrap());
        a.hold_next_flush_commit(move || {
            a2.pause_heartbeat(true);
            let t = Instant::now();
            while !store.need_shared().unwrap().expired_sessions().unwrap().iter().any(|s| s.id == ida) {
                assert!(t.elapsed() < Duration::from_secs(20), "A's session never expired");
                std::thread::sleep(Duration::from_millis(100));
            }
            // B's gc cleans the dead session up and takes its upload.
            let rep = maintenance::gc(&b, 0.0, &maintenance::NoProgress).unwrap();
            assert!(rep.orphans_deleted > 0, "gc kept the upload of a session it removed: {rep:?}");
            b.prune_trash_older_than(Duration::ZERO);
            assert!(!store.need_shared().unwrap().sessions().unwrap().iter().any(|s| s.id == ida), "gc did not remove the expired session");
        });
    }
    let e = a.fsync(fs, false).expect_err("a stalled machine's commit went through after its session was cleaned up");
    assert_eq!(e.errno(), libc::EIO, "{e}");
    // Its lock passed on; it takes none again, and changes nothing more.
    assert_eq!(b.set_lock(locked, 2, LockStyle::Posix, LockKind::Write, 0, LOCK_EOF, 22).unwrap(), LockOutcome::Granted, "the stalled machine's lock outlived its session");
    assert!(a.set_lock(locked, 1, LockStyle::Posix, LockKind::Write, 0, LOCK_EOF, 11).is_err(), "a fenced machine took a lock again");
    assert_eq!(b.set_lock(locked, 2, LockStyle::Posix, LockKind::Unlock, 0, LOCK_EOF, 22).unwrap(), LockOutcome::Granted);
    assert!(a.create(ROOT_INO, b"after", FileKind::File, 0o644, 0, root()).is_err(), "a fenced machine created a file");
    assert!(b.resolve(b"after").is_err());
    // Nothing names a deleted pack; every fsync'd byte is there.
    for (name, data) in [("a-synced", &a_synced), ("b-synced", &b_synced), ("live", &live)] {
        let ino = b.resolve(name.as_bytes()).unwrap();
        b.catch_up(ino).unwrap();
        assert!(read_all(&b, ino) == *data, "{name} on B");
    }
    assert_eq!(b.getattr(fs).unwrap().size, 0, "the fenced commit changed the file");
    fsck_clean(&b);
    assert!(a.close().is_err(), "the unmount of a fenced mount says so");
    drop(vols);
    drop(a);
    // A's directory mounts again: its journal replays what the fenced
    // commit could not save.
    let a = Volume::load(&tmp.path().join("m0"), fast()).unwrap();
    assert_ne!(a.lock_session().unwrap(), ida);
    assert!(read_all(&a, a.resolve(b"stalled").unwrap()) == late, "the stalled machine's journaled bytes after its remount");
    a.sync().unwrap();
    b.close().unwrap();
    drop(b);
    a.close().unwrap();
    drop(a);
    unmount_all_then_fsck(&tmp, Vec::new(), "m1");
    drop(store);
}

/// Issue 55 on a shared volume: a file of 256 KiB rewritten in place,
/// round after round (random writes, each round flushed as an fsync
/// would), on machine A, with the default chunk grace (none fixed: the
/// flush rounds under way, docs/shared-volume.md §7 "Chunk grace"). The
/// mounts' own cleaners (a look every second at the bound) bring the dead
/// bytes under the bound once no round is under way, with no call to gc,
/// and every byte reads back on both machines. With the old fixed grace
/// (15 minutes) not one dead chunk could go before the grace was over, and
/// the dead bytes grew with every rewrite.
#[test]
fn a_shared_volume_keeps_its_dead_bytes_bounded_under_rewrites() {
    const FILE: usize = 256 << 10;
    const FLOOR: u64 = 1 << 20;
    let opts = || {
        let o = pg_opts();
        OpenOptions {
            chunk_grace: None,
            cloud: CloudOptions { gc_interval: Some(Duration::from_secs(3600)), gc_bound: cairn_engine::cleaner::DeadBound { ratio: 1.0, floor: FLOOR }, ..o.cloud.clone() },
            ..o
        }
    };
    let (tmp, _url, _cfg, vols) = machines("rewrite-bound", 2, opts);
    let (a, b) = (&vols[0], &vols[1]);
    let mut model = random_bytes(551, FILE);
    let f = mkfile(a, ROOT_INO, "db", &model);
    a.flush_now().unwrap();
    a.open(f).unwrap();
    let mut written = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for i in 0..120u64 {
        let off = next(FILE as u64 - 1024) as usize;
        let len = (next(48 << 10) as usize + (16 << 10)).min(FILE - off);
        let data = random_bytes(55_000 + i, len);
        a.write(f, off as u64, &data).unwrap();
        model[off..off + len].copy_from_slice(&data);
        written += len as u64;
        a.flush_file_now(f).unwrap();
    }
    a.release(f).unwrap();
    a.sync().unwrap();
    assert!(written > 4 * FLOOR, "the loop rewrote {written} bytes: not past the bound");
    let t0 = Instant::now();
    let s = loop {
        let s = maintenance::stats(b).unwrap();
        if s.dead_bound.is_some_and(|d| s.dead_bytes <= d) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "the dead bytes never came under the bound: {s:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(s.dead_bound, Some(FLOOR), "live bytes are below the floor: {s:?}");
    assert!(vols.iter().map(|v| v.metrics_snapshot().cleaner_rounds).sum::<u64>() > 0);
    b.catch_up(f).unwrap();
    for v in &vols {
        assert!(read_all(v, f) == model, "the file differs from the model");
    }
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// The chunk grace against flush rounds under way (docs/shared-volume.md
/// §7): machine A's round finds a chunk by hash while it is live (file
/// `y` holds the same bytes as `x`); held between its lookups and its
/// commit, machine B unlinks `x` (the chunk dies, after A's round began)
/// and runs gc: the pack stays (settling), A's commit references the
/// chunk without losing a race, and `y` reads back on both. Once A's
/// round is over, the same chunk dead again goes at B's next gc, a few
/// seconds later, not 15 minutes. With no grace at all (gc takes every
/// chunk at zero) A's round lost the chunk and had to store it again.
#[test]
fn a_chunk_that_died_during_a_flush_round_stays_until_it_ends() {
    let opts = || {
        let o = pg_opts();
        // No background round takes the file before the test holds it.
        OpenOptions { chunk_grace: None, flush_age: Duration::from_secs(3600), ..o }
    };
    let (tmp, _url, _cfg, vols) = machines("inflight", 2, opts);
    let (a, b) = (vols[0].clone(), vols[1].clone());
    let data = random_bytes(552, 3 << 20);
    let x = mkfile(&a, ROOT_INO, "x", &data);
    a.fsync(x, false).unwrap();
    let y = mkfile(&a, ROOT_INO, "y", &data);
    let seen = Arc::new(std::sync::Mutex::new(None));
    {
        let (b, seen) = (b.clone(), seen.clone());
        a.hold_next_flush_commit(move || {
            b.catch_up(ROOT_INO).unwrap();
            b.unlink(ROOT_INO, b"x").unwrap();
            b.sync().unwrap();
            let rep = maintenance::gc(&b, 0.0, &maintenance::NoProgress).unwrap();
            *seen.lock().unwrap() = Some(rep);
        });
    }
    a.fsync(y, false).unwrap();
    let rep = seen.lock().unwrap().take().expect("the held commit ran");
    assert!(rep.packs_settling > 0 && rep.packs_deleted == 0, "gc during A's round took the chunk A found live: {rep:?}");
    assert_eq!(a.metrics_snapshot().flush_rounds_raced, 0, "A's round lost a chunk it found live");
    b.catch_up(y).unwrap();
    assert!(read_all(&a, y) == data && read_all(&b, y) == data);

    // A's round is over: dead again, the chunk goes once the margin passed.
    a.unlink(ROOT_INO, b"y").unwrap();
    a.sync().unwrap();
    std::thread::sleep(Duration::from_secs(cairn_engine::maintenance::DEATH_MARGIN_SECS as u64 + 2));
    let rep = maintenance::gc(&b, 0.0, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_deleted > 0 && rep.packs_settling == 0, "gc with no round under way: {rep:?}");
    drop((a, b));
    unmount_all_then_fsck(&tmp, vols, "m1");
}

/// Issue 49, fencing for repacks: machine A's gc copies the live chunks
/// of a partly dead pack into new packs and stalls before its commit; the
/// server drops its maintenance connection (as `tcp_user_timeout` does to
/// a frozen machine), so machine B's gc takes the lock and runs: it
/// repacks the same pack itself and must leave A's uploaded copies alone
/// (they are recorded as uploading under A's live session). When A thaws,
/// its commit finds the chunks no longer where it read them and gives up
/// (Raced), discarding its copies: no row names a deleted pack, every
/// byte reads back, fsck is clean. Before, B's gc took A's copies for
/// orphans and deleted them, and A's commit moved the chunks into them
/// (the file read EIO).
#[test]
fn a_stalled_repack_neither_loses_its_copies_nor_moves_a_chunk_twice() {
    let (tmp, _url, cfg, vols) = machines("stalled-repack", 2, pg_opts);
    let (a, b) = (vols[0].clone(), vols[1].clone());
    // Packs of 1 MiB; a quarter of the first overwritten: partly dead.
    let orig = random_bytes(4921, 2 << 20);
    let f = mkfile(&a, ROOT_INO, "partly-dead", &orig);
    a.fsync(f, false).unwrap();
    let over = random_bytes(4922, 256 << 10);
    a.write(f, 640 << 10, &over).unwrap();
    a.fsync(f, false).unwrap();
    let mut want = orig.clone();
    want[640 << 10..896 << 10].copy_from_slice(&over);

    let b_rep = Arc::new(std::sync::Mutex::new(None));
    {
        let (b, b_rep) = (b.clone(), b_rep.clone());
        // Only this volume's: other tests run on the same server at once.
        let app = format!("cairn-maintenance cairn_{}", cfg.volume_id);
        a.hold_next_move_commit(move || {
            // The server ends the stalled machine's maintenance connection.
            let ended = pg_query(&format!("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{app}'"));
            assert_eq!(ended, "1", "A's maintenance connection");
            let rep = maintenance::gc(&b, 0.9, &maintenance::NoProgress).unwrap();
            b.prune_trash_older_than(Duration::ZERO);
            *b_rep.lock().unwrap() = Some(rep);
        });
    }
    let a_result = maintenance::gc(&a, 0.9, &maintenance::NoProgress);
    let b_rep = b_rep.lock().unwrap().take().expect("A's gc never reached its commit");
    assert_eq!(b_rep.orphans_deleted, 0, "B's gc took the stalled machine's uploaded copies for orphans: {b_rep:?}");
    assert!(b_rep.packs_repacked > 0, "B's gc did not repack the partly dead pack, so the race never happened: {b_rep:?}");
    let e = a_result.expect_err("A's gc committed moves of chunks B had already moved");
    assert_eq!(e.kind(), ErrorKind::Raced, "{e}");
    b.prune_trash_older_than(Duration::ZERO);
    for (m, v) in [("A", &a), ("B", &b)] {
        v.catch_up(f).unwrap();
        assert!(read_all(v, f) == want, "machine {m}: the file after both repacks");
    }
    fsck_clean(&b);
    drop((a, b));
    unmount_all_then_fsck(&tmp, vols, "m0");
}
