//! Maintenance on a whole volume: statistics, consistency check, garbage
//! collection. fsck and gc need the volume opened exclusively (not mounted).

use crate::error::{Error, ErrorKind, Result};
use crate::extent::{decode_page, Source};
use crate::meta;
use crate::pack::{self, BlobEntry, PackBuilder};
use crate::types::{FileKind, ROOT_INO};
use crate::volume::{discard_packs, Volume};
use cairn_backend::Subsystem;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Progress callbacks for long operations (the CLI draws bars).
pub trait Progress {
    /// A new phase with `total` steps (0 if unknown).
    fn phase(&self, name: &str, total: u64);
    /// `n` more steps done.
    fn inc(&self, n: u64);
}

/// Progress that shows nothing.
pub struct NoProgress;
impl Progress for NoProgress {
    fn phase(&self, _: &str, _: u64) {}
    fn inc(&self, _: u64) {}
}

/// Volume statistics.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Stats {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// Sum of regular file sizes.
    pub logical_bytes: u64,
    /// Logical bytes that are not holes.
    pub data_bytes: u64,
    /// Plaintext bytes of the chunks still referenced.
    pub unique_bytes: u64,
    /// Stored (compressed, encrypted) bytes of referenced chunks.
    pub live_stored_bytes: u64,
    /// Bytes of all packs in the backend.
    pub stored_bytes: u64,
    /// Bytes of packs occupied by unreferenced chunks.
    pub dead_bytes: u64,
    pub chunks: u64,
    pub dead_chunks: u64,
    pub packs: u64,
    /// data_bytes / unique_bytes.
    pub dedup_ratio: f64,
    /// unique_bytes / live_stored_bytes.
    pub compression_ratio: f64,
    /// data_bytes / stored_bytes.
    pub overall_ratio: f64,
    /// The local cache of a volume in a bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::disk::CacheStats>,
    /// What the home holds that deletes did not free (a tape: deleted and
    /// replaced objects stay until `cairn tape reclaim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub medium: Option<MediumSpace>,
    /// The most dead bytes the cleaner's bound allows beside the live ones
    /// (docs/frugal.md §8); None where no cleaner runs (a tape, or
    /// `--gc-interval 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_bound: Option<u64>,
    /// Packs below a quarter of the pack target; the cleaner merges them
    /// once there are [`crate::cleaner::SMALL_PACKS`].
    #[serde(default)]
    pub small_packs: u64,
}

/// Space on an append-only home (see [`cairn_backend::Sequential::space`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq, Eq)]
pub struct MediumSpace {
    /// Bytes of live objects (packs, metadata versions, the config).
    pub live_bytes: u64,
    /// Bytes of deleted or replaced objects still on the medium.
    pub dead_bytes: u64,
    /// Room left, when the medium says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Computes the statistics from the committed metadata.
pub fn stats(vol: &Volume) -> Result<Stats> {
    vol.meta.read(|c| {
        let mut s = Stats::default();
        for (kind, n, size, data) in c.inode_totals()?.by_kind {
            match kind {
                FileKind::File => {
                    s.files = n;
                    s.logical_bytes = size;
                    s.data_bytes = data;
                }
                FileKind::Dir => s.directories = n,
                FileKind::Symlink => s.symlinks = n,
                _ => {}
            }
        }
        let t = c.chunk_totals()?;
        s.chunks = t.live_chunks;
        s.dead_chunks = t.dead_chunks;
        s.unique_bytes = t.unique_bytes;
        s.live_stored_bytes = t.live_stored_bytes;
        s.packs = t.packs;
        s.stored_bytes = t.pack_bytes;
        s.dead_bytes = t.dead_bytes;
        s.dedup_ratio = ratio(s.data_bytes, s.unique_bytes);
        s.compression_ratio = ratio(s.unique_bytes, s.live_stored_bytes);
        s.overall_ratio = ratio(s.data_bytes, s.stored_bytes);
        s.cache = vol.cloud().map(|c| c.cache.stats());
        s.medium = vol.chunks.backend.sequential().and_then(|q| q.space()).map(|m| MediumSpace { live_bytes: m.live_bytes, dead_bytes: m.dead_bytes, free_bytes: m.free_bytes });
        s.small_packs = c.pack_counts(vol.cfg.pack_target / crate::cleaner_rules::SMALL_PACK_SHARE)?.1;
        s.dead_bound = vol.cleaner_bound().map(|b| b.of(s.stored_bytes.saturating_sub(s.dead_bytes)));
        Ok(s)
    })
}

impl Volume {
    /// The cleaner's bound on dead bytes where a mount runs the cleaner
    /// (this one, or one opened with these options): every kind but a
    /// tape, unless `--gc-interval 0`.
    pub(crate) fn cleaner_bound(&self) -> Option<&crate::cleaner_rules::DeadBound> {
        // A tape's cloud options have no interval (`Cloud::open`).
        let o = self.cloud().map_or(&self.opts.cloud, |c| &c.opts);
        o.gc_interval.is_some().then_some(&o.gc_bound)
    }
}

/// What fsck found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FsckReport {
    /// Inconsistencies: something is wrong or lost.
    pub errors: Vec<String>,
    /// Leaks that lose nothing (e.g. a pack uploaded just before a crash and
    /// never committed); `gc` reclaims them.
    pub warnings: Vec<String>,
    pub inodes: u64,
    pub chunks: u64,
    pub packs: u64,
    pub blobs_read: u64,
    /// Packs in the bucket that no metadata names and that gc put in the
    /// trash: deleted after the grace period, not a leak.
    pub packs_in_trash: u64,
    /// Packs in the bucket that no pack row names but that a session
    /// recorded as uploading (docs/shared-volume.md §7 "Fencing"): a
    /// flush under way on a machine, or one of a gone session that gc
    /// reclaims after the grace; not a leak.
    pub packs_uploading: u64,
}

