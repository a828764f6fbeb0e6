//! What a tape's catalog says (docs/format.md, "Catalog payload"): the
//! index of the objects on the tape and, from version 2, the bytes of the
//! few objects a mount reads first (the volume's metadata chain), so that a
//! machine with only the tape reaches them without a locate each
//! (docs/tape.md §8). Also the head every object starts with, which lets a
//! scan name what it finds.
//!
//! Everything here parses bytes read off a tape: untrusted, so errors,
//! never panics, and memory bounded by what was read.

use crate::layout::Extent;
use cairn_backend::validate_name;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Magic of an object's head.
pub const OBJECT_MAGIC: &[u8; 4] = b"CTO1";
/// Format of the catalog's index.
pub const INDEX_FORMAT: &str = "cairn-tape-index";
/// The version this Cairn writes; version 1 (no inline objects) is read.
pub const INDEX_VERSION: u32 = 2;
/// Magic of a version-2 payload. A version-1 payload is bare zstd (whose
/// frames start `28 b5 2f fd`), so the two never collide.
pub const PAYLOAD_MAGIC: &[u8; 8] = b"CTIX0002";
/// A catalog carries at most this many inline bytes by default: about
/// 0.8 s of the default emulated drive, read with the catalog.
pub const INLINE_MAX: u64 = 64 << 20;
/// The index JSON may not decompress to more than this.
const JSON_LIMIT: usize = 256 << 20;

/// One object in the index.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct IndexEntry {
    /// Its id in the block headers.
    pub id: u64,
    /// Bytes of the object (its head not counted).
    pub size: u64,
    /// Bytes of its head before the object's first byte.
    pub head: u64,
    /// Where its bytes (head included) lie, in object order.
    pub extents: Vec<Extent>,
    /// Deleted (logically: the blocks stay).
    #[serde(default)]
    pub dead: bool,
}

/// The objects on a tape.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Index {
    /// Objects by name; a name put again points at its newest copy, the
    /// older copy's bytes are dead.
    pub objects: BTreeMap<String, IndexEntry>,
    /// Bytes of object copies that no name points at any more.
    #[serde(default)]
    pub replaced_bytes: u64,
    /// The next object id.
    pub next_id: u64,
}

impl Index {
    /// Bytes of live objects and of dead ones (deleted or replaced).
    pub fn space(&self) -> (u64, u64) {
        self.objects.values().fold((0, self.replaced_bytes), |(l, d), o| if o.dead { (l, d + o.size) } else { (l + o.size, d) })
    }
}

/// Where an inline object's bytes lie within a payload's inline bytes.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct InlineSpan {
    /// First byte, from the start of the inline bytes.
    pub offset: u64,
    /// Bytes: the object's size.
    pub len: u64,
}

/// A catalog payload, decoded and checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatalogPayload {
    /// The objects on the tape.
    pub index: Index,
    /// Copies of some live objects' bytes (empty from a version-1 payload):
    /// each equals the object on the tape, which the catalog's checksum
    /// vouches for as it does the index.
    pub inline: BTreeMap<String, Vec<u8>>,
}

/// Chooses, among names in order, the ones a catalog carries inline.
pub type InlineChooser = Arc<dyn Fn(&[&str]) -> Vec<String> + Send + Sync>;

/// Which objects a catalog carries inline: those a mount needs first.
/// The store knows nothing of what objects mean; the engine does, and
/// says it here.
#[derive(Clone)]
pub struct InlinePolicy {
    /// Only live names under these prefixes are considered (few and
    /// narrow: the store lists them at every put of such a name).
    pub prefixes: Vec<String>,
    /// Given those names in order, the ones a mount reads first.
    pub choose: InlineChooser,
    /// Inline bytes a catalog carries at most; a chosen set above it is not
    /// inlined (a mount then locates to each, as from a version-1 catalog).
    pub max_bytes: u64,
}

