//! Cairn's metadata store: the [`MetaStore`] trait every store implements
//! (its contract is `docs/metadata-store.md`), the row types it persists,
//! its [`conformance`] suite, and the two stores that pass it: the
//! embedded SQLite store ([`sqlite`], a volume directory's own file) and
//! the PostgreSQL store ([`postgres`], a schema per volume in a database
//! many machines share).
//!
//! [`open`] and [`create`] choose the store by where the metadata lives
//! ([`Location`]: a file or a server's URL), so the engine names no store:
//! it holds an `Arc<dyn MetaStore>`, and everything it asks of the
//! metadata is a typed operation of [`MetaRead`] (queries) or [`MetaTx`]
//! (changes, inside one transaction). No connection and no SQL leave this
//! crate. [`shipped`] reads the form in which a cloud volume's metadata
//! travels to its bucket.

pub mod conformance;
mod error;
mod location;
pub mod locks;
pub mod postgres;
pub mod schema;
pub mod sqlite;
pub mod types;

pub use error::{Error, ErrorKind, Result};
pub use locks::{LockKind, LockOutcome, LockOwner, LockRequest, LockRow, LockStyle, LOCK_EOF};
pub use types::{Attr, FileKind, Ino, Timestamp, ROOT_INO};
pub use location::{create, open, Location, OpenOptions};
/// The group commit window of the embedded store, a writer's default.
pub use sqlite::GROUP_WINDOW;

/// The form a cloud volume's metadata travels in (docs/format.md
/// "Metadata versions"): a whole database file of the embedded store (a
/// base) and the patchsets that follow it (deltas), which a store makes
/// through [`ShipChanges`]. These read and apply them to a file without
/// opening it as a store.
pub mod shipped {
    pub use crate::sqlite::{apply_patchsets, pack_names_in};
}

use std::collections::HashMap;

/// Inode flag: the inode belongs to a snapshot (or is the `.snapshots`
/// directory) and refuses every change with EROFS.
pub const FLAG_READ_ONLY: i64 = 1;

/// `info` key: until when stored bytes were added to the bill (seconds
/// since the epoch).
pub const BILL_STORAGE_AT_KEY: &str = "bill_storage_at";

/// Where a stored chunk lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRow {
    pub id: u64,
    pub hash: [u8; 32],
    pub pack: u64,
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub flags: u8,
    pub refs: i64,
    /// When `refs` last reached 0, on the store's clock (seconds, as
    /// [`MetaStore::clock_secs`]): a store many machines share dates it so
    /// that a collector leaves a chunk alone for a grace period
    /// (docs/shared-volume.md §7); None while referenced, and always in a
    /// store one process writes. Ignored by [`MetaTx::insert_chunk`].
    pub zero_since: Option<i64>,
}

/// A pack row.
#[derive(Clone, Debug)]
pub struct PackRow {
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub blobs: u64,
    pub dead_bytes: u64,
}

/// Where a pack lives (`packs.tier`, docs/tiers.md §2, docs/format.md
/// "Metadata"): 0 is the volume's home (its directory, its bucket's
/// default class or its tape); the others are storage classes by their
/// stable numbers [`TIER_STANDARD`] .. [`TIER_TAPE`].
pub type TierCode = u8;
/// `packs.tier`: the volume's home, whatever its class (every pack before
/// schema 3 / 8, and every pack the flusher writes).
pub const TIER_HOME: TierCode = 0;
pub const TIER_STANDARD: TierCode = 1;
pub const TIER_STANDARD_IA: TierCode = 2;
pub const TIER_GLACIER_IR: TierCode = 3;
pub const TIER_GLACIER: TierCode = 4;
pub const TIER_DEEP_ARCHIVE: TierCode = 5;
pub const TIER_TAPE: TierCode = 6;

/// `inodes.tier_pin` (docs/tiers.md §5): the low four bits are the pin
/// ([`PIN_AUTO`], [`PIN_HOT`], [`PIN_WARM`], [`PIN_COLD`]); [`PIN_INHERITED`]
/// is set on a pin a create copied from the parent directory (not set on
/// this inode by `cairn tier set`).
pub const PIN_AUTO: u8 = 0;
pub const PIN_HOT: u8 = 1;
pub const PIN_WARM: u8 = 2;
pub const PIN_COLD: u8 = 3;
/// The pin's bits in `inodes.tier_pin`.
pub const PIN_MASK: u8 = 15;
/// The pin came from the parent at create.
pub const PIN_INHERITED: u8 = 16;

/// A pack's tier and since when it is there (ns since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackTier {
    pub tier: TierCode,
    pub since: i64,
}

/// A restore of a pack in flight, or a restored copy still readable
/// (`restores`, docs/tiers.md §6): one row per pack, so that every reader
/// on every machine waits on one restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreRow {
    pub pack: u64,
    /// The pack's tier when the restore was asked ([`TierCode`]).
    pub class: TierCode,
    /// When it was asked (ns since the epoch).
    pub requested_ns: i64,
    /// When the copy should be readable (ns), the class's restore time.
    pub ready_estimate_ns: i64,
    /// When the restored copy expires (ns): None until it is known
    /// (ready).
    pub expires_ns: Option<i64>,
}

/// A full inode row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRow {
    pub attr: Attr,
    pub data_bytes: u64,
    pub parent: Option<Ino>,
    pub target: Option<Vec<u8>>,
    /// The journal position up to which this inode's records are committed,
    /// in the journal of the store's writer: the inode's own column in a
    /// store with one journal per volume (SQLite); this store's journal's
    /// mark for the inode where several machines' journals share the
    /// volume (PostgreSQL: `JournalMarks::set_journal`; 0 without a mark or
    /// without a journal set). See `docs/metadata-store.md` "Journal marks".
    pub jseq: u64,
    /// `FLAG_*` bits.
    pub flags: i64,
    /// The file's content version: raised by every `update_content` of it
    /// (a flush's or an edit's commit) in a store that keeps it
    /// ([`MetaStore::shared`]: one that many machines share); always 0
    /// elsewhere. A writer that loaded a file's extent
    /// map at version `v` commits against that map only while the row
    /// still says `v` (docs/shared-volume.md §3 "Two writers of one
    /// file").
    pub cver: u64,
}

