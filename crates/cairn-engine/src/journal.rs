//! The write-back journal: a redo log of file content changes.
//!
//! Every write, truncate and hole punch is appended here before it is
//! acknowledged; `fsync` makes it durable with one `fdatasync`. The data of
//! a write stays in the journal (and the page cache) until the flusher has
//! chunked and packed it and committed the new extents, so memory only holds
//! an interval map per file. After a crash, records newer than each inode's
//! committed `jseq` are replayed.
//!
//! The journal is sharded by inode so that writers to different files do
//! not serialise on one lock. Each shard is a sequence of segment files
//! `s{shard}-{segment:08}.jnl` of records:
//!
//! ```text
//! record = magic "CJR1" u32 | kind u8 | flags u8 | pad 2 | ino u64 | seq u64 | arg u64 | time i64 | len u32 | crc32 u32 | data
//!   kind 1 write:    arg = file offset, data = the bytes (len of them), or
//!                    sealed (flags bit 0): nonce || AES-256-GCM(bytes) || tag
//!   kind 2 truncate: arg = new size, len = 0
//!   kind 3 punch:    arg = offset, len = hole length, no data (zeros)
//! ```
//! `seq` is global and increasing. A record whose checksum fails with no
//! record that verifies after it is a torn tail (the last append, cut short
//! by a crash: never acknowledged) and ignored. One with an intact record
//! after it is damage: the journal refuses to open, naming the segment and
//! offset, and deletes nothing; salvaging replays every record that
//! verifies and keeps a copy of the segment.
//!
//! On an encrypted volume every write record is sealed with the journal key
//! (the header is its associated data), so the local disk never holds file
//! content in the clear. A sealed record is opened whole when any of its
//! bytes is read; a small cache keeps recently opened records.

use crate::crypto::{JournalCipher, NONCE_LEN, SEAL_OVERHEAD};
use crate::error::{Error, Result};
use crate::extent::JLoc;
use crate::types::{Ino, Timestamp};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const MAGIC: u32 = 0x3152_4A43; // "CJR1" little-endian
const HEADER: usize = 48;
const SEGMENT_MAX: u64 = 64 << 20;
/// Number of shards.
pub const SHARDS: usize = 8;

/// Kinds of journal records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Write,
    Truncate,
    Punch,
}

/// A record found during replay.
#[derive(Clone, Debug)]
pub struct Record {
    pub kind: RecordKind,
    pub ino: Ino,
    pub seq: u64,
    pub arg: u64,
    pub time: Timestamp,
    pub len: u32,
    /// Where the data starts (writes only).
    pub loc: JLoc,
}

struct Segment {
    file: Arc<File>,
    path: PathBuf,
    max_seq: u64,
    size: u64,
    /// Bytes known durable.
    synced: u64,
    /// Whether the directory entry is known durable (the journal directory
    /// was fsync'd after the segment was created).
    named: bool,
}

struct Shard {
    id: u16,
    segments: BTreeMap<u32, Segment>,
    /// The segment being appended to (always the last one).
    active: Option<u32>,
    next_segment: u32,
}

/// Flags bit: the record's data is sealed.
const FLAG_SEALED: u8 = 1;
/// Opened sealed records kept in memory (each at most one write's bytes).
const OPENED_CACHE: usize = 16;

/// The sharded journal of one volume.
pub struct Journal {
    dir: PathBuf,
    shards: Vec<Mutex<Shard>>,
    seq: AtomicU64,
    bytes: AtomicU64,
    /// Seals write records (encrypted volumes).
    cipher: Option<JournalCipher>,
    /// Plaintexts of recently opened sealed records, by (shard, segment,
    /// record start); segment numbers are never reused while open.
    opened: Mutex<OpenedRecords>,
    /// fsyncs of the journal directory so far.
    dir_fsyncs: AtomicU64,
    /// One per shard, held by the caller fsyncing that shard's segments:
    /// fsyncs that arrive meanwhile wait and then usually find their
    /// records durable (group commit), instead of flushing again.
    syncing: Vec<Mutex<()>>,
}

/// Opened sealed records by (shard, segment, record start): the record's
/// stored bytes, opened in place (plaintext from `NONCE_LEN` on).
type OpenedRecords = lru::LruCache<(u16, u32, u64), Arc<Vec<u8>>>;

fn segment_path(dir: &Path, shard: u16, seg: u32) -> PathBuf {
    dir.join(format!("s{shard}-{seg:08}.jnl"))
}

