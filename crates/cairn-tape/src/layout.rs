//! The self-describing on-tape layout (format version 1; the bytes are in
//! `docs/format.md`, "Tape").
//!
//! ```text
//! position 0      label block
//! position 1      filemark
//! 2 .. D-1        data blocks, each naming its volume, object, sequence number and byte offset
//! D               filemark                      (D = "data end")
//! D+1 .. D+n      catalog blocks (the caller's catalog, framed with a length and a BLAKE3)
//! D+n+1           filemark, then end of data
//! ```
//!
//! Appending locates to `D` (overwriting the filemark and the old catalog),
//! writes data blocks, then a new filemark, catalog and filemark
//! ([`TapeWriter::write_catalog`]). Mounting reads the label and then the
//! catalog, found from the end of data ([`read_catalog`]): two locates, no
//! scan. When the catalog is missing or damaged, [`scan`] reads every block
//! from position 2 to the end of data and rebuilds each object's extents
//! from the block headers, telling complete objects from incomplete ones.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::device::{DeviceError, ReadOutcome, TapeDevice};

/// The layout version written by this code; others are refused.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the header at the start of every data and catalog block.
pub const HEADER_LEN: usize = 64;
/// Bytes of the label's fixed part (the caller's info follows).
pub const LABEL_FIXED_LEN: usize = 64;
/// Position of the first data block.
pub const DATA_START: u64 = 2;
/// Magic of the label block.
pub const LABEL_MAGIC: &[u8; 8] = b"CAIRNTAP";
/// Magic of a data or catalog block header.
pub const BLOCK_MAGIC: &[u8; 4] = b"CTB1";
/// Magic of the catalog frame.
pub const CATALOG_MAGIC: &[u8; 8] = b"CRNCATLG";
const CATALOG_FRAME_LEN: usize = 48;
/// A catalog frame may declare at most this many bytes: a hostile tape's
/// catalog is refused at its first block rather than read into memory.
/// (A full LTO-9 of 128 MiB packs indexes in a few MiB; the inline
/// objects add at most 64 MiB.)
pub const CATALOG_MAX: u64 = 512 << 20;
/// Blocks per device call when writing or reading runs.
const BATCH_BLOCKS: usize = 32;

/// A volume's identity: 16 bytes, shown as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VolumeId(pub [u8; 16]);

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VolumeId({self})")
    }
}

/// A layout error. Each names the device; those about a place on the tape
/// name the position.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The tape has no recorded data at all.
    #[error("{device}: the tape is blank")]
    BlankTape {
        /// The device.
        device: String,
    },
    /// The first block is not a Cairn label.
    #[error("{device}: not a Cairn tape (no Cairn label at the beginning of the tape)")]
    NotCairnTape {
        /// The device.
        device: String,
    },
    /// The label names a format version this code does not know.
    #[error("{device}: unknown tape format version {version} (this build reads version {FORMAT_VERSION})")]
    UnknownVersion {
        /// The device.
        device: String,
        /// The version found.
        version: u32,
    },
    /// The label is there but does not check.
    #[error("{device}: damaged tape label: {reason}")]
    DamagedLabel {
        /// The device.
        device: String,
        /// What is wrong.
        reason: String,
    },
    /// The tape belongs to another volume.
    #[error("{device}: wrong tape: volume {found}, expected volume {expected}")]
    WrongVolume {
        /// The device.
        device: String,
        /// The volume asked for.
        expected: VolumeId,
        /// The volume on the tape.
        found: VolumeId,
    },
    /// The tape was written with another block size than the device uses.
    #[error(
        "{device}: the tape uses {tape}-byte blocks, the device is set to {device_block_size}"
    )]
    BlockSizeMismatch {
        /// The device.
        device: String,
        /// Block size in the label.
        tape: u32,
        /// Block size of the device.
        device_block_size: usize,
    },
    /// The tape ends without a catalog (a crash before the last catalog
    /// was written); `scan` rebuilds it.
    #[error("{device}: no catalog at the end of the tape ({reason}); run tape recover to rebuild it from the blocks")]
    NoCatalog {
        /// The device.
        device: String,
        /// What was found instead.
        reason: String,
    },
    /// The catalog is there but does not check; `scan` rebuilds it.
    #[error("{device}: damaged catalog at block {position}: {reason}; run tape recover to rebuild it from the blocks")]
    DamagedCatalog {
        /// The device.
        device: String,
        /// Where.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// A block does not check, or is not the block the extent names.
    #[error("{device}: bad block at {position}: {reason}")]
    BadBlock {
        /// The device.
        device: String,
        /// Where.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// The medium ended while writing an object; the object is incomplete
    /// on this tape. Blocks written before (other objects, earlier runs)
    /// are intact, and a catalog still fits in the early-warning zone.
    #[error("{device}: end of medium while writing object {object_id}")]
    EndOfMedium {
        /// The device.
        device: String,
        /// The object that did not fit.
        object_id: u64,
    },
    /// A call the layout cannot honour.
    #[error("{device}: {message}")]
    InvalidArgument {
        /// The device.
        device: String,
        /// What was wrong.
        message: String,
    },
    /// The device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Result of a layout operation.
pub type Result<T, E = LayoutError> = std::result::Result<T, E>;

/// Why bytes are not a label (see [`Label::parse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelError {
    /// No Cairn magic.
    NotCairn,
    /// A version this code does not read.
    UnknownVersion(u32),
    /// The magic is right but the rest does not check.
    Damaged(String),
}

/// The volume label, the first block of the tape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// Layout format version.
    pub version: u32,
    /// Block size of every block on the tape.
    pub block_size: u32,
    /// The volume.
    pub volume_id: VolumeId,
    /// When the tape was formatted, seconds since the epoch.
    pub created: u64,
    /// The caller's bytes (e.g. the volume config, so that an encrypted
    /// tape can be opened from the tape alone), at most
    /// `block_size - 64` bytes.
    pub info: Vec<u8>,
}

impl Label {
    /// A version-1 label.
    pub fn new(volume_id: VolumeId, block_size: u32, created: u64, info: &[u8]) -> Self {
        Label {
            version: FORMAT_VERSION,
            block_size,
            volume_id,
            created,
            info: info.to_vec(),
        }
    }