impl InodeRow {
    pub fn read_only(&self) -> bool {
        self.flags & FLAG_READ_ONLY != 0
    }
}

/// What the cleaner needs of a pack with dead bytes: dead byte-seconds
/// accrued until `mark` (ns), dead bytes since then.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadPack {
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub blobs: u64,
    pub dead_bytes: u64,
    pub dead_acc: f64,
    pub mark: i64,
}

/// One row of the bill.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BillRow {
    /// Days since the epoch (UTC).
    pub day: i64,
    /// Who: `write`, `read_miss`, `prefetch`, `gc`, `metadata`, `other`, or
    /// `storage`.
    pub subsystem: String,
    /// A request kind (`GET`, `HEAD`, `PUT`, `POST`, `LIST`, `DELETE`), or
    /// for `storage`, `live` or `dead`.
    pub item: String,
    pub requests: u64,
    /// Payload bytes; for `storage`, byte-seconds.
    pub bytes: u64,
}

/// Owner and mode of the root directory at creation.
#[derive(Clone, Copy, Debug)]
pub struct Caller0 {
    pub uid: u32,
    pub gid: u32,
    pub perm: u32,
}

/// A stored extent page linked from a file: its key in the file, its id,
/// and its encoded bytes (opaque to the store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPage {
    pub key: i64,
    pub id: u64,
    pub data: Vec<u8>,
}

/// A stored page as `inspect` sees it: with its link count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageLink {
    pub key: i64,
    pub id: u64,
    pub refs: i64,
    pub data: Vec<u8>,
}

/// A page a file links at `key`: a stored one (`id`), or a new one
/// (`id` 0) with its bytes and the chunk ids its extents reference (one
/// entry per reference).
#[derive(Clone, Debug, Default)]
pub struct PageUpsert {
    pub key: i64,
    pub id: u64,
    pub data: Vec<u8>,
    pub chunks: Vec<u64>,
}

/// The page edits of one file, to persist in one call.
#[derive(Clone, Debug, Default)]
pub struct PageEdits {
    /// Stored pages this file starts linking (a clone's shared pages).
    pub gained: Vec<u64>,
    /// Pages to link at their keys; new pages are stored first.
    pub upserts: Vec<PageUpsert>,
    /// Keys to unlink.
    pub deletes: Vec<i64>,
    /// Stored pages that lose one link, with the chunk ids their extents
    /// reference: freed, releasing those references, when the last goes.
    pub dropped: Vec<(u64, Vec<u64>)>,
}

/// Reads the chunk references out of a page's bytes (the store keeps pages
/// opaque; it needs them when it frees a page nobody handed it).
pub trait PageCodec: Send + Sync {
    /// Appends the chunk id of every chunk extent of page `data` to `out`.
    fn chunk_ids(&self, data: &[u8], out: &mut Vec<u64>) -> Result<()>;
}

/// Counts of inodes by kind, and sizes (for `cairn stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeTotals {
    /// (kind, count, sum of sizes, sum of allocated bytes)
    pub by_kind: Vec<(FileKind, u64, u64, u64)>,
}

/// Chunk and pack totals (for `cairn stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkTotals {
    pub live_chunks: u64,
    pub dead_chunks: u64,
    /// Raw bytes of live chunks.
    pub unique_bytes: u64,
    /// Stored bytes of live chunks.
    pub live_stored_bytes: u64,
    pub packs: u64,
    pub pack_bytes: u64,
    pub dead_bytes: u64,
}

/// Who opens a session (`Sessions::open_session`): shown by `cairn status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionInfo {
    pub host: String,
    pub pid: u32,
    /// Where the volume is mounted (or what opened it: fsck, gc).
    pub mount: String,
    /// The Cairn version of the session's process.
    pub version: String,
}

/// A session as the store keeps it. Times are the store's clock (the
/// database's for PostgreSQL), `expired` is computed on that clock too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRow {
    pub id: u64,
    pub host: String,
    pub pid: u32,
    pub mount: String,
    pub version: String,
    pub started: Timestamp,
    pub expires: Timestamp,
    pub expired: bool,
}

/// What a change row says changed (`docs/shared-volume.md` §6).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Changed {
    /// The inode's attributes, content, xattrs or pages (or it was deleted).
    Inode(Ino),
    /// The entry `name` in directory `parent` appeared or went.
    Entry { parent: Ino, name: Vec<u8> },
}

/// One row of the change log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Taken when the row is inserted, so not in commit order: a smaller
    /// seq may commit after a larger one (gaps too: rolled-back or retried
    /// transactions). [`ChangeCursor`] copes with both.
    pub seq: u64,
    pub what: Changed,
    /// The session of the store that committed it (None: no session open).
    pub session: Option<u64>,
}

/// A reader's position in the change log ([`ChangeLog::read_changes`]):
/// the highest seq read, and the *holes* below it, seqs not seen yet.
///
/// A `seq` is taken when a transaction inserts its rows, not when it
/// commits, and writers do not serialize their commits: a row can become
/// visible after a larger seq was already read (its transaction was still
/// committing). Each hole is a seq of such a transaction, or of one that
/// rolled back or was retried (then a gap for good). Every read asks for
/// the holes again and delivers the rows that appeared; a hole is
/// forgotten once it has been open longer than [`ChangeCursor::hole_bound`]
/// (the store's bound on a transaction's life after it took its seq).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeCursor {
    /// The highest seq read (or the start).
    pub after: u64,
    /// seq -> when this reader first found it missing.
    pub holes: std::collections::BTreeMap<u64, std::time::Instant>,
    /// How long a hole is asked for (0: the store has no holes).
    pub hole_bound: std::time::Duration,
    /// [`ChangeLog::changes_trimmed_through`] as the last `read_changes`
    /// that returned rows saw it (PostgreSQL: in the same statement, so
    /// the same snapshot as the rows; a reader needs no second query).
    pub trimmed: u64,
    /// The store's server history the cursor belongs to (PostgreSQL:
    /// bumped when the store finds the server crashed and recovered or
    /// failed over, whose change log may have lost or will reuse seqs).
    /// A `read_changes` that finds it changed moves the cursor to the
    /// new server's newest row and takes the new value: the reader then
    /// drops everything it cached, as after a trim that overtook it.
    pub history: u64,
}

