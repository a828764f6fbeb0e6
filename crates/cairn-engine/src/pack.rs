//! Packs: immutable backend objects holding many blobs (format v1).
//!
//! ```text
//! pack    = header blob* index trailer
//! header  = "CAIRNPK1" (8 bytes) || volume id (16 bytes)
//! blob    = sealed(payload)              payload = zstd(chunk) or chunk
//! index   = sealed(entries || count u32)  (encrypted volumes, AAD "cairn-pack-index" || volume id)
//!         | entries || count u32 || keyed checksum (32 bytes)   (unencrypted volumes)
//! entry   = chunk id (32) || offset u64 || stored_len u32 || raw_len u32 || flags u8   (49 bytes)
//! trailer = index length u32 || "CRNIDX01" (8 bytes)
//! ```
//! All integers little-endian. A blob's AEAD associated data is its chunk id
//! and flags, so a blob cannot be passed off as another. The index makes a
//! pack self-describing: the chunk index can be rebuilt from the backend alone.

use crate::crypto::{ChunkId, Keys, ID_LEN};
use crate::error::{Error, Result};

pub const PACK_MAGIC: &[u8; 8] = b"CAIRNPK1";
pub const TRAILER_MAGIC: &[u8; 8] = b"CRNIDX01";
pub const HEADER_LEN: usize = 24;
pub const TRAILER_LEN: usize = 12;
const ENTRY_LEN: usize = ID_LEN + 8 + 4 + 4 + 1;
/// Blob flag: payload is zstd-compressed.
pub const FLAG_ZSTD: u8 = 1;

/// One blob's place in a pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobEntry {
    pub id: ChunkId,
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub flags: u8,
}

/// Associated data binding a blob to its id and flags.
pub fn blob_aad(id: &ChunkId, flags: u8) -> [u8; ID_LEN + 1] {
    let mut a = [0u8; ID_LEN + 1];
    a[..ID_LEN].copy_from_slice(id);
    a[ID_LEN] = flags;
    a
}

/// Encodes one chunk as a blob: compress (keep raw if it does not shrink), seal.
pub fn encode_blob<'a>(keys: &Keys, id: &ChunkId, chunk: &'a [u8], zstd_level: i32) -> (std::borrow::Cow<'a, [u8]>, u8) {
    use std::borrow::Cow;
    match Payload::of(chunk, zstd_level) {
        Payload::Zstd(c) => (Cow::Owned(keys.seal(&blob_aad(id, FLAG_ZSTD), c)), FLAG_ZSTD),
        // Stored as it is on a volume without encryption: no copy here,
        // the pack builder's is the only one.
        Payload::Raw if !keys.encrypted() => (Cow::Borrowed(chunk), 0),
        Payload::Raw => (Cow::Owned(keys.seal_slice(&blob_aad(id, 0), chunk)), 0),
    }
}

/// A chunk's payload before it is placed in a pack: the chunk itself, or
/// its zstd compression when that is smaller.
pub enum Payload {
    Raw,
    Zstd(Vec<u8>),
}

impl Payload {
    /// Compresses `chunk` if that is worth it (as [`encode_blob`] does).
    pub fn of(chunk: &[u8], zstd_level: i32) -> Payload {
        let compressed = if worth_compressing(chunk, zstd_level) { zstd::bulk::compress(chunk, zstd_level).ok() } else { None };
        match compressed {
            Some(c) if c.len() < chunk.len() => Payload::Zstd(c),
            _ => Payload::Raw,
        }
    }

    /// The bytes to seal, given the chunk this is the payload of.
    pub fn bytes<'a>(&'a self, chunk: &'a [u8]) -> &'a [u8] {
        match self {
            Payload::Raw => chunk,
            Payload::Zstd(c) => c,
        }
    }

    pub fn flags(&self) -> u8 {
        match self {
            Payload::Raw => 0,
            Payload::Zstd(_) => FLAG_ZSTD,
        }
    }
}

/// Whether a chunk is worth a full compression pass: three 16 KiB samples
/// (start, middle, end) are tried first. Already-compressed or encrypted
/// data (no sample shrinks by 3%) skips the pass that would be thrown away.
fn worth_compressing(chunk: &[u8], level: i32) -> bool {
    const SAMPLE: usize = 16 << 10;
    if chunk.len() < 8 * SAMPLE {
        return true;
    }
    let starts = [0, chunk.len() / 2 - SAMPLE / 2, chunk.len() - SAMPLE];
    starts.iter().any(|&s| {
        let part = &chunk[s..s + SAMPLE];
        zstd::bulk::compress(part, level).is_ok_and(|c| c.len() < SAMPLE * 97 / 100)
    })
}