    /// The label block (`block_size` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.block_size as usize];
        b[0..8].copy_from_slice(LABEL_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        b[16..32].copy_from_slice(&self.volume_id.0);
        b[32..40].copy_from_slice(&self.created.to_le_bytes());
        b[40..44].copy_from_slice(&(self.info.len() as u32).to_le_bytes());
        b[64..64 + self.info.len()].copy_from_slice(&self.info);
        let mut h = crc32fast::Hasher::new();
        h.update(&b[..60]);
        h.update(&self.info);
        b[60..64].copy_from_slice(&h.finalize().to_le_bytes());
        b
    }

    /// Parses a label block; never panics, whatever the bytes.
    pub fn parse(b: &[u8]) -> std::result::Result<Label, LabelError> {
        if b.len() < LABEL_FIXED_LEN || &b[0..8] != LABEL_MAGIC {
            return Err(LabelError::NotCairn);
        }
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION {
            return Err(LabelError::UnknownVersion(version));
        }
        let block_size = u32_at(b, 12);
        let info_len = u32_at(b, 40) as usize;
        if info_len > b.len() - LABEL_FIXED_LEN {
            return Err(LabelError::Damaged(format!(
                "info length {info_len} runs past the block"
            )));
        }
        if b[44..60].iter().any(|&x| x != 0) {
            return Err(LabelError::Damaged("reserved bytes are not zero".into()));
        }
        let info = &b[64..64 + info_len];
        let mut h = crc32fast::Hasher::new();
        h.update(&b[..60]);
        h.update(info);
        if h.finalize() != u32_at(b, 60) {
            return Err(LabelError::Damaged("checksum mismatch".into()));
        }
        if (block_size as usize) < LABEL_FIXED_LEN + info_len {
            return Err(LabelError::Damaged(format!(
                "block size {block_size} cannot hold the label"
            )));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[16..32]);
        Ok(Label {
            version,
            block_size,
            volume_id: VolumeId(id),
            created: u64_at(b, 32),
            info: info.to_vec(),
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// What a block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// Part of an object (caller data).
    Data,
    /// Part of a catalog.
    Catalog,
}

/// The header at the start of every data and catalog block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// Data or catalog.
    pub kind: BlockKind,
    /// The last block of its object (or catalog).
    pub last: bool,
    /// The volume the block belongs to.
    pub volume_id: VolumeId,
    /// The object (for a catalog block, the catalog's generation).
    pub object_id: u64,
    /// Index of this block within its object, from 0.
    pub seq: u64,
    /// Byte offset of the payload within the object.
    pub offset: u64,
    /// Payload bytes in this block (the rest is zero padding).
    pub payload_len: u32,
}

impl BlockHeader {
    /// Writes the header, `payload` and zero padding into `block` (one
    /// whole block; `payload` fits after the header).
    pub fn encode(&self, payload: &[u8], block: &mut [u8]) {
        debug_assert_eq!(payload.len(), self.payload_len as usize);
        block[0..4].copy_from_slice(BLOCK_MAGIC);
        block[4] = match self.kind {
            BlockKind::Data => 1,
            BlockKind::Catalog => 2,
        };
        block[5] = self.last as u8;
        block[6..8].fill(0);
        block[8..24].copy_from_slice(&self.volume_id.0);
        block[24..32].copy_from_slice(&self.object_id.to_le_bytes());
        block[32..40].copy_from_slice(&self.seq.to_le_bytes());
        block[40..48].copy_from_slice(&self.offset.to_le_bytes());
        block[48..52].copy_from_slice(&self.payload_len.to_le_bytes());
        block[52..60].fill(0);
        block[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
        block[HEADER_LEN + payload.len()..].fill(0);
        let mut h = crc32fast::Hasher::new();
        h.update(&block[..60]);
        h.update(payload);
        block[60..64].copy_from_slice(&h.finalize().to_le_bytes());
    }

    /// Parses and checks a block; returns its header and payload. Never
    /// panics, whatever the bytes.
    pub fn decode(block: &[u8]) -> std::result::Result<(BlockHeader, &[u8]), String> {
        if block.len() < HEADER_LEN {
            return Err(format!(
                "{}-byte block is shorter than a header",
                block.len()
            ));
        }
        if &block[0..4] != BLOCK_MAGIC {
            return Err("not a Cairn block (no block magic)".into());
        }
        let kind = match block[4] {
            1 => BlockKind::Data,
            2 => BlockKind::Catalog,
            k => return Err(format!("unknown block kind {k}")),
        };
        if block[5] > 1 || block[6..8] != [0, 0] || block[52..60].iter().any(|&x| x != 0) {
            return Err("unknown flags or non-zero reserved bytes".into());
        }
        let payload_len = u32_at(block, 48);
        if payload_len as usize > block.len() - HEADER_LEN {
            return Err(format!("payload length {payload_len} runs past the block"));
        }
        let payload = &block[HEADER_LEN..HEADER_LEN + payload_len as usize];
        let mut h = crc32fast::Hasher::new();
        h.update(&block[..60]);
        h.update(payload);
        if h.finalize() != u32_at(block, 60) {
            return Err("checksum mismatch".into());
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&block[8..24]);
        let hdr = BlockHeader {
            kind,
            last: block[5] == 1,
            volume_id: VolumeId(id),
            object_id: u64_at(block, 24),
            seq: u64_at(block, 32),
            offset: u64_at(block, 40),
            payload_len,
        };
        if hdr.offset.checked_add(payload_len as u64).is_none() {
            return Err("offset overflows".into());
        }
        Ok((hdr, payload))
    }
}

/// Frames a catalog: magic, length and BLAKE3-256 of the bytes, then the bytes.
pub fn frame_catalog(catalog: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(CATALOG_FRAME_LEN + catalog.len());
    f.extend_from_slice(CATALOG_MAGIC);
    f.extend_from_slice(&(catalog.len() as u64).to_le_bytes());
    f.extend_from_slice(blake3::hash(catalog).as_bytes());
    f.extend_from_slice(catalog);
    f
}

/// Checks a framed catalog and returns the catalog bytes. Never panics.
pub fn unframe_catalog(framed: &[u8]) -> std::result::Result<&[u8], String> {
    if framed.len() < CATALOG_FRAME_LEN || &framed[..8] != CATALOG_MAGIC {
        return Err("no catalog frame".into());
    }
    let len = u64_at(framed, 8);
    if len != (framed.len() - CATALOG_FRAME_LEN) as u64 {
        return Err(format!(
            "catalog length {len} but {} bytes follow the frame",
            framed.len() - CATALOG_FRAME_LEN
        ));
    }
    let body = &framed[CATALOG_FRAME_LEN..];
    if blake3::hash(body).as_bytes() != &framed[16..48] {
        return Err("catalog checksum mismatch".into());
    }
    Ok(body)
}

/// A run of consecutive blocks of one object on the tape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Extent {
    /// The object.
    pub object_id: u64,
    /// Position of the first block.
    pub start: u64,
    /// Number of blocks.
    pub blocks: u64,
    /// Sequence number of the first block within the object.
    pub first_seq: u64,
    /// Byte offset within the object of the first block's payload.
    pub offset: u64,
    /// Payload bytes in the run.
    pub len: u64,
}

/// Where appending continues: the data end `D` (the filemark before the
/// catalog, which appending overwrites) and the next catalog generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendPoint {
    /// Position where the next data block goes.
    pub data_end: u64,
    /// Generation of the next catalog.
    pub next_generation: u64,
}

/// Where a catalog was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogLocation {
    /// Position of its first block (a hint for [`read_catalog`]).
    pub start: u64,
    /// Its blocks.
    pub blocks: u64,
    /// Its generation (1 for the catalog written by [`format`]).
    pub generation: u64,
}

