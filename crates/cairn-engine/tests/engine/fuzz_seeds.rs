//! The fuzz targets' seed corpora (fuzz/seeds/TARGET/NAME, which
//! scripts/fuzz.sh hands libFuzzer beside its scratch corpus): small
//! well-formed inputs, so that a run in a fresh clone starts where the
//! parsers are deep, and the damaged forms the tests build (a flipped byte,
//! a cut, a broken link), named `bad-*`.
//!
//! This test checks the committed seeds: every seed the generator makes is
//! in the tree, a well-formed one is accepted and a damaged one refused by
//! the call its target makes first. `CAIRN_WRITE_FUZZ_SEEDS=1` writes them
//! (`CAIRN_WRITE_FUZZ_SEEDS=1 cargo test --release -p cairn-engine --test
//! engine fuzz_seeds`); the encrypted ones differ between runs (random
//! nonces), so the check is by outcome, not by bytes.

use cairn_engine::cloud::versions::{self, Header, Kind, Prev};
use cairn_engine::crypto::{KdfParams, Keys};
use cairn_engine::extent::{decode_page, encode_page, Extent, Page};
use cairn_engine::journal::{encode_record, scan_bytes, RecordKind};
use cairn_engine::trace::{Event, Record, TraceReader};
use cairn_engine::{pack, InitOptions, Timestamp, VolumeConfig};
use cairn_tape::index::{object_head, parse_object_head};
use cairn_tape::layout::{frame_catalog, unframe_catalog, BlockHeader, BlockKind, Label, VolumeId, HEADER_LEN};
use std::path::{Path, PathBuf};

/// A seed: its target, its file name, its bytes, and whether the target's
/// first parser must accept it.
struct Seed {
    target: &'static str,
    name: &'static str,
    bytes: Vec<u8>,
    valid: bool,
}

fn seed(target: &'static str, name: &'static str, bytes: Vec<u8>) -> Seed {
    Seed { target, name, valid: !name.starts_with("bad-"), bytes }
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds")
}

/// Flips the bits of byte `at`.
fn flip(mut b: Vec<u8>, at: usize) -> Vec<u8> {
    b[at] ^= 0x5a;
    b
}

/// A pack of two chunks, as the target opens it (volume id 7s, master key 1s).
fn pack(encrypted: bool) -> Vec<u8> {
    let vid = [7u8; 16];
    let keys = Keys::derive(&[1u8; 32], encrypted);
    let mut b = pack::PackBuilder::new(&vid);
    for (i, chunk) in [b"the first chunk of a small pack, compressible compressible compressible".to_vec(), (0..200u8).collect()].iter().enumerate() {
        let id = [i as u8 + 1; 32];
        let (blob, flags) = pack::encode_blob(&keys, &id, chunk, 3);
        b.add(id, &blob, chunk.len() as u32, flags);
    }
    b.finish(&keys, &vid).0.bytes().to_vec()
}

fn journal_segment() -> Vec<u8> {
    let mut seg = Vec::new();
    seg.extend(encode_record(RecordKind::Write, 7, 10, 0, 11, b"hello world", Timestamp(1)));
    seg.extend(encode_record(RecordKind::Write, 7, 11, 4096, 5, b"again", Timestamp(2)));
    seg.extend(encode_record(RecordKind::Truncate, 7, 12, 100, 0, &[], Timestamp(3)));
    seg.extend(encode_record(RecordKind::Punch, 7, 13, 10, 20, &[], Timestamp(4)));
    seg.extend(encode_record(RecordKind::Write, 8, 14, 0, 3, b"end", Timestamp(5)));
    seg
}

/// The input of `journal_damage`: 4 control bytes, then the records' data.
fn journal_damage(ctl: [u8; 4]) -> Vec<u8> {
    let mut b = ctl.to_vec();
    b.extend((0..120u8).map(|i| b'a' + i % 26));
    b
}

/// The input of `meta_chain`: per object a tag byte (0x80 | version, 0x40
/// for a base), a 2-byte length and the body.
fn meta_chain(objects: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, body) in objects {
        out.push(*tag);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(body);
    }
    out
}

fn version(keys: &Keys, kind: Kind, v: u64, prev: Option<Prev>) -> Vec<u8> {
    let h = Header { kind, version: v, time: 1_700_000_000 + v, writer: [3; 8], prev };
    versions::encode(keys, &h, format!("metadata of version {v}").as_bytes()).unwrap()
}

fn trace(records: &[Record]) -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    cairn_engine::trace::write_trace(&p, 1_700_000_000_000_000_000, records).unwrap();
    std::fs::read(p).unwrap()
}