impl InlinePolicy {
    /// Whether `name` is one the policy looks at.
    pub fn covers(&self, name: &str) -> bool {
        self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

impl fmt::Debug for InlinePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InlinePolicy").field("prefixes", &self.prefixes).field("max_bytes", &self.max_bytes).finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct DocOut<'a> {
    format: &'static str,
    version: u32,
    #[serde(flatten)]
    index: &'a Index,
    inline: BTreeMap<&'a str, InlineSpan>,
}

#[derive(Deserialize)]
struct DocIn {
    format: String,
    version: u32,
    #[serde(flatten)]
    index: Index,
    #[serde(default)]
    inline: BTreeMap<String, InlineSpan>,
}

/// Encodes a version-2 catalog payload: the index, and `inline` (names of
/// live objects with their bytes, in the order given) after it.
pub fn encode_catalog(index: &Index, inline: &[(&str, &[u8])]) -> Vec<u8> {
    let mut spans = BTreeMap::new();
    let mut offset = 0u64;
    for (name, bytes) in inline {
        spans.insert(*name, InlineSpan { offset, len: bytes.len() as u64 });
        offset += bytes.len() as u64;
    }
    let json = serde_json::to_vec(&DocOut { format: INDEX_FORMAT, version: INDEX_VERSION, index, inline: spans }).expect("the index serialises");
    let z = zstd::bulk::compress(&json, 3).expect("compressing in memory");
    let mut out = Vec::with_capacity(12 + z.len() + offset as usize);
    out.extend_from_slice(PAYLOAD_MAGIC);
    out.extend_from_slice(&u32::try_from(z.len()).expect("a compressed index under 4 GiB").to_le_bytes());
    out.extend_from_slice(&z);
    for (_, bytes) in inline {
        out.extend_from_slice(bytes);
    }
    out
}

/// Parses a catalog payload of version 1 or 2; untrusted bytes give an
/// error, never a panic.
pub fn decode_catalog(bytes: &[u8]) -> std::result::Result<CatalogPayload, String> {
    let (z, inline_bytes, want) = match bytes.strip_prefix(PAYLOAD_MAGIC.as_slice()) {
        Some(rest) => {
            let n = rest.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize).ok_or("catalog payload cut short in its header")?;
            let z = rest.get(4..4 + n).ok_or_else(|| format!("catalog payload names a {n}-byte index but holds {}", rest.len().saturating_sub(4)))?;
            (z, &rest[4 + n..], 2)
        }
        None => (bytes, &[][..], 1),
    };
    // Streamed, so memory grows with what the index holds, not the limit.
    let mut json = Vec::new();
    let read = zstd::stream::read::Decoder::new(z).and_then(|d| std::io::Read::read_to_end(&mut std::io::Read::take(d, JSON_LIMIT as u64 + 1), &mut json));
    read.map_err(|e| format!("not a compressed index ({e})"))?;
    if json.len() > JSON_LIMIT {
        return Err(format!("the index is over {JSON_LIMIT} bytes"));
    }
    let d: DocIn = serde_json::from_slice(&json).map_err(|e| format!("malformed index ({e})"))?;
    if d.format != INDEX_FORMAT {
        return Err(format!("not a Cairn tape index ({:?})", d.format));
    }
    if d.version != want {
        return Err(match want {
            1 if d.version <= INDEX_VERSION => format!("index version {} in a version-1 payload", d.version),
            _ if d.version > INDEX_VERSION => format!("index version {} is not supported (this Cairn reads versions 1 to {INDEX_VERSION})", d.version),
            _ => format!("index version {} in a version-{want} payload", d.version),
        });
    }
    let mut inline = BTreeMap::new();
    for (name, span) in d.inline {
        let e = d.index.objects.get(&name).filter(|e| !e.dead).ok_or_else(|| format!("inline object {name:?} is not a live object of the index"))?;
        if span.len != e.size {
            return Err(format!("inline object {name}: {} bytes, the index says {}", span.len, e.size));
        }
        let end = span.offset.checked_add(span.len).filter(|&end| end <= inline_bytes.len() as u64).ok_or_else(|| format!("inline object {name} lies past the payload's end"))?;
        inline.insert(name, inline_bytes[span.offset as usize..end as usize].to_vec());
    }
    Ok(CatalogPayload { index: d.index, inline })
}

/// The head written before an object's bytes: magic, name length, name.
pub fn object_head(name: &str) -> Vec<u8> {
    let mut h = Vec::with_capacity(6 + name.len());
    h.extend_from_slice(OBJECT_MAGIC);
    h.extend_from_slice(&(name.len() as u16).to_le_bytes());
    h.extend_from_slice(name.as_bytes());
    h
}