impl CatalogLocation {
    /// Where appending after this catalog continues.
    pub fn append_point(&self) -> AppendPoint {
        AppendPoint {
            data_end: self.start - 1,
            next_generation: self.generation + 1,
        }
    }
}

/// A catalog read back from the tape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    /// The caller's catalog bytes, checked.
    pub bytes: Vec<u8>,
    /// Where it is.
    pub location: CatalogLocation,
}

impl Catalog {
    /// Where appending after this catalog continues.
    pub fn append_point(&self) -> AppendPoint {
        self.location.append_point()
    }
}

fn name<D: TapeDevice + ?Sized>(dev: &D) -> String {
    dev.name().to_string()
}

/// Formats a tape: label, filemark, an empty data segment, and `catalog`.
/// Overwrites whatever the tape held; check with [`read_label`] first.
pub fn format<D: TapeDevice + ?Sized>(
    dev: &mut D,
    label: &Label,
    catalog: &[u8],
) -> Result<CatalogLocation> {
    check_block_size(dev, label)?;
    if label.info.len() > label.block_size as usize - LABEL_FIXED_LEN {
        return Err(LayoutError::InvalidArgument {
            device: name(dev),
            message: format!(
                "label info of {} bytes does not fit a {}-byte block",
                label.info.len(),
                label.block_size
            ),
        });
    }
    dev.rewind()?;
    dev.write_blocks(&label.encode())?;
    dev.write_filemarks(1)?;
    let mut w = TapeWriter::new(
        label,
        AppendPoint {
            data_end: DATA_START,
            next_generation: 1,
        },
    );
    w.write_catalog(dev, catalog)
}

fn check_block_size<D: TapeDevice + ?Sized>(dev: &D, label: &Label) -> Result<()> {
    if label.block_size as usize != dev.block_size() {
        return Err(LayoutError::BlockSizeMismatch {
            device: name(dev),
            tape: label.block_size,
            device_block_size: dev.block_size(),
        });
    }
    Ok(())
}

/// Rewinds and reads the label; with `expect`, a label of another volume is
/// [`LayoutError::WrongVolume`].
pub fn read_label<D: TapeDevice + ?Sized>(dev: &mut D, expect: Option<VolumeId>) -> Result<Label> {
    dev.rewind()?;
    let mut buf = vec![0u8; dev.block_size()];
    match dev.read_blocks(&mut buf)? {
        ReadOutcome::EndOfData => return Err(LayoutError::BlankTape { device: name(dev) }),
        ReadOutcome::Filemark => return Err(LayoutError::NotCairnTape { device: name(dev) }),
        ReadOutcome::Blocks(_) => {}
    }
    let label = match Label::parse(&buf) {
        Ok(l) => l,
        Err(LabelError::NotCairn) => return Err(LayoutError::NotCairnTape { device: name(dev) }),
        Err(LabelError::UnknownVersion(version)) => {
            return Err(LayoutError::UnknownVersion {
                device: name(dev),
                version,
            })
        }
        Err(LabelError::Damaged(reason)) => {
            return Err(LayoutError::DamagedLabel {
                device: name(dev),
                reason,
            })
        }
    };
    check_block_size(dev, &label)?;
    if let Some(expected) = expect {
        if label.volume_id != expected {
            return Err(LayoutError::WrongVolume {
                device: name(dev),
                expected,
                found: label.volume_id,
            });
        }
    }
    Ok(label)
}

/// What reading one block at the current position met.
enum One {
    Block,
    Filemark,
    End,
}

fn read_one<D: TapeDevice + ?Sized>(dev: &mut D) -> Result<One> {
    let mut buf = vec![0u8; dev.block_size()];
    Ok(match dev.read_blocks(&mut buf)? {
        ReadOutcome::Blocks(_) => One::Block,
        ReadOutcome::Filemark => One::Filemark,
        ReadOutcome::EndOfData => One::End,
    })
}

/// The end of the tape read in one pass when a catalog is looked for:
/// a catalog this long or shorter (with the filemarks around it) costs no
/// locate back to its start. Reading it takes 0.2 s on the default
/// emulated drive (80 MB/s) and 0.04 s on LTO-9, against 3 s or more for
/// the locate it saves (docs/tape.md §8).
pub const CATALOG_WINDOW: u64 = 16 << 20;

/// Reads the catalog. With a `hint` (the start position returned when it
/// was written), reads it there and checks that it is the last thing on
/// the tape; otherwise (or if the hint is stale) spaces to the end of data
/// and reads the last [`CATALOG_WINDOW`] bytes before it forward: two
/// locates in all, and the tape is left at the end of data. A catalog
/// longer than the window costs one locate more, back to its start. The
/// tape is never scanned. A tape that ends in data blocks (no catalog was
/// written after the last append) gives [`LayoutError::NoCatalog`]; a
/// catalog that does not check gives [`LayoutError::DamagedCatalog`].
pub fn read_catalog<D: TapeDevice + ?Sized>(
    dev: &mut D,
    label: &Label,
    hint: Option<u64>,
) -> Result<Catalog> {
    read_catalog_passing(dev, label, hint, &mut |_, _| {})
}

