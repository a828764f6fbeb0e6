//! Storage backends for Cairn.
//!
//! A backend stores immutable, named objects: packs, the volume config, key
//! files. The trait is deliberately small — put, ranged get, delete, list —
//! so that a local directory, an S3 bucket and (through an adapter) a tape can
//! all sit behind it. Every implementation must satisfy the contract written
//! on [`Backend`]; the shared checks in [`conformance`] prove it.
//!
//! ```
//! use cairn_backend::{Backend, LocalBackend};
//! let dir = tempfile::tempdir().unwrap();
//! let b = LocalBackend::create(dir.path()).unwrap();
//! b.put("packs/00/abc", b"hello").unwrap();
//! assert_eq!(b.get_range("packs/00/abc", 1, 3).unwrap(), b"ell");
//! ```
#![deny(missing_docs)]

mod error;
mod local;
pub mod meter;
mod retry;
mod s3;
pub mod conformance;

pub use error::{Error, ErrorKind, Result};
pub use local::LocalBackend;
pub use meter::{Meter, Metered, Payers, RequestCounts, RequestKind, Subsystem};
pub use retry::{RetryPolicy, Retrying};
pub use s3::{put_requests, S3Backend, S3Location, NO_CREDENTIALS};

/// An object store holding immutable named objects.
///
/// Contract:
/// - Names are `/`-separated relative paths of ASCII letters, digits, `-`, `_`
///   and `.`; no empty component, no `..`.
/// - `put` is atomic and durable when it returns: a reader sees the whole old
///   object (or none) or the whole new one, never a prefix, and a crash after
///   `put` returned does not lose the object. A store that declares
///   [`Capabilities::deferred_durability`] (a tape drive's buffer) makes a
///   put durable only when a later [`Backend::sync`] returns; until then a
///   power cut may lose it, but never a part of an object that a `sync`
///   covered, and objects become durable in the order they were put.
/// - `get_range` returns exactly `len` bytes or fails; reading past the end
///   is an error of kind [`ErrorKind::OutOfRange`], a missing object
///   [`ErrorKind::NotFound`].
/// - `put_if_absent` stores only if no object of that name exists, atomically
///   (of two concurrent calls at most one succeeds); otherwise it fails with
///   [`ErrorKind::AlreadyExists`] and leaves the object as it was.
/// - Conditional updates (only where [`Backend::conditional_updates`] says
///   so): `get_tagged` returns the object and its *tag*, an opaque string
///   that changes whenever the object is replaced or recreated with other
///   bytes (S3's ETag; a content hash on a local directory).
///   `put_if_match(name, data, tag)` replaces the object only if it exists
///   and its tag is still `tag`, atomically (of two updates from the same
///   tag at most one succeeds), and returns the new tag; otherwise it fails
///   with [`ErrorKind::Changed`] (also when the object is gone) and leaves
///   the store as it was. A store without them fails both with
///   [`ErrorKind::Permanent`].
/// - `delete` of a missing object succeeds (idempotent).
/// - `list` returns every object whose name starts with `prefix`, with sizes,
///   in no particular order.
/// - Errors say what kind they are ([`ErrorKind`]): only
///   [`ErrorKind::Transient`] ones may succeed when retried ([`Retrying`]
///   does that), and errors about one object name it ([`Error::object`]).
pub trait Backend: Send + Sync {
    /// Stores `data` under `name`, replacing any object of that name.
    fn put(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Stores `data` under `name` only if nothing is stored there yet.
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()>;
    /// Whether [`Backend::get_tagged`] and [`Backend::put_if_match`] work
    /// (see the contract). Without them a lease cannot fence a holder that
    /// lost it (docs/cloud.md §4).
    fn conditional_updates(&self) -> bool {
        false
    }
    /// Reads the whole object and its tag (see the contract).
    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        Err(Error::new(ErrorKind::Permanent, format!("{} does not support conditional updates", self.describe())).with_object(name))
    }
    /// Replaces `name` only if its tag is still `tag`; returns the new tag.
    fn put_if_match(&self, name: &str, _data: &[u8], _tag: &str) -> Result<String> {
        Err(Error::new(ErrorKind::Permanent, format!("{} does not support conditional updates", self.describe())).with_object(name))
    }
    /// Reads `len` bytes of `name` starting at `offset`.
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>>;
    /// Reads adjacent ranges `(offset, len)` of `name`, in order (each
    /// starting where the one before it ends), one buffer each: what
    /// one `get_range` of their span returns, cut up. The default is
    /// exactly that (one request); a store with cheap reads fills each
    /// buffer directly and spares the copy.
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        let (offset, len) = span_of(ranges)?;
        split_span(self.get_range(name, offset, len)?, ranges)
    }
    /// Reads the whole object.
    fn get(&self, name: &str) -> Result<Vec<u8>>;
    /// The object's size in bytes.
    fn size(&self, name: &str) -> Result<u64>;
    /// Removes `name`; succeeds if it does not exist.
    fn delete(&self, name: &str) -> Result<()>;
    /// All objects whose names start with `prefix`.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// What this backend does cheaply.
    fn capabilities(&self) -> Capabilities;
    /// Makes every object put so far durable (see the contract: only
    /// stores with deferred durability need it; for the others it does
    /// nothing).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// A short description for messages, e.g. `local:/srv/vol/store`.
    fn describe(&self) -> String;
    /// Where the requests this backend sends are counted, for the bill
    /// (remote stores; wrappers pass their inner backend's on). None: they
    /// are not counted (a local directory costs no requests).
    fn meter(&self) -> Option<std::sync::Arc<Meter>> {
        None
    }
    /// What only a sequential medium answers (a tape drive: its
    /// write-behind backlog, where objects lie, the space deletes did not
    /// free). None: a store without an order that matters; wrappers pass
    /// their inner store's on.
    fn sequential(&self) -> Option<&dyn Sequential> {
        None
    }
    /// A handle on this same store whose requests are billed to `who`
    /// (docs/design.md, "Who pays and for which file"): a metering store
    /// returns a view sharing its connection and [`Meter`]; a wrapper
    /// wraps its inner store's handle. None: the store bills nothing by
    /// subsystem, so it serves every payer itself. Made once per payer
    /// ([`meter::Payers`]), never per request.
    fn paid_by(&self, _who: Subsystem) -> Option<std::sync::Arc<dyn Backend>> {
        None
    }
}