/// How much a decoded blob is checked against its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Always the full keyed BLAKE3 of the plaintext: `fsck --read-data`
    /// and the cleaner, which must also catch a writer's own mistakes.
    Full,
    /// The read path: on an encrypted volume the AEAD tag, bound to the
    /// id and flags, already proves the bytes are the ones a key holder
    /// sealed for this id (docs/threat-model.md, "Reads trust the seal"),
    /// so the hash is skipped; without encryption it is the full hash.
    Sealed,
}

/// Decodes a blob back into the chunk and verifies it (`verify`). Any
/// mismatch is an error: corrupt data is never returned.
pub fn decode_blob(keys: &Keys, e: &BlobEntry, stored: Vec<u8>, verify: Verify) -> Result<Vec<u8>> {
    let payload = keys.open(&blob_aad(&e.id, e.flags), stored)?;
    let chunk = if e.flags & FLAG_ZSTD != 0 {
        zstd::bulk::decompress(&payload, e.raw_len as usize)
            .map_err(|err| Error::corrupt(format!("decompression failed: {err}")))?
    } else {
        payload
    };
    let hash_it = verify == Verify::Full || !keys.encrypted();
    if chunk.len() != e.raw_len as usize || (hash_it && !keys.verify_id(&e.id, &chunk)) {
        return Err(Error::corrupt("chunk content does not match its id"));
    }
    Ok(chunk)
}

/// Builds a pack in memory.
///
/// The pack starts at the first address in the buffer aligned for direct
/// I/O (up to 4 KiB in), so the local store writes it with `O_DIRECT`
/// straight from here instead of through a bounce copy.
pub struct PackBuilder {
    buf: Vec<u8>,
    /// Where the pack starts in `buf`.
    start: usize,
    entries: Vec<BlobEntry>,
}

/// The alignment a pack's first byte gets in its builder's buffer.
const BUFFER_ALIGN: usize = 4096;

/// A finished pack: its bytes, in the builder's buffer.
pub struct BuiltPack {
    buf: Vec<u8>,
    start: usize,
}

impl BuiltPack {
    /// The pack as stored.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
    /// The buffer, for reuse.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }
}