impl ChangeCursor {
    /// A cursor after `seq`, with no holes.
    pub fn at(seq: u64) -> Self {
        ChangeCursor { after: seq, ..Default::default() }
    }

    /// The holes, ascending.
    pub fn hole_seqs(&self) -> Vec<u64> {
        self.holes.keys().copied().collect()
    }
}

/// Held while this process runs the volume's maintenance (cleanup of dead
/// sessions, GC); dropping it releases the lock.
pub trait MaintenanceGuard: Send {
    /// Whether the lock is still held (false for PostgreSQL if the
    /// connection holding it died: the server released it; stop and try
    /// `try_maintenance` again).
    fn still_held(&mut self) -> bool;
}

/// Notices of other machines' commits (`ChangeLog::subscribe`).
pub trait ChangeFeed: Send {
    /// Waits up to `timeout` for a notice; true if one (or more) arrived
    /// since the last call, or if the feed reconnected (notices sent while
    /// it was away are lost: read the log again), false on a quiet timeout.
    /// An error means the feed could not reconnect; call again later.
    fn wait(&mut self, timeout: std::time::Duration) -> Result<bool>;
}

/// The queries of a metadata store. Every method sees the state of the
/// enclosing `read` or `write` (see `docs/metadata-store.md`).
pub trait MetaRead {
    /// One inode (directories report size 4096, 8 blocks).
    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>>;
    /// The entry `name` in `parent`: (ino, kind).
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>>;
    /// A path step as one query: `parent`'s row (None: no such inode) and,
    /// if `parent` has an entry `name` whose inode exists, that inode's
    /// row. PostgreSQL answers in one statement; the default asks three.
    fn lookup_inode(&self, parent: Ino, name: &[u8]) -> Result<(Option<InodeRow>, Option<InodeRow>)> {
        let Some(p) = self.get_inode(parent)? else { return Ok((None, None)) };
        let child = match self.lookup(parent, name)? {
            Some((ino, _)) => self.get_inode(ino)?,
            None => None,
        };
        Ok((Some(p), child))
    }
    /// Entries of a directory, sorted by name.
    fn list_dir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, FileKind)>>;
    fn dir_is_empty(&self, dir: Ino) -> Result<bool>;
    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Xattr names of an inode, sorted.
    fn list_xattrs(&self, ino: Ino) -> Result<Vec<Vec<u8>>>;
    /// The pages a file links, by key; Corrupt if a link names a missing page.
    fn load_pages(&self, ino: Ino) -> Result<Vec<StoredPage>>;
    /// The pages a file links with their link counts, in no order.
    fn page_links(&self, ino: Ino) -> Result<Vec<PageLink>>;
    /// The bytes of a stored page.
    fn page_data(&self, id: u64) -> Result<Option<Vec<u8>>>;
    /// A value of the `info` key-value table.
    fn get_info(&self, key: &str) -> Result<Option<i64>>;
    fn chunk_by_id(&self, id: u64) -> Result<Option<ChunkRow>>;
    fn chunk_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ChunkRow>>;
    /// Chunks of a pack, by offset.
    fn chunks_in_pack(&self, pack: u64) -> Result<Vec<ChunkRow>>;
    /// Every chunk, by pack and offset.
    fn all_chunks(&self) -> Result<Vec<ChunkRow>>;
    /// The highest chunk id in use (0 if none).
    fn max_chunk_id(&self) -> Result<u64>;
    /// A pack's name; Corrupt if it is missing.
    fn pack_name(&self, id: u64) -> Result<String>;
    /// Whether a pack of this name is in the metadata.
    fn pack_exists(&self, name: &str) -> Result<bool>;
    /// Every pack, by id.
    fn all_packs(&self) -> Result<Vec<PackRow>>;
    /// Every pack holding dead bytes, by id.
    fn dead_packs(&self) -> Result<Vec<DeadPack>>;
    /// Bytes of every pack, and the dead ones among them.
    fn pack_bytes(&self) -> Result<(u64, u64)>;
    /// How many packs there are, and how many of them are smaller than
    /// `small` bytes (the cleaner's look, docs/frugal.md §8).
    fn pack_counts(&self, small: u64) -> Result<(u64, u64)> {
        let all = self.all_packs()?;
        Ok((all.len() as u64, all.iter().filter(|p| p.size < small).count() as u64))
    }
    /// The bill's rows from day `since` on (all for None); none when the
    /// store keeps no bill.
    fn bill_rows(&self, since: Option<i64>) -> Result<Vec<BillRow>>;
    /// Every inode, by number.
    fn all_inodes(&self) -> Result<Vec<InodeRow>>;
    /// Inodes with no names left that no session has open (in a store that
    /// keeps open files: one that offers [`MetaStore::shared`]): the ones
    /// nobody can reach any more, safe to free.
    fn orphan_inodes(&self) -> Result<Vec<Ino>>;
    /// Whether a session other than `except` has `ino` open (a row of the
    /// open-file registry). Always false in a store that keeps none.
    fn open_elsewhere(&self, ino: Ino, except: u64) -> Result<bool>;
    /// Every dentry: (parent, name, ino, kind code).
    fn all_dentries(&self) -> Result<Vec<(Ino, Vec<u8>, Ino, i64)>>;
    /// Every stored page: (id, refs, data), by id.
    fn all_pages(&self) -> Result<Vec<(u64, i64, Vec<u8>)>>;
    /// Every page link: (ino, key, page id), by ino and key.
    fn all_page_links(&self) -> Result<Vec<(Ino, i64, u64)>>;
    fn count_inodes(&self) -> Result<u64>;
    /// The highest journal position recorded on an inode: of this store's
    /// journal only where marks are kept per journal (0 without a journal
    /// set).
    fn max_jseq(&self) -> Result<u64>;
    fn inode_totals(&self) -> Result<InodeTotals>;
    fn chunk_totals(&self) -> Result<ChunkTotals>;
    /// Where pack `id` lives and since when; None if there is no such pack.
    fn pack_tier(&self, id: u64) -> Result<Option<PackTier>>;
    /// The inode's `tier_pin` (pin bits and [`PIN_INHERITED`]); None if
    /// there is no such inode.
    fn tier_pin(&self, ino: Ino) -> Result<Option<u8>>;
    /// Pack `pack`'s restore row, if any.
    fn get_restore(&self, pack: u64) -> Result<Option<RestoreRow>>;
    /// Every restore row, by pack.
    fn list_restores(&self) -> Result<Vec<RestoreRow>>;
}

