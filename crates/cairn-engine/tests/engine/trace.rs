//! Access traces (docs/trace.md) recorded by a cloud volume: every file
//! request, where each flush put the bytes, and every pack read of the
//! cache, counted as the cache counts them. (The replay of such a trace is
//! tested in sim_live.rs.)

use crate::cloud::{init_in, opts};
use crate::common::*;
use cairn_backend::Backend;
use cairn_engine::cache::disk::Durability;
use cairn_engine::trace::{CacheEvent, Event, TraceReader};
use cairn_engine::*;
use cairn_testing::MemoryBackend;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

fn events(path: &Path) -> Vec<Event> {
    TraceReader::open(path).unwrap().map(|r| r.unwrap().event).collect()
}

/// The extents of `ino` in PLACE records (described or not), by offset,
/// must tile `[0, size)`; a read of the file comes after them and after the
/// CHUNK records of every chunk it needed.
fn check_placed(ev: &[Event], ino: Ino, size: u64, described: bool) {
    let mut located: HashSet<u64> = HashSet::new();
    let mut placed: HashSet<u64> = HashSet::new();
    let mut at: BTreeMap<u64, u64> = BTreeMap::new();
    for e in ev {
        match *e {
            Event::Chunk { chunk, .. } => {
                located.insert(chunk);
            }
            Event::Place { ino: i, offset, len, chunk, described: d } if i == ino && d == described => {
                placed.insert(chunk);
                at.insert(offset, len);
            }
            Event::Read { ino: i, .. } if i == ino => {
                assert!(!at.is_empty(), "inode {ino} read before it was placed");
                assert!(placed.is_subset(&located), "inode {ino} read before its chunks were located");
            }
            _ => {}
        }
    }
    let mut pos = 0;
    for (off, len) in at {
        assert_eq!(off, pos, "inode {ino}: a gap or overlap at {pos}");
        pos += len;
    }
    assert_eq!(pos, size, "inode {ino}: placed bytes");
}

/// Bytes of `ino` in records of one kind.
fn bytes_of(ev: &[Event], ino: Ino, reads: bool) -> u64 {
    ev.iter()
        .map(|e| match *e {
            Event::Read { ino: i, len, .. } if reads && i == ino => len,
            Event::Write { ino: i, len, .. } if !reads && i == ino => len,
            _ => 0,
        })
        .sum()
}

#[test]
fn a_cloud_mount_records_what_it_did() {
    let a = tempfile::tempdir().unwrap();
    let t = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let mut o = opts(&bucket, Durability::Local);
    o.cache_bytes = 0; // reads reach the pack cache
    o.cloud.cache_bytes = 4 << 20;
    o.trace = Some(t.path().join("one"));
    let v = Volume::load(a.path(), o.clone()).unwrap();
    let sizes = [300_000u64, 100_000, 70_000];
    let inos: Vec<Ino> = sizes.iter().enumerate().map(|(i, &n)| mkfile(&v, ROOT_INO, &format!("f{i}"), &random_bytes(i as u64, n as usize))).collect();
    v.flush_now().unwrap();
    let cache = v.cloud().unwrap().cache.clone();
    cache.drain(&mut |_, _| {});
    read_all(&v, inos[0]);
    read_all(&v, inos[1]);
    v.truncate(inos[1], 50_000).unwrap();
    v.unlink(ROOT_INO, b"f2").unwrap();
    v.close().unwrap();
    drop(v);
    let stats = cache.stats();
    drop(cache); // records the clean shutdown: the next mount keeps what is cached

    let ev = events(&t.path().join("one"));
    assert_eq!(ev[0], Event::CacheOpened { block: cairn_engine::cache::disk::DEFAULT_BLOCK, capacity: 4 << 20, merge: 4772, ahead: cairn_engine::cache::disk::DEFAULT_AHEAD });
    // (The flush at unmount commits the truncated file again.)
    let before_truncate = ev.iter().position(|e| matches!(e, Event::Truncate { .. })).unwrap();
    for (&ino, &size) in inos.iter().zip(&sizes) {
        assert_eq!(bytes_of(&ev, ino, false), size, "inode {ino}: bytes written");
        check_placed(&ev[..before_truncate], ino, size, false);
    }
    assert_eq!((bytes_of(&ev, inos[0], true), bytes_of(&ev, inos[1], true)), (sizes[0], sizes[1]));
    assert!(ev.contains(&Event::Truncate { ino: inos[1], size: 50_000 }));
    assert!(ev.contains(&Event::Remove { ino: inos[2] }));
    // Each new pack: PACK before its chunks, then into the outbox and up.
    let packs: HashSet<u64> = ev.iter().filter_map(|e| if let Event::Pack { pack, .. } = e { Some(*pack) } else { None }).collect();
    let mut cache_events: HashMap<CacheEvent, u64> = HashMap::new();
    for e in &ev {
        if let Event::Cache { event, pack, group, .. } = *e {
            *cache_events.entry(event).or_default() += 1;
            if event.is_read() {
                assert!(packs.contains(&pack), "a read of a pack never written");
                assert!(inos.contains(&group), "a pack read for no file ({group})");
            }
        }
    }
    let n = |e| cache_events.get(&e).copied().unwrap_or(0);
    assert_eq!((n(CacheEvent::Queued), n(CacheEvent::Uploaded)), (packs.len() as u64, packs.len() as u64));
    assert_eq!((n(CacheEvent::Hit) + n(CacheEvent::Outbox), n(CacheEvent::Miss)), (stats.hits, stats.misses), "the cache's reads, as it counted them");
    assert!(stats.hits + stats.misses > 0);

    // A second mount describes what it finds: the pieces of the packs it
    // kept, then the committed map of a file before its first read.
    o.trace = Some(t.path().join("two"));
    let v = Volume::load(a.path(), o).unwrap();
    read_all(&v, inos[0]);
    v.close().unwrap();
    let ev = events(&t.path().join("two"));
    assert!(matches!(ev[0], Event::CacheOpened { .. }));
    assert!(matches!(ev[1], Event::Cache { event: CacheEvent::Held, len, .. } if len <= cairn_engine::cache::disk::KEEP_PIECE), "the pieces of packs cached at the last unmount: {:?}", ev[1]);
    check_placed(&ev, inos[0], sizes[0], true);
    assert_eq!(bytes_of(&ev, inos[0], true), sizes[0]);
}
