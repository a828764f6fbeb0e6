//! Keys and sealing: keyed BLAKE3 chunk ids, AES-256-GCM blobs, and the
//! Argon2id-wrapped master key.
//!
//! One random 32-byte master secret per volume. Two independent keys are
//! derived from it with BLAKE3's key derivation: the chunk-id key (keyed
//! hashing, so ids reveal nothing about content to someone without the key)
//! and the data key (AES-256-GCM, from `ring`, whose assembly uses AES-NI and
//! carry-less multiplication: several times RustCrypto's speed here). The master secret is only ever written
//! wrapped (encrypted volumes) or, for unencrypted volumes, in the clear
//! config where it only serves as a checksum key.

use crate::error::{Error, Result};
use rand::RngCore;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use zeroize::Zeroizing;

/// Length of a chunk id.
pub const ID_LEN: usize = 32;
/// AES-GCM nonce length.
pub const NONCE_LEN: usize = 12;
/// AES-GCM tag length.
pub const TAG_LEN: usize = 16;
/// Bytes an encrypted blob adds to its payload.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;

/// A chunk id: keyed BLAKE3-256 of the chunk's plaintext.
pub type ChunkId = [u8; ID_LEN];

/// The volume's working keys, derived from the master secret.
pub struct Keys {
    id_key: [u8; 32],
    cipher: Option<LessSafeKey>,
    /// Key of the write-back journal's records (encrypted volumes only).
    journal: Option<Zeroizing<[u8; 32]>>,
    /// Chunk ids are per owner (`DedupDomain::Owner`, docs/format.md §2).
    owner_domains: bool,
}

/// Seals and opens the write-back journal's records: AES-256-GCM under its
/// own key, derived from the master secret apart from the data key.
pub struct JournalCipher(LessSafeKey);

impl JournalCipher {
    /// `nonce || ciphertext || tag` of `payload`, bound to `aad` (the record
    /// header). Nonces are random: after a crash, sequence numbers that were
    /// handed out but never written may be handed out again.
    pub fn seal(&self, aad: &[u8], payload: &[u8]) -> Vec<u8> {
        seal_with(&self.0, aad, payload)
    }

    /// Opens `nonce || ciphertext || tag` in place: the plaintext is then at
    /// `NONCE_LEN..NONCE_LEN + n` of `sealed` (no copy to move it to the
    /// front); `None` if it was altered.
    pub fn open_in_place(&self, aad: &[u8], sealed: &mut [u8]) -> Option<usize> {
        open_with(&self.0, aad, sealed)
    }
}

fn aes_key(k: &[u8]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k).expect("32-byte AES-256 key"))
}

fn random_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::thread_rng().fill_bytes(&mut n);
    n
}

/// `nonce || AES-256-GCM(key, nonce, payload, aad) || tag`.
fn seal_with(key: &LessSafeKey, aad: &[u8], payload: &[u8]) -> Vec<u8> {
    let nonce = random_nonce();
    let mut out = Vec::with_capacity(payload.len() + SEAL_OVERHEAD);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(payload);
    let tag = key
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut out[NONCE_LEN..])
        .expect("AES-GCM sealing cannot fail for in-range lengths");
    out.extend_from_slice(tag.as_ref());
    out
}

/// Opens `nonce || ciphertext || tag` in place; returns the plaintext length.
fn open_with(key: &LessSafeKey, aad: &[u8], sealed: &mut [u8]) -> Option<usize> {
    if sealed.len() < SEAL_OVERHEAD {
        return None;
    }
    let nonce = Nonce::try_assume_unique_for_key(&sealed[..NONCE_LEN]).ok()?;
    key.open_in_place(nonce, Aad::from(aad), &mut sealed[NONCE_LEN..]).ok().map(|p| p.len())
}

impl Keys {
    /// Derives the keys from a master secret. `encrypt` selects whether blobs
    /// are sealed with AES-256-GCM.
    pub fn derive(master: &[u8; 32], encrypt: bool) -> Self {
        let id_key = blake3::derive_key("cairn v1 chunk id key", master);
        let cipher = encrypt.then(|| {
            let dk = Zeroizing::new(blake3::derive_key("cairn v1 data key", master));
            aes_key(&dk[..])
        });
        let journal = encrypt.then(|| Zeroizing::new(blake3::derive_key("cairn v1 journal key", master)));
        Keys { id_key, cipher, journal, owner_domains: false }
    }

    /// Keys whose chunk ids are per owner (a volume made with
    /// `--dedup-domain owner`).
    pub fn with_owner_domains(mut self, on: bool) -> Self {
        self.owner_domains = on;
        self
    }

    /// Whether chunk ids are per owner.
    pub fn owner_domains(&self) -> bool {
        self.owner_domains
    }

