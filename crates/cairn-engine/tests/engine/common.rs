#![allow(dead_code)]
use cairn_engine::*;
use std::path::Path;
use std::sync::Arc;

/// Small chunks so tests exercise many chunk boundaries quickly.
pub fn small_chunks() -> ChunkerParams {
    ChunkerParams { min: 4 << 10, avg: 16 << 10, max: 64 << 10, ..Default::default() }
}

pub fn init_small(dir: &Path) {
    init(dir, &InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), ..Default::default() }).unwrap();
}

pub fn open(dir: &Path) -> Arc<Volume> {
    Volume::load(dir, OpenOptions::default()).unwrap()
}

pub fn root() -> Caller {
    Caller { uid: 0, gid: 0 }
}

pub fn mkfile(v: &Volume, parent: Ino, name: &str, data: &[u8]) -> Ino {
    let a = v.create(parent, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
    v.open(a.ino).unwrap();
    let mut off = 0;
    for piece in data.chunks(128 << 10) {
        v.write(a.ino, off, piece).unwrap();
        off += piece.len() as u64;
    }
    v.release(a.ino).unwrap();
    a.ino
}

pub fn read_all(v: &Volume, ino: Ino) -> Vec<u8> {
    let size = v.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = v.read(ino, out.len() as u64, 1 << 20).unwrap();
        assert!(!got.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&got);
    }
    out
}

/// Deterministic pseudo-random bytes (incompressible).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn stored_pack_bytes(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map(|rd| rd.flatten().map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() { walk(&e.path()) } else { m.len() }
        }).sum()).unwrap_or(0)
    }
    walk(&dir.join("store/packs"))
}