/// The grace fsck asks `uploads_in_flight` with: long enough that it
/// deletes no record (that is gc's to do).
const UPLOADS_KEPT_BY_FSCK: std::time::Duration = std::time::Duration::from_secs(10 * 365 * 86_400);

/// Checks the volume: namespace, extents against reference counts, chunks
/// against packs and their indexes, and with `read_data` every blob.
pub fn fsck(vol: &Volume, read_data: bool, progress: &dyn Progress) -> Result<FsckReport> {
    vol.sync()?;
    let mut rep = FsckReport::default();
    let (inodes, dentries, pages, links, chunks, packs) = vol.meta.read(|c| {
        Ok((c.all_inodes()?, c.all_dentries()?, c.all_pages()?, c.all_page_links()?, c.all_chunks()?, c.all_packs()?))
    })?;
    rep.inodes = inodes.len() as u64;
    rep.chunks = chunks.len() as u64;
    rep.packs = packs.len() as u64;
    progress.phase("namespace", inodes.len() as u64);
    // Namespace.
    let by_ino: HashMap<u64, &meta::InodeRow> = inodes.iter().map(|r| (r.attr.ino, r)).collect();
    let mut names: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    for (parent, name, ino, kind) in &dentries {
        let n = String::from_utf8_lossy(name);
        match by_ino.get(ino) {
            None => rep.errors.push(format!("entry {n:?} in directory {parent} points to missing inode {ino}")),
            Some(r) => {
                if r.attr.kind.code() != *kind {
                    rep.errors.push(format!("entry {n:?} in directory {parent}: kind differs from inode {ino}"));
                }
                if r.attr.kind == FileKind::Dir {
                    *subdirs.entry(*parent).or_default() += 1;
                    if r.parent != Some(*parent) {
                        rep.errors.push(format!("directory {ino} is named in {parent} but records parent {:?}", r.parent));
                    }
                }
            }
        }
        if !by_ino.get(parent).is_some_and(|p| p.attr.kind == FileKind::Dir) {
            rep.errors.push(format!("entry {n:?} lives in {parent}, which is not a directory"));
        }
        *names.entry(*ino).or_default() += 1;
    }
    for r in &inodes {
        progress.inc(1);
        let ino = r.attr.ino;
        let n = names.get(&ino).copied().unwrap_or(0);
        if r.attr.kind == FileKind::Dir {
            let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
            if ino != ROOT_INO && n != 1 {
                rep.errors.push(format!("directory {ino} has {n} names"));
            }
            if r.attr.nlink != want {
                rep.errors.push(format!("directory {ino} has link count {} but {want} expected", r.attr.nlink));
            }
        } else if r.attr.nlink != n {
            rep.errors.push(format!("inode {ino} has link count {} but {n} names", r.attr.nlink));
        }
    }
    // Pages against chunks: each stored page counts once per extent,
    // however many files link it.
    progress.phase("extents", pages.len() as u64);
    let chunk_by_id: HashMap<u64, &meta::ChunkRow> = chunks.iter().map(|c| (c.id, c)).collect();
    let mut refs: HashMap<u64, i64> = HashMap::new();
    let mut page_lens: HashMap<u64, (u64, u64)> = HashMap::new(); // page -> (len, data)
    let mut page_refs: HashMap<u64, i64> = HashMap::new();
    for (id, prefs, data) in &pages {
        progress.inc(1);
        page_refs.insert(*id, *prefs);
        let page = match decode_page(0, data) {
            Ok(p) => p,
            Err(e) => {
                rep.errors.push(format!("extent page #{id}: {e}"));
                continue;
            }
        };
        let l = page_lens.entry(*id).or_default();
        for e in &page.extents {
            l.0 += e.len;
            if let Source::Chunk(cid) = e.src {
                l.1 += e.len;
                *refs.entry(cid).or_default() += 1;
                match chunk_by_id.get(&cid) {
                    None => rep.errors.push(format!("extent page #{id} references missing chunk #{cid}")),
                    Some(c) if e.off + e.len > c.raw_len as u64 => {
                        rep.errors.push(format!("extent page #{id}: extent {}+{} past the end of chunk #{cid} ({} bytes)", e.off, e.len, c.raw_len))
                    }
                    _ => {}
                }
            }
        }
    }
    // Links against pages and files.
    let mut lens: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // ino -> (len, data)
    let mut links_of: HashMap<u64, i64> = HashMap::new();
    for (ino, key, page) in &links {
        *links_of.entry(*page).or_default() += 1;
        match page_lens.get(page) {
            Some((len, data)) => {
                let l = lens.entry(*ino).or_default();
                l.0 += len;
                l.1 += data;
            }
            None if !page_refs.contains_key(page) => rep.errors.push(format!("inode {ino}: key {key} links missing page #{page}")),
            None => {}
        }
    }
    for (id, n) in &page_refs {
        let linked = links_of.get(id).copied().unwrap_or(0);
        if linked != *n {
            rep.errors.push(format!("extent page #{id}: link count {n} but {linked} files link it"));
        }
    }
    for r in &inodes {
        if r.attr.kind == FileKind::File {
            let (len, data) = lens.get(&r.attr.ino).copied().unwrap_or((0, 0));
            if len != r.attr.size {
                rep.errors.push(format!("inode {}: size {} but extents cover {len} bytes", r.attr.ino, r.attr.size));
            }
            if data != r.data_bytes {
                rep.errors.push(format!("inode {}: allocation {} but extents hold {data} data bytes", r.attr.ino, r.data_bytes));
            }
        } else if lens.contains_key(&r.attr.ino) {
            rep.errors.push(format!("inode {} is not a file but has extents", r.attr.ino));
        }
    }
    for (id, n) in &refs {
        if !by_ino.is_empty() && chunk_by_id.get(id).is_some_and(|c| c.refs != *n) {
            rep.errors.push(format!("chunk #{id}: reference count {} but {n} extents use it", chunk_by_id[id].refs));
        }
    }
    for c in &chunks {
        if c.refs != 0 && !refs.contains_key(&c.id) {
            rep.errors.push(format!("chunk #{}: reference count {} but no extent uses it", c.id, c.refs));
        }
    }
    // Chunks against packs.
    let pack_by_id: HashMap<u64, &meta::PackRow> = packs.iter().map(|p| (p.id, p)).collect();
    let mut dead: HashMap<u64, u64> = HashMap::new();
    let mut in_pack: HashMap<u64, Vec<&meta::ChunkRow>> = HashMap::new();
    for c in &chunks {
        if !pack_by_id.contains_key(&c.pack) {
            rep.errors.push(format!("chunk #{} lives in missing pack #{}", c.id, c.pack));
        }
        if c.refs == 0 {
            *dead.entry(c.pack).or_default() += c.stored_len as u64;
        }
        in_pack.entry(c.pack).or_default().push(c);
    }
    let listed: HashMap<String, u64> = vol.chunks.backend.list("packs/")?.into_iter().map(|o| (o.name, o.size)).collect();
    progress.phase("packs", packs.len() as u64);
    for p in &packs {
        progress.inc(1);
        let d = dead.get(&p.id).copied().unwrap_or(0);
        if d != p.dead_bytes {
            rep.errors.push(format!("pack {}: dead bytes recorded {} but {d} found", p.name, p.dead_bytes));
        }
        match listed.get(&p.name) {
            None => {
                rep.errors.push(format!("pack {} is missing from the backend ({} chunks lost)", p.name, in_pack.get(&p.id).map_or(0, |v| v.len())));
                continue;
            }
            Some(&size) if size != p.size => {
                rep.errors.push(format!("pack {} has {size} bytes in the backend but {} recorded (truncated?)", p.name, p.size));
                continue;
            }
            _ => {}
        }
        match pack::read_index(vol.chunks.backend.as_ref(), &vol.chunks.keys, &vol.vid, &p.name) {
            Err(e) => rep.errors.push(format!("pack {}: index unreadable: {e}", p.name)),
            Ok(entries) => {
                let idx: HashMap<[u8; 32], &BlobEntry> = entries.iter().map(|e| (e.id, e)).collect();
                for c in in_pack.get(&p.id).map(|v| v.as_slice()).unwrap_or(&[]) {
                    match idx.get(&c.hash) {
                        Some(e) if e.offset == c.offset && e.stored_len == c.stored_len && e.raw_len == c.raw_len && e.flags == c.flags => {}
                        Some(_) => rep.errors.push(format!("pack {}: index disagrees with the metadata about chunk #{}", p.name, c.id)),
                        None => rep.errors.push(format!("pack {}: chunk #{} is not in its index", p.name, c.id)),
                    }
                }
            }
        }
    }
    // Packs a session recorded as uploading are not leaks (a pack that
    // committed between the reads above and this one is warned about;
    // gc, which reads in the safe order, keeps it).
    let uploading: HashSet<String> = vol.meta.shared().map_or(Ok(Vec::new()), |s| s.uploads_in_flight(UPLOADS_KEPT_BY_FSCK))?.into_iter().collect();
    let known: HashSet<&str> = packs.iter().map(|p| p.name.as_str()).collect();
    let trashed = if listed.keys().any(|n| !known.contains(n.as_str())) { vol.trashed_packs(&mut rep.warnings) } else { HashSet::new() };
    for name in listed.keys() {
        if known.contains(name.as_str()) {
            continue;
        }
        if trashed.contains(name) {
            rep.packs_in_trash += 1;
        } else if uploading.contains(name) {
            rep.packs_uploading += 1;
        } else {
            rep.warnings.push(format!("pack {name} is in the backend but not in the metadata (left by an interrupted flush; gc removes it)"));
        }
    }
    if read_data {
        let live: Vec<&meta::ChunkRow> = chunks.iter().filter(|c| pack_by_id.get(&c.pack).is_some_and(|p| listed.get(&p.name) == Some(&p.size))).collect();
        progress.phase("read data", live.len() as u64);
        for c in live {
            progress.inc(1);
            let name = &pack_by_id[&c.pack].name;
            let e = BlobEntry { id: c.hash, offset: c.offset, stored_len: c.stored_len, raw_len: c.raw_len, flags: c.flags };
            let r = vol.chunks.backend.get_range(name, c.offset, c.stored_len as u64).map_err(Error::from).and_then(|b| pack::decode_blob(&vol.chunks.keys, &e, b, pack::Verify::Full));
            rep.blobs_read += 1;
            if let Err(err) = r {
                rep.errors.push(format!("pack {name}: chunk #{} at offset {} is corrupt: {err}", c.id, c.offset));
            }
        }
    }
    Ok(rep)
}

