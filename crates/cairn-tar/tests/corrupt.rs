//! Corrupt and hostile input: the right error, never a panic.

use cairn_tar::{
    data_padding, parse, write_header, HeaderSpec, MemberKind, Parser, TarError, END_OF_ARCHIVE,
};
use proptest::prelude::*;

fn spec<'a>(path: &'a [u8], size: u64, xattrs: &'a [(Vec<u8>, Vec<u8>)]) -> HeaderSpec<'a> {
    HeaderSpec {
        path,
        kind: MemberKind::File,
        link_target: None,
        mode: 0o644,
        uid: 1,
        gid: 2,
        uname: Some(b"u"),
        gname: Some(b"g"),
        mtime_ns: 1_700_000_000_000_000_000,
        atime_ns: None,
        size,
        dev_major: 0,
        dev_minor: 0,
        xattrs,
    }
}

/// Three members: plain, pax (long name, xattr), plain; returns the archive
/// and the offset of each member's first header and data.
fn sample() -> (Vec<u8>, Vec<(u64, u64)>) {
    let long = b"d/".repeat(80);
    let long = [long, b"file".to_vec()].concat();
    let x = vec![(b"user.k".to_vec(), b"v".to_vec())];
    let members: Vec<(Vec<u8>, usize)> =
        vec![(b"a.txt".to_vec(), 700), (long, 1024), (b"c".to_vec(), 5)];
    let mut out = Vec::new();
    let mut offs = Vec::new();
    for (i, (p, n)) in members.iter().enumerate() {
        let hdr = out.len() as u64;
        let xs: &[(Vec<u8>, Vec<u8>)] = if i == 1 { &x } else { &[] };
        out.extend_from_slice(&write_header(&spec(p, *n as u64, xs), hdr, None));
        offs.push((hdr, out.len() as u64));
        out.extend(std::iter::repeat_n(i as u8 + 1, *n));
        out.resize(out.len() + data_padding(*n as u64) as usize, 0);
    }
    out.extend_from_slice(&END_OF_ARCHIVE);
    (out, offs)
}