/// Parses an object head from the start of an object's bytes: the name and
/// the head's length.
pub fn parse_object_head(b: &[u8]) -> std::result::Result<(String, u64), String> {
    if b.len() < 6 || &b[..4] != OBJECT_MAGIC {
        return Err("no object head".into());
    }
    let n = u16::from_le_bytes([b[4], b[5]]) as usize;
    let name = b.get(6..6 + n).ok_or("object head cut short")?;
    let name = std::str::from_utf8(name).map_err(|_| "object name is not UTF-8")?;
    validate_name(name).map_err(|e| e.to_string())?;
    Ok((name.to_string(), 6 + n as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Index {
        let mut i = Index { next_id: 9, ..Default::default() };
        let e = |id, size| IndexEntry { id, size, head: 17, extents: vec![Extent { object_id: id, start: 2, blocks: 1, first_seq: 0, offset: 0, len: 17 + size }], dead: false };
        i.objects.insert("packs/ab/cd".into(), e(3, 10));
        i.objects.insert("meta/0000000000000001.base".into(), e(4, 5));
        i.objects.insert("meta/0000000000000002.delta".into(), e(5, 3));
        i
    }

    #[test]
    fn a_catalog_round_trips_with_and_without_inline_objects() {
        let i = index();
        let p = decode_catalog(&encode_catalog(&i, &[])).unwrap();
        assert_eq!((p.index, p.inline.len()), (i.clone(), 0));
        let bytes = encode_catalog(&i, &[("meta/0000000000000001.base", b"base!"), ("meta/0000000000000002.delta", b"dlt")]);
        let p = decode_catalog(&bytes).unwrap();
        assert_eq!(p.index, i);
        assert_eq!(p.inline["meta/0000000000000001.base"], b"base!");
        assert_eq!(p.inline["meta/0000000000000002.delta"], b"dlt");
    }

    /// A version-1 payload (bare zstd of the index, as Cairn wrote before
    /// 2026-11-29) is still read, with nothing inline.
    #[test]
    fn a_version_1_payload_is_read() {
        let json = br#"{"format":"cairn-tape-index","version":1,"objects":{"config":{"id":0,"size":4,"head":12,"extents":[],"dead":false}},"replaced_bytes":0,"next_id":1}"#;
        let p = decode_catalog(&zstd::bulk::compress(json, 3).unwrap()).unwrap();
        assert_eq!((p.index.objects["config"].size, p.index.next_id, p.inline.len()), (4, 1, 0));
    }

    /// The fuzz target's seeds are payloads built by hand from
    /// docs/format.md (one of each version): the code reads what the spec
    /// says.
    #[test]
    fn the_payloads_built_from_the_spec_are_read() {
        let v1 = decode_catalog(include_bytes!("../../../fuzz/seeds/tape_catalog/v1")).unwrap();
        assert_eq!((v1.index.objects["config"].extents[0].start, v1.inline.len()), (3, 0));
        let v2 = decode_catalog(include_bytes!("../../../fuzz/seeds/tape_catalog/v2")).unwrap();
        assert_eq!(v2.inline["config"], b"cfg!");
        assert_eq!(v2.inline["meta/0000000000000001.base"], b"base!");
        assert!(v2.index.objects["packs/ab/cd"].dead);
        assert_eq!((v2.index.replaced_bytes, v2.index.next_id), (7, 3));
    }

    #[test]
    fn bad_payloads_are_refused_naming_why() {
        let i = index();
        let err = |b: &[u8]| decode_catalog(b).unwrap_err();
        assert!(err(b"garbage").contains("compressed"));
        let future = zstd::bulk::compress(br#"{"format":"cairn-tape-index","version":3,"objects":{},"next_id":0}"#, 1).unwrap();
        assert!(err(&future).contains("version 3"), "{}", err(&future));
        // An inline object that is not in the index, of another size, or
        // past the end.
        let good = encode_catalog(&i, &[("meta/0000000000000001.base", b"base!")]);
        assert!(err(&good[..good.len() - 1]).contains("past the payload's end"));
        assert!(err(&encode_catalog(&i, &[("meta/0000000000000001.base", b"bas")])).contains("the index says 5"));
        assert!(err(&encode_catalog(&i, &[("meta/0000000000000009.delta", b"x")])).contains("not a live object"));
        let mut dead = i.clone();
        dead.objects.get_mut("meta/0000000000000001.base").unwrap().dead = true;
        assert!(err(&encode_catalog(&dead, &[("meta/0000000000000001.base", b"base!")])).contains("not a live object"));
        // A header whose index length runs past the payload.
        let mut cut = PAYLOAD_MAGIC.to_vec();
        cut.extend_from_slice(&1000u32.to_le_bytes());
        cut.extend_from_slice(b"short");
        assert!(err(&cut).contains("1000-byte index"));
        assert!(err(&PAYLOAD_MAGIC[..]).contains("cut short"));
    }

    #[test]
    fn object_heads_round_trip_and_bad_ones_are_refused() {
        let h = object_head("meta/0000000000000001.base");
        assert_eq!(parse_object_head(&h).unwrap(), ("meta/0000000000000001.base".to_string(), h.len() as u64));
        assert!(parse_object_head(b"CTO1\xff\xff").is_err());
        assert!(parse_object_head(b"XXXX\x01\x00a").is_err());
        assert!(parse_object_head(b"CTO1\x02\x00..").is_err(), "names follow the backend's rules");
    }
}