/// The changes of a metadata store, inside one transaction (`write`).
/// What [`MetaTx::create_node`] makes.
#[derive(Clone, Copy, Debug)]
pub struct NewNode<'a> {
    /// The inode (its number from `alloc_ino`).
    pub attr: &'a Attr,
    pub parent: Ino,
    pub name: &'a [u8],
    /// A symlink's target.
    pub target: Option<&'a [u8]>,
    /// The journal position at its creation (see `insert_inode`).
    pub jseq: u64,
    /// The parent's new mtime and ctime.
    pub now: Timestamp,
    /// (session, generation): register the new file as open.
    pub open: Option<(u64, u64)>,
}

pub trait MetaTx: MetaRead {
    /// Locks the rows of `inos` (those that exist) until the transaction
    /// ends, before it reads them (see [`MetaStore::write_locking`]); in
    /// ascending order. A store whose write transactions exclude each
    /// other whole needs nothing.
    fn lock_inodes(&self, inos: &[Ino]) -> Result<()> {
        let _ = inos;
        Ok(())
    }
    /// [`MetaTx::lock_inodes`] of one inode, then its row as it is once
    /// locked (one query where the store can).
    fn lock_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        self.lock_inodes(&[ino])?;
        self.get_inode(ino)
    }
    /// Removes `name` from `parent` if it still names `ino`, and then
    /// touches `parent` (`touch_dir` with `nlink_delta`); false, changing
    /// nothing, if the name no longer names `ino`. One statement where the
    /// store can.
    fn unlink_entry(&self, parent: Ino, name: &[u8], ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<bool> {
        if !self.delete_dentry(parent, name, ino)? {
            return Ok(false);
        }
        self.touch_dir(parent, now, nlink_delta)?;
        Ok(true)
    }
    /// Hands out a new inode number, never handed out before (also across
    /// rolled-back transactions and reopens).
    fn alloc_ino(&self) -> Result<Ino>;
    /// A new inode numbered `a.ino` (from `alloc_ino`, or the root). `jseq`:
    /// the journal position at its creation (a store with marks per
    /// journal records no mark: the number is new, so no journal holds a
    /// record of it from before).
    fn insert_inode(&self, a: &Attr, parent: Option<Ino>, target: Option<&[u8]>, jseq: u64) -> Result<()> {
        self.insert_inode_full(a, 0, parent, target, jseq, 0)
    }
    /// A new inode and its first name, as a create, mknod, mkdir or
    /// symlink makes them: `insert_inode`, `insert_dentry` (Exists if the
    /// name is taken), `touch_dir` of the parent (a directory adds a link
    /// to it), and with `open` = (session, generation) the new file's
    /// `mark_open` (SessionLost if the session is gone). The new inode
    /// takes the parent's tier pin, marked [`PIN_INHERITED`] (docs/tiers.md
    /// §5). A store may do it all in one statement.
    fn create_node(&self, n: &NewNode) -> Result<()> {
        let dir = n.attr.kind == FileKind::Dir;
        self.insert_inode(n.attr, dir.then_some(n.parent), n.target, n.jseq)?;
        let pin = self.tier_pin(n.parent)?.unwrap_or(0) & PIN_MASK;
        if pin != PIN_AUTO {
            self.set_tier_pin(n.attr.ino, pin | PIN_INHERITED)?;
        }
        self.insert_dentry(n.parent, n.name, n.attr.ino, n.attr.kind)?;
        self.touch_dir(n.parent, n.now, dir as i64)?;
        if let Some((session, gen)) = n.open {
            if !self.mark_open(session, n.attr.ino, gen)? {
                return Err(Error::corrupt(format!("inode {} vanished in the transaction that made it", n.attr.ino)));
            }
        }
        Ok(())
    }
    /// A new inode with its allocation and flags given (clones, snapshots).
    fn insert_inode_full(&self, a: &Attr, data_bytes: u64, parent: Option<Ino>, target: Option<&[u8]>, jseq: u64, flags: i64) -> Result<()>;
    /// Writes back perm, uid, gid, nlink, atime, mtime, ctime.
    fn update_attr(&self, a: &Attr) -> Result<()>;
    /// Records a flushed file's size, allocation and journal position
    /// (which only grows): the position is this store's journal's mark
    /// where marks are kept per journal, changed in the same transaction;
    /// other journals' marks stay as they are. Raises the inode's content
    /// version by exactly 1 where the store keeps it (`InodeRow::cver`).
    fn update_content(&self, ino: Ino, size: u64, data_bytes: u64, mtime: Timestamp, ctime: Timestamp, jseq: u64) -> Result<()>;
    fn set_nlink(&self, ino: Ino, nlink: u32, ctime: Timestamp) -> Result<()>;
    /// Sets the link count alone (fsck-style repairs, tree copies).
    fn fix_nlink(&self, ino: Ino, nlink: u32) -> Result<()>;
    fn set_parent(&self, ino: Ino, parent: Ino) -> Result<()>;
    fn set_btime(&self, ino: Ino, btime: Timestamp) -> Result<()>;
    /// Sets a directory's mtime and ctime to `now` and adds `nlink_delta`.
    fn touch_dir(&self, ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<()>;
    fn set_flags(&self, ino: Ino, flags: i64) -> Result<()>;
    /// A new entry; fails (Exists) if `name` is taken in `parent`.
    fn insert_dentry(&self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Result<()>;
    /// Removes `name` from `parent` only if it still names `expect`; true if
    /// it did (and was removed).
    fn delete_dentry(&self, parent: Ino, name: &[u8], expect: Ino) -> Result<bool>;
    /// Removes an inode row with its xattrs, page links and every journal's
    /// mark for it (its pages must have been released first:
    /// `release_pages`).
    fn delete_inode(&self, ino: Ino) -> Result<()>;
    fn set_xattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()>;
    /// True if the xattr existed.
    fn remove_xattr(&self, ino: Ino, name: &[u8]) -> Result<bool>;
    /// Copies every xattr of `src` to `dst`.
    fn copy_xattrs(&self, src: Ino, dst: Ino) -> Result<()>;
    /// Persists the page edits of one file; records the chunk reference
    /// changes (applied when the transaction's closure returns). Returns
    /// the ids of the new pages, by key.
    fn save_pages(&self, ino: Ino, edits: &PageEdits) -> Result<Vec<(i64, u64)>>;
    /// Unlinks every page of `ino`, freeing those no other file links and
    /// releasing their chunk references.
    fn release_pages(&self, ino: Ino) -> Result<()>;
    /// Links every page of `src` into `dst` as well (which has none).
    fn share_pages(&self, src: Ino, dst: Ino) -> Result<()>;
    fn set_info(&self, key: &str, value: i64) -> Result<()>;
    /// A new chunk row (with its id given and `refs` usually 0: its first
    /// reference comes with the pages that use it).
    fn insert_chunk(&self, ch: &ChunkRow) -> Result<()>;
    /// Moves a chunk from pack `from` to pack `to` at `offset` (repacking,
    /// or a flush absorbing its held pack). [`ErrorKind::Raced`] if the
    /// chunk is no longer in `from`, or gone: another cleaner moved or
    /// freed it since the caller read it, and applying this move would
    /// point the row at a copy the other side may already have deleted.
    fn relocate_chunk(&self, id: u64, from: u64, to: u64, offset: u64) -> Result<()>;
    /// A new pack; returns its id. `dead_bytes`: bytes of its blobs no page
    /// references yet.
    /// The pack is in the home tier ([`TIER_HOME`]) since now
    /// (`tier_since`, ns, equal to `created`).
    fn insert_pack(&self, name: &str, size: u64, blobs: u64, dead_bytes: u64) -> Result<u64>;
    /// Records that pack `pack` now lives in `tier`, since `since` (ns);
    /// false if there is no such pack.
    fn set_pack_tier(&self, pack: u64, tier: TierCode, since: i64) -> Result<bool>;
    /// Sets the inode's `tier_pin` (pin bits, and [`PIN_INHERITED`] as
    /// given); false if there is no such inode. A create copies its
    /// parent directory's pin (marked inherited) in the statement that
    /// makes the inode ([`MetaTx::create_node`]).
    fn set_tier_pin(&self, ino: Ino, pin: u8) -> Result<bool>;
    /// Records a restore of `r.pack`, unless the pack has one: true if
    /// this row was inserted, false if another was there (kept as it
    /// was: the restore already asked is the one to wait on).
    fn insert_restore(&self, r: &RestoreRow) -> Result<bool>;
    /// Deletes pack `pack`'s restore row; true if there was one.
    fn delete_restore(&self, pack: u64) -> Result<bool>;
    /// Deletes a pack with its unreferenced chunks (Corrupt if live chunks
    /// remain); returns the chunks deleted.
    fn delete_pack(&self, pack: u64) -> Result<u64>;
    /// Adds to a row of the bill.
    fn add_bill(&self, r: &BillRow) -> Result<()>;
    /// Makes the store keep a bill; true if it did not before.
    fn ensure_bill_table(&self) -> Result<bool>;
    /// Adds dead-byte accrual to a store from before it; true if it was missing.
    fn ensure_dead_accrual(&self) -> Result<bool>;
    /// Adds reference-count changes to the transaction's (applied with the
    /// others when the closure returns). Only for repairs and tests: page
    /// operations count their references themselves.
    fn add_chunk_refs(&self, deltas: &HashMap<u64, i64>) -> Result<()>;
    /// Records that `session` has `ino` open, under generation `gen`
    /// (replacing the generation of a row it had): while the row lives, no
    /// other session frees the inode. False, recording nothing, if the
    /// inode is gone (its last name went and it was freed first);
    /// SessionLost if the session is. A store that keeps no open files
    /// only answers whether the inode exists.
    fn mark_open(&self, session: u64, ino: Ino, gen: u64) -> Result<bool>;
    /// Deletes `session`'s rows of these `(ino, gen)` pairs; a row marked
    /// again under another generation since stays (a close that lost a
    /// race with a new open of the same file). `gen` 0: any generation.
    fn mark_closed(&self, session: u64, rows: &[(Ino, u64)]) -> Result<()>;
}

/// SQLite-only: committed changes as session patchsets and whole-database
/// snapshots, which a cloud volume ships to its bucket.
pub trait ShipChanges {
    /// Starts recording every committed change.
    fn capture_changes(&self) -> Result<()>;
    /// Commits the open group, then returns a patchset of every row changed
    /// since the last call (None when nothing changed), and records afresh.
    fn take_changes(&self) -> Result<Option<Vec<u8>>>;
    /// Whether changes were recorded since the last `take_changes`.
    fn has_changes(&self) -> bool;
    /// The whole database as of the last commit, as bytes; restarts capture.
    fn snapshot(&self) -> Result<Vec<u8>>;
}

/// A metadata store: the core every store implements (reads, writes,
/// barriers; see `docs/metadata-store.md` for the contract), and the
/// accessors to what only some stores offer: [`ShipChanges`]
/// ([`MetaStore::shipping`]) and [`SharedVolume`] ([`MetaStore::shared`]).
pub trait MetaStore: Send + Sync {
    /// Runs `f` on one consistent state including every change whose
    /// `write` returned. May run `f` again on a retryable failure.
    fn read(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()>;
    /// [`MetaStore::read`] for a closure that runs one query: the store may
    /// run it without a transaction of its own (PostgreSQL: one round trip
    /// instead of three). A second query in `f` fails (internal error).
    fn read_one(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()> {
        self.read(f)
    }
    /// [`MetaStore::read`] for many queries (a hint: the store may take one
    /// read transaction for them).
    fn read_many(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()> {
        self.read(f)
    }
    /// Runs `f` as one transaction: all of it or none. An error of `f` is
    /// returned as it was after the rollback. May run `f` again on a
    /// retryable failure, so `f` must have no effect but its return.
    fn write(&self, f: &mut dyn FnMut(&dyn MetaTx) -> Result<()>) -> Result<()>;
    /// [`MetaStore::write`] for a namespace operation that names up front
    /// the inodes whose rows (and directory entries) it changes: `inos`
    /// (the directories it adds names to or removes names from), the
    /// inodes that the entries `entries` (parent, name) name when it starts
    /// (what it unlinks, removes, renames or renames over), and with
    /// `rename_lock` the volume-wide lock of renames between directories.
    /// A store of many writers locks all of those rows at once, in one
    /// ascending order, before `f` runs, so no two operations wait for
    /// each other in a cycle. `f` locks any more rows it comes to change
    /// with [`MetaTx::lock_inodes`] before reading them (an entry that
    /// changed meanwhile). Such a store may then run it without
    /// serializable isolation: the locks serialize it against every other
    /// writer of those rows, so two creates in one directory queue instead
    /// of one failing and running again (docs/shared-volume.md §4).
    /// Elsewhere the same as `write`.
    fn write_locking(&self, inos: &[Ino], entries: &[(Ino, &[u8])], rename_lock: bool, f: &mut dyn FnMut(&dyn MetaTx) -> Result<()>) -> Result<()> {
        let _ = (inos, entries, rename_lock);
        self.write(f)
    }
    /// Hands out a chunk id for a chunk about to be packed, outside any
    /// transaction (its row is inserted later, by the transaction that
    /// commits its pack). Never one a committed chunk row has, nor one
    /// handed out before by this open store; an id handed out but never
    /// committed may come again after a reopen (nothing kept it).
    fn alloc_chunk_id(&self) -> Result<u64>;
    /// Commits the open group of changes now (not durable yet).
    fn commit(&self) -> Result<()>;
    /// Makes every change whose `write` returned before the call durable.
    fn sync(&self) -> Result<()>;
    /// Whether every returned change is known durable.
    fn is_durable(&self) -> bool;
    /// What a `kill -9` leaves (crash tests): uncommitted changes are lost
    /// and the store refuses every later change.
    fn abandon(&self);
    /// Whether a `sync` found changes that may be lost (the server's
    /// history changed before they were durable: a crash or a failover of
    /// PostgreSQL): every later change and sync then fails until
    /// [`MetaStore::resume_after_loss`]. Never, where that cannot happen.
    fn is_lost(&self) -> bool {
        false
    }
    /// After [`MetaStore::is_lost`]: the caller has what it needs to
    /// redo the changes that may be lost (the engine: its write-back
    /// journal, replayed as a new mount would). The store connects to the
    /// history the server has now, forgets the unproven changes of the
    /// old one, and accepts changes and syncs again.
    fn resume_after_loss(&self) -> Result<()> {
        Ok(())
    }
    /// Whether this open upgraded the store's schema (tables or columns
    /// added): a store whose changes ship as row patchsets must ship a
    /// whole base next, as they hold rows, not schema.
    fn schema_upgraded(&self) -> bool {
        false
    }
    /// Folds logs back on a clean shutdown; a no-op where nothing to fold.
    fn checkpoint(&self) -> Result<()> {
        self.commit()
    }
    /// Hint: an operation is about to visit much of the metadata.
    fn prefetch(&self, _max_bytes: u64) {}
    /// Now, in seconds since the epoch, on the clock every writer of the
    /// store shares: grace periods that one machine starts and another
    /// ends (the trash's) are measured on it, whatever the machines'
    /// clocks say. A store of one machine answers that machine's clock.
    fn clock_secs(&self) -> Result<i64> {
        Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64))
    }
    /// Change shipping ([`ShipChanges`]), if this store offers it: a
    /// store whose whole state fits in a file a bucket can hold (SQLite).
    fn shipping(&self) -> Option<&dyn ShipChanges> {
        None
    }
    /// The capabilities of a store many machines share ([`SharedVolume`]):
    /// sessions, the change log, file locks, uploads and flush rounds in
    /// flight, journal marks, and with them the open-file registry, content
    /// versions and session fencing of [`MetaRead`]/[`MetaTx`]. None for a
    /// store one process writes (SQLite): the engine then needs none of
    /// them (it is the only writer, and the kernel keeps its locks).
    fn shared(&self) -> Option<&dyn SharedVolume> {
        None
    }
}

/// What a store many machines mount read-write at once offers
/// (`docs/shared-volume.md`; PostgreSQL), reached through
/// [`MetaStore::shared`]. Offering it also promises, in the core traits:
/// an open-file registry ([`MetaTx::mark_open`], [`MetaTx::mark_closed`],
/// [`MetaRead::open_elsewhere`], [`MetaRead::orphan_inodes`] honouring it),
/// content versions ([`InodeRow::cver`], raised by every
/// [`MetaTx::update_content`]), chunk dates ([`ChunkRow::zero_since`]),
/// row locks for [`MetaStore::write_locking`], and session fencing (once
/// the session of [`Sessions::open_session`] is removed, every write of
/// this store fails with SessionLost). Conformance: the checks of
/// [`conformance::SHARED_CHECKS`], run only on stores that offer it.
pub trait SharedVolume: Sessions + ChangeLog + FileLocks + InFlight + JournalMarks + Send + Sync {}

/// Sessions of the machines that mount a volume, and the volume's
/// maintenance lock (`docs/shared-volume.md` §7). Each call is its own
/// transaction on the store's clock.
pub trait Sessions {
    /// Registers a session expiring `ttl` from now (store clock) and
    /// returns its id, never handed out before. Later change rows of this
    /// store carry it, and every later write transaction of
    /// this store commits only while the session's row exists: once
    /// another machine removed it (`remove_session`), each fails with
    /// SessionLost and changes nothing (docs/shared-volume.md §7
    /// "Fencing").
    fn open_session(&self, who: &SessionInfo, ttl: std::time::Duration) -> Result<u64>;
    /// Sets the session's expiry to now + `ttl` (store clock). SessionLost
    /// if it is gone or already expired: it is never brought back.
    fn renew_session(&self, id: u64, ttl: std::time::Duration) -> Result<()>;
    /// Ends a session of this process (no error if it is gone already),
    /// with its open-file rows.
    fn close_session(&self, id: u64) -> Result<()>;
    /// Every session, by id (`cairn status`).
    fn sessions(&self) -> Result<Vec<SessionRow>>;
    /// The sessions past their expiry, by id (for the cleaner).
    fn expired_sessions(&self) -> Result<Vec<SessionRow>>;
    /// Removes a session row and its open-file rows in one transaction
    /// (the cleaner, after a session expired); true if it was there.
    fn remove_session(&self, id: u64) -> Result<bool>;
    /// The volume's maintenance lock, if nobody (no process, no machine)
    /// holds it: at most one guard per volume lives at a time.
    fn try_maintenance(&self) -> Result<Option<Box<dyn MaintenanceGuard>>>;
}

/// The change log (`docs/shared-volume.md` §6): a row per changed inode
/// or entry, written in the transaction that changes it and carrying the
/// writer's session, read by the other machines to drop what they cache,
/// and the notices of commits that wake them.
pub trait ChangeLog {
    /// Change rows with `seq > after` committed now, ascending, at most
    /// `limit`. A row with a
    /// smaller seq may still commit later (PostgreSQL: its transaction was
    /// committing): a reader that must miss nothing uses
    /// [`ChangeLog::read_changes`].
    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>>;
    /// Where a reader that must see every change committed from now on
    /// starts: after the newest change, with holes for the seqs below it
    /// that may still commit.
    fn change_cursor(&self) -> Result<ChangeCursor>;
    /// The change rows after `cursor` and those of its holes that
    /// committed since, at most `limit`, each once: holes first, then
    /// ascending; advances `cursor` past them (noting the new holes) and
    /// forgets holes older than its bound: a row whose transaction commits
    /// within `hole_bound` of this reader first finding its seq missing is
    /// delivered by a later call.
    fn read_changes(&self, cursor: &mut ChangeCursor, limit: usize) -> Result<Vec<Change>>;
    /// The highest change seq committed (0 if none).
    fn last_change_seq(&self) -> Result<u64>;
    /// Deletes change rows older than `older_than` (store clock); returns
    /// how many.
    fn trim_changes(&self, older_than: std::time::Duration) -> Result<u64>;
    /// The highest seq a trim removed (0 if none): a reader whose cursor
    /// is below it may have missed changes and must drop everything it
    /// caches.
    fn changes_trimmed_through(&self) -> Result<u64>;
    /// A feed of commit notices, or None if the store cannot listen (a
    /// reader then polls `read_changes`).
    fn subscribe(&self) -> Result<Option<Box<dyn ChangeFeed>>>;
}

/// File locks every machine sees (`docs/shared-volume.md` §8), kept by
/// session and the kernel's lock owner; [`locks::plan`] computes a
/// request's effect.
pub trait FileLocks {
    /// Takes, changes or drops (`LockKind::Unlock`) a lock of `req.owner`
    /// on `req.ino` as [`locks::plan`] computes it, atomically against
    /// every other machine: two conflicting requests are never both
    /// granted. A conflict changes nothing and names one holder. Never
    /// waits for a holder (the caller retries). Idempotent: the same
    /// request again is granted and changes nothing.
    fn set_lock(&self, req: &LockRequest) -> Result<LockOutcome>;
    /// `F_GETLK`: a lock of another owner that would conflict with `req`,
    /// if any; changes nothing.
    fn test_lock(&self, req: &LockRequest) -> Result<Option<LockRow>>;
    /// Drops every lock of `style` that `owner` holds on `ino` (a close
    /// drops the POSIX locks of its lock owner, the last close of an open
    /// file its flock); returns how many ranges went.
    fn release_locks(&self, ino: Ino, owner: LockOwner, style: LockStyle) -> Result<u64>;
    /// Drops every lock of a session; returns how many ranges went.
    /// `close_session` and `remove_session` do it too, in the same
    /// transaction as the session row.
    fn release_session_locks(&self, session: u64) -> Result<u64>;
    /// Every lock on `ino`, by owner and start (tests, `cairn status`).
    fn locks_on(&self, ino: Ino) -> Result<Vec<LockRow>>;
    /// Every lock on each of `inos`, with its inode: what a mount's parked
    /// lock requests ask each round, in one query however many wait (a
    /// store of many machines answers in one round trip).
    fn locks_on_many(&self, inos: &[Ino]) -> Result<Vec<(Ino, LockRow)>>;
}

/// What a session has under way that a collector on another machine must
/// respect (`docs/shared-volume.md` §7 "Uploads", "Chunk grace"): packs
/// being uploaded, flush rounds in progress.
pub trait InFlight {
    /// Records, before the upload starts, that this store's session is
    /// uploading pack `name` (docs/shared-volume.md §7 "Uploads"): until
    /// a transaction inserts the pack (`insert_pack` drops the record in
    /// it) or `end_uploads` drops it, `uploads_in_flight` names it, so gc
    /// on another machine leaves the object alone. SessionLost (nothing
    /// recorded) if the session is gone; nothing to do without a session.
    fn begin_upload(&self, name: &str) -> Result<()>;
    /// Drops the records of uploads whose packs will never be committed
    /// (deleted after a rolled-back round).
    fn end_uploads(&self, names: &[&str]) -> Result<()>;
    /// Records that this store's session has a flush round under way from
    /// now (store clock; kept if one is recorded already) until
    /// [`InFlight::flush_ended`]: a collector on any machine leaves every
    /// chunk that died after that moment alone, since the round may have
    /// found it by hash while it was live (docs/shared-volume.md §7 "Chunk
    /// grace"). Nothing to do without a session.
    fn flush_started(&self) -> Result<()>;
    /// The round recorded by [`InFlight::flush_started`] committed or
    /// gave up.
    fn flush_ended(&self) -> Result<()>;
    /// The store-clock second the oldest flush round under way on any
    /// session began (see [`InFlight::flush_started`]); None if none is.
    fn oldest_flush(&self) -> Result<Option<i64>>;
    /// The packs recorded as uploading that a collector must leave alone:
    /// those of existing sessions, and those of gone sessions recorded
    /// less than `grace` ago (store clock); the records of the others are
    /// deleted (their session can commit nothing any more).
    fn uploads_in_flight(&self, grace: std::time::Duration) -> Result<Vec<String>>;
}

/// Journal positions per machine (`docs/metadata-store.md` "Journal
/// marks"): each machine's journal keeps its own marks, so that a replay
/// skips only what its own journal committed.
pub trait JournalMarks {
    /// Tells the store which journal its writer keeps (a random id per
    /// cache directory, never 0), before its first write. From then on
    /// `jseq` of `get_inode`/`all_inodes`, `update_content` and `max_jseq`
    /// are this journal's marks. `legacy`: the journal held records before
    /// it had an id (written by a build without marks): its marks start as
    /// the positions that build recorded on the inodes.
    fn set_journal(&self, id: u64, legacy: bool) -> Result<()>;
    /// Deletes this store's journal's marks at or below `upto`: the
    /// caller's journal holds no record at or below it any more (it was
    /// found empty after `upto` was handed out), so those marks guard
    /// nothing. Returns how many went.
    fn trim_journal_marks(&self, upto: u64) -> Result<u64>;
}

/// Runs `f` through one of the store's read entries (`read`, `read_one`,
/// `read_many`) and returns its value.
fn read_by<T, E>(run: impl FnOnce(&mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()>, mut f: impl FnMut(&dyn MetaRead) -> Result<T, E>) -> Result<T, E>
where
    E: From<Error>,
    Error: From<E>,
{
    let mut out = None;
    run(&mut |tx| {
        out = Some(f(tx)?);
        Ok(())
    })?;
    Ok(out.expect("a read that succeeded ran its closure"))
}

/// The convenient forms of [`MetaStore::read`] and [`MetaStore::write`]:
/// closures returning a value and any error that converts to and from the
/// store's.
pub trait MetaStoreExt: MetaStore {
    fn read_with<T, E>(&self, f: impl FnMut(&dyn MetaRead) -> Result<T, E>) -> Result<T, E>
    where
        E: From<Error>,
        Error: From<E>,
    {
        read_by(|g| self.read(g), f)
    }
    fn read_one_with<T, E>(&self, f: impl FnMut(&dyn MetaRead) -> Result<T, E>) -> Result<T, E>
    where
        E: From<Error>,
        Error: From<E>,
    {
        read_by(|g| self.read_one(g), f)
    }
    fn read_many_with<T, E>(&self, f: impl FnMut(&dyn MetaRead) -> Result<T, E>) -> Result<T, E>
    where
        E: From<Error>,
        Error: From<E>,
    {
        read_by(|g| self.read_many(g), f)
    }
    fn write_with<T, E>(&self, f: impl FnMut(&dyn MetaTx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<Error>,
        Error: From<E>,
    {
        write_by(|g| self.write(g), f)
    }
    /// [`MetaStore::write_locking`] with a typed result.
    fn write_locking_with<T, E>(&self, inos: &[Ino], entries: &[(Ino, &[u8])], rename_lock: bool, f: impl FnMut(&dyn MetaTx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<Error>,
        Error: From<E>,
    {
        write_by(|g| self.write_locking(inos, entries, rename_lock, g), f)
    }
}

impl<S: MetaStore + ?Sized> MetaStoreExt for S {}

/// Runs `f` through `write` (one of the store's write entries) and hands
/// back its typed result.
fn write_by<T, E>(write: impl FnOnce(&mut dyn FnMut(&dyn MetaTx) -> Result<()>) -> Result<()>, mut f: impl FnMut(&dyn MetaTx) -> Result<T, E>) -> Result<T, E>
where
    E: From<Error>,
    Error: From<E>,
{
    let mut out = None;
    write(&mut |tx| {
        out = Some(f(tx)?);
        Ok(())
    })?;
    Ok(out.expect("a write that succeeded ran its closure"))
}