/// What gc did.
#[derive(Debug, Clone, Serialize, Default)]
pub struct GcReport {
    pub packs_deleted: u64,
    pub packs_repacked: u64,
    /// Packs planned but kept: a chunk of theirs dead when planned was
    /// referenced again before the commit (found by hash). The next gc
    /// takes them.
    pub packs_kept: u64,
    /// Packs left for a later gc: a chunk of theirs lost its last
    /// reference less than the chunk grace ago (a shared volume, where
    /// another machine may be about to reference it again).
    pub packs_settling: u64,
    pub orphans_deleted: u64,
    pub chunks_deleted: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// How long the upload records of a gone session are kept before their
/// objects count as orphans (`uploads_in_flight`: room for a PUT still in
/// flight on a stalled machine), and the fixed chunk grace `--chunk-grace`
/// used to mean by default (docs/shared-volume.md §7).
pub const CHUNK_GRACE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Seconds before the start of the oldest flush round under way that a
/// chunk must have died for a collector to take it: the store dates a
/// death at the statement that brings the count to 0, a little before
/// that transaction commits, and counts whole seconds.
pub const DEATH_MARGIN_SECS: i64 = 5;

impl Volume {
    /// The store-clock second up to which a chunk at zero references may
    /// be collected (its `zero_since` at or before it); None when every
    /// chunk at zero may be (a volume one process writes: its flushes
    /// and its collector take turns under the chunk guard).
    ///
    /// On a shared volume (docs/shared-volume.md §7 "Chunk grace"): a
    /// chunk that died after the oldest flush round under way on any
    /// machine began (less [`DEATH_MARGIN_SECS`]) stays, since that round
    /// may have found it by hash while it was live and be about to
    /// reference it; with no round under way, one that died more than the
    /// margin ago may go. A writer that finds a chunk already dead and
    /// loses it to a collector learns so at its commit (`Raced`) and
    /// stores it again. `--chunk-grace` asks for a fixed grace instead.
    pub(crate) fn collect_dead_before(&self) -> Result<Option<i64>> {
        if !self.is_shared() {
            return Ok(None);
        }
        match self.opts.chunk_grace {
            Some(g) if g.is_zero() => Ok(None),
            Some(g) => Ok(Some(self.meta.store().clock_secs()? - g.as_secs() as i64)),
            None => {
                let now = self.meta.store().clock_secs()?;
                let oldest = self.meta.need_shared()?.oldest_flush()?.map_or(now, |s| s.min(now));
                Ok(Some(oldest - DEATH_MARGIN_SECS))
            }
        }
    }
}

/// Whether a chunk at zero references is still in its grace period
/// (`before` from [`Volume::collect_dead_before`]).
pub(crate) fn settling(c: &meta::ChunkRow, before: Option<i64>) -> bool {
    c.refs == 0 && matches!((c.zero_since, before), (Some(z), Some(b)) if z > b)
}

/// On a volume many machines write (metadata in PostgreSQL), the volume's
/// maintenance lock: one machine at a time runs gc or the cleaner
/// (docs/shared-volume.md §7). Waits up to `wait` for it; `Ok(None)` when
/// another machine still holds it then. A volume only this process writes
/// needs no lock: a guard that holds nothing.
pub(crate) fn maintenance_lock(vol: &Volume, wait: std::time::Duration) -> Result<Option<Box<dyn meta::MaintenanceGuard>>> {
    if !vol.is_shared() {
        return Ok(Some(Box::new(NoLock)));
    }
    let until = std::time::Instant::now() + wait;
    loop {
        if let Some(g) = vol.meta.need_shared()?.try_maintenance()? {
            return Ok(Some(g));
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// On a volume many machines write: removes the sessions past their expiry
/// (machines that crashed or lost the database for longer than the
/// session's lifetime), logging whose they were. Runs under the
/// maintenance lock. A removed session is never renewed again: if its
/// mount still runs, its next heartbeat finds it gone and it stops writing.
/// Its file locks go with it (the store deletes them with the session
/// row), freeing them for the other machines. Returns how many went.
pub fn clean_up_sessions(vol: &Volume) -> Result<usize> {
    if !vol.is_shared() {
        return Ok(0);
    }
    let mut n = 0;
    for s in vol.meta.need_shared()?.expired_sessions()? {
        if vol.meta.need_shared()?.remove_session(s.id)? {
            tracing::info!(session = s.id, host = %s.host, pid = s.pid, mount = %s.mount, "removed an expired session (its heartbeats stopped) and its open files");
            n += 1;
        }
    }
    // Files whose last name went while a dead session had them open, and
    // any another machine unlinked while it had them open: nobody can
    // reach them now.
    if !vol.is_read_only() {
        vol.remove_orphans()?;
        // The change log (two rows per create or unlink) is trimmed here,
        // by the machine holding the maintenance lock: rows older than
        // CHANGES_KEPT (a mount whose cursor they overtook drops its
        // caches, docs/shared-volume.md §6).
        let trimmed = vol.meta.need_shared()?.trim_changes(CHANGES_KEPT)?;
        if trimmed > 0 {
            tracing::debug!(rows = trimmed, "trimmed the change log");
        }
    }
    Ok(n)
}

/// How long the change log keeps a row (docs/shared-volume.md §6).
pub const CHANGES_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// The maintenance "lock" of a volume one process writes.
struct NoLock;

impl meta::MaintenanceGuard for NoLock {
    fn still_held(&mut self) -> bool {
        true
    }
}

/// Deletes packs with no live chunk, repacks packs whose live share of
/// bytes is below `repack_below` (0..1), and removes orphan packs.
pub fn gc(vol: &Volume, repack_below: f64, progress: &dyn Progress) -> Result<GcReport> {
    vol.check_writable()?;
    let Some(_maintenance) = maintenance_lock(vol, std::time::Duration::from_secs(30))? else {
        return Err(Error::new(
            ErrorKind::Busy,
            "another machine is running gc or the cleaner on this volume (it holds the maintenance lock); try again when it is done",
        ));
    };
    clean_up_sessions(vol)?;
    vol.sync()?;
    let mut rep = GcReport::default();
    // The bucket first, then the uploads under way, then the packs: a
    // flush's pack listed here is recorded as uploading before its PUT,
    // and its commit moves it from the uploads to the packs in one
    // transaction, so it is in one of the two read after it (in that
    // order) and never taken for an orphan (docs/shared-volume.md §7
    // "Uploads"). Those of a session gone for longer than the grace are
    // orphans: that session can commit nothing any more (fencing).
    let listed = vol.chunks.paid(Subsystem::Gc).list("packs/")?;
    let uploading = vol.meta.shared().map_or(Ok(Vec::new()), |s| s.uploads_in_flight(vol.opts.chunk_grace.unwrap_or(CHUNK_GRACE)))?;
    let packs = vol.meta.read(|tx| Ok(tx.all_packs()?))?;
    rep.bytes_before = listed.iter().map(|o| o.size).sum();
    let known: HashSet<&str> = packs.iter().map(|p| p.name.as_str()).chain(uploading.iter().map(|n| n.as_str())).collect();
    progress.phase("gc", packs.len() as u64 + listed.len() as u64);
    // Orphans: uploaded by a flush or gc whose commit never became durable.
    // `vol.sync()` above made every commit durable, so none refers to them.
    progress.inc(listed.len() as u64);
    rep.orphans_deleted = vol.delete_objects(Subsystem::Gc, listed.iter().map(|o| o.name.as_str()).filter(|n| !known.contains(n)))?;
    let before = vol.collect_dead_before()?;
    let mut mover = Mover::new(vol, before);
    let mut emptied: Vec<meta::PackRow> = Vec::new();
    let mut repacked: HashSet<u64> = HashSet::new();
    for p in packs {
        progress.inc(1);
        if p.dead_bytes == 0 {
            continue;
        }
        let chunks = vol.meta.read(|c| Ok(c.chunks_in_pack(p.id)?))?;
        if chunks.iter().any(|c| settling(c, before)) {
            rep.packs_settling += 1;
            continue;
        }
        let live_bytes: u64 = chunks.iter().filter(|c| c.refs > 0).map(|c| c.stored_len as u64).sum();
        if !worth_cleaning(live_bytes, p.size, repack_below) {
            continue;
        }
        mover.copy_live(&p.name, &chunks)?;
        if live_bytes > 0 {
            repacked.insert(p.id);
        }
        emptied.push(p);
    }
    mover.finish()?;
    // Point chunks at their new packs and drop the old rows in one
    // transaction; only then delete the old objects.
    let done = vol.meta.write(|tx| mover.commit(tx, emptied.iter().map(|p| p.id))).inspect_err(|_| {
        // Nothing committed: the packs this run wrote name nothing.
        mover.discard();
    })?;
    vol.chunks.forget_chunks(&done.freed_chunks);
    for p in emptied.iter().filter(|p| !done.kept.contains(&p.id)) {
        vol.chunks.forget_pack_name(p.id);
    }
    rep.chunks_deleted = done.chunks_dropped;
    rep.packs_kept = done.kept.len() as u64;
    rep.packs_repacked = repacked.difference(&done.kept).count() as u64;
    // The old objects go only once that transaction is durable (rule 3):
    // before, a power cut would bring back rows pointing into them.
    rep.packs_deleted = vol.delete_objects(Subsystem::Gc, emptied.iter().filter(|p| !done.kept.contains(&p.id)).map(|p| p.name.as_str()))?;
    rep.bytes_after = vol.chunks.paid(Subsystem::Gc).list("packs/")?.iter().map(|o| o.size).sum();
    Ok(rep)
}

/// `gc`'s rule: a pack goes when nothing in it is live, and is repacked
/// when its live share of bytes is below `repack_below`.
fn worth_cleaning(live_bytes: u64, size: u64, repack_below: f64) -> bool {
    live_bytes == 0 || (live_bytes as f64) < repack_below * size as f64
}

/// A pack `gc` would delete (no live bytes) or repack.
#[derive(Debug, Clone, Serialize)]
pub struct GcCandidate {
    pub name: String,
    pub size: u64,
    pub dead_bytes: u64,
    pub live_bytes: u64,
}

/// What `gc` with `repack_below` would clean, changing nothing.
pub fn gc_candidates(vol: &Volume, repack_below: f64) -> Result<Vec<GcCandidate>> {
    let before = vol.collect_dead_before()?;
    let mut out = Vec::new();
    for p in vol.meta.read(|tx| Ok(tx.all_packs()?))?.into_iter().filter(|p| p.dead_bytes > 0) {
        let chunks = vol.meta.read(|c| Ok(c.chunks_in_pack(p.id)?))?;
        if chunks.iter().any(|c| settling(c, before)) {
            continue;
        }
        let live_bytes: u64 = chunks.iter().filter(|c| c.refs > 0).map(|c| c.stored_len as u64).sum();
        if worth_cleaning(live_bytes, p.size, repack_below) {
            out.push(GcCandidate { name: p.name, size: p.size, dead_bytes: p.dead_bytes, live_bytes });
        }
    }
    Ok(out)
}

/// The runs of live chunks of a pack (its rows in offset order): maximal
/// sequences not broken by a dead chunk, as (first index, last index).
pub(crate) fn live_runs(chunks: &[meta::ChunkRow]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        if c.refs == 0 {
            continue;
        }
        match runs.last_mut() {
            Some(r) if r.1 + 1 == i => r.1 = i,
            _ => runs.push((i, i)),
        }
    }
    runs
}

/// Where a run of chunks lies in its pack: (offset, length).
pub(crate) fn run_span(chunks: &[meta::ChunkRow], (a, b): (usize, usize)) -> (u64, u64) {
    let start = chunks[a].offset;
    (start, chunks[b].offset + chunks[b].stored_len as u64 - start)
}

/// Moves the live chunks of packs being emptied into new packs (gc and the
/// cleaner): one ranged read per run of adjacent live chunks, every blob
/// checked before it is copied (corruption is never propagated), new packs
/// uploaded as they fill. Blobs are position-independent, so they are
/// copied as stored.
/// A chunk a [`Mover`] copied.
pub(crate) struct Moved {
    pub(crate) id: u64,
    /// The pack it was copied from.
    pub(crate) from: u64,
    /// Index into `Mover::sealed` of the pack it was copied into.
    pub(crate) to: usize,
    /// Its offset there.
    pub(crate) offset: u64,
    pub(crate) stored_len: u32,
}

/// What [`Mover::commit`] did.
#[derive(Default)]
pub(crate) struct Committed {
    /// Dead chunk rows deleted with the packs.
    pub(crate) chunks_dropped: u64,
    /// Stored bytes of those chunks.
    pub(crate) dead_bytes_freed: u64,
    /// Packs kept whole because a chunk of theirs came back to life.
    pub(crate) kept: HashSet<u64>,
    /// The dead chunks whose rows went (ids are never reused): what this
    /// mount holds of them in memory goes too (`ChunkStore::forget_chunks`).
    pub(crate) freed_chunks: Vec<u64>,
}

pub(crate) struct Mover<'a> {
    vol: &'a Volume,
    /// Chunks that reached zero after this store-clock second are in
    /// their grace period (`Volume::collect_dead_before`).
    before: Option<i64>,
    builder: Option<PackBuilder>,
    pub(crate) moved: Vec<Moved>,
    /// Uploaded packs: (name, size, blobs).
    pub(crate) sealed: Vec<(String, u64, u64)>,
    /// Stored bytes copied.
    pub(crate) bytes: u64,
}

impl<'a> Mover<'a> {
    pub(crate) fn new(vol: &'a Volume, before: Option<i64>) -> Self {
        Mover { vol, before, builder: None, moved: Vec::new(), sealed: Vec::new(), bytes: 0 }
    }

    /// Copies the live chunks of pack `name`, whose rows (offset order) are
    /// `chunks`.
    pub(crate) fn copy_live(&mut self, name: &str, chunks: &[meta::ChunkRow]) -> Result<()> {
        let vol = self.vol;
        for run in live_runs(chunks) {
            let (start, len) = run_span(chunks, run);
            let data = vol.chunks.paid(Subsystem::Gc).get_range(name, start, len)?;
            for c in &chunks[run.0..=run.1] {
                let at = (c.offset - start) as usize;
                let blob = data.get(at..at + c.stored_len as usize).ok_or_else(|| Error::corrupt(format!("pack {name}: short read")))?;
                let e = BlobEntry { id: c.hash, offset: c.offset, stored_len: c.stored_len, raw_len: c.raw_len, flags: c.flags };
                pack::decode_blob(&vol.chunks.keys, &e, blob.to_vec(), pack::Verify::Full).map_err(|err| Error::corrupt(format!("pack {name}: chunk #{} is corrupt, not moving it: {err}", c.id)))?;
                let b = self.builder.get_or_insert_with(|| PackBuilder::new(&vol.vid));
                let ne = b.add(c.hash, blob, c.raw_len, c.flags);
                self.moved.push(Moved { id: c.id, from: c.pack, to: self.sealed.len(), offset: ne.offset, stored_len: c.stored_len });
                self.bytes += c.stored_len as u64;
                if b.len() as u64 >= vol.cfg.pack_target {
                    self.sealed.push(upload(vol, self.builder.take().expect("builder"))?);
                }
            }
        }
        Ok(())
    }

    /// Uploads the last, partly filled pack.
    pub(crate) fn finish(&mut self) -> Result<()> {
        if let Some(b) = self.builder.take().filter(|b| !b.is_empty()) {
            self.sealed.push(upload(self.vol, b)?);
        }
        let hold = self.vol.stall.before_move_commit.lock().take();
        if let Some(f) = hold {
            f();
        }
        Ok(())
    }

    /// In transaction `tx`: the new packs' rows (a moved chunk that died
    /// meanwhile is dead in its new pack), the moved chunks pointed at
    /// them, and the `emptied` packs' rows dropped with their dead chunks.
    ///
    /// A pack one of whose chunks was dead when it was planned but is
    /// referenced now (a writer found it by hash meanwhile, on this machine
    /// or another), or died again within the grace, is kept whole: its
    /// chunks stay where they are, their copies are dead bytes of the new
    /// packs, and the next round plans it again. The rest of the round
    /// still commits.
    pub(crate) fn commit(&self, tx: &dyn meta::MetaTx, emptied: impl IntoIterator<Item = u64>) -> Result<Committed> {
        let moved_ids: HashSet<u64> = self.moved.iter().map(|m| m.id).collect();
        let mut out = Committed::default();
        let mut gone = Vec::new();
        for p in emptied {
            let mut freed = 0;
            let mut revived = false;
            let mut ids = Vec::new();
            for c in tx.chunks_in_pack(p)? {
                if moved_ids.contains(&c.id) {
                    continue;
                }
                if c.refs > 0 || settling(&c, self.before) {
                    revived = true;
                    break;
                }
                freed += c.stored_len as u64;
                ids.push(c.id);
            }
            if revived {
                out.kept.insert(p);
            } else {
                out.dead_bytes_freed += freed;
                out.freed_chunks.extend(ids);
                gone.push(p);
            }
        }
        let mut dead_in: HashMap<usize, u64> = HashMap::new();
        for m in &self.moved {
            if out.kept.contains(&m.from) || tx.chunk_by_id(m.id)?.is_some_and(|c| c.refs == 0) {
                *dead_in.entry(m.to).or_default() += m.stored_len as u64;
            }
        }
        let mut ids = Vec::with_capacity(self.sealed.len());
        for (i, (name, size, blobs)) in self.sealed.iter().enumerate() {
            ids.push(tx.insert_pack(name, *size, *blobs, dead_in.get(&i).copied().unwrap_or(0))?);
        }
        for m in self.moved.iter().filter(|m| !out.kept.contains(&m.from)) {
            tx.relocate_chunk(m.id, m.from, ids[m.to], m.offset)?;
        }
        for p in gone {
            out.chunks_dropped += tx.delete_pack(p)?;
        }
        Ok(out)
    }

    /// Deletes the uploaded packs, which no metadata names (a round given
    /// up before its commit).
    pub(crate) fn discard(&self) {
        discard_packs(self.vol, Subsystem::Gc, self.sealed.iter().map(|(name, _, _)| name.as_str()));
    }
}

pub(crate) fn upload(vol: &Volume, b: PackBuilder) -> Result<(String, u64, u64)> {
    let (pack, entries) = b.finish(&vol.chunks.keys, &vol.vid);
    let name = pack::fresh_name();
    // Recorded as under way before the PUT, as a flush's pack is: a
    // cleaner that stalls past its maintenance lock (its connection
    // dropped) must not find its copies taken for orphans by the gc that
    // took over, and then commit rows naming them. Its commit drops the
    // record (`insert_pack`); a session gone uploads nothing.
    if let Some(s) = vol.meta.shared() {
        s.begin_upload(&name)?;
    }
    vol.chunks.paid(Subsystem::Gc).put(&name, pack.bytes())?;
    Ok((name, pack.bytes().len() as u64, entries.len() as u64))
}
