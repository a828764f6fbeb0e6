//! A well-formed journal segment built from the input, then damaged the way
//! the input says: one byte of a middle record changed, or the segment cut
//! short. The scanner must tell damage (a bad record with intact ones after
//! it: reported, and the records after it still found) from a torn tail (the
//! last record cut short: ignored), never panic, and stay bounded.
#![no_main]
use cairn_engine::journal::{encode_record, scan_bytes, RecordKind};
use cairn_engine::Timestamp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if input.len() < 4 {
        return;
    }
    let (ctl, body) = input.split_at(4);
    // Between 3 and 10 records; their data are slices of the body.
    let n = 3 + (ctl[0] as usize % 8);
    let mut seg = Vec::new();
    let mut starts = Vec::new();
    let piece = body.len() / n;
    for i in 0..n {
        starts.push(seg.len());
        let data = &body[i * piece..(i + 1) * piece];
        let rec = match i % 3 {
            0 | 1 => encode_record(RecordKind::Write, 7, 10 + i as u64, (i * 4096) as u64, data.len() as u32, data, Timestamp(i as i64)),
            _ => encode_record(RecordKind::Truncate, 7, 10 + i as u64, i as u64, 0, &[], Timestamp(i as i64)),
        };
        seg.extend_from_slice(&rec);
    }
    starts.push(seg.len());
    // The body could hold bytes that read as records of their own (a file
    // of journal segments written through the volume): the exact checks
    // below hold only when it holds no record magic.
    let magics = |b: &[u8]| b.windows(4).filter(|w| *w == b"CJR1").count();
    let plain = magics(&seg) == n;
    let intact = scan_bytes(&seg).expect("in memory");
    assert_eq!(intact.records.len(), n);
    assert!(intact.damage.is_empty());

    if ctl[1] & 1 == 0 {
        // One byte of a middle record changed.
        let k = 1 + ctl[2] as usize % (n - 2);
        let span = starts[k + 1] - starts[k];
        let at = starts[k] + (u16::from_le_bytes([ctl[2], ctl[3]]) as usize % span);
        let mut bad = seg.clone();
        bad[at] ^= ctl[3] | 1;
        let scan = scan_bytes(&bad).expect("in memory");
        if scan.records.iter().any(|r| r.loc.record == (starts[k] + 48) as u64) {
            // The change kept a matching checksum (a crafted length): it
            // cannot be seen.
            return;
        }
        assert_eq!(scan.damage.first().map(|d| d.offset), Some(starts[k] as u64), "damage at record {k} (byte {at}) not reported");
        assert!(scan.records.iter().take(k).map(|r| r.seq).eq((0..k).map(|i| 10 + i as u64)), "records before the damage lost");
        if plain && magics(&bad) <= n {
            let seqs: Vec<u64> = scan.records.iter().map(|r| r.seq).collect();
            let want: Vec<u64> = (0..n).filter(|i| *i != k).map(|i| 10 + i as u64).collect();
            assert_eq!(seqs, want, "records after the damage lost");
        }
    } else {
        // Cut inside the last record: a torn tail, ignored.
        let last = starts[n - 1];
        let cut = last + (u16::from_le_bytes([ctl[2], ctl[3]]) as usize % (starts[n] - last));
        let scan = scan_bytes(&seg[..cut]).expect("in memory");
        if plain {
            assert!(scan.damage.is_empty(), "a torn tail reported as damage");
            assert_eq!(scan.records.len(), n - 1);
            assert_eq!(scan.end, last as u64);
        }
    }
});