/// A ustar archive of the given (name, data) members and its end.
fn tar(members: &[(&[u8], &[u8], u8)]) -> Vec<u8> {
    let mut a = Vec::new();
    for (name, data, kind) in members {
        a.extend_from_slice(&cairn_testing::ustar_header(name, *kind, data.len() as u64));
        a.extend_from_slice(data);
        a.resize(a.len().div_ceil(512) * 512, 0);
    }
    a.resize(a.len() + 1024, 0);
    a
}

/// A pax record "LEN key=value\n".
fn pax(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut n = body.len() + 1;
    while format!("{n}{body}").len() != n {
        n += 1;
    }
    format!("{n}{body}").into_bytes()
}

fn seeds() -> Vec<Seed> {
    let mut s = Vec::new();
    // pack
    s.push(seed("pack", "plain", pack(false)));
    s.push(seed("pack", "encrypted", pack(true)));
    let p = pack(false);
    s.push(seed("pack", "bad-trailer", flip(p.clone(), p.len() - 3)));
    s.push(seed("pack", "bad-cut", p[..p.len() - 7].to_vec()));
    s.push(seed("pack", "bad-magic", flip(p, 0)));
    // extent_page
    let page = Page::new(1, vec![Extent::chunk(5, 0, 4096), Extent::hole(8192), Extent::chunk(9, 100, 1 << 20), Extent::chunk(5, 4096, 10)]);
    let page = encode_page(&page).unwrap();
    s.push(seed("extent_page", "page", page.clone()));
    s.push(seed("extent_page", "bad-cut", page[..page.len() - 1].to_vec()));
    // journal
    let seg = journal_segment();
    s.push(seed("journal", "segment", seg.clone()));
    s.push(seed("journal", "bad-damaged-middle", flip(seg.clone(), 48 + 11 + 50)));
    s.push(seed("journal", "bad-torn-tail", seg[..seg.len() - 2].to_vec()));
    // journal_damage (any input is well formed: the target damages it)
    s.push(seed("journal_damage", "flip", journal_damage([5, 0, 1, 7])));
    s.push(seed("journal_damage", "cut", journal_damage([2, 1, 9, 3])));
    // config
    let plain = VolumeConfig::create(&InitOptions::default()).unwrap().0.to_bytes();
    let enc = VolumeConfig::create(&InitOptions {
        passphrase: Some(b"pass".to_vec().into()),
        kdf: Some(KdfParams { m_kib: 64, t: 1, p: 1 }),
        ..Default::default()
    })
    .unwrap()
    .0
    .to_bytes();
    s.push(seed("config", "plain", plain.clone()));
    s.push(seed("config", "encrypted", enc));
    s.push(seed("config", "bad-cut", plain[..plain.len() / 2].to_vec()));
    // meta_chain: a base and two deltas; a hole; a broken link.
    let keys = Keys::derive(&[1u8; 32], false);
    let v1 = version(&keys, Kind::Base, 1, None);
    let v2 = version(&keys, Kind::Delta, 2, Some(Prev { version: 1, digest: versions::digest(&v1) }));
    let v3 = version(&keys, Kind::Delta, 3, Some(Prev { version: 2, digest: versions::digest(&v2) }));
    let v3_wrong = version(&keys, Kind::Delta, 3, Some(Prev { version: 2, digest: [0; 32] }));
    s.push(seed("meta_chain", "chain", meta_chain(&[(0xc1, v1.clone()), (0x82, v2.clone()), (0x83, v3.clone())])));
    s.push(seed("meta_chain", "bad-hole", meta_chain(&[(0xc1, v1.clone()), (0x83, v3)])));
    s.push(seed("meta_chain", "bad-link", meta_chain(&[(0xc1, v1), (0x82, v2), (0x83, v3_wrong)])));
    // trace_reader
    let recs = [
        Record { time: 1, event: Event::Write { ino: 2, offset: 0, len: 4096 } },
        Record { time: 2, event: Event::Read { ino: 2, offset: 0, len: 4096 } },
        Record { time: 3, event: Event::Chunk { chunk: 9, pack: 4, offset: 0, len: 4096 } },
        Record { time: 4, event: Event::Truncate { ino: 2, size: 10 } },
        Record { time: 5, event: Event::Remove { ino: 2 } },
    ];
    let t = trace(&recs);
    s.push(seed("trace_reader", "trace", t.clone()));
    s.push(seed("trace_reader", "bad-torn-tail", t[..t.len() - 5].to_vec()));
    s.push(seed("trace_reader", "bad-magic", flip(t, 0)));
    // tar
    let a = tar(&[(b"dir/", b"", b'5'), (b"dir/hello.txt", b"hello world\n", b'0'), (b"PaxHeader", &[pax("path", "a/long/name/é.txt"), pax("mtime", "1.5")].concat(), b'x'), (b"x", b"pax named", b'0')]);
    s.push(seed("tar", "ustar-pax", a.clone()));
    s.push(seed("tar", "bad-checksum", flip(a.clone(), 512 + 150)));
    s.push(seed("tar", "bad-cut", a[..512 + 6].to_vec()));
    // tape_layout
    let vid = VolumeId([7; 16]);
    let label = Label::new(vid, 1024, 1_700_000_000, b"cairn tape label info").encode();
    s.push(seed("tape_layout", "label", label.clone()));
    s.push(seed("tape_layout", "bad-label", flip(label, 9)));
    let payload = b"object bytes in one block";
    let h = BlockHeader { kind: BlockKind::Data, last: true, volume_id: vid, object_id: 3, seq: 0, offset: 0, payload_len: payload.len() as u32 };
    let mut block = vec![0u8; 512];
    h.encode(payload, &mut block);
    s.push(seed("tape_layout", "block", block.clone()));
    s.push(seed("tape_layout", "bad-block", flip(block, HEADER_LEN + 3)));
    let framed = frame_catalog(b"a catalog payload");
    s.push(seed("tape_layout", "catalog-frame", framed.clone()));
    s.push(seed("tape_layout", "bad-catalog-frame", flip(framed.clone(), framed.len() - 1)));
    s.push(seed("tape_layout", "object-head", object_head("packs/0123456789abcdef")));
    s
}