    /// The id of a chunk written by a file of owner `uid`: on a volume of
    /// one dedup domain, [`Keys::chunk_id`] (the owner plays no part); with
    /// owner domains, the first 28 bytes of `keyed_hash(id_key, "cairn
    /// owner domain" || 0 || uid_le32 || chunk)` followed by `uid_le32`, so
    /// that the id alone says which key to verify it with.
    pub fn chunk_id_of(&self, uid: u32, data: &[u8]) -> ChunkId {
        if !self.owner_domains {
            return self.chunk_id(data);
        }
        let mut h = blake3::Hasher::new_keyed(&self.id_key);
        h.update(b"cairn owner domain\0");
        h.update(&uid.to_le_bytes());
        h.update(data);
        let mut id = *h.finalize().as_bytes();
        id[28..].copy_from_slice(&uid.to_le_bytes());
        id
    }

    /// Whether `id` is the id of `data` (in whichever owner's domain the
    /// id names, with owner domains).
    pub fn verify_id(&self, id: &ChunkId, data: &[u8]) -> bool {
        if !self.owner_domains {
            return self.chunk_id(data) == *id;
        }
        let uid = u32::from_le_bytes(id[28..].try_into().expect("4 bytes"));
        self.chunk_id_of(uid, data) == *id
    }

    /// The journal's cipher, for encrypted volumes.
    pub fn journal_cipher(&self) -> Option<JournalCipher> {
        self.journal.as_ref().map(|k| JournalCipher(aes_key(&k[..])))
    }

    /// Whether blobs are encrypted.
    pub fn encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    /// The id of a chunk.
    pub fn chunk_id(&self, data: &[u8]) -> ChunkId {
        *blake3::keyed_hash(&self.id_key, data).as_bytes()
    }

    /// A keyed checksum of arbitrary bytes in a separate domain (pack indexes
    /// of unencrypted volumes).
    pub fn checksum(&self, domain: &str, data: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.id_key);
        h.update(domain.as_bytes());
        h.update(&[0]);
        h.update(data);
        *h.finalize().as_bytes()
    }

    /// Seals `payload` in place (encrypted volumes): output is
    /// `nonce || ciphertext || tag`. Unencrypted volumes return it unchanged.
    pub fn seal(&self, aad: &[u8], payload: Vec<u8>) -> Vec<u8> {
        match &self.cipher {
            None => payload,
            Some(c) => seal_with(c, aad, &payload),
        }
    }

    /// Bytes `seal_into` writes for a payload of `len` bytes.
    pub fn sealed_len(&self, len: usize) -> usize {
        len + if self.cipher.is_some() { SEAL_OVERHEAD } else { 0 }
    }

    /// Seals `payload` straight into `out` (exactly `sealed_len(payload.len())`
    /// bytes, possibly uninitialised): the payload is copied once, then
    /// encrypted where it lies. Unencrypted volumes get the payload as it is.
    pub fn seal_into(&self, aad: &[u8], payload: &[u8], out: &mut [std::mem::MaybeUninit<u8>]) {
        assert_eq!(out.len(), self.sealed_len(payload.len()), "seal_into: wrong output length");
        let write = |out: &mut [std::mem::MaybeUninit<u8>], at: usize, bytes: &[u8]| {
            // SAFETY: `at + bytes.len() <= out.len()` (the lengths are
            // checked above) and the source is a distinct live slice.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().add(at).cast::<u8>(), bytes.len()) };
        };
        let Some(key) = &self.cipher else {
            write(out, 0, payload);
            return;
        };
        let nonce = random_nonce();
        write(out, 0, &nonce);
        write(out, NONCE_LEN, payload);
        // SAFETY: bytes 0..NONCE_LEN + payload.len() were written above.
        let body = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().add(NONCE_LEN).cast::<u8>(), payload.len()) };
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), body)
            .expect("AES-GCM sealing cannot fail for in-range lengths");
        write(out, NONCE_LEN + payload.len(), tag.as_ref());
    }

    /// Like [`Keys::seal`] from a borrowed payload: one copy either way.
    pub fn seal_slice(&self, aad: &[u8], payload: &[u8]) -> Vec<u8> {
        match &self.cipher {
            None => payload.to_vec(),
            Some(c) => seal_with(c, aad, payload),
        }
    }

    /// Opens a sealed blob; fails if it was altered or sealed under another key.
    pub fn open(&self, aad: &[u8], mut sealed: Vec<u8>) -> Result<Vec<u8>> {
        let Some(c) = &self.cipher else { return Ok(sealed) };
        if sealed.len() < SEAL_OVERHEAD {
            return Err(Error::corrupt("sealed blob shorter than nonce and tag"));
        }
        // Decrypted to the front of the buffer as it goes (ring's
        // `open_within`), not opened in place and then moved: a blob read
        // back is copied once less.
        let nonce = Nonce::try_assume_unique_for_key(&sealed[..NONCE_LEN]).map_err(|_| Error::corrupt("sealed blob nonce"))?;
        let n = c.open_within(nonce, Aad::from(aad), &mut sealed, NONCE_LEN..).map_err(|_| Error::corrupt("authentication failed (data altered or wrong key)"))?.len();
        sealed.truncate(n);
        Ok(sealed)
    }
}