/// The questions only a sequential, write-behind store answers (a tape
/// drive, reached through [`Backend::sequential`]): kept off [`Backend`]
/// so that the object-store contract stays what every store implements.
pub trait Sequential: Send + Sync {
    /// What the store has accepted and not yet written. The engine uses it
    /// to feed a streaming drive before it runs dry (docs/tape.md §2).
    fn backlog(&self) -> Backlog;
    /// Where byte `offset` of `name` lies on the medium (a tape's block
    /// position), so that a caller with many reads to make can issue them
    /// in one pass (`cairn tape recall`). None: the store does not know the
    /// object (not written yet, deleted).
    fn position(&self, _name: &str, _offset: u64) -> Option<u64> {
        None
    }
    /// What the store holds that deleting did not free (an append-only
    /// medium): shown by `cairn stats`. None: deletes free space here.
    fn space(&self) -> Option<StoreSpace> {
        None
    }
}

/// See [`Sequential::space`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreSpace {
    /// Bytes of live objects.
    pub live_bytes: u64,
    /// Bytes of deleted or replaced objects still taking room.
    pub dead_bytes: u64,
    /// Room left for new objects, when the store knows it.
    pub free_bytes: Option<u64>,
}

/// See [`Sequential::backlog`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backlog {
    /// Bytes of puts waiting to be written.
    pub queued_bytes: u64,
    /// The store is writing, or wrote moments ago: letting the backlog run
    /// dry now stops a moving medium (a tape backhitches to restart).
    pub streaming: bool,
}

/// What a backend does cheaply; the engine adapts to it (pack sizes, read
/// batching, whether GC may delete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Requests cross a network and may be billed: batch them, cache reads.
    pub remote: bool,
    /// A ranged read costs about its bytes (false where each read must
    /// first position the medium, as on tape).
    pub cheap_ranged_reads: bool,
    /// Deleting an object frees its space (false on append-only media).
    pub frees_on_delete: bool,
    /// The pack size that suits the store (bytes).
    pub preferred_pack_size: u64,
    /// One process at a time can open the store (a tape in a drive): the
    /// open itself excludes others, so no lease object is kept.
    pub exclusive: bool,
    /// `put` is durable only after [`Backend::sync`] (see the contract).
    pub deferred_durability: bool,
}

impl Capabilities {
    /// A local directory.
    pub const LOCAL: Capabilities = Capabilities { remote: false, cheap_ranged_reads: true, frees_on_delete: true, preferred_pack_size: 32 << 20, exclusive: false, deferred_durability: false };
}

impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        (**self).put(name, data)
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        (**self).put_if_absent(name, data)
    }
    fn conditional_updates(&self) -> bool {
        (**self).conditional_updates()
    }
    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        (**self).get_tagged(name)
    }
    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        (**self).put_if_match(name, data, tag)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        (**self).get_range(name, offset, len)
    }
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        (**self).get_ranges(name, ranges)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        (**self).get(name)
    }
    fn size(&self, name: &str) -> Result<u64> {
        (**self).size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        (**self).delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        (**self).list(prefix)
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    fn sync(&self) -> Result<()> {
        (**self).sync()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn meter(&self) -> Option<std::sync::Arc<Meter>> {
        (**self).meter()
    }
    fn sequential(&self) -> Option<&dyn Sequential> {
        (**self).sequential()
    }
    fn paid_by(&self, who: Subsystem) -> Option<std::sync::Arc<dyn Backend>> {
        (**self).paid_by(who)
    }
}

/// One listed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Checks an object name against the contract on [`Backend`].
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        });
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::InvalidName, format!("invalid object name {name:?}")))
    }
}

/// The span `(offset, len)` of adjacent ranges (`Backend::get_ranges`);
/// an error if they are not adjacent and in order.
pub fn span_of(ranges: &[(u64, u64)]) -> Result<(u64, u64)> {
    let Some(&(start, _)) = ranges.first() else { return Ok((0, 0)) };
    let mut end = start;
    for &(off, len) in ranges {
        if off != end {
            return Err(Error::new(ErrorKind::Permanent, format!("get_ranges: range at {off} does not follow the one ending at {end}")));
        }
        end = off.checked_add(len).ok_or_else(|| Error::new(ErrorKind::OutOfRange, format!("range {off}+{len} past 2^64")))?;
    }
    Ok((start, end - start))
}

/// Cuts the bytes of a span into the ranges it covers.
pub fn split_span(span: Vec<u8>, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
    let Some(&(start, _)) = ranges.first() else { return Ok(Vec::new()) };
    ranges
        .iter()
        .map(|&(off, len)| {
            let at = (off - start) as usize;
            span.get(at..at + len as usize).map(<[u8]>::to_vec).ok_or_else(|| Error::new(ErrorKind::OutOfRange, "get_ranges: short read"))
        })
        .collect()
}
