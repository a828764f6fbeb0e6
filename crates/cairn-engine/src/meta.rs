//! The engine's side of the metadata store seam (`docs/metadata-store.md`).
//!
//! The store itself is `cairn_meta`: a [`MetaStore`] trait of typed
//! operations, and `cairn_meta::open`, which chooses the store by where
//! the metadata lives (a file in the volume directory, or a server's URL);
//! the engine names no store. [`Meta`] holds one as `Arc<dyn MetaStore>`
//! and gives the engine the
//! closure forms it uses (`read(|tx| ..)`, `write(|tx| ..)`) with the
//! engine's error type; [`load_extents`] and [`save_extents`] translate
//! extent maps to the store's opaque pages. No SQL lives in the engine.

use crate::error::{Error, Result};
use crate::extent::{decode_page, encode_page, ExtentMap, PageChanges, Source};
use crate::types::Ino;
pub use cairn_meta::GROUP_WINDOW;
pub use cairn_meta::{
    BillRow, Caller0, ChunkRow, ChunkTotals, DeadPack, InodeRow, InodeTotals, MaintenanceGuard, MetaRead, MetaStore, MetaTx, NewNode, PackRow, PageEdits, PageLink, PageUpsert,
    SharedVolume, ShipChanges, StoredPage, BILL_STORAGE_AT_KEY, FLAG_READ_ONLY,
};
pub use cairn_meta::{Location, OpenOptions};
use cairn_meta::{MetaStoreExt, PageCodec};
use std::sync::Arc;

/// How long a session lives without a heartbeat: past it, another
/// machine may clean up after this one (JuiceFS: 60 s).
pub const SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The page format of `extent.rs`, for the store to read the chunk
/// references of a page it frees.
struct ExtentCodec;

impl PageCodec for ExtentCodec {
    fn chunk_ids(&self, data: &[u8], out: &mut Vec<u64>) -> cairn_meta::Result<()> {
        for e in decode_page(0, data)?.extents {
            if let Source::Chunk(id) = e.src {
                out.push(id);
            }
        }
        Ok(())
    }
}

/// The volume's metadata store.
pub struct Meta {
    store: Arc<dyn MetaStore>,
}

impl Meta {
    /// Creates a fresh store with the root directory where `at` says (see
    /// `cairn_meta::create`): a database file, or volume `id`'s schema
    /// (`cairn_<id>`) in the database a URL names.
    pub fn create(at: Location<'_>, root: Caller0) -> Result<()> {
        Ok(cairn_meta::create(at, root)?)
    }

    /// Options to open a store with the engine's page format and the
    /// store's defaults; the caller sets what it needs (`exclusive` and
    /// `group_window` for a file, `timeout` and `sync_commit` for a URL).
    pub fn options() -> OpenOptions {
        OpenOptions::new(Arc::new(ExtentCodec))
    }

    /// Opens the store where `at` says (see `cairn_meta::open`), with
    /// options from [`Meta::options`].
    pub fn open(at: Location<'_>, opts: OpenOptions) -> Result<Self> {
        Ok(Meta::from_store(cairn_meta::open(at, opts)?))
    }