fn fix_checksum(block: &mut [u8]) {
    block[148..156].fill(b' ');
    let sum: u32 = block[..512].iter().map(|&b| u32::from(b)).sum();
    block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

fn p(a: &[u8]) -> Result<Vec<cairn_tar::Member>, TarError> {
    parse(a, a.len() as u64)
}

#[test]
fn sample_parses() {
    let (a, offs) = sample();
    let ms = p(&a).unwrap();
    assert_eq!(ms.len(), 3);
    for (m, (h, d)) in ms.iter().zip(&offs) {
        assert_eq!(m.header_offset, *h);
        assert_eq!(m.data[0].archive_offset, *d);
    }
    assert!(
        offs[1].1 - offs[1].0 > 512,
        "second member has a pax header"
    );
}

#[test]
fn truncation_everywhere() {
    let (a, offs) = sample();
    let full = p(&a).unwrap();
    let end_of_members = a.len() - 1024;
    for cut in 0..a.len() {
        match p(&a[..cut]) {
            Ok(ms) => {
                // Only at a member boundary, or inside the end marker.
                assert!(
                    cut >= end_of_members || cut % 512 == 0,
                    "cut {cut} accepted"
                );
                assert!(full.starts_with(&ms));
                let boundary =
                    cut >= end_of_members || offs.iter().any(|(h, _)| *h == cut as u64) || cut == 0;
                assert!(boundary, "cut {cut}: accepted inside a member");
            }
            Err(TarError::Truncated { offset, .. }) => {
                assert!(cut < end_of_members, "cut {cut}: end marker region refused");
                // The error names the start of the member being read.
                assert!(
                    offs.iter().any(|(h, _)| *h == offset) || offset % 512 == 0,
                    "cut {cut}: offset {offset}"
                );
            }
            Err(e) => panic!("cut {cut}: unexpected {e}"),
        }
    }
    // Specific cases: in the middle of member 2's data → Truncated at its
    // first (pax) header; inside member 3's header block → at that block.
    match p(&a[..offs[1].1 as usize + 100]) {
        Err(TarError::Truncated { offset, .. }) => assert_eq!(offset, offs[1].1 - 512),
        other => panic!("{other:?}"),
    }
    match p(&a[..offs[2].0 as usize + 100]) {
        Err(e @ TarError::Truncated { .. }) => {
            assert_eq!(e.offset(), Some(offs[2].0));
            assert!(e.to_string().contains(&offs[2].0.to_string()), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Between the pax header and its member header.
    match p(&a[..offs[1].0 as usize + 1024]) {
        Err(TarError::Truncated { offset, .. }) => assert_eq!(offset, offs[1].0),
        other => panic!("{other:?}"),
    }
}

#[test]
fn end_marker_variants() {
    let (a, _) = sample();
    let body = &a[..a.len() - 1024];
    assert_eq!(p(body).unwrap().len(), 3, "EOF at a block boundary");
    assert_eq!(p(&a[..a.len() - 512]).unwrap().len(), 3, "one zero block");
    let mut more = a.clone();
    more.extend_from_slice(&[0u8; 4096]);
    assert_eq!(p(&more).unwrap().len(), 3, "extra zero blocks");
    assert_eq!(p(&[]).unwrap().len(), 0, "empty archive");
}

#[test]
fn bad_checksums() {
    let (a, offs) = sample();
    for (i, (h, d)) in offs.iter().enumerate() {
        // The member's own header block (the last before its data).
        let hb = (*d - 512) as usize;
        for at in [hb + 148, hb + 150, hb + 10, hb + 300] {
            let mut b = a.clone();
            b[at] ^= 0x01;
            match p(&b) {
                Err(TarError::BadChecksum { offset, .. }) => {
                    assert_eq!(offset, hb as u64, "member {i} byte {at}")
                }
                other => panic!("member {i} byte {at}: {other:?}"),
            }
        }
        // The streaming parser yields the members before the bad one.
        let mut b = a.clone();
        b[*h as usize + 148] ^= 0x02;
        let got: Vec<_> = Parser::new(&b[..], b.len() as u64).collect();
        assert_eq!(got.len(), i + 1);
        assert!(got[..i].iter().all(Result::is_ok));
        let e = got[i].as_ref().unwrap_err();
        assert!(matches!(e, TarError::BadChecksum { .. }), "{e}");
        assert!(e.to_string().contains(&format!("offset {h}")), "{e}");
    }
    // Not a tar file at all.
    let junk = vec![b'x'; 2048];
    assert!(matches!(
        p(&junk),
        Err(TarError::BadChecksum { offset: 0, .. })
    ));
    // A compressed archive is named as such.
    let mut gz = vec![0x1f, 0x8b, 8, 0];
    gz.resize(2048, 7);
    let e = p(&gz).unwrap_err();
    assert!(matches!(e, TarError::Unsupported { offset: 0, .. }), "{e}");
    assert!(e.to_string().contains("gzip"), "{e}");
}

#[test]
fn sizes_past_the_end_and_nonsense() {
    let (a, offs) = sample();
    let hb = (offs[2].1 - 512) as usize;
    let set_size = |field: &[u8]| {
        let mut b = a.clone();
        b[hb + 124..hb + 136].copy_from_slice(field);
        fix_checksum(&mut b[hb..hb + 512]);
        b
    };
    match p(&set_size(b"77777777777\0")) {
        Err(e @ TarError::Truncated { .. }) => assert_eq!(e.offset(), Some(hb as u64)),
        other => panic!("{other:?}"),
    }
    // Base-256: huge, and negative.
    let mut huge = [0xffu8; 12];
    huge[0] = 0x80;
    huge[1..5].fill(0);
    assert!(matches!(
        p(&set_size(&huge)),
        Err(TarError::Truncated { .. } | TarError::BadField { .. })
    ));
    let neg = [0xffu8; 12];
    match p(&set_size(&neg)) {
        Err(TarError::BadField { field, offset, .. }) => {
            assert_eq!(field, "size");
            assert_eq!(offset, hb as u64);
        }
        other => panic!("{other:?}"),
    }
    // u64::MAX: rounding up overflows.
    let mut max = [0xffu8; 12];
    max[0] = 0x80;
    max[1..4].fill(0);
    assert!(p(&set_size(&max)).is_err());
    // Garbage digits.
    assert!(matches!(
        p(&set_size(b"12345678x01\0")),
        Err(TarError::BadField { field: "size", .. })
    ));
}

/// A pax 'x' header with the given records, then a member "f".
fn with_pax(records: &[u8]) -> Vec<u8> {
    let mut b = [0u8; 512];
    b[..7].copy_from_slice(b"paxhdr\0");
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0000000\0");
    b[116..124].copy_from_slice(b"0000000\0");
    b[124..136].copy_from_slice(format!("{:011o}\0", records.len()).as_bytes());
    b[136..148].copy_from_slice(b"00000000000\0");
    b[156] = b'x';
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    fix_checksum(&mut b);
    let mut out = b.to_vec();
    out.extend_from_slice(records);
    out.resize(out.len() + data_padding(records.len() as u64) as usize, 0);
    let at = out.len() as u64;
    out.extend_from_slice(&write_header(&spec(b"f", 3, &[]), at, None));
    out.extend_from_slice(b"abc");
    out.resize(out.len() + 509, 0);
    out.extend_from_slice(&END_OF_ARCHIVE);
    out
}

#[test]
fn pax_records() {
    // Well-formed: path, fractional mtime, LIBARCHIVE xattr (base64,
    // %-encoded name), trailing NUL padding.
    let ok = with_pax(
        b"12 path=abc\n30 mtime=1234567890.000000001\n36 LIBARCHIVE.xattr.user.a%3Db=aGk=\n\0\0\0",
    );
    let ms = p(&ok).unwrap();
    assert_eq!(ms[0].path, b"abc");
    assert_eq!(ms[0].mtime_ns, 1_234_567_890_000_000_001);
    assert_eq!(ms[0].xattrs, vec![(b"user.a=b".to_vec(), b"hi".to_vec())]);
    assert_eq!(ms[0].data[0].len, 3);

    for bad in [
        &b"xx path=a\n"[..],        // length not a number
        b"99 path=abc\n",           // length past the data
        b"11 path=abc\n",           // length inside the record
        b"10 pathabc\n",            // no '='
        b"7 =abc\n",                // empty keyword
        b"12 path=abc ",            // no newline
        b"path=abc\n",              // no length
        b"13 size=12ab\n",          // size not a number
        b"16 mtime=1.2.3x\n",       // bad time
        b"22 GNU.sparse.major=x\n", // bad sparse number
    ] {
        match p(&with_pax(bad)) {
            Err(e @ TarError::BadField { .. }) => {
                assert_eq!(e.offset(), Some(0), "{e}");
                assert!(e.to_string().contains("offset 0"), "{e}");
            }
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bad)),
        }
    }
    // A pax size past the end of the archive.
    assert!(matches!(
        p(&with_pax(b"20 size=99999999999\n")),
        Err(TarError::Truncated { .. })
    ));
    // A pax header followed by the end marker.
    let mut lone = with_pax(b"12 path=abc\n");
    lone.truncate(1024);
    lone.extend_from_slice(&END_OF_ARCHIVE);
    assert!(matches!(
        p(&lone),
        Err(TarError::BadField {
            field: "extended header",
            ..
        })
    ));
}

#[test]
fn sparse_maps_checked() {
    // pax 0.1 map whose runs do not add up to the stored size (3 bytes).
    let bad_sum = with_pax(b"25 GNU.sparse.size=10000\n24 GNU.sparse.map=0,5,9\n");
    assert!(matches!(p(&bad_sum), Err(TarError::BadField { .. })));
    let bad_sum = with_pax(b"25 GNU.sparse.size=10000\n27 GNU.sparse.map=0,5,100,1\n");
    assert!(matches!(p(&bad_sum), Err(TarError::BadField { .. })));
    // Past the real size.
    let past = with_pax(b"22 GNU.sparse.size=10\n24 GNU.sparse.map=9,3\n");
    assert!(matches!(p(&past), Err(TarError::BadField { .. })));
    // Overlapping.
    let overlap = with_pax(b"23 GNU.sparse.size=100\n28 GNU.sparse.map=10,2,11,1\n");
    assert!(matches!(p(&overlap), Err(TarError::BadField { .. })));
    // Good: 2 bytes at 10, 1 at 50 → 3 stored.
    let good = with_pax(b"23 GNU.sparse.size=100\n28 GNU.sparse.map=10,2,50,1\n");
    let ms = p(&good).unwrap();
    assert_eq!(ms[0].size, 100);
    assert_eq!(ms[0].data.len(), 2);
    assert_eq!(ms[0].data[1].file_offset, 50);
    assert_eq!(
        ms[0].data[1].archive_offset,
        ms[0].data[0].archive_offset + 2
    );
    // 1.0 with an absurd count in the data area: refused before allocating.
    let mut v1 =
        with_pax(b"22 GNU.sparse.major=1\n22 GNU.sparse.minor=0\n26 GNU.sparse.realsize=10\n");
    let data_at = v1.len() - 1024 - 512;
    v1[data_at..data_at + 3].copy_from_slice(b"9\n\0");
    let v1b = {
        let mut x = v1.clone();
        x[data_at..data_at + 3].copy_from_slice(b"99\n");
        x
    };
    assert!(matches!(p(&v1), Err(TarError::BadField { .. })));
    assert!(matches!(p(&v1b), Err(TarError::BadField { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let _ = p(&data);
        // Claimed length longer than the data: reads come up short.
        let _ = parse(&data[..], data.len() as u64 + 1000);
    }

    #[test]
    fn mutated_archives_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        fix in any::<bool>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let (mut a, _) = sample();
        for (i, v) in &flips {
            let at = i.index(a.len());
            a[at] = *v;
        }
        if fix {
            for blk in a.chunks_mut(512) {
                if blk.len() == 512 && blk.iter().any(|&c| c != 0) {
                    fix_checksum(blk);
                }
            }
        }
        let _ = p(&a);
        let c = cut.index(a.len() + 1);
        let _ = p(&a[..c]);
    }
}