/// Whether the target's first parser accepts `b`.
fn accepted(target: &str, b: &[u8]) -> bool {
    match target {
        "pack" => {
            let n = b.len();
            n >= pack::TRAILER_LEN
                && pack::check_header(b, &[7; 16]).is_ok()
                && pack::parse_trailer(&b[n - pack::TRAILER_LEN..], n as u64).is_ok_and(|len| {
                    let end = n - pack::TRAILER_LEN;
                    [false, true].iter().any(|&e| pack::decode_index(&Keys::derive(&[1; 32], e), &[7; 16], b[end - len as usize..end].to_vec(), n as u64).is_ok())
                })
        }
        "extent_page" => decode_page(1, b).is_ok(),
        "journal" => scan_bytes(b).is_ok_and(|s| s.damage.is_empty() && s.end as usize == b.len()),
        "journal_damage" => b.len() >= 4,
        "config" => VolumeConfig::parse(b).is_ok(),
        "meta_chain" => {
            let mut objects = Vec::new();
            let mut rest = b;
            while let Some((&tag, r)) = rest.split_first() {
                let len = u16::from_le_bytes([r[0], r[1]]) as usize;
                let name = format!("meta/{:016}.{}", tag & 0x1f, if tag & 0x40 != 0 { "base" } else { "delta" });
                objects.push((name, r[2..2 + len].to_vec()));
                rest = &r[2 + len..];
            }
            versions::verify_chain(&objects).is_ok()
        }
        "trace_reader" => TraceReader::new(b).is_ok_and(|r| {
            let mut r = r;
            let all_ok = r.by_ref().all(|x| x.is_ok());
            all_ok && !r.torn_tail()
        }),
        "tar" => cairn_tar::parse(b, b.len() as u64).is_ok(),
        "tape_layout" => Label::parse(b).is_ok() || BlockHeader::decode(b).is_ok() || unframe_catalog(b).is_ok() || parse_object_head(b).is_ok(),
        t => panic!("no seed check for target {t}"),
    }
}

#[test]
fn fuzz_seeds() {
    let write = std::env::var_os("CAIRN_WRITE_FUZZ_SEEDS").is_some();
    let mut problems = Vec::new();
    for s in seeds() {
        assert!(s.bytes.len() <= 8192, "seed {}/{} is {} bytes: keep seeds small", s.target, s.name, s.bytes.len());
        assert_eq!(accepted(s.target, &s.bytes), s.valid, "the generated seed {}/{}", s.target, s.name);
        let p = dir().join(s.target).join(s.name);
        if write {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &s.bytes).unwrap();
            continue;
        }
        match std::fs::read(&p) {
            Ok(b) if accepted(s.target, &b) == s.valid => {}
            Ok(_) => problems.push(format!("{} is {}accepted by its target's parser", p.display(), if s.valid { "not " } else { "" })),
            Err(e) => problems.push(format!("{}: {e}", p.display())),
        }
    }
    // Every target has seeds.
    let targets = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets")).unwrap();
    for t in targets {
        let t = t.unwrap().path();
        let name = t.file_stem().unwrap().to_str().unwrap().to_string();
        if std::fs::read_dir(dir().join(&name)).map_or(true, |mut d| d.next().is_none()) {
            problems.push(format!("fuzz target {name} has no seeds in fuzz/seeds/{name}"));
        }
    }
    assert!(problems.is_empty(), "the committed fuzz seeds (write them with CAIRN_WRITE_FUZZ_SEEDS=1):\n{}", problems.join("\n"));
}
