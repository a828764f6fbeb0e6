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
/// - Storage classes (docs/tiers.md §1, §6): `put_in_class(name, data,
///   StorageClass::Standard)` is `put`; another class is stored only by a
///   store that has classes (S3), else it fails with
///   [`ErrorKind::Unsupported`] and stores nothing. A GET (`get`,
///   `get_range`, `get_ranges`, `get_tagged`) of an object in an archive
///   class ([`StorageClass::needs_restore`]) without a restored copy fails
///   with [`ErrorKind::Archived`], never a generic error; `restore(name,
///   days, speed)` asks for a readable copy for `days` days (a second
///   request while one is under way, or for an object already restored,
///   succeeds), and `restore_state` says where the object stands
///   ([`ObjectState`]). A store without classes answers `Unsupported` to
///   `restore` and [`ObjectState::STANDARD`] to `restore_state` (NotFound
///   for a missing object, as `size`).
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
    /// Stores `data` under `name` in storage class `class` (see the
    /// contract: only a store with classes takes another than `Standard`).
    fn put_in_class(&self, name: &str, data: &[u8], class: StorageClass) -> Result<()> {
        if class == StorageClass::Standard {
            return self.put(name, data);
        }
        Err(Error::new(ErrorKind::Unsupported, format!("{} has no storage class {}", self.describe(), class.name())).with_object(name))
    }
    /// Asks for a readable copy of archived object `name` for `days` days
    /// (S3 `RestoreObject`); returns when the request is accepted, not
    /// when the copy is ready ([`Backend::restore_state`] says that).
    fn restore(&self, name: &str, _days: u32, _speed: RestoreSpeed) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, format!("{} has no archive classes to restore from", self.describe())).with_object(name))
    }
    /// Where object `name` stands: its class and its restore (a HEAD).
    fn restore_state(&self, name: &str) -> Result<ObjectState> {
        self.size(name)?;
        Ok(ObjectState::STANDARD)
    }
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

/// An S3 storage class (docs/tiers.md §1). The class is an attribute of
/// the object, not of its bytes: `x-amz-storage-class` on the PUT (and on
/// the creation of a multipart upload), reported by HEAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorageClass {
    /// `STANDARD` (also what a store without classes holds).
    Standard,
    /// `STANDARD_IA`.
    StandardIa,
    /// `GLACIER_IR` (Instant Retrieval: read at once).
    GlacierIr,
    /// `GLACIER` (Flexible Retrieval: restore first).
    Glacier,
    /// `DEEP_ARCHIVE` (restore first).
    DeepArchive,
}

impl StorageClass {
    /// Every class.
    pub const ALL: [StorageClass; 5] = [StorageClass::Standard, StorageClass::StandardIa, StorageClass::GlacierIr, StorageClass::Glacier, StorageClass::DeepArchive];

    /// S3's name (`STANDARD`, `GLACIER`, ...).
    pub fn name(self) -> &'static str {
        match self {
            StorageClass::Standard => "STANDARD",
            StorageClass::StandardIa => "STANDARD_IA",
            StorageClass::GlacierIr => "GLACIER_IR",
            StorageClass::Glacier => "GLACIER",
            StorageClass::DeepArchive => "DEEP_ARCHIVE",
        }
    }

    /// The class of an S3 name; None for a class Cairn does not use
    /// (`INTELLIGENT_TIERING`, `ONEZONE_IA`, ...).
    pub fn from_name(s: &str) -> Option<StorageClass> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Whether a GET needs a restore first.
    pub fn needs_restore(self) -> bool {
        matches!(self, StorageClass::Glacier | StorageClass::DeepArchive)
    }
}

/// How fast a restore should be (S3's retrieval tiers; the price grows
/// with the speed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreSpeed {
    /// `Expedited`: minutes (GLACIER only).
    Expedited,
    /// `Standard`: hours.
    Standard,
    /// `Bulk`: the cheapest, the slowest.
    Bulk,
}

impl RestoreSpeed {
    /// S3's name of the tier.
    pub fn name(self) -> &'static str {
        match self {
            RestoreSpeed::Expedited => "Expedited",
            RestoreSpeed::Standard => "Standard",
            RestoreSpeed::Bulk => "Bulk",
        }
    }
}

/// What [`Backend::restore_state`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectState {
    /// The object's class.
    pub class: StorageClass,
    /// Its restore.
    pub restore: RestoreState,
}

impl ObjectState {
    /// A readable object of the standard class.
    pub const STANDARD: ObjectState = ObjectState { class: StorageClass::Standard, restore: RestoreState::None };

    /// Whether a GET of the object succeeds now.
    pub fn readable(&self) -> bool {
        !self.class.needs_restore() || matches!(self.restore, RestoreState::Ready { .. })
    }
}

/// Where the restore of an object stands (S3's `x-amz-restore` header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreState {
    /// None asked for (or its copy expired).
    None,
    /// Under way (`ongoing-request="true"`).
    Ongoing,
    /// Done: a copy is readable until `expiry` (S3's HTTP date, as given).
    Ready {
        /// `expiry-date`, when the store gave one.
        expiry: Option<String>,
    },
}

impl RestoreState {
    /// Parses S3's `x-amz-restore` header (`ongoing-request="true"` or
    /// `ongoing-request="false", expiry-date="Fri, 21 Dec 2012 00:00:00 GMT"`);
    /// None if it is not one.
    pub fn parse_header(h: &str) -> Option<RestoreState> {
        let h = h.trim();
        let field = |key: &str| -> Option<&str> {
            let at = h.find(key)? + key.len();
            let rest = h[at..].trim_start().strip_prefix('=')?.trim_start().strip_prefix('"')?;
            Some(&rest[..rest.find('"')?])
        };
        match field("ongoing-request")? {
            "true" => Some(RestoreState::Ongoing),
            "false" => Some(RestoreState::Ready { expiry: field("expiry-date").map(str::to_string) }),
            _ => None,
        }
    }
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
    fn put_in_class(&self, name: &str, data: &[u8], class: StorageClass) -> Result<()> {
        (**self).put_in_class(name, data, class)
    }
    fn restore(&self, name: &str, days: u32, speed: RestoreSpeed) -> Result<()> {
        (**self).restore(name, days, speed)
    }
    fn restore_state(&self, name: &str) -> Result<ObjectState> {
        (**self).restore_state(name)
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

#[cfg(test)]
mod class_tests {
    use super::*;

    #[test]
    fn restore_headers_parse() {
        assert_eq!(RestoreState::parse_header("ongoing-request=\"true\""), Some(RestoreState::Ongoing));
        assert_eq!(
            RestoreState::parse_header("ongoing-request=\"false\", expiry-date=\"Fri, 21 Dec 2012 00:00:00 GMT\""),
            Some(RestoreState::Ready { expiry: Some("Fri, 21 Dec 2012 00:00:00 GMT".into()) })
        );
        assert_eq!(RestoreState::parse_header("ongoing-request=\"maybe\""), None);
        assert_eq!(RestoreState::parse_header(""), None);
        for c in StorageClass::ALL {
            assert_eq!(StorageClass::from_name(c.name()), Some(c));
        }
        assert!(StorageClass::Glacier.needs_restore() && StorageClass::DeepArchive.needs_restore() && !StorageClass::GlacierIr.needs_restore());
    }
}