impl PackBuilder {
    pub fn new(volume_id: &[u8; 16]) -> Self {
        Self::with_capacity(volume_id, 1 << 20)
    }
    /// A builder whose buffer will not need to grow below `cap` bytes.
    pub fn with_capacity(volume_id: &[u8; 16], cap: usize) -> Self {
        Self::with_buffer(volume_id, Vec::with_capacity(cap))
    }
    /// A builder writing into `buf` (emptied first; its capacity is reused).
    pub fn with_buffer(volume_id: &[u8; 16], mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.reserve(BUFFER_ALIGN + PACK_MAGIC.len() + volume_id.len());
        // Only a buffer that grows later moves the pack off the alignment
        // (then the store copies it once, as before).
        let start = Some(buf.as_ptr().align_offset(BUFFER_ALIGN)).filter(|&k| k < BUFFER_ALIGN).unwrap_or(0);
        buf.resize(start, 0);
        buf.extend_from_slice(PACK_MAGIC);
        buf.extend_from_slice(volume_id);
        PackBuilder { buf, start, entries: Vec::new() }
    }
    /// Appends an encoded blob; returns its entry.
    pub fn add(&mut self, id: ChunkId, blob: &[u8], raw_len: u32, flags: u8) -> BlobEntry {
        let e = BlobEntry { id, offset: self.len() as u64, stored_len: blob.len() as u32, raw_len, flags };
        self.buf.extend_from_slice(blob);
        self.entries.push(e.clone());
        e
    }
    /// Appends blobs sealed in place: blob `k` is chunk `blobs[k].0` (raw
    /// length `blobs[k].1`, flags `blobs[k].2`) with payload `payload(k)`,
    /// sealed by [`Keys::seal_into`] straight into the space the pack keeps
    /// it in (on rayon's pool when `parallel`): each payload byte is copied
    /// once, with no zero-filling of the space first. Returns the entries,
    /// in order.
    pub fn append_sealed<'p>(
        &mut self,
        keys: &Keys,
        blobs: &[(ChunkId, u32, u8)],
        parallel: bool,
        payload: impl Fn(usize) -> &'p [u8] + Sync,
    ) -> Vec<BlobEntry> {
        use rayon::prelude::*;
        let mut offset = self.len() as u64;
        let entries: Vec<BlobEntry> = blobs
            .iter()
            .enumerate()
            .map(|(k, &(id, raw_len, flags))| {
                let stored = keys.sealed_len(payload(k).len());
                let e = BlobEntry { id, offset, stored_len: stored as u32, raw_len, flags };
                offset += stored as u64;
                e
            })
            .collect();
        let total = (offset - self.len() as u64) as usize;
        self.buf.reserve(total);
        let mut rest = &mut self.buf.spare_capacity_mut()[..total];
        let mut slots = Vec::with_capacity(entries.len());
        for e in &entries {
            let (slot, tail) = std::mem::take(&mut rest).split_at_mut(e.stored_len as usize);
            slots.push(slot);
            rest = tail;
        }
        let seal = |(k, slot): (usize, &mut [std::mem::MaybeUninit<u8>])| {
            keys.seal_into(&blob_aad(&entries[k].id, entries[k].flags), payload(k), slot)
        };
        if parallel {
            slots.into_par_iter().enumerate().for_each(seal);
        } else {
            slots.into_iter().enumerate().for_each(seal);
        }
        // SAFETY: the slots tile the `total` reserved bytes, and seal_into
        // wrote each whole (it asserts the slot's length; a panic unwinds
        // past this line).
        unsafe { self.buf.set_len(self.buf.len() + total) };
        self.entries.extend(entries.iter().cloned());
        entries
    }
    /// The pack's length so far.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Appends index and trailer; returns the pack and the entries.
    pub fn finish(mut self, keys: &Keys, volume_id: &[u8; 16]) -> (BuiltPack, Vec<BlobEntry>) {
        let index = encode_index(keys, volume_id, &self.entries);
        self.buf.extend_from_slice(&index);
        self.buf.extend_from_slice(&(index.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(TRAILER_MAGIC);
        (BuiltPack { buf: self.buf, start: self.start }, self.entries)
    }
}

/// Bytes of blobs in a pack of `size` bytes holding `blobs` blobs: the pack
/// less its header, index and trailer (whose sizes the format fixes), so a
/// pack's live bytes are this less its dead bytes, without reading its
/// chunk rows.
pub fn blob_bytes(size: u64, blobs: u64, encrypted: bool) -> u64 {
    let index = ENTRY_LEN as u64 * blobs + 4 + if encrypted { crate::crypto::SEAL_OVERHEAD as u64 } else { 32 };
    size.saturating_sub((HEADER_LEN + TRAILER_LEN) as u64 + index)
}

/// A new pack's object name: `packs/XY/NAME`, NAME 32 random hex digits.
/// Random, not the pack's checksum: an unencrypted pack is a deterministic
/// function of its blobs, so the same chunks packed again (a file deleted and
/// written back, a cleaner's output) would take the name of a pack that is
/// in the trash, and the trash's deletion would then remove the new one.
pub fn fresh_name() -> String {
    let h = hex::encode(rand::random::<[u8; 16]>());
    format!("packs/{}/{}", &h[..2], h)
}

fn index_aad(volume_id: &[u8; 16]) -> Vec<u8> {
    let mut a = b"cairn-pack-index".to_vec();
    a.extend_from_slice(volume_id);
    a
}

fn encode_index(keys: &Keys, volume_id: &[u8; 16], entries: &[BlobEntry]) -> Vec<u8> {
    let mut plain = Vec::with_capacity(entries.len() * ENTRY_LEN + 4 + 32);
    for e in entries {
        plain.extend_from_slice(&e.id);
        plain.extend_from_slice(&e.offset.to_le_bytes());
        plain.extend_from_slice(&e.stored_len.to_le_bytes());
        plain.extend_from_slice(&e.raw_len.to_le_bytes());
        plain.push(e.flags);
    }
    plain.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    if keys.encrypted() {
        keys.seal(&index_aad(volume_id), plain)
    } else {
        let sum = keys.checksum("cairn-pack-index", &plain);
        plain.extend_from_slice(&sum);
        plain
    }
}

/// Parses a trailer (the last [`TRAILER_LEN`] bytes): the index length.
pub fn parse_trailer(t: &[u8], pack_size: u64) -> Result<u64> {
    if t.len() != TRAILER_LEN || &t[4..] != TRAILER_MAGIC {
        return Err(Error::corrupt("pack trailer missing or damaged (truncated pack?)"));
    }
    let n = u32::from_le_bytes(t[..4].try_into().expect("4 bytes")) as u64;
    if n + (TRAILER_LEN + HEADER_LEN) as u64 > pack_size {
        return Err(Error::corrupt("pack index length exceeds the pack"));
    }
    Ok(n)
}

/// Decodes and authenticates a pack index; checks every entry lies inside
/// the blob area.
pub fn decode_index(keys: &Keys, volume_id: &[u8; 16], index: Vec<u8>, pack_size: u64) -> Result<Vec<BlobEntry>> {
    let plain = if keys.encrypted() {
        keys.open(&index_aad(volume_id), index).map_err(|e| e.context("pack index"))?
    } else {
        if index.len() < 36 {
            return Err(Error::corrupt("pack index too short"));
        }
        let (body, sum) = index.split_at(index.len() - 32);
        if keys.checksum("cairn-pack-index", body) != sum {
            return Err(Error::corrupt("pack index checksum mismatch"));
        }
        body.to_vec()
    };
    if plain.len() < 4 {
        return Err(Error::corrupt("pack index too short"));
    }
    let (body, cnt) = plain.split_at(plain.len() - 4);
    let count = u32::from_le_bytes(cnt.try_into().expect("4 bytes")) as usize;
    if body.len() != count.checked_mul(ENTRY_LEN).ok_or_else(|| Error::corrupt("pack index count"))? {
        return Err(Error::corrupt("pack index length does not match its entry count"));
    }
    let blob_end = pack_size.saturating_sub(TRAILER_LEN as u64);
    let mut out = Vec::with_capacity(count);
    for c in body.chunks_exact(ENTRY_LEN) {
        let mut id = [0u8; ID_LEN];
        id.copy_from_slice(&c[..ID_LEN]);
        let e = BlobEntry {
            id,
            offset: u64::from_le_bytes(c[32..40].try_into().expect("8")),
            stored_len: u32::from_le_bytes(c[40..44].try_into().expect("4")),
            raw_len: u32::from_le_bytes(c[44..48].try_into().expect("4")),
            flags: c[48],
        };
        if e.offset < HEADER_LEN as u64 || e.offset.checked_add(e.stored_len as u64).is_none_or(|end| end > blob_end) || e.flags & !FLAG_ZSTD != 0 {
            return Err(Error::corrupt("pack index entry out of bounds"));
        }
        out.push(e);
    }
    Ok(out)
}

/// Checks a pack header.
pub fn check_header(h: &[u8], volume_id: &[u8; 16]) -> Result<()> {
    if h.len() < HEADER_LEN || &h[..8] != PACK_MAGIC {
        return Err(Error::corrupt("not a Cairn pack (bad magic)"));
    }
    if &h[8..24] != volume_id {
        return Err(Error::corrupt("pack belongs to another volume"));
    }
    Ok(())
}

/// Reads and verifies a whole pack's index through a backend.
pub fn read_index(
    backend: &dyn cairn_backend::Backend,
    keys: &Keys,
    volume_id: &[u8; 16],
    name: &str,
) -> Result<Vec<BlobEntry>> {
    let size = backend.size(name)?;
    if size < (HEADER_LEN + TRAILER_LEN) as u64 {
        return Err(Error::corrupt(format!("pack {name} is truncated ({size} bytes)")));
    }
    let ctx = |e: Error| e.context(format!("pack {name}"));
    check_header(&backend.get_range(name, 0, HEADER_LEN as u64)?, volume_id).map_err(ctx)?;
    let t = backend.get_range(name, size - TRAILER_LEN as u64, TRAILER_LEN as u64)?;
    let n = parse_trailer(&t, size).map_err(ctx)?;
    let idx = backend.get_range(name, size - TRAILER_LEN as u64 - n, n)?;
    decode_index(keys, volume_id, idx, size).map_err(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(keys: &Keys, vid: &[u8; 16], chunks: &[Vec<u8>]) -> (Vec<u8>, Vec<BlobEntry>) {
        let mut b = PackBuilder::new(vid);
        for c in chunks {
            let id = keys.chunk_id(c);
            let (blob, flags) = encode_blob(keys, &id, c, 1);
            b.add(id, &blob, c.len() as u32, flags);
        }
        let (pack, entries) = b.finish(keys, vid);
        (pack.bytes().to_vec(), entries)
    }

    #[test]
    fn a_pack_starts_at_an_aligned_address_in_its_buffer() {
        let keys = Keys::derive(&[3u8; 32], false);
        let vid = [1u8; 16];
        for cap in [16 << 10, 1 << 20] {
            let mut b = PackBuilder::with_capacity(&vid, cap);
            let c = vec![7u8; 5000];
            let e = b.add(keys.chunk_id(&c), &c, 5000, 0);
            assert_eq!(e.offset, HEADER_LEN as u64, "blob offsets count from the pack's start");
            let (p, _) = b.finish(&keys, &vid);
            assert_eq!(p.bytes().as_ptr() as usize % 4096, 0);
            assert!(p.bytes().starts_with(PACK_MAGIC));
            assert!(parse_trailer(&p.bytes()[p.bytes().len() - TRAILER_LEN..], p.bytes().len() as u64).is_ok());
        }
    }

    /// Blobs sealed in place (the flush's path) make the pack that adding
    /// encoded blobs one at a time makes, but for the nonces: the same
    /// entries, lengths, flags and decoded bytes, on and off rayon's pool,
    /// appended to a pack that already holds a blob.
    #[test]
    fn blobs_sealed_in_place_decode_as_added_ones() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let noise: Vec<u8> = (0..300_000).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect();
        let chunks = vec![vec![0u8; 200_000], noise.clone(), b"x".to_vec(), noise[..70_000].to_vec(), (0..150_000u32).map(|i| (i % 97) as u8).collect()];
        for enc in [false, true] {
            let keys = Keys::derive(&[4u8; 32], enc);
            let vid = [2u8; 16];
            let first = b"already here".to_vec();
            let (_, want) = build(&keys, &vid, &[first.clone()].into_iter().chain(chunks.iter().cloned()).collect::<Vec<_>>());
            for parallel in [false, true] {
                let mut b = PackBuilder::new(&vid);
                let id0 = keys.chunk_id(&first);
                let (blob0, f0) = encode_blob(&keys, &id0, &first, 1);
                b.add(id0, &blob0, first.len() as u32, f0);
                let payloads: Vec<Payload> = chunks.iter().map(|c| Payload::of(c, 1)).collect();
                let blobs: Vec<(ChunkId, u32, u8)> = chunks.iter().zip(&payloads).map(|(c, p)| (keys.chunk_id(c), c.len() as u32, p.flags())).collect();
                let got = b.append_sealed(&keys, &blobs, parallel, |k| payloads[k].bytes(&chunks[k]));
                assert_eq!(got, want[1..], "entries, enc {enc}, parallel {parallel}");
                let (pack, entries) = b.finish(&keys, &vid);
                assert_eq!(entries, want);
                let bytes = pack.bytes();
                let n = parse_trailer(&bytes[bytes.len() - TRAILER_LEN..], bytes.len() as u64).unwrap();
                let idx = bytes[bytes.len() - TRAILER_LEN - n as usize..bytes.len() - TRAILER_LEN].to_vec();
                assert_eq!(decode_index(&keys, &vid, idx, bytes.len() as u64).unwrap(), want);
                for (e, c) in entries[1..].iter().zip(&chunks) {
                    let stored = bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize].to_vec();
                    assert_eq!(&decode_blob(&keys, e, stored, Verify::Full).unwrap(), c, "enc {enc}, parallel {parallel}");
                }
            }
        }
    }

    #[test]
    fn roundtrip_both_modes() {
        for enc in [false, true] {
            let keys = Keys::derive(&[3u8; 32], enc);
            let vid = [9u8; 16];
            let chunks = vec![vec![0u8; 5000], (0..3000u32).map(|i| (i * 31) as u8).collect(), b"x".to_vec()];
            let (bytes, entries) = build(&keys, &vid, &chunks);
            let size = bytes.len() as u64;
            let n = parse_trailer(&bytes[bytes.len() - TRAILER_LEN..], size).unwrap();
            let idx = bytes[bytes.len() - TRAILER_LEN - n as usize..bytes.len() - TRAILER_LEN].to_vec();
            let parsed = decode_index(&keys, &vid, idx, size).unwrap();
            assert_eq!(parsed, entries);
            let blobs: u64 = entries.iter().map(|e| e.stored_len as u64).sum();
            assert_eq!(blob_bytes(size, entries.len() as u64, enc), blobs);
            for (e, c) in entries.iter().zip(&chunks) {
                let stored = bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize].to_vec();
                for v in [Verify::Full, Verify::Sealed] {
                    assert_eq!(&decode_blob(&keys, e, stored.clone(), v).unwrap(), c);
                }
            }
            // One flipped byte anywhere in a blob is detected, by either check.
            let e = &entries[1];
            let mut stored = bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize].to_vec();
            let mid = stored.len() / 2;
            stored[mid] ^= 0x40;
            for v in [Verify::Full, Verify::Sealed] {
                assert!(decode_blob(&keys, e, stored.clone(), v).is_err());
            }
        }
    }

    /// What the read path's check relies on: a sealed blob opens only under
    /// the id and flags it was sealed for, so one blob served for another's
    /// entry is an error; and what it leaves to `fsck --read-data`: a writer
    /// that sealed the wrong bytes under an id is caught by the full hash.
    #[test]
    fn the_seal_binds_a_blob_to_its_id_and_the_full_hash_to_its_content() {
        let keys = Keys::derive(&[5u8; 32], true);
        let (a, b) = (vec![1u8; 3000], vec![2u8; 3000]);
        let (ida, idb) = (keys.chunk_id(&a), keys.chunk_id(&b));
        let (blob_a, fa) = encode_blob(&keys, &ida, &a, 1);
        let entry = |id, blob: &[u8], flags| BlobEntry { id, offset: 0, stored_len: blob.len() as u32, raw_len: 3000, flags };
        for v in [Verify::Full, Verify::Sealed] {
            assert!(decode_blob(&keys, &entry(idb, &blob_a, fa), blob_a.to_vec(), v).is_err(), "{v:?}: a's blob under b's id");
            assert!(decode_blob(&keys, &entry(ida, &blob_a, fa ^ FLAG_ZSTD), blob_a.to_vec(), v).is_err(), "{v:?}: other flags");
        }
        let (wrong, fw) = encode_blob(&keys, &ida, &b, 1);
        let e = entry(ida, &wrong, fw);
        assert_eq!(decode_blob(&keys, &e, wrong.to_vec(), Verify::Sealed).unwrap(), b);
        assert!(decode_blob(&keys, &e, wrong.to_vec(), Verify::Full).is_err());
        // Without encryption there is no seal: both checks hash.
        let plain = Keys::derive(&[5u8; 32], false);
        let (wrong, fw) = encode_blob(&plain, &plain.chunk_id(&a), &b, 1);
        let e = entry(plain.chunk_id(&a), &wrong, fw);
        assert!(decode_blob(&plain, &e, wrong.to_vec(), Verify::Sealed).is_err());
    }

    #[test]
    fn compressible_tails_are_still_compressed() {
        let keys = Keys::derive(&[3u8; 32], false);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut chunk: Vec<u8> = (0..512 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let random = chunk.clone();
        chunk.extend(std::iter::repeat(b'a').take(512 << 10));
        let id = keys.chunk_id(&chunk);
        let (blob, flags) = encode_blob(&keys, &id, &chunk, 1);
        assert_eq!(flags, FLAG_ZSTD);
        assert!(blob.len() < 700 << 10);
        let (blob, flags) = encode_blob(&keys, &keys.chunk_id(&random), &random, 1);
        assert_eq!((flags, blob.len()), (0, random.len()));
    }

    #[test]
    fn truncated_pack_trailer_is_an_error() {
        let keys = Keys::derive(&[3u8; 32], false);
        let (bytes, _) = build(&keys, &[1; 16], &[vec![1u8; 100]]);
        let cut = &bytes[..bytes.len() - 5];
        assert!(parse_trailer(&cut[cut.len() - TRAILER_LEN..], cut.len() as u64).is_err());
    }
}