/// Argon2id cost parameters, recorded beside the wrapped key.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct KdfParams {
    pub m_kib: u32,
    pub t: u32,
    pub p: u32,
}

impl Default for KdfParams {
    fn default() -> Self {
        // 64 MiB, 3 passes: about a quarter of a second here.
        KdfParams { m_kib: 64 * 1024, t: 3, p: 1 }
    }
}

fn kek(pass: &[u8], salt: &[u8], p: KdfParams) -> Result<Zeroizing<[u8; 32]>> {
    let params = argon2::Params::new(p.m_kib, p.t, p.p, Some(32))
        .map_err(|e| Error::config(format!("bad Argon2 parameters in volume config: {e}")))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = Zeroizing::new([0u8; 32]);
    a.hash_password_into(pass, salt, &mut out[..])
        .map_err(|e| Error::config(format!("key derivation failed: {e}")))?;
    Ok(out)
}

/// A master secret wrapped by a passphrase-derived key.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct WrappedKey {
    pub kdf: String,
    #[serde(flatten)]
    pub params: KdfParams,
    pub salt: String,
    pub sealed: String,
}

/// A fresh random master secret.
pub fn random_master() -> Zeroizing<[u8; 32]> {
    let mut m = Zeroizing::new([0u8; 32]);
    rand::thread_rng().fill_bytes(&mut m[..]);
    m
}

/// Wraps `master` under `pass`; `aad` binds it to one volume.
pub fn wrap_master(master: &[u8; 32], pass: &[u8], aad: &[u8], params: KdfParams) -> Result<WrappedKey> {
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    let k = kek(pass, &salt, params)?;
    let sealed = seal_with(&aes_key(&k[..]), aad, &master[..]);
    Ok(WrappedKey { kdf: "argon2id".into(), params, salt: hex::encode(salt), sealed: hex::encode(sealed) })
}

/// Unwraps the master secret; a wrong passphrase gives a clear Config error.
pub fn unwrap_master(w: &WrappedKey, pass: &[u8], aad: &[u8]) -> Result<Zeroizing<[u8; 32]>> {
    if w.kdf != "argon2id" {
        return Err(Error::config(format!("unknown key derivation {:?}", w.kdf)));
    }
    let salt = hex::decode(&w.salt).map_err(|_| Error::config("key file: bad salt"))?;
    let sealed = hex::decode(&w.sealed).map_err(|_| Error::config("key file: bad sealed key"))?;
    if sealed.len() != NONCE_LEN + 32 + TAG_LEN {
        return Err(Error::config("key file: sealed key has the wrong length"));
    }
    let k = kek(pass, &salt, w.params)?;
    let mut buf = Zeroizing::new(sealed);
    let n = open_with(&aes_key(&k[..]), aad, &mut buf[..]).ok_or_else(|| Error::config("wrong passphrase"))?;
    if n != 32 {
        return Err(Error::config("key file: unwrapped key has the wrong length"));
    }
    let mut m = Zeroizing::new([0u8; 32]);
    m.copy_from_slice(&buf[NONCE_LEN..NONCE_LEN + 32]);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_roundtrip_and_tamper() {
        let k = Keys::derive(&[7u8; 32], true);
        let s = k.seal(b"aad", b"hello world".to_vec());
        assert_eq!(k.open(b"aad", s.clone()).unwrap(), b"hello world");
        assert!(k.open(b"other", s.clone()).is_err());
        let mut t = s.clone();
        t[15] ^= 1;
        assert!(k.open(b"aad", t).is_err());
    }

    #[test]
    fn ids_are_keyed() {
        let a = Keys::derive(&[1u8; 32], false);
        let b = Keys::derive(&[2u8; 32], false);
        assert_ne!(a.chunk_id(b"x"), b.chunk_id(b"x"));
        assert_eq!(a.chunk_id(b"x"), a.chunk_id(b"x"));
    }

    #[test]
    fn wrong_passphrase_is_config_error() {
        let p = KdfParams { m_kib: 64, t: 1, p: 1 };
        let m = random_master();
        let w = wrap_master(&m, b"right", b"vol", p).unwrap();
        assert_eq!(&unwrap_master(&w, b"right", b"vol").unwrap()[..], &m[..]);
        let e = unwrap_master(&w, b"wrong", b"vol").unwrap_err();
        assert!(e.message().contains("wrong passphrase"));
    }
}