fn parse_name(name: &str) -> Option<(u16, u32)> {
    let rest = name.strip_prefix('s')?.strip_suffix(".jnl")?;
    let (a, b) = rest.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The segment files in a journal directory, in (shard, segment) order.
fn segments_in(dir: &Path) -> Result<Vec<(u16, u32, PathBuf)>> {
    let mut found = Vec::new();
    for ent in fs::read_dir(dir).map_err(|e| Error::io(format!("journal {}: {e}", dir.display())))? {
        let ent = ent?;
        let name = ent.file_name();
        if let Some((sh, seg)) = name.to_str().and_then(parse_name) {
            if (sh as usize) < SHARDS {
                found.push((sh, seg, ent.path()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// One line about a damaged segment, naming the file and the offsets.
fn describe_damage(path: &Path, scan: &Scan) -> String {
    let spans: Vec<String> = scan
        .damage
        .iter()
        .map(|d| match d.resume {
            Some(r) => format!("bytes {}..{}", d.offset, r),
            None => format!("from byte {} on (no intact record found within the search bound)", d.offset),
        })
        .collect();
    let after = match scan.records_after_damage() {
        0 => "what follows it could not be searched within bounds".to_string(),
        n => format!("{n} records after it verify"),
    };
    format!(
        "journal segment {} is damaged: the record at byte {} fails its checksum but {after} \
         (not a torn write from a crash: only the last record can be torn); damaged: {}",
        path.display(),
        scan.damage[0].offset,
        spans.join(", ")
    )
}

/// Copies a damaged segment into `journal-damaged/` beside the journal
/// directory (never overwriting an earlier copy), durably; returns the copy.
fn keep_evidence(dir: &Path, path: &Path) -> Result<PathBuf> {
    let aside = dir.parent().unwrap_or(dir).join("journal-damaged");
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&aside)
            .map_err(|e| Error::os(format_args!("creating {}", aside.display()), &e))?;
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("segment");
    let dst = (0u32..)
        .map(|n| if n == 0 { aside.join(name) } else { aside.join(format!("{name}.{n}")) })
        .find(|p| !p.exists())
        .expect("a free name");
    fs::copy(path, &dst).map_err(|e| Error::os(format_args!("copying {} to {}", path.display(), dst.display()), &e))?;
    File::open(&dst)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::os(format_args!("fsync {}", dst.display()), &e))?;
    crate::fsutil::fsync_dir(&aside)?;
    Ok(dst)
}

/// Checks every segment of a journal directory without opening the volume
/// (no key needed: checksums cover sealed records as stored). Returns one
/// line per damaged segment; a torn tail is not damage.
pub fn check_dir(dir: &Path) -> Result<Vec<String>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (sh, seg, path) in segments_in(dir)? {
        let file = File::open(&path).map_err(|e| Error::os(format_args!("opening {}", path.display()), &e))?;
        let scan = scan_segment(&file, Some(sh), seg)?;
        if !scan.damage.is_empty() {
            out.push(describe_damage(&path, &scan));
        }
    }
    Ok(out)
}

/// The tails every segment of a journal directory ends with (bytes past
/// the last record that verifies; see [`Tail`]), one line each, and
/// whether it is damage (`true`) or a torn write.
pub fn check_tails(dir: &Path) -> Result<Vec<(String, bool)>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (sh, seg, path) in segments_in(dir)? {
        let file = File::open(&path).map_err(|e| Error::os(format_args!("opening {}", path.display()), &e))?;
        if let Some(t) = scan_segment(&file, Some(sh), seg)?.tail {
            out.push((t.describe(&path), t.damaged.is_some()));
        }
    }
    Ok(out)
}

/// The file in a journal directory naming the journal: 16 hex digits.
pub const ID_FILE: &str = "id";

/// The id of the journal in `dir` (kept in `dir/id`), if it has one.
/// Journal positions are only comparable within one journal: a store
/// shared by several machines keeps its commit marks per journal id
/// (`docs/shared-volume.md` §11.1).
pub fn read_journal_id(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join(ID_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let t = text.trim();
            match u64::from_str_radix(t, 16) {
                Ok(id) if id != 0 && t.len() == 16 => Ok(Some(id)),
                _ => Err(Error::corrupt(format!(
                    "journal id file {} holds {t:?}, not 16 hex digits: the journal's commit marks cannot be found. \
                     If the directory holds no journal segments (s*.jnl), removing the file is safe",
                    path.display()
                ))),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::os(format_args!("reading {}", path.display()), &e)),
    }
}

/// A new journal id: random, never 0.
pub fn new_journal_id() -> u64 {
    loop {
        let v: u64 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

/// Keeps `id` as the id of the journal in `dir`, durably (0600).
pub fn save_journal_id(dir: &Path, id: u64) -> Result<()> {
    crate::fsutil::replace_private_file(dir, ID_FILE, format!("{id:016x}\n").as_bytes())
}

impl Journal {
    /// Opens the journal directory and reads back every intact record, in
    /// sequence order. Existing segments stay readable (their data backs the
    /// replayed writes); new records go to new segments. A damaged segment
    /// (a record that fails its checks with intact records after it) is an
    /// error naming it, and nothing is replayed or deleted; see
    /// [`Journal::open_with`] to salvage.
    pub fn open(dir: &Path, cipher: Option<JournalCipher>) -> Result<(Self, Vec<Record>)> {
        Self::open_with(dir, cipher, false)
    }

    /// As [`Journal::open`]; with `salvage`, a damaged segment is copied
    /// into `journal-damaged/` beside the journal directory (the evidence)
    /// and every record of it that verifies is read back, the damaged
    /// stretches skipped.
    pub fn open_with(dir: &Path, cipher: Option<JournalCipher>, salvage: bool) -> Result<(Self, Vec<Record>)> {
        crate::fsutil::create_private_dir_all(dir).map_err(|e| Error::io(format!("journal {}: {e}", dir.display())))?;
        let mut shards: Vec<Shard> = (0..SHARDS as u16)
            .map(|id| Shard { id, segments: BTreeMap::new(), active: None, next_segment: 0 })
            .collect();
        let mut records = Vec::new();
        let mut total = 0u64;
        let mut max_seq = 0u64;
        let mut damaged = Vec::new();
        for (sh, seg, path) in segments_in(dir)? {
            let file = File::open(&path).map_err(|e| Error::io(format!("journal {}: {e}", path.display())))?;
            let scan = scan_segment(&file, Some(sh), seg)?;
            if !scan.damage.is_empty() {
                if !salvage {
                    damaged.push(describe_damage(&path, &scan));
                    continue;
                }
                let kept = keep_evidence(dir, &path)?;
                tracing::warn!(
                    "{}; salvaging its {} records that verify (a copy of the segment is kept as {})",
                    describe_damage(&path, &scan),
                    scan.records.len(),
                    kept.display()
                );
            }
            if let Some(t) = &scan.tail {
                if t.damaged.is_some() {
                    let kept = keep_evidence(dir, &path).map(|p| format!("; a copy of the segment is kept as {}", p.display())).unwrap_or_else(|e| format!("; keeping a copy failed: {e}"));
                    tracing::error!("{}{kept}", t.describe(&path));
                } else {
                    tracing::warn!("{}", t.describe(&path));
                }
            }
            let recs = scan.records;
            let good_len = scan.end;
            let seg_max = recs.iter().map(|r| r.seq).max().unwrap_or(0);
            max_seq = max_seq.max(seg_max);
            total += good_len;
            records.extend(recs);
            let s = &mut shards[sh as usize];
            s.next_segment = s.next_segment.max(seg + 1);
            s.segments.insert(seg, Segment { file: Arc::new(file), path, max_seq: seg_max, size: good_len, synced: good_len, named: false });
        }
        if !damaged.is_empty() {
            return Err(Error::corrupt(format!(
                "{}. Nothing was replayed and nothing deleted. `cairn fsck --salvage-journal` replays every record that verifies \
                 (the damaged ones are lost; a copy of each damaged segment is kept in journal-damaged/ beside the journal); \
                 a read-only mount shows the volume without the journal's records",
                damaged.join("; ")
            )));
        }
        records.sort_by_key(|r| r.seq);
        let j = Journal {
            dir: dir.to_path_buf(),
            shards: shards.into_iter().map(Mutex::new).collect(),
            seq: AtomicU64::new(max_seq),
            bytes: AtomicU64::new(total),
            cipher,
            opened: Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(OPENED_CACHE).expect("non-zero"))),
            dir_fsyncs: AtomicU64::new(0),
            syncing: (0..SHARDS).map(|_| Mutex::new(())).collect(),
        };
        Ok((j, records))
    }

    /// Every intact record of the live segments, in sequence order: what
    /// [`Journal::open`] would read back now (the replay after a loss of
    /// metadata commits, `volume/resume.rs`). Each shard is read under its
    /// lock, so no append of it is half written meanwhile.
    pub fn live_records(&self) -> Result<Vec<Record>> {
        let mut records = Vec::new();
        for shm in &self.shards {
            let sh = shm.lock();
            for (&seg, s) in &sh.segments {
                let scan = scan_segment(&*s.file, Some(sh.id), seg)?;
                records.extend(scan.records);
            }
        }
        records.sort_by_key(|r| r.seq);
        Ok(records)
    }

    /// A journal that holds nothing and refuses appends (read-only volumes).
    pub fn disabled() -> Self {
        Journal {
            dir: PathBuf::new(),
            shards: Vec::new(),
            seq: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            cipher: None,
            opened: Mutex::new(lru::LruCache::new(std::num::NonZeroUsize::new(1).expect("non-zero"))),
            dir_fsyncs: AtomicU64::new(0),
            syncing: Vec::new(),
        }
    }

    /// Makes sure future sequence numbers are above `seq`.
    pub fn bump_seq(&self, seq: u64) {
        self.seq.fetch_max(seq, Ordering::SeqCst);
    }

    /// The last sequence number handed out.
    pub fn last_seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Whether no live segment holds a record. Read after `last_seq`, a
    /// true answer means no record at or below that seq is left (an
    /// append takes its seq and lands in a segment under its shard's lock).
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|sh| sh.lock().segments.values().all(|s| s.max_seq == 0))
    }

    /// Bytes held in live segments.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn shard_of(ino: Ino) -> usize {
        (ino as usize).wrapping_mul(0x9E37_79B9) % SHARDS
    }

    /// Appends a record; returns its seq and where its data lies. The caller
    /// holds the file's lock, so one file's records are in seq order.
    pub fn append(&self, kind: RecordKind, ino: Ino, arg: u64, len: u32, data: &[u8], time: Timestamp) -> Result<(u64, JLoc)> {
        let Some(shard) = self.shards.get(Self::shard_of(ino)) else {
            return Err(Error::new(crate::error::ErrorKind::ReadOnly, "volume is open read-only"));
        };
        let sealed = self.cipher.is_some() && kind == RecordKind::Write;
        let stored_len = if sealed { data.len() + SEAL_OVERHEAD } else { data.len() };
        let mut sh = shard.lock();
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let need = (HEADER + stored_len) as u64;
        let seg_no = match sh.active {
            Some(a) if sh.segments[&a].size + need <= SEGMENT_MAX || sh.segments[&a].size == 0 => a,
            _ => {
                let n = sh.next_segment;
                sh.next_segment += 1;
                let path = segment_path(&self.dir, sh.id, n);
                let f = OpenOptions::new().read(true).write(true).create_new(true).mode(crate::fsutil::PRIVATE_FILE).open(&path)
                    .map_err(|e| Error::os(format_args!("creating journal segment {}", path.display()), &e))?;
                sh.segments.insert(n, Segment { file: Arc::new(f), path, max_seq: 0, size: 0, synced: 0, named: false });
                sh.active = Some(n);
                n
            }
        };
        let shard_id = sh.id;
        let seg = sh.segments.get_mut(&seg_no).expect("active segment");
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = match kind {
            RecordKind::Write => 1,
            RecordKind::Truncate => 2,
            RecordKind::Punch => 3,
        };
        h[5] = if sealed { FLAG_SEALED } else { 0 };
        h[8..16].copy_from_slice(&ino.to_le_bytes());
        h[16..24].copy_from_slice(&seq.to_le_bytes());
        h[24..32].copy_from_slice(&arg.to_le_bytes());
        h[32..40].copy_from_slice(&time.0.to_le_bytes());
        h[40..44].copy_from_slice(&len.to_le_bytes());
        let sealed_data;
        let stored: &[u8] = match &self.cipher {
            Some(c) if sealed => {
                // Sealed under the shard's lock: the header, with its seq,
                // is the associated data.
                sealed_data = c.seal(&h[..44], data);
                &sealed_data
            }
            _ => data,
        };
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h[..44]);
        crc.update(stored);
        h[44..48].copy_from_slice(&crc.finalize().to_le_bytes());
        let at = seg.size;
        let written = seg.file.write_all_at(&h, at).and_then(|()| if stored.is_empty() { Ok(()) } else { seg.file.write_all_at(stored, at + HEADER as u64) });
        if let Err(e) = written {
            // A failed append (a full disk) may leave torn bytes past the
            // end. Cut them off (shrinking needs no space) so that a later,
            // shorter record never sits in front of bytes that could read
            // back as a record; if even that fails, use a new segment.
            let err = Error::os(format_args!("journal write {}", seg.path.display()), &e);
            if seg.file.set_len(at).is_err() {
                sh.active = None;
            }
            return Err(err);
        }
        seg.size += need;
        seg.max_seq = seq;
        self.bytes.fetch_add(need, Ordering::Relaxed);
        let start = at + HEADER as u64;
        Ok((seq, JLoc { shard: shard_id, segment: seg_no, offset: start, record: start, sealed_len: if sealed { len } else { 0 } }))
    }

    /// Reads the bytes at `loc` (as many as `dst` holds, all within one
    /// record) from `file`, the segment `loc` names (see [`Journal::file`]).
    /// A sealed record is opened and checked whole: an altered one is an
    /// error, never wrong bytes.
    pub fn read(&self, file: &File, loc: &JLoc, dst: &mut [u8]) -> Result<()> {
        if loc.sealed_len == 0 {
            return file.read_exact_at(dst, loc.offset).map_err(|e| read_error(loc, &e));
        }
        dst.copy_from_slice(self.opened(file, loc, dst.len())?.as_ref());
        Ok(())
    }

    /// The `len` plaintext bytes at `loc`, in a sealed record: the record
    /// is opened whole (or found opened) and checked.
    fn opened(&self, file: &File, loc: &JLoc, len: usize) -> Result<OpenedSlice> {
        let key = (loc.shard, loc.segment, loc.record);
        let cached = self.opened.lock().get(&key).cloned();
        let plain = match cached {
            Some(p) => p,
            None => {
                let Some(c) = &self.cipher else {
                    return Err(Error::config("the journal holds sealed records but the volume was opened without its key"));
                };
                let mut h = [0u8; HEADER];
                let start = loc.record.checked_sub(HEADER as u64).ok_or_else(|| Error::corrupt("journal location before its record header"))?;
                file.read_exact_at(&mut h, start).map_err(|e| read_error(loc, &e))?;
                let mut stored = Vec::new();
                pread_append(file, loc, loc.record, loc.sealed_len as usize + SEAL_OVERHEAD, &mut stored)?;
                if c.open_in_place(&h[..44], &mut stored) != Some(loc.sealed_len as usize) {
                    return Err(Error::corrupt(format!("journal segment s{}-{:08}: the record at {start} fails authentication", loc.shard, loc.segment)));
                }
                let p = Arc::new(stored);
                self.opened.lock().put(key, p.clone());
                p
            }
        };
        let from = NONCE_LEN + (loc.offset - loc.record) as usize;
        if plain.get(from..from + len).is_none() {
            return Err(Error::corrupt("journal location past the end of its record"));
        }
        Ok(OpenedSlice { plain, from, len })
    }

    /// Appends the `len` bytes at `loc` to `buf`. The flush reads every
    /// journaled byte back once, so nothing is zero-filled first: unsealed
    /// records are read straight into the buffer's spare capacity, sealed
    /// ones into a fresh buffer, opened there and copied once.
    pub fn read_append(&self, file: &File, loc: &JLoc, len: usize, buf: &mut Vec<u8>) -> Result<()> {
        if loc.sealed_len != 0 {
            buf.extend_from_slice(self.opened(file, loc, len)?.as_ref());
            return Ok(());
        }
        pread_append(file, loc, loc.offset, len, buf)
    }

    /// The open segment file holding `loc` (kept open even once retired, so
    /// a reader that planned with it can still read).
    pub fn file(&self, loc: &JLoc) -> Result<Arc<File>> {
        let sh = self.shards.get(loc.shard as usize).ok_or_else(|| Error::io("journal is disabled"))?.lock();
        sh.segments
            .get(&loc.segment)
            .map(|s| s.file.clone())
            .ok_or_else(|| Error::io(format!("journal segment s{}-{:08} is gone", loc.shard, loc.segment)))
    }

    /// Makes every record of `ino`'s shard durable.
    pub fn sync_for(&self, ino: Ino) -> Result<()> {
        if self.shards.is_empty() {
            return Ok(());
        }
        self.sync_shard(Self::shard_of(ino))
    }

    fn sync_shard(&self, i: usize) -> Result<()> {
        let _leader = self.syncing[i].lock();
        let files: Vec<(u32, Arc<File>, PathBuf, u64, bool)> = {
            let sh = self.shards[i].lock();
            sh.segments
                .iter()
                .filter(|(_, s)| s.synced < s.size)
                .map(|(n, s)| (*n, s.file.clone(), s.path.clone(), s.size, s.named))
                .collect()
        };
        if files.is_empty() {
            return Ok(());
        }
        for (_, f, p, _, _) in &files {
            f.sync_data().map_err(|e| Error::os(format_args!("fsync {}", p.display()), &e))?;
        }
        // New segment files must be findable after a crash too; once their
        // names are durable, later fsyncs skip the directory (a device
        // flush of its own: dbench's fsyncs paid two or three).
        let new_names = files.iter().any(|f| !f.4);
        if new_names {
            crate::fsutil::fsync_dir(&self.dir)?;
            self.dir_fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        let mut sh = self.shards[i].lock();
        for (n, _, _, size, _) in files {
            if let Some(s) = sh.segments.get_mut(&n) {
                // Only what was written before the fsync began is known durable.
                s.synced = s.synced.max(size);
                s.named |= new_names;
            }
        }
        Ok(())
    }

    /// How many times the journal directory has been fsync'd.
    pub fn dir_fsyncs(&self) -> u64 {
        self.dir_fsyncs.load(Ordering::Relaxed)
    }

    /// Makes every record durable.
    pub fn sync_all(&self) -> Result<()> {
        (0..self.shards.len()).try_for_each(|i| self.sync_shard(i))
    }

    /// Deletes segments whose records are all older than `min_live_seq`
    /// (every record below it is committed to the metadata).
    ///
    /// `make_durable` runs once, before the first deletion and only if there
    /// is something to delete: it must make the metadata commits that hold
    /// those records durable (rule 1 of "Order of writes" in
    /// `docs/format.md`: a segment may hold the only durable copy of
    /// acknowledged data until then). Segments picked here stop taking
    /// appends at once, so nothing newer can land in them meanwhile. If it
    /// fails, nothing is deleted. Returns the number of segments deleted.
    pub fn retire(&self, min_live_seq: u64, make_durable: impl FnOnce() -> Result<()>) -> Result<usize> {
        let mut picked: Vec<(usize, u32)> = Vec::new();
        for (i, shm) in self.shards.iter().enumerate() {
            let mut sh = shm.lock();
            let dead: Vec<u32> = sh.segments.iter().filter(|(_, s)| s.max_seq < min_live_seq).map(|(n, _)| *n).collect();
            for n in dead {
                if sh.active == Some(n) {
                    sh.active = None;
                }
                picked.push((i, n));
            }
        }
        if picked.is_empty() {
            return Ok(0);
        }
        make_durable()?;
        let mut deleted = 0;
        for (i, n) in picked {
            let mut sh = self.shards[i].lock();
            if let Some(s) = sh.segments.remove(&n) {
                self.bytes.fetch_sub(s.size, Ordering::Relaxed);
                fs::remove_file(&s.path).map_err(|e| Error::io(format!("removing {}: {e}", s.path.display())))?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

/// A range of an opened sealed record.
struct OpenedSlice {
    plain: Arc<Vec<u8>>,
    from: usize,
    len: usize,
}

impl AsRef<[u8]> for OpenedSlice {
    fn as_ref(&self) -> &[u8] {
        &self.plain[self.from..self.from + self.len]
    }
}

fn read_error(loc: &JLoc, e: &std::io::Error) -> Error {
    Error::os(format_args!("reading journal segment s{}-{:08}", loc.shard, loc.segment), e)
}

/// Appends the `len` bytes at `pos` of `loc`'s segment `file` to `buf`,
/// read straight into its spare capacity (no zero-fill first).
fn pread_append(file: &File, loc: &JLoc, pos: u64, len: usize, buf: &mut Vec<u8>) -> Result<()> {
    use std::os::fd::AsRawFd;
    buf.reserve(len);
    let mut done = 0usize;
    while done < len {
        let dst = buf.spare_capacity_mut();
        // SAFETY: pread writes at most `len - done` bytes into the buffer's
        // spare capacity (reserved above), which starts at the pointer
        // given; only the bytes it reports written are then counted as
        // initialized (set_len).
        let n = unsafe { libc::pread(file.as_raw_fd(), dst.as_mut_ptr().cast(), len - done, (pos + done as u64) as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(read_error(loc, &e));
        }
        if n == 0 {
            return Err(Error::corrupt(format!("journal segment s{}-{:08} ends before the record it holds", loc.shard, loc.segment)));
        }
        // SAFETY: the n bytes after the old length were just written.
        unsafe { buf.set_len(buf.len() + n as usize) };
        done += n as usize;
    }
    Ok(())
}

/// Positioned reads from a file or a byte slice.
trait ReadAt {
    fn len(&self) -> std::io::Result<u64>;
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        self.read_exact_at(buf, pos)
    }
}

impl ReadAt for [u8] {
    fn len(&self) -> std::io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        let p = pos as usize;
        let src = self.get(p..p + buf.len()).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// Bytes the search for an intact record past a damaged one may checksum in
/// candidates that pass the cheap header checks. Bounds the time a crafted
/// segment can cost; a search that runs out counts as damage.
const RESYNC_BUDGET: u64 = 256 << 20;
/// Bytes read at a time while checksumming or searching.
const SCAN_BUF: usize = 64 << 10;

/// A damaged stretch of a segment: a record that fails its checks with at
/// least one record that verifies after it. A crash can only tear the last
/// append (appends to a segment are serial, a failed one is cut off again,
/// and records go after the last one), so this is damage to acknowledged
/// data, not a torn write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// Where the record that fails its checks starts.
    pub offset: u64,
    /// Where the next record that verifies starts; `None` if the search
    /// for one ran out of its budget (a crafted segment), so that later
    /// records cannot be ruled out.
    pub resume: Option<u64>,
}

/// What a scan of one segment found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Every record that verifies, in file order, those past damage too.
    pub records: Vec<Record>,
    /// Damaged stretches in file order; empty for an intact segment, torn
    /// tail or not.
    pub damage: Vec<Damage>,
    /// Where the last record that verifies ends (bytes past it are a torn
    /// tail, ignored).
    pub end: u64,
    /// The segment's length.
    pub len: u64,
    /// What the bytes past `end` are, when there are any.
    pub tail: Option<Tail>,
}

/// Bytes after a segment's last record that verifies, with no record that
/// verifies after them: dropped on replay (the torn-tail rule), but not
/// silently (issue 50).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tail {
    /// Where they start (the start of the record that fails).
    pub offset: u64,
    /// How many bytes there are.
    pub len: u64,
    /// `Some(why)` when they hold a whole record (its length as its header
    /// says) that fails its checks: damage to a record written in full,
    /// which may have been acknowledged (fsync'd), not a torn write.
    /// `None`: an append cut short (shorter than its header says, or no
    /// readable header, or zeros), as a crash leaves it: never acknowledged.
    pub damaged: Option<String>,
}

impl Tail {
    /// One line about it, naming the segment.
    pub fn describe(&self, path: &Path) -> String {
        match &self.damaged {
            Some(why) => format!(
                "journal segment {}: the last record, at byte {} ({} bytes), is whole but {why}: damage, not a torn write; \
                 its change (possibly acknowledged by an fsync) was dropped on replay",
                path.display(),
                self.offset,
                self.len
            ),
            None => format!(
                "journal segment {}: {} bytes at byte {} after the last intact record are a torn write (an append cut short \
                 by a crash, never acknowledged) and were ignored",
                path.display(),
                self.len,
                self.offset
            ),
        }
    }
}

/// Classifies the bytes `[pos, size)` of a segment past its last record
/// that verifies (see [`Tail`]).
fn classify_tail<R: ReadAt + ?Sized>(f: &R, pos: u64, size: u64) -> std::io::Result<Tail> {
    let len = size - pos;
    let torn = Tail { offset: pos, len, damaged: None };
    if len < HEADER as u64 {
        return Ok(torn);
    }
    let mut h = [0u8; HEADER];
    f.read_at(&mut h, pos)?;
    if h.iter().all(|&b| b == 0) {
        return Ok(torn);
    }
    let magic_ok = h[0..4] == MAGIC.to_le_bytes();
    // Read the header as if its magic were right: a whole record whose
    // only fault is the magic, or its checksum, is damage.
    let mut fixed = h;
    fixed[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    let kind_ok = matches!(fixed[4], 1..=3) && fixed[5] & !FLAG_SEALED == 0 && fixed[6..8] == [0, 0];
    if !kind_ok {
        return Ok(torn);
    }
    let sealed = fixed[5] & FLAG_SEALED != 0;
    let rlen = u32::from_le_bytes(fixed[40..44].try_into().expect("4")) as u64;
    let dlen = match fixed[4] {
        1 if sealed => rlen + SEAL_OVERHEAD as u64,
        1 => rlen,
        _ => 0,
    };
    if HEADER as u64 + dlen > len {
        return Ok(torn);
    }
    let mut buf = Vec::new();
    let verifies_fixed = checksum_ok(f, pos, &fixed, dlen, &mut buf)?;
    // A crash leaves the end of an append unwritten (zeros), never its
    // bytes changed: a record whose magic alone is wrong, or whose last
    // byte got out and whose checksum still fails, was written whole.
    let mut last = [0u8; 1];
    f.read_at(&mut last, pos + HEADER as u64 + dlen - 1)?;
    let why = match (magic_ok, verifies_fixed) {
        (false, true) => "its magic is altered (the rest of it verifies)",
        (true, false) if last[0] != 0 => "its checksum fails",
        _ => return Ok(torn),
    };
    Ok(Tail { offset: pos, len, damaged: Some(why.to_string()) })
}

impl Scan {
    /// Records that verify after the first damage.
    pub fn records_after_damage(&self) -> usize {
        match self.damage.first() {
            Some(d) => self.records.iter().filter(|r| r.loc.record > d.offset).count(),
            None => 0,
        }
    }
}

/// Parses a segment held in memory (for fuzzing and tools): every record
/// that verifies, any damage, and the intact length.
pub fn scan_bytes(data: &[u8]) -> Result<Scan> {
    scan_segment(data, None, 0)
}

/// One unsealed record as it is stored (for tests, fuzzing and tools; the
/// journal itself writes records in [`Journal::append`]). `data` is a
/// write's bytes (and `len` is its length) or empty.
pub fn encode_record(kind: RecordKind, ino: Ino, seq: u64, arg: u64, len: u32, data: &[u8], time: Timestamp) -> Vec<u8> {
    let mut r = vec![0u8; HEADER];
    r[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    r[4] = match kind {
        RecordKind::Write => 1,
        RecordKind::Truncate => 2,
        RecordKind::Punch => 3,
    };
    r[8..16].copy_from_slice(&ino.to_le_bytes());
    r[16..24].copy_from_slice(&seq.to_le_bytes());
    r[24..32].copy_from_slice(&arg.to_le_bytes());
    r[32..40].copy_from_slice(&time.0.to_le_bytes());
    r[40..44].copy_from_slice(&len.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&r[..44]);
    crc.update(data);
    r[44..48].copy_from_slice(&crc.finalize().to_le_bytes());
    r.extend_from_slice(data);
    r
}

/// The record header at `pos` if it is well formed and its data lies within
/// the segment: (kind, sealed, len, stored data length).
fn header_at<R: ReadAt + ?Sized>(f: &R, pos: u64, size: u64, h: &mut [u8; HEADER]) -> std::io::Result<Option<(RecordKind, bool, u32, u64)>> {
    if pos.checked_add(HEADER as u64).is_none_or(|e| e > size) {
        return Ok(None);
    }
    f.read_at(h, pos)?;
    if u32::from_le_bytes(h[0..4].try_into().expect("4")) != MAGIC {
        return Ok(None);
    }
    let kind = match h[4] {
        1 => RecordKind::Write,
        2 => RecordKind::Truncate,
        3 => RecordKind::Punch,
        _ => return Ok(None),
    };
    let flags = h[5];
    if flags & !FLAG_SEALED != 0 {
        return Ok(None);
    }
    let sealed = flags & FLAG_SEALED != 0;
    let len = u32::from_le_bytes(h[40..44].try_into().expect("4"));
    let dlen = match kind {
        RecordKind::Write if sealed => len as u64 + SEAL_OVERHEAD as u64,
        RecordKind::Write => len as u64,
        _ => 0,
    };
    if pos + HEADER as u64 + dlen > size {
        return Ok(None);
    }
    Ok(Some((kind, sealed, len, dlen)))
}

/// Whether the checksum in `h` covers it and the `dlen` data bytes after
/// it (read in pieces: memory stays bounded whatever the header claims).
fn checksum_ok<R: ReadAt + ?Sized>(f: &R, pos: u64, h: &[u8; HEADER], dlen: u64, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[..44]);
    let mut at = pos + HEADER as u64;
    let end = at + dlen;
    while at < end {
        let n = ((end - at) as usize).min(SCAN_BUF);
        buf.resize(n, 0);
        f.read_at(&mut buf[..n], at)?;
        crc.update(&buf[..n]);
        at += n as u64;
    }
    Ok(crc.finalize() == u32::from_le_bytes(h[44..48].try_into().expect("4")))
}

/// The next position from `from` on where a record verifies: a header in
/// form, with its padding zero, a sequence number above `min_seq` (numbers
/// rise within a segment), an inode of `shard` when known, and a checksum
/// that matches. `Ok(None)`: there is none; `Err(())`: the budget ran out.
fn resync<R: ReadAt + ?Sized>(f: &R, from: u64, size: u64, min_seq: u64, shard: Option<u16>, budget: &mut u64, buf: &mut Vec<u8>) -> std::io::Result<std::result::Result<Option<u64>, ()>> {
    let mut win = vec![0u8; SCAN_BUF];
    let mut h = [0u8; HEADER];
    let mut start = from;
    while start.saturating_add(HEADER as u64) <= size {
        let n = ((size - start) as usize).min(SCAN_BUF);
        f.read_at(&mut win[..n], start)?;
        for i in 0..n.saturating_sub(3) {
            if win[i..i + 4] != MAGIC.to_le_bytes() {
                continue;
            }
            let q = start + i as u64;
            let Some((_, _, _, dlen)) = header_at(f, q, size, &mut h)? else { continue };
            let seq = u64::from_le_bytes(h[16..24].try_into().expect("8"));
            let ino = u64::from_le_bytes(h[8..16].try_into().expect("8"));
            if h[6..8] != [0, 0] || seq <= min_seq || shard.is_some_and(|s| Journal::shard_of(ino) != s as usize) {
                continue;
            }
            let cost = HEADER as u64 + dlen;
            if cost > *budget {
                return Ok(Err(()));
            }
            *budget -= cost;
            if checksum_ok(f, q, &h, dlen, buf)? {
                return Ok(Ok(Some(q)));
            }
        }
        if n < SCAN_BUF {
            break;
        }
        // Overlap by three bytes: a magic may straddle the windows.
        start += (n - 3) as u64;
    }
    Ok(Ok(None))
}

/// Reads a segment: every record that verifies, and where it is damaged.
/// A record that fails its checks with nothing intact after it is a torn
/// tail (the last append, cut short by a crash: never acknowledged); one
/// with an intact record after it is damage. `shard`, when known, is the
/// segment's shard (records of other shards' inodes do not belong in it).
fn scan_segment<R: ReadAt + ?Sized>(f: &R, shard: Option<u16>, seg: u32) -> Result<Scan> {
    let size = f.len()?;
    let mut scan = Scan { len: size, ..Default::default() };
    let mut pos = 0u64;
    let mut h = [0u8; HEADER];
    let mut buf = Vec::new();
    // Records that verify are checksummed once each (they do not overlap);
    // the budget pays for every other checksum: one torn tail, and the
    // search past damage.
    let mut budget = RESYNC_BUDGET.saturating_add(size);
    let mut last_seq = 0u64;
    while pos < size {
        let parsed = match header_at(f, pos, size, &mut h)? {
            Some((kind, sealed, len, dlen)) => {
                if checksum_ok(f, pos, &h, dlen, &mut buf)? {
                    Some((kind, sealed, len, dlen))
                } else {
                    budget = budget.saturating_sub(HEADER as u64 + dlen);
                    None
                }
            }
            None => None,
        };
        let Some((kind, sealed, len, dlen)) = parsed else {
            match resync(f, pos + 1, size, last_seq, shard, &mut budget, &mut buf)? {
                Ok(None) => break,
                Ok(Some(q)) => {
                    scan.damage.push(Damage { offset: pos, resume: Some(q) });
                    pos = q;
                    continue;
                }
                Err(()) => {
                    scan.damage.push(Damage { offset: pos, resume: None });
                    break;
                }
            }
        };
        let seq = u64::from_le_bytes(h[16..24].try_into().expect("8"));
        last_seq = last_seq.max(seq);
        scan.records.push(Record {
            kind,
            ino: u64::from_le_bytes(h[8..16].try_into().expect("8")),
            seq,
            arg: u64::from_le_bytes(h[24..32].try_into().expect("8")),
            time: Timestamp(i64::from_le_bytes(h[32..40].try_into().expect("8"))),
            len,
            loc: JLoc {
                shard: shard.unwrap_or(0),
                segment: seg,
                offset: pos + HEADER as u64,
                record: pos + HEADER as u64,
                sealed_len: if sealed && kind == RecordKind::Write { len } else { 0 },
            },
        });
        pos += HEADER as u64 + dlen;
        scan.end = pos;
    }
    if scan.end < size && scan.damage.last().is_none_or(|d| d.resume.is_some_and(|r| r <= scan.end)) {
        scan.tail = Some(classify_tail(f, scan.end, size)?);
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopen_and_torn_tail_is_ignored() {
        let d = tempfile::tempdir().unwrap();
        let (j, recs) = Journal::open(d.path(), None).unwrap();
        assert!(recs.is_empty());
        let (s1, l1) = j.append(RecordKind::Write, 5, 100, 5, b"hello", Timestamp(1)).unwrap();
        let (s2, _) = j.append(RecordKind::Truncate, 5, 3, 0, b"", Timestamp(2)).unwrap();
        j.sync_all().unwrap();
        let path = segment_path(d.path(), l1.shard, l1.segment);
        drop(j);
        // A torn record at the tail.
        let f = OpenOptions::new().append(true).open(&path).unwrap();
        use std::io::Write;
        (&f).write_all(&[0x43, 0x4A, 0x52, 0x31, 1, 0, 0]).unwrap();
        let (j2, recs) = Journal::open(d.path(), None).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!((recs[0].seq, recs[0].kind, recs[0].arg), (s1, RecordKind::Write, 100));
        assert_eq!((recs[1].seq, recs[1].kind, recs[1].arg), (s2, RecordKind::Truncate, 3));
        let mut buf = [0u8; 5];
        j2.file(&recs[0].loc).unwrap().read_exact_at(&mut buf, recs[0].loc.offset).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(j2.last_seq() >= s2);
        // Nothing is deleted when the metadata cannot be made durable.
        let e = j2.retire(s2 + 1, || Err(Error::io("fsync failed"))).unwrap_err();
        assert!(e.to_string().contains("fsync failed"), "{e}");
        assert!(path.exists());
        let mut calls = 0;
        assert_eq!(j2.retire(s2 + 1, || { calls += 1; Ok(()) }).unwrap(), 1);
        assert_eq!((calls, j2.bytes(), path.exists()), (1, 0, false));
        // With nothing to delete, the metadata is not synced at all.
        assert_eq!(j2.retire(s2 + 1, || panic!("no sync needed")).unwrap(), 0);
    }

    #[test]
    fn the_directory_is_fsynced_only_after_a_new_segment() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(d.path(), None).unwrap();
        let (s1, _) = j.append(RecordKind::Write, 5, 0, 1, b"a", Timestamp(1)).unwrap();
        j.sync_for(5).unwrap();
        assert_eq!(j.dir_fsyncs(), 1, "a new segment's name must be made durable");
        j.append(RecordKind::Write, 5, 1, 1, b"b", Timestamp(2)).unwrap();
        j.sync_for(5).unwrap();
        assert_eq!(j.dir_fsyncs(), 1, "a second fsync into the same segment flushed the directory again");
        // Retiring empties the shard; the next record starts a new segment.
        let (s2, _) = j.append(RecordKind::Write, 5, 2, 1, b"c", Timestamp(3)).unwrap();
        assert!(s2 > s1);
        j.sync_for(5).unwrap();
        j.retire(s2 + 1, || Ok(())).unwrap();
        j.append(RecordKind::Write, 5, 3, 1, b"d", Timestamp(4)).unwrap();
        j.sync_for(5).unwrap();
        assert_eq!(j.dir_fsyncs(), 2, "the new segment's name was not made durable");
        drop(j);
        let (_, recs) = Journal::open(d.path(), None).unwrap();
        assert_eq!(recs.len(), 1);
    }

    /// Five fsync'd records of one file in one segment; returns the
    /// segment's path and where each record starts (and the end).
    fn five_records(dir: &Path) -> (PathBuf, Vec<u64>) {
        let (j, _) = Journal::open(dir, None).unwrap();
        let mut starts = Vec::new();
        let mut path = PathBuf::new();
        for i in 0..5u64 {
            let data = vec![i as u8 + 1; 1000 + i as usize];
            let (_, loc) = j.append(RecordKind::Write, 9, i * 2000, data.len() as u32, &data, Timestamp(i as i64)).unwrap();
            j.sync_for(9).unwrap();
            starts.push(loc.record - HEADER as u64);
            path = segment_path(dir, loc.shard, loc.segment);
        }
        starts.push(fs::metadata(&path).unwrap().len());
        (path, starts)
    }

    fn flip(path: &Path, at: u64, mask: u8) {
        let mut b = fs::read(path).unwrap();
        b[at as usize] ^= mask;
        fs::write(path, &b).unwrap();
    }

    #[test]
    fn a_damaged_middle_record_is_an_error_not_a_torn_tail() {
        // A byte of the data, of the checksum, of the magic, and of the
        // length (which then claims more than the segment holds).
        for (what, at, mask) in [("data", HEADER as u64 + 10, 0x01u8), ("checksum", 45, 0x80), ("magic", 0, 0xFF), ("length", 43, 0x40)] {
            let t = tempfile::tempdir().unwrap();
            let jd = t.path().join("journal");
            let d = &jd;
            let (path, starts) = five_records(d);
            let before = fs::read(&path).unwrap();
            flip(&path, starts[2] + at, mask);
            let e = Journal::open(d, None).err().unwrap_or_else(|| panic!("{what}: damage replayed silently"));
            let msg = e.to_string();
            assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt, "{what}: {msg}");
            assert!(msg.contains(&path.display().to_string()) && msg.contains(&format!("record at byte {}", starts[2])), "{what}: {msg}");
            assert!(msg.contains("2 records after it verify"), "{what}: {msg}");
            // Nothing deleted, nothing changed; a second open says the same.
            assert_eq!(fs::read(&path).unwrap().len(), before.len(), "{what}");
            assert!(Journal::open(d, None).is_err());
            assert_eq!(check_dir(d).unwrap().len(), 1, "{what}");
            // Salvage: the intact records, a copy kept aside.
            let (_, recs) = Journal::open_with(d, None, true).unwrap();
            assert_eq!(recs.iter().map(|r| r.arg).collect::<Vec<_>>(), vec![0, 2000, 6000, 8000], "{what}");
            let kept = d.parent().unwrap().join("journal-damaged").join(path.file_name().unwrap());
            assert_eq!(fs::read(&kept).unwrap(), fs::read(&path).unwrap(), "{what}: the evidence");
        }
    }

    #[test]
    fn a_cut_short_last_record_is_a_torn_tail() {
        let d = tempfile::tempdir().unwrap();
        let (path, starts) = five_records(d.path());
        let b = fs::read(&path).unwrap();
        // Cut anywhere inside the last record, or followed by zeros (space
        // the file system allocated but never wrote), or by the start of a
        // record whose header alone got out.
        for cut in [starts[4] + 1, starts[4] + 30, starts[4] + HEADER as u64, starts[5] - 1] {
            for tail in [Vec::new(), vec![0u8; 8192], b[starts[3] as usize..starts[3] as usize + HEADER].to_vec()] {
                let mut t = b[..cut as usize].to_vec();
                t.extend_from_slice(&tail);
                let scan = scan_bytes(&t).unwrap();
                assert!(scan.damage.is_empty(), "cut at {cut}: {:?}", scan.damage);
                assert_eq!((scan.records.len(), scan.end), (4, starts[4]));
            }
        }
        // A segment of zeros past its records is no damage either.
        let mut t = b.clone();
        t.extend_from_slice(&[0u8; 100_000]);
        let scan = scan_bytes(&t).unwrap();
        assert!(scan.damage.is_empty());
        assert_eq!(scan.records.len(), 5);
    }

    #[test]
    fn a_damaged_last_record_is_reported_apart_from_a_torn_one() {
        let d = tempfile::tempdir().unwrap();
        let (path, starts) = five_records(d.path());
        let b = fs::read(&path).unwrap();
        // Its magic damaged (the issue's case), or a byte of its data
        // flipped: whole records that fail, so damage, at their offset.
        for (what, at, mask) in [("magic", starts[4], 0xFFu8), ("data", starts[4] + HEADER as u64 + 1, 0x10)] {
            let mut t = b.clone();
            t[at as usize] ^= mask;
            let scan = scan_bytes(&t).unwrap();
            assert!(scan.damage.is_empty(), "{what}: {:?}", scan.damage);
            assert_eq!(scan.records.len(), 4, "{what}");
            let tail = scan.tail.unwrap_or_else(|| panic!("{what}: no tail reported"));
            assert_eq!((tail.offset, tail.len), (starts[4], starts[5] - starts[4]), "{what}");
            let why = tail.damaged.clone().unwrap_or_else(|| panic!("{what}: called a torn write"));
            assert!(why.contains(if what == "magic" { "magic" } else { "checksum" }), "{what}: {why}");
            assert!(tail.describe(&path).contains(&format!("at byte {}", starts[4])), "{}", tail.describe(&path));
        }
        // Cut short, or its end never written (zeros): a torn write.
        for t in [b[..starts[4] as usize + 30].to_vec(), { let mut t = b[..starts[5] as usize - 20].to_vec(); t.extend_from_slice(&[0; 20]); t }] {
            let tail = scan_bytes(&t).unwrap().tail.expect("a tail");
            assert_eq!(tail.offset, starts[4]);
            assert_eq!(tail.damaged, None, "{tail:?}");
        }
        // An intact segment has none.
        assert_eq!(scan_bytes(&b).unwrap().tail, None);
    }

    #[test]
    fn a_crafted_segment_costs_bounded_work() {
        // Record headers at every 48 bytes that claim the rest of the
        // segment and fail their checksums: without the budget the search
        // would checksum O(n^2) bytes.
        let mut b = Vec::new();
        b.extend_from_slice(&encode_record(RecordKind::Write, 9, 1, 0, 3, b"abc", Timestamp(0)));
        let n = 4 << 20;
        while b.len() < n {
            let mut r = encode_record(RecordKind::Write, 9, 2, 0, 0, &[], Timestamp(0));
            r[40..44].copy_from_slice(&(n.saturating_sub(b.len() + HEADER) as u32).to_le_bytes());
            b.extend_from_slice(&r);
        }
        // The budget's outcome, not a time: only a search that ran out of
        // it leaves `resume: None` (one that finds nothing ends the scan
        // with no damage).
        let scan = scan_bytes(&b).unwrap();
        assert_eq!(scan.records.len(), 1);
        assert_eq!(scan.damage, vec![Damage { offset: 51, resume: None }], "a search that ran out counts as damage");
    }

    /// Sealed records read back in parts (as the flush's windows do) give
    /// the bytes written; a record altered on disk is refused, not served.
    #[test]
    fn sealed_records_read_back_in_parts_and_altered_ones_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let keys = crate::crypto::Keys::derive(&[7u8; 32], true);
        let (j, _) = Journal::open(d.path(), keys.journal_cipher()).unwrap();
        let data: Vec<Vec<u8>> = (0..20u8).map(|i| (0..3000u32).map(|k| (k as u8).wrapping_mul(i + 3)).collect()).collect();
        let locs: Vec<JLoc> = data.iter().map(|x| j.append(RecordKind::Write, 9, 0, x.len() as u32, x, Timestamp(1)).unwrap().1).collect();
        for (l, x) in locs.iter().zip(&data) {
            let f = j.file(l).unwrap();
            let mut buf = vec![9u8; 2];
            j.read_append(&f, &JLoc { offset: l.offset + 100, ..*l }, 2000, &mut buf).unwrap();
            j.read_append(&f, &JLoc { offset: l.offset + 2100, ..*l }, 900, &mut buf).unwrap();
            assert_eq!(buf[..2], [9, 9]);
            assert_eq!(buf[2..], x[100..]);
        }
        // Altered on disk, and no longer among the opened records.
        let l = locs[2];
        let f = OpenOptions::new().write(true).open(segment_path(d.path(), l.shard, l.segment)).unwrap();
        f.write_all_at(&[0x55], l.record + 40).unwrap();
        let mut buf = Vec::new();
        let e = j.read_append(&j.file(&l).unwrap(), &l, 10, &mut buf).unwrap_err();
        assert!(e.to_string().contains("fails authentication"), "{e}");
    }
}