    /// A volume's metadata in any store.
    pub fn from_store(store: Arc<dyn MetaStore>) -> Self {
        Meta { store }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    /// The store's shared-volume capabilities (sessions, the change log,
    /// file locks, uploads and rounds in flight, journal marks): Some
    /// where many machines share the volume (PostgreSQL).
    pub fn shared(&self) -> Option<&dyn SharedVolume> {
        self.store.shared()
    }

    /// [`Meta::shared`] for a caller that runs only on a shared volume:
    /// NotSupported elsewhere.
    pub fn need_shared(&self) -> cairn_meta::Result<&dyn SharedVolume> {
        self.store.shared().ok_or_else(|| cairn_meta::Error::new(cairn_meta::ErrorKind::NotSupported, "the metadata store is not shared (sessions, the change log and file locks are kept only where many machines mount the volume)"))
    }

    /// Runs queries on one consistent state, including every change whose
    /// `write` returned. `f` may run more than once (see the contract).
    pub fn read<T>(&self, f: impl FnMut(&dyn MetaRead) -> Result<T>) -> Result<T> {
        self.store.read_with(f)
    }

    /// [`Meta::read`] for a closure that runs exactly one query (see
    /// `MetaStore::read_one`): the hot `getattr` and `lookup` of a shared
    /// volume in one round trip.
    pub fn read_one<T>(&self, f: impl FnMut(&dyn MetaRead) -> Result<T>) -> Result<T> {
        self.store.read_one_with(f)
    }

    /// [`Meta::read`] for many queries (one read transaction).
    pub fn read_many<T>(&self, f: impl FnMut(&dyn MetaRead) -> Result<T>) -> Result<T> {
        self.store.read_many_with(f)
    }

    /// Runs `f` as one change: all of it or (if `f` or the store fails) none
    /// of it. Seen by every later read at once; durable after the next
    /// [`Meta::sync`]. `f` may run more than once (a PostgreSQL store retries
    /// serialization failures), so it must have no effect but its return.
    pub fn write<T>(&self, f: impl FnMut(&dyn MetaTx) -> Result<T>) -> Result<T> {
        self.store.write_with(f)
    }

    /// [`Meta::write`] for a namespace operation that names the inodes
    /// whose rows it changes (see `MetaStore::write_locking`): `inos`
    /// up front, any others with `tx.lock_inodes` before it reads them.
    pub fn write_locking<T>(&self, inos: &[Ino], entries: &[(Ino, &[u8])], rename_lock: bool, f: impl FnMut(&dyn MetaTx) -> Result<T>) -> Result<T> {
        self.store.write_locking_with(inos, entries, rename_lock, f)
    }

    pub fn commit(&self) -> Result<()> {
        Ok(self.store.commit()?)
    }

    /// The barrier every ordering rule of `docs/format.md` waits on.
    pub fn sync(&self) -> Result<()> {
        Ok(self.store.sync()?)
    }

    pub fn is_durable(&self) -> bool {
        self.store.is_durable()
    }

    pub fn abandon(&self) {
        self.store.abandon()
    }

    pub fn checkpoint(&self) -> Result<()> {
        Ok(self.store.checkpoint()?)
    }

    pub fn prefetch(&self, max_bytes: u64) {
        self.store.prefetch(max_bytes)
    }

    fn ship(&self) -> Result<&dyn ShipChanges> {
        self.store.shipping().ok_or_else(|| Error::invalid("this metadata store does not ship its changes"))
    }

    /// See `cairn_meta::ShipChanges`.
    /// Whether this open upgraded the store's schema
    /// ([`MetaStore::schema_upgraded`]).
    pub fn schema_upgraded(&self) -> bool {
        self.store.schema_upgraded()
    }

    pub fn capture_changes(&self) -> Result<()> {
        Ok(self.ship()?.capture_changes()?)
    }

    pub fn take_changes(&self) -> Result<Option<Vec<u8>>> {
        Ok(self.ship()?.take_changes()?)
    }

    pub fn has_changes(&self) -> bool {
        self.store.shipping().is_some_and(|s| s.has_changes())
    }

    pub fn snapshot(&self) -> Result<Vec<u8>> {
        Ok(self.ship()?.snapshot()?)
    }
}

/// Loads a file's extent map.
pub fn load_extents(tx: &dyn MetaRead, ino: Ino) -> Result<ExtentMap> {
    let mut pages = Vec::new();
    let mut total = 0u64;
    for sp in tx.load_pages(ino)? {
        let mut p = decode_page(sp.key, &sp.data).map_err(|e| e.context(format!("inode {ino}, page #{}", sp.id)))?;
        p.id = sp.id;
        total = total
            .checked_add(p.len)
            .filter(|t| *t <= crate::extent::MAX_FILE_SPAN)
            .ok_or_else(|| Error::corrupt(format!("inode {ino}: its pages describe more than the largest file")))?;
        pages.push(p);
    }
    Ok(ExtentMap::from_pages(pages))
}

fn chunk_ids(extents: &[crate::extent::Extent]) -> Vec<u64> {
    extents.iter().filter_map(|e| if let Source::Chunk(id) = e.src { Some(id) } else { None }).collect()
}

/// Persists the page edits of one file: new pages are encoded and stored,
/// dropped ones unlinked; the store counts the chunk references. Returns
/// the ids of the new pages by key, for `ExtentMap::assign_ids`.
pub fn save_extents(tx: &dyn MetaTx, ino: Ino, ch: &PageChanges) -> Result<Vec<(i64, u64)>> {
    let mut upserts = Vec::with_capacity(ch.upserts.len());
    for p in &ch.upserts {
        upserts.push(if p.id == 0 {
            PageUpsert { key: p.key, id: 0, data: encode_page(p)?, chunks: chunk_ids(&p.extents) }
        } else {
            PageUpsert { key: p.key, id: p.id, data: Vec::new(), chunks: Vec::new() }
        });
    }
    let edits = PageEdits {
        gained: ch.gained.clone(),
        upserts,
        deletes: ch.deletes.clone(),
        dropped: ch.dropped.iter().map(|p| (p.id, chunk_ids(&p.extents))).collect(),
    };
    Ok(tx.save_pages(ino, &edits)?)
}

/// Removes `name` from `parent` if it still names `ino` (the inode the
/// operation looked up); fails otherwise, so a name someone re-created
/// meanwhile is never removed.
pub fn remove_entry(tx: &dyn MetaTx, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
    if tx.delete_dentry(parent, name, ino)? {
        Ok(())
    } else {
        Err(Error::not_found(format!("{} no longer names inode {ino}", String::from_utf8_lossy(name))))
    }
}