/// [`read_catalog`], also handing `passed` the data blocks of the volume
/// read with the window before the catalog (the last objects written): a
/// caller that will read them keeps them instead of reading them again.
pub fn read_catalog_passing<D: TapeDevice + ?Sized>(
    dev: &mut D,
    label: &Label,
    hint: Option<u64>,
    passed: &mut dyn FnMut(&BlockHeader, &[u8]),
) -> Result<Catalog> {
    check_block_size(dev, label)?;
    if let Some(start) = hint {
        if let Ok(c) = read_catalog_at(dev, label, start, None, Vec::new()) {
            // The last thing on the tape: a filemark, then end of data
            // (read on rather than locate: a locate costs seconds).
            if matches!(read_one(dev), Ok(One::Filemark)) && matches!(read_one(dev), Ok(One::End)) {
                return Ok(c);
            }
        }
    }
    dev.space_to_eod()?;
    let eod = dev.position()?;
    if eod < DATA_START + 2 {
        return Err(LayoutError::NoCatalog {
            device: name(dev),
            reason: format!("the tape ends at block {eod}"),
        });
    }
    let bs = dev.block_size();
    let from = eod.saturating_sub((CATALOG_WINDOW / bs as u64).max(2)).max(DATA_START);
    dev.locate(from)?;
    // What lies at from..eod: blocks (their bytes) and filemarks (None).
    let mut tail: Vec<Option<Vec<u8>>> = Vec::with_capacity((eod - from) as usize);
    let mut buf = vec![0u8; BATCH_BLOCKS * bs];
    while (tail.len() as u64) < eod - from {
        let want = ((eod - from) as usize - tail.len()).min(BATCH_BLOCKS);
        match dev.read_blocks(&mut buf[..want * bs])? {
            ReadOutcome::Blocks(n) => tail.extend(buf[..n * bs].chunks(bs).map(|b| Some(b.to_vec()))),
            ReadOutcome::Filemark => tail.push(None),
            ReadOutcome::EndOfData => break,
        }
    }
    let at = |p: u64| p.checked_sub(from).and_then(|i| tail.get(i as usize)).and_then(|b| b.as_deref());
    let no_catalog = |dev: &D, reason: &str| LayoutError::NoCatalog {
        device: name(dev),
        reason: reason.into(),
    };
    // The tape ends `catalog's last block, filemark`; a crash between the
    // catalog and that filemark leaves the catalog's last block last.
    let end = from + tail.len() as u64;
    let is_block = |p: u64| at(p).is_some();
    let last_pos = if end > from && is_block(end - 1) {
        end - 1
    } else if end >= from + 2 && is_block(end - 2) {
        end - 2
    } else if end > from {
        return Err(no_catalog(dev, "the data segment ends without a catalog"));
    } else {
        return Err(no_catalog(dev, "unexpected end of data"));
    };
    let block = at(last_pos).expect("a block");
    let (h, _) = BlockHeader::decode(block).map_err(|reason| LayoutError::DamagedCatalog {
        device: name(dev),
        position: last_pos,
        reason,
    })?;
    if h.volume_id != label.volume_id {
        return Err(LayoutError::DamagedCatalog {
            device: name(dev),
            position: last_pos,
            reason: format!("the last block belongs to volume {}", h.volume_id),
        });
    }
    if h.kind == BlockKind::Data {
        let reason = match last_pos + 1 == end {
            true => format!("the tape ends in data blocks (object {} at block {last_pos})", h.object_id),
            false => "the data segment ends without a catalog".to_string(),
        };
        return Err(LayoutError::NoCatalog { device: name(dev), reason });
    }
    if !h.last || h.seq > last_pos {
        return Err(LayoutError::DamagedCatalog {
            device: name(dev),
            position: last_pos,
            reason: "the catalog's last block is missing".into(),
        });
    }
    let start = last_pos - h.seq;
    // Within the window: checked from the blocks read, no locate back.
    let read: Vec<Vec<u8>> = match start >= from {
        true => (start..=last_pos).map_while(|p| at(p).map(<[u8]>::to_vec)).collect(),
        false => Vec::new(),
    };
    if start >= from && read.len() as u64 != h.seq + 1 {
        return Err(LayoutError::DamagedCatalog {
            device: name(dev),
            position: start + read.len() as u64,
            reason: "a filemark inside the catalog".into(),
        });
    }
    let c = read_catalog_at(dev, label, start, Some(h.object_id), read)?;
    for b in (from..start.max(from)).filter_map(at) {
        if let Ok((h, payload)) = BlockHeader::decode(b) {
            if h.kind == BlockKind::Data && h.volume_id == label.volume_id {
                passed(&h, payload);
            }
        }
    }
    if start < from {
        // Leave the tape at the end of data, where the next write starts
        // (reading on from the catalog's last block: its filemark, if any).
        let _ = read_one(dev);
    }
    Ok(c)
}

/// Reads and checks the catalog that starts at `start`. `read`: its blocks
/// already in hand, in order from `start` (the tape is then not moved);
/// when empty, the tape is located to `start` and read.
fn read_catalog_at<D: TapeDevice + ?Sized>(
    dev: &mut D,
    label: &Label,
    start: u64,
    generation: Option<u64>,
    read: Vec<Vec<u8>>,
) -> Result<Catalog> {
    let damaged = |dev: &D, position: u64, reason: String| LayoutError::DamagedCatalog {
        device: name(dev),
        position,
        reason,
    };
    let in_hand = !read.is_empty();
    if !in_hand {
        dev.locate(start)?;
    }
    let mut read = read.into_iter();
    let bs = dev.block_size();
    let mut framed = Vec::new();
    let mut buf = vec![0u8; BATCH_BLOCKS * bs];
    let mut seq = 0u64;
    let mut gen = generation;
    loop {
        let n = match read.next() {
            Some(b) => {
                buf[..bs].copy_from_slice(&b);
                1
            }
            None if in_hand => {
                return Err(damaged(dev, start + seq, "the catalog ends before its last block".into()))
            }
            None => match dev.read_blocks(&mut buf)? {
                ReadOutcome::Blocks(n) => n,
                _ => {
                    return Err(damaged(
                        dev,
                        start + seq,
                        "the catalog ends before its last block".into(),
                    ))
                }
            },
        };
        for i in 0..n {
            let pos = start + seq;
            let (h, payload) = BlockHeader::decode(&buf[i * bs..(i + 1) * bs])
                .map_err(|r| damaged(dev, pos, r))?;
            if h.kind != BlockKind::Catalog || h.volume_id != label.volume_id {
                return Err(damaged(
                    dev,
                    pos,
                    "not a catalog block of this volume".into(),
                ));
            }
            if *gen.get_or_insert(h.object_id) != h.object_id
                || h.seq != seq
                || h.offset != framed.len() as u64
            {
                return Err(damaged(
                    dev,
                    pos,
                    format!("block {} of catalog {} out of order", h.seq, h.object_id),
                ));
            }
            framed.extend_from_slice(payload);
            if framed.len() >= 16 {
                let declared = u64_at(&framed, 8);
                if declared > CATALOG_MAX || framed.len() as u64 > CATALOG_FRAME_LEN as u64 + declared {
                    return Err(damaged(dev, pos, format!("the catalog runs past its declared length ({declared} bytes; at most {CATALOG_MAX})")));
                }
            }
            seq += 1;
            if h.last {
                if i + 1 != n || read.len() != 0 {
                    return Err(damaged(
                        dev,
                        pos + 1,
                        "blocks follow the catalog's last block".into(),
                    ));
                }
                let bytes = unframe_catalog(&framed)
                    .map_err(|r| damaged(dev, start, r))?
                    .to_vec();
                return Ok(Catalog {
                    bytes,
                    location: CatalogLocation {
                        start,
                        blocks: seq,
                        generation: h.object_id,
                    },
                });
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Open {
    next_seq: u64,
    next_offset: u64,
}

/// Appends objects to a tape, in runs that may interleave with other
/// objects' runs, and writes catalogs.
///
/// The writer does not hold the device: every call takes it, so the caller
/// can read in between (the writer locates back before its next write).
/// Object ids are the caller's and must never be reused on a volume (after
/// a recovery, start above [`ScanReport::max_object_id`]).
#[derive(Debug)]
pub struct TapeWriter {
    volume_id: VolumeId,
    block_size: usize,
    next_pos: u64,
    generation: u64,
    open: HashMap<u64, Open>,
}

impl TapeWriter {
    /// A writer appending at `at` (from [`Catalog::append_point`],
    /// [`CatalogLocation::append_point`] or [`ScanReport::append_point`]).
    pub fn new(label: &Label, at: AppendPoint) -> Self {
        TapeWriter {
            volume_id: label.volume_id,
            block_size: label.block_size as usize,
            next_pos: at.data_end,
            generation: at.next_generation,
            open: HashMap::new(),
        }
    }

    /// Payload bytes per block (block size minus the header). Runs that
    /// are a multiple of it waste no padding.
    pub fn payload_capacity(&self) -> usize {
        self.block_size - HEADER_LEN
    }

    /// Where the next block will be written.
    pub fn position(&self) -> u64 {
        self.next_pos
    }

    /// Objects started but not yet written with `last`.
    pub fn open_objects(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.open.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Appends `data` to object `object_id` as one run of consecutive
    /// blocks (its last block padded), and returns where it went; `last`
    /// marks the object's end. The data is in the drive (not yet durable:
    /// see [`flush`](Self::flush)). On [`LayoutError::EndOfMedium`] the
    /// object is incomplete on this tape; other objects are not affected.
    pub fn write<D: TapeDevice + ?Sized>(
        &mut self,
        dev: &mut D,
        object_id: u64,
        data: &[u8],
        last: bool,
    ) -> Result<Extent> {
        self.write_parts(dev, object_id, &[], data, last)
    }

    /// As [`write`](Self::write) with `head` followed by `data`: the same
    /// blocks as their concatenation, without copying `data` (a pack is
    /// tens of MiB; only the first block's payload is assembled).
    pub fn write_parts<D: TapeDevice + ?Sized>(
        &mut self,
        dev: &mut D,
        object_id: u64,
        head: &[u8],
        data: &[u8],
        last: bool,
    ) -> Result<Extent> {
        if dev.block_size() != self.block_size {
            return Err(LayoutError::BlockSizeMismatch {
                device: name(dev),
                tape: self.block_size as u32,
                device_block_size: dev.block_size(),
            });
        }
        let st = self.open.get(&object_id).copied().unwrap_or(Open {
            next_seq: 0,
            next_offset: 0,
        });
        let cap = self.payload_capacity();
        let total = head.len() + data.len();
        let nblocks = if total == 0 {
            u64::from(last)
        } else {
            total.div_ceil(cap) as u64
        };
        let extent = Extent {
            object_id,
            start: self.next_pos,
            blocks: nblocks,
            first_seq: st.next_seq,
            offset: st.next_offset,
            len: total as u64,
        };
        if nblocks == 0 {
            return Ok(extent);
        }
        if let Err(e) = self.position_for_write(dev) {
            self.open.remove(&object_id);
            return Err(e);
        }
        // The head and as much of the data as fills its last block, copied;
        // the rest of the data cut into blocks where it lies.
        let split = data.len().min((cap - head.len() % cap) % cap);
        let mut first = Vec::with_capacity(head.len() + split);
        first.extend_from_slice(head);
        first.extend_from_slice(&data[..split]);
        let chunks: Vec<&[u8]> = if total == 0 {
            vec![&[][..]]
        } else {
            first.chunks(cap).chain(data[split..].chunks(cap)).collect()
        };
        let mut buf = vec![0u8; BATCH_BLOCKS.min(chunks.len()) * self.block_size];
        let mut seq = st.next_seq;
        let mut offset = st.next_offset;
        for (b, batch) in chunks.chunks(BATCH_BLOCKS).enumerate() {
            for (i, payload) in batch.iter().enumerate() {
                let is_last = last && b * BATCH_BLOCKS + i + 1 == chunks.len();
                let h = BlockHeader {
                    kind: BlockKind::Data,
                    last: is_last,
                    volume_id: self.volume_id,
                    object_id,
                    seq,
                    offset,
                    payload_len: payload.len() as u32,
                };
                h.encode(
                    payload,
                    &mut buf[i * self.block_size..(i + 1) * self.block_size],
                );
                seq += 1;
                offset += payload.len() as u64;
            }
            match dev.write_blocks(&buf[..batch.len() * self.block_size]) {
                Ok(()) => self.next_pos += batch.len() as u64,
                Err(DeviceError::EndOfMedium { written_blocks, .. }) => {
                    self.next_pos += written_blocks;
                    self.open.remove(&object_id);
                    return Err(LayoutError::EndOfMedium {
                        device: name(dev),
                        object_id,
                    });
                }
                Err(e) => {
                    self.open.remove(&object_id);
                    if let Ok(p) = dev.position() {
                        self.next_pos = p;
                    }
                    return Err(e.into());
                }
            }
        }
        if last {
            self.open.remove(&object_id);
        } else {
            self.open.insert(
                object_id,
                Open {
                    next_seq: seq,
                    next_offset: offset,
                },
            );
        }
        Ok(extent)
    }

    /// Forgets an unfinished object (its blocks stay on the tape, and a
    /// scan reports it incomplete).
    pub fn abandon(&mut self, object_id: u64) {
        self.open.remove(&object_id);
    }

    /// Moves the tape to where the next block will be written, ahead of
    /// the write (a writer locates there by itself otherwise).
    pub fn prepare<D: TapeDevice + ?Sized>(&mut self, dev: &mut D) -> Result<()> {
        self.position_for_write(dev)
    }

    fn position_for_write<D: TapeDevice + ?Sized>(&mut self, dev: &mut D) -> Result<()> {
        if dev.position()? != self.next_pos {
            dev.locate(self.next_pos)?;
        }
        Ok(())
    }

    /// Makes every block written so far durable (a drive flush; on a real
    /// drive this stops the tape, so the next write backhitches).
    pub fn flush<D: TapeDevice + ?Sized>(&mut self, dev: &mut D) -> Result<()> {
        dev.flush()?;
        Ok(())
    }

    /// Ends the data segment and writes `catalog` after it: filemark (in
    /// immediate mode: the tape keeps streaming), the framed catalog,
    /// filemark (which makes the data and then the catalog durable). The writer stays usable: its next block
    /// overwrites this catalog. Unfinished objects may continue after it.
    pub fn write_catalog<D: TapeDevice + ?Sized>(
        &mut self,
        dev: &mut D,
        catalog: &[u8],
    ) -> Result<CatalogLocation> {
        self.position_for_write(dev)?;
        let data_end = self.next_pos;
        // No sync point here: the drive writes its buffer in order, so a
        // catalog that reached the tape whole has every data block before
        // it there too, and a torn one is refused by its length and hash.
        // Waiting would stop the tape, and the catalog's first block would
        // then start it again with a backhitch (seconds) at every sync.
        dev.write_filemarks_immediate(1)?;
        let framed = frame_catalog(catalog);
        let cap = self.payload_capacity();
        let chunks: Vec<&[u8]> = framed.chunks(cap).collect();
        let mut buf = vec![0u8; BATCH_BLOCKS.min(chunks.len()) * self.block_size];
        let mut offset = 0u64;
        for (b, batch) in chunks.chunks(BATCH_BLOCKS).enumerate() {
            for (i, payload) in batch.iter().enumerate() {
                let seq = (b * BATCH_BLOCKS + i) as u64;
                let h = BlockHeader {
                    kind: BlockKind::Catalog,
                    last: seq + 1 == chunks.len() as u64,
                    volume_id: self.volume_id,
                    object_id: self.generation,
                    seq,
                    offset,
                    payload_len: payload.len() as u32,
                };
                h.encode(
                    payload,
                    &mut buf[i * self.block_size..(i + 1) * self.block_size],
                );
                offset += payload.len() as u64;
            }
            match dev.write_blocks(&buf[..batch.len() * self.block_size]) {
                Ok(()) => {}
                Err(DeviceError::EndOfMedium { .. }) => {
                    // Past the early warning the next write goes through.
                    dev.write_blocks(&buf[..batch.len() * self.block_size])?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        dev.write_filemarks(1)?;
        let loc = CatalogLocation {
            start: data_end + 1,
            blocks: chunks.len() as u64,
            generation: self.generation,
        };
        self.next_pos = data_end;
        self.generation += 1;
        Ok(loc)
    }
}

/// A gap up to this many bytes ahead is read through rather than located
/// over: a locate costs seconds whatever the distance (3 s on LTO before
/// any travel), reading on costs the gap at the streaming rate (256 MiB:
/// 3.4 s at 80 MB/s, 0.7 s at LTO-9's 400 MB/s), and the tape keeps moving.
pub const READ_THROUGH_BYTES: u64 = 256 << 20;

/// Reads `blocks` blocks from the current position (a gap before the next
/// extent), handing each data block of the volume that checks to `passed`
/// (its header and payload; blocks that fail their checks are skipped, as
/// nobody asked for them); false, with the tape wherever it got to, if the
/// gap is longer than [`READ_THROUGH_BYTES`] or holds a filemark or the end
/// of data (the caller then locates).
fn read_through<D: TapeDevice + ?Sized>(
    dev: &mut D,
    label: &Label,
    blocks: u64,
    buf: &mut [u8],
    passed: &mut dyn FnMut(&BlockHeader, &[u8]),
) -> Result<bool> {
    let bs = dev.block_size();
    if blocks * bs as u64 > READ_THROUGH_BYTES {
        return Ok(false);
    }
    let mut left = blocks;
    while left > 0 {
        let want = left.min((buf.len() / bs) as u64) as usize;
        match dev.read_blocks(&mut buf[..want * bs])? {
            ReadOutcome::Blocks(n) => {
                left -= n as u64;
                for b in buf[..n * bs].chunks(bs) {
                    if let Ok((h, payload)) = BlockHeader::decode(b) {
                        if h.kind == BlockKind::Data && h.volume_id == label.volume_id {
                            passed(&h, payload);
                        }
                    }
                }
            }
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// Reads extents in the order given (sort them by `start` for one pass),
/// checking every block against the extent (volume, object, sequence,
/// offset, checksum), and hands each block's payload to `sink` with its
/// byte offset within the object.
pub fn read_extents<D, F>(dev: &mut D, label: &Label, extents: &[Extent], sink: F) -> Result<()>
where
    D: TapeDevice + ?Sized,
    F: FnMut(&Extent, u64, &[u8]) -> Result<()>,
{
    read_extents_passing(dev, label, extents, sink, &mut |_, _| {})
}

/// [`read_extents`], also handing `passed` the data blocks read through
/// between extents (a gap up to [`READ_THROUGH_BYTES`] is read rather than
/// located over): the tape has read them anyway, and a caller that will
/// want them keeps them instead of locating back later.
pub fn read_extents_passing<D, F>(
    dev: &mut D,
    label: &Label,
    extents: &[Extent],
    mut sink: F,
    passed: &mut dyn FnMut(&BlockHeader, &[u8]),
) -> Result<()>
where
    D: TapeDevice + ?Sized,
    F: FnMut(&Extent, u64, &[u8]) -> Result<()>,
{
    check_block_size(dev, label)?;
    let bs = dev.block_size();
    let mut buf = vec![0u8; BATCH_BLOCKS * bs];
    for e in extents {
        if e.blocks == 0 {
            continue;
        }
        let at = dev.position()?;
        if at != e.start && !(e.start > at && read_through(dev, label, e.start - at, &mut buf, passed)?) {
            dev.locate(e.start)?;
        }
        let mut done = 0u64;
        let mut offset = e.offset;
        while done < e.blocks {
            let want = (e.blocks - done).min(BATCH_BLOCKS as u64) as usize;
            let pos = e.start + done;
            let n = match dev.read_blocks(&mut buf[..want * bs])? {
                ReadOutcome::Blocks(n) => n,
                ReadOutcome::Filemark => {
                    return Err(bad(
                        dev,
                        pos,
                        format!(
                            "filemark where block {} of object {} belongs",
                            e.first_seq + done,
                            e.object_id
                        ),
                    ))
                }
                ReadOutcome::EndOfData => {
                    return Err(bad(
                        dev,
                        pos,
                        format!(
                            "end of data where block {} of object {} belongs",
                            e.first_seq + done,
                            e.object_id
                        ),
                    ))
                }
            };
            for i in 0..n {
                let p = pos + i as u64;
                let (h, payload) =
                    BlockHeader::decode(&buf[i * bs..(i + 1) * bs]).map_err(|r| bad(dev, p, r))?;
                let seq = e.first_seq + done + i as u64;
                if h.volume_id != label.volume_id {
                    return Err(bad(dev, p, format!("block of volume {}", h.volume_id)));
                }
                if h.kind != BlockKind::Data
                    || h.object_id != e.object_id
                    || h.seq != seq
                    || h.offset != offset
                {
                    return Err(bad(
                        dev,
                        p,
                        format!(
                            "expected block {seq} of object {} at offset {offset}, found {:?} block {} of object {} at offset {}",
                            e.object_id, h.kind, h.seq, h.object_id, h.offset
                        ),
                    ));
                }
                sink(e, offset, payload)?;
                offset += payload.len() as u64;
            }
            done += n as u64;
        }
        if offset - e.offset != e.len {
            return Err(bad(
                dev,
                e.start,
                format!(
                    "extent of object {} holds {} bytes, not {}",
                    e.object_id,
                    offset - e.offset,
                    e.len
                ),
            ));
        }
    }
    Ok(())
}

fn bad<D: TapeDevice + ?Sized>(dev: &D, position: u64, reason: String) -> LayoutError {
    LayoutError::BadBlock {
        device: name(dev),
        position,
        reason,
    }
}

/// Reads a whole object from its extents (in any order; read in position
/// order) and returns its bytes; the extents must cover it from offset 0
/// without gaps.
pub fn read_object<D: TapeDevice + ?Sized>(
    dev: &mut D,
    label: &Label,
    extents: &[Extent],
) -> Result<Vec<u8>> {
    let mut sorted = extents.to_vec();
    sorted.sort_by_key(|e| e.start);
    let total: u64 = sorted.iter().map(|e| e.len).sum();
    let end = sorted.iter().map(|e| e.offset + e.len).max().unwrap_or(0);
    if end != total {
        return Err(LayoutError::InvalidArgument {
            device: name(dev),
            message: format!("extents cover {total} bytes but reach offset {end}"),
        });
    }
    let mut out = vec![0u8; total as usize];
    let mut covered = 0u64;
    read_extents(dev, label, &sorted, |_, off, payload| {
        out[off as usize..off as usize + payload.len()].copy_from_slice(payload);
        covered += payload.len() as u64;
        Ok(())
    })?;
    debug_assert_eq!(covered, total);
    Ok(out)
}

/// One object as a scan found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedObject {
    /// The object.
    pub object_id: u64,
    /// Its runs, in position order.
    pub extents: Vec<Extent>,
    /// Payload bytes found.
    pub len: u64,
    /// Every block from 0 to one marked last, in order, without gaps.
    pub complete: bool,
    /// Why it is incomplete.
    pub problem: Option<String>,
}

/// A block a scan could not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBlock {
    /// Where.
    pub position: u64,
    /// Why.
    pub reason: String,
}

/// What [`scan`] found on a tape.
#[derive(Debug, Clone)]
pub struct ScanReport {
    /// The label.
    pub label: Label,
    /// Every object with at least one block, by id.
    pub objects: BTreeMap<u64, ScannedObject>,
    /// The newest complete catalog found after the data, if any.
    pub catalog: Option<Catalog>,
    /// Blocks that failed their checks.
    pub bad_blocks: Vec<BadBlock>,
    /// Blocks of another volume.
    pub foreign_blocks: u64,
    /// Positions of filemarks after the label's.
    pub filemarks: Vec<u64>,
    /// End of recorded data.
    pub end_of_data: u64,
    /// The highest object id seen (start new ids above it).
    pub max_object_id: Option<u64>,
    /// The highest catalog generation seen.
    pub max_generation: u64,
    /// Position after the last good data block.
    pub data_end: u64,
}

impl ScanReport {
    /// Objects whose every block was found.
    pub fn complete(&self) -> impl Iterator<Item = &ScannedObject> {
        self.objects.values().filter(|o| o.complete)
    }

    /// Objects with missing blocks (named by a recovery).
    pub fn incomplete(&self) -> impl Iterator<Item = &ScannedObject> {
        self.objects.values().filter(|o| !o.complete)
    }

    /// Where to append (and write the rebuilt catalog): after the last data
    /// block, with a generation above every catalog seen.
    pub fn append_point(&self) -> AppendPoint {
        AppendPoint {
            data_end: self.data_end,
            next_generation: self.max_generation + 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    pos: u64,
    seq: u64,
    offset: u64,
    len: u64,
    last: bool,
}

/// Reads every block from the label to the end of data and rebuilds each
/// object's extents from the block headers (`tape recover`). Unreadable or
/// failing blocks are reported, not fatal; only a missing label (or one of
/// another volume, with `expect`) stops the scan.
pub fn scan<D: TapeDevice + ?Sized>(dev: &mut D, expect: Option<VolumeId>) -> Result<ScanReport> {
    let label = read_label(dev, expect)?;
    check_block_size(dev, &label)?;
    let bs = dev.block_size();
    dev.locate(DATA_START - 1)?;
    match read_one(dev)? {
        One::Filemark => {}
        _ => {
            return Err(LayoutError::DamagedLabel {
                device: name(dev),
                reason: "no filemark after the label".into(),
            });
        }
    }
    let mut data: BTreeMap<u64, Vec<Seen>> = BTreeMap::new();
    // Only the newest generation's catalog blocks after the last data
    // are kept (only such a catalog counts), at most CATALOG_MAX bytes of
    // them: a tape of catalog blocks costs no more memory than one catalog.
    let mut max_generation = 0u64;
    let mut newest: Option<(u64, Vec<(u64, BlockHeader, Vec<u8>)>)> = None;
    let mut newest_bytes = 0u64;
    let mut bad_blocks = Vec::new();
    let mut foreign = 0u64;
    let mut filemarks = Vec::new();
    let mut last_data = None;
    let mut pos = DATA_START;
    let mut buf = vec![0u8; BATCH_BLOCKS * bs];
    loop {
        let outcome = match dev.read_blocks(&mut buf) {
            Ok(o) => o,
            Err(DeviceError::Io { .. }) => {
                // A medium error: try the blocks one at a time, then skip the bad one.
                dev.locate(pos)?;
                let mut one = vec![0u8; bs];
                match dev.read_blocks(&mut one) {
                    Ok(ReadOutcome::Blocks(_)) => {
                        buf[..bs].copy_from_slice(&one);
                        ReadOutcome::Blocks(1)
                    }
                    Ok(o) => o,
                    Err(e @ DeviceError::Io { .. }) => {
                        bad_blocks.push(BadBlock {
                            position: pos,
                            reason: e.to_string(),
                        });
                        pos += 1;
                        match dev.locate(pos) {
                            Ok(()) => continue,
                            Err(DeviceError::EndOfData { .. }) => break,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        match outcome {
            ReadOutcome::EndOfData => break,
            ReadOutcome::Filemark => {
                filemarks.push(pos);
                pos += 1;
            }
            ReadOutcome::Blocks(n) => {
                for i in 0..n {
                    let p = pos + i as u64;
                    match BlockHeader::decode(&buf[i * bs..(i + 1) * bs]) {
                        Err(reason) => bad_blocks.push(BadBlock {
                            position: p,
                            reason,
                        }),
                        Ok((h, _)) if h.volume_id != label.volume_id => foreign += 1,
                        Ok((h, payload)) => match h.kind {
                            BlockKind::Data => {
                                data.entry(h.object_id).or_default().push(Seen {
                                    pos: p,
                                    seq: h.seq,
                                    offset: h.offset,
                                    len: h.payload_len as u64,
                                    last: h.last,
                                });
                                last_data = Some(p);
                                // A catalog before data is no longer the tape's.
                                newest = None;
                            }
                            BlockKind::Catalog => {
                                let generation = h.object_id;
                                max_generation = max_generation.max(generation);
                                match &mut newest {
                                    Some((g, blocks)) if *g == generation => {
                                        newest_bytes += payload.len() as u64;
                                        if newest_bytes <= CATALOG_MAX + CATALOG_FRAME_LEN as u64 {
                                            blocks.push((p, h, payload.to_vec()));
                                        } else {
                                            blocks.clear();
                                        }
                                    }
                                    Some((g, _)) if *g > generation => {}
                                    _ => {
                                        newest_bytes = payload.len() as u64;
                                        newest = Some((generation, vec![(p, h, payload.to_vec())]));
                                    }
                                }
                            }
                        },
                    }
                }
                pos += n as u64;
            }
        }
    }
    let objects = data
        .into_iter()
        .map(|(id, seen)| (id, assemble(id, seen)))
        .collect::<BTreeMap<_, _>>();
    let data_end = last_data.map_or(DATA_START, |p| p + 1);
    // The newest catalog counts only if it is whole and lies after all the data.
    let catalog = newest
        .as_ref()
        .filter(|(generation, _)| *generation == max_generation)
        .and_then(|(generation, blocks)| {
            let generation = *generation;
            let start = blocks.first()?.0;
            if start <= data_end {
                return None;
            }
            let mut framed = Vec::new();
            for (i, (p, h, payload)) in blocks.iter().enumerate() {
                if *p != start + i as u64 || h.seq != i as u64 || h.offset != framed.len() as u64 {
                    return None;
                }
                framed.extend_from_slice(payload);
            }
            if !blocks.last()?.1.last {
                return None;
            }
            let bytes = unframe_catalog(&framed).ok()?.to_vec();
            Some(Catalog {
                bytes,
                location: CatalogLocation {
                    start,
                    blocks: blocks.len() as u64,
                    generation,
                },
            })
        });
    Ok(ScanReport {
        label,
        max_object_id: objects.keys().next_back().copied(),
        objects,
        catalog,
        bad_blocks,
        foreign_blocks: foreign,
        filemarks,
        end_of_data: pos,
        max_generation,
        data_end,
    })
}

fn assemble(object_id: u64, mut seen: Vec<Seen>) -> ScannedObject {
    seen.sort_by_key(|s| (s.seq, s.pos));
    let mut problem = None;
    let mut offset = 0u64;
    for (i, s) in seen.iter().enumerate() {
        if s.seq != i as u64 {
            problem = Some(if s.seq < i as u64 {
                format!("block {} appears twice", s.seq)
            } else {
                format!("block {i} is missing")
            });
            break;
        }
        if s.offset != offset {
            problem = Some(format!(
                "block {i} is at offset {} instead of {offset}",
                s.offset
            ));
            break;
        }
        if s.last && i + 1 != seen.len() {
            problem = Some(format!("blocks follow the last block {i}"));
            break;
        }
        offset += s.len;
    }
    if problem.is_none() && !seen.last().is_some_and(|s| s.last) {
        problem = Some(format!(
            "its last block is missing (found {} blocks, {offset} bytes)",
            seen.len()
        ));
    }
    // Runs: consecutive positions holding consecutive blocks.
    let mut by_pos = seen.clone();
    by_pos.sort_by_key(|s| s.pos);
    let mut extents: Vec<Extent> = Vec::new();
    for s in by_pos {
        if let Some(e) = extents.last_mut() {
            if e.start + e.blocks == s.pos
                && e.first_seq + e.blocks == s.seq
                && e.offset + e.len == s.offset
            {
                e.blocks += 1;
                e.len += s.len;
                continue;
            }
        }
        extents.push(Extent {
            object_id,
            start: s.pos,
            blocks: 1,
            first_seq: s.seq,
            offset: s.offset,
            len: s.len,
        });
    }
    let len = seen.iter().map(|s| s.len).sum();
    ScannedObject {
        object_id,
        extents,
        len,
        complete: problem.is_none(),
        problem,
    }
}
