//! Header writing: ustar when everything fits, pax `x` + ustar otherwise.

use crate::num::{format_pax_time, put_base256, put_octal};
use crate::{MemberKind, BLOCK};

/// Two zero blocks: the end-of-archive marker.
pub const END_OF_ARCHIVE: [u8; 1024] = [0u8; 1024];

/// Zero bytes to write after `size` bytes of member data so the next header
/// starts on a block boundary.
pub fn data_padding(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

/// What [`write_header`] records about a member.
#[derive(Clone, Copy, Debug)]
pub struct HeaderSpec<'a> {
    /// Path inside the archive, raw bytes, without a trailing '/' (one is
    /// added for directories). Should be relative.
    pub path: &'a [u8],
    /// What the member is.
    pub kind: MemberKind,
    /// Symlink target, or the path of the earlier member a hard link names.
    pub link_target: Option<&'a [u8]>,
    /// Permission bits; only `0o7777` is kept.
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Owner name.
    pub uname: Option<&'a [u8]>,
    /// Group name.
    pub gname: Option<&'a [u8]>,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Access time: recorded (in the pax header) when given.
    pub atime_ns: Option<i64>,
    /// Data size. Only regular files carry data: for other kinds the header
    /// records 0 and the caller writes no data (see [`HeaderSpec::data_len`]).
    pub size: u64,
    /// Device numbers, for character and block devices.
    pub dev_major: u32,
    /// See `dev_major`.
    pub dev_minor: u32,
    /// Extended attributes, recorded as `SCHILY.xattr.NAME`. Names
    /// containing '=' or NUL cannot be represented and are left out.
    pub xattrs: &'a [(Vec<u8>, Vec<u8>)],
}

impl HeaderSpec<'_> {
    /// Bytes of data the caller must write after the header (`size` for a
    /// regular file, 0 for every other kind).
    pub fn data_len(&self) -> u64 {
        if self.kind == MemberKind::File {
            self.size
        } else {
            0
        }
    }
}

const MAX_OCTAL_11: u64 = 0o77777777777; // size, mtime fields
const MAX_OCTAL_7: u64 = 0o7777777; // uid, gid, dev fields

/// A pax record `"LEN KEY=VALUE\n"`, LEN counting itself.
fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let base = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = base + 1;
    while len != base + len.to_string().len() {
        len = base + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// Splits a path into (prefix, name) for the ustar fields, if it fits.
fn split_ustar(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.len() <= 100 {
        return Some((&[], path));
    }
    if path.len() > 256 {
        return None;
    }
    // The prefix must be ≤ 155 bytes and the name ≤ 100 and non-empty.
    let lo = path.len().saturating_sub(101);
    (lo..path.len().min(156))
        .find(|&i| path[i] == b'/' && i + 1 < path.len())
        .map(|i| (&path[..i], &path[i + 1..]))
}

fn set_checksum(block: &mut [u8; 512]) {
    block[148..156].fill(b' ');
    let sum: u64 = block.iter().map(|&b| u64::from(b)).sum();
    let s = format!("{sum:06o}");
    block[148..154].copy_from_slice(s.as_bytes());
    block[154] = 0;
    block[155] = b' ';
}

struct Fields<'a> {
    name: &'a [u8],
    prefix: &'a [u8],
    mode: u32,
    uid: u64,
    gid: u64,
    size: u64,
    mtime: i64,
    typeflag: u8,
    linkname: &'a [u8],
    uname: &'a [u8],
    gname: &'a [u8],
    dev_major: u32,
    dev_minor: u32,
}

/// A ustar header block. Numbers that do not fit in octal use base-256
/// (read by GNU tar and libarchive); for the values that matter a pax
/// record carries the exact value anyway.
fn ustar_block(f: &Fields) -> [u8; 512] {
    let mut b = [0u8; 512];
    let copy = |dst: &mut [u8], src: &[u8]| {
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
    };
    copy(&mut b[0..100], f.name);
    put_octal(&mut b[100..108], u64::from(f.mode & 0o7777));
    for (r, v) in [(108..116, f.uid), (116..124, f.gid)] {
        if !put_octal(&mut b[r.clone()], v) {
            put_octal(&mut b[r], 0);
        }
    }
    if !put_octal(&mut b[124..136], f.size) {
        put_base256(&mut b[124..136], f.size as i64);
    }
    let mtime = f.mtime.clamp(0, MAX_OCTAL_11 as i64) as u64;
    put_octal(&mut b[136..148], mtime);
    b[156] = f.typeflag;
    copy(&mut b[157..257], f.linkname);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    copy(&mut b[265..297], f.uname);
    copy(&mut b[297..329], f.gname);
    for (r, v) in [(329..337, f.dev_major), (337..345, f.dev_minor)] {
        if !put_octal(&mut b[r.clone()], u64::from(v)) {
            put_base256(&mut b[r], i64::from(v));
        }
    }
    copy(&mut b[345..500], f.prefix);
    set_checksum(&mut b);
    b
}

/// A name for the pax header itself, as GNU tar makes one:
/// `DIR/PaxHeaders/BASE`, ASCII only, within 100 bytes.
fn pax_header_name(path: &[u8]) -> Vec<u8> {
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    let (dir, base) = match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (&b"."[..], trimmed),
    };
    let clean = |s: &[u8]| -> Vec<u8> {
        s.iter()
            .map(|&c| {
                if c.is_ascii_graphic() || c == b' ' {
                    c
                } else {
                    b'_'
                }
            })
            .collect()
    };
    let mut base = clean(base);
    base.truncate(40);
    let mut dir = clean(dir);
    dir.truncate(100 - 12 - base.len());
    let mut out = dir;
    out.extend_from_slice(b"/PaxHeaders/");
    out.extend_from_slice(&base);
    out
}

fn is_ascii(s: &[u8]) -> bool {
    s.iter().all(|&c| c.is_ascii() && c != 0)
}

/// Header bytes for a member whose first header block starts at archive
/// offset `pos` (a multiple of 512).
///
/// Plain ustar when everything fits; otherwise a pax `x` header first,
/// as GNU tar `--format=posix` writes it, for: paths or link targets that
/// are too long or not ASCII, sizes ≥ 8 GiB, uid/gid ≥ 2^21, user and group
/// names that are too long or not ASCII, mtimes with a fraction or out of
/// the octal range, atimes, and xattrs (`SCHILY.xattr.NAME`). A path that
/// is not valid UTF-8 is marked `hdrcharset=BINARY`.
///
/// With `align = Some(A)` (A a power of two ≥ 512), the result is sized so
/// that `pos + len` is a multiple of A: a pax header is always emitted then
/// (when the plain header does not already land there) and padded with a
/// `comment` record, which GNU tar and bsdtar skip silently (the padding
/// costs less than A + 1536 bytes). Alignment is
/// ignored if `A` is not a power of two ≥ 512 or `pos` is not a multiple of
/// 512.
pub fn write_header(spec: &HeaderSpec, pos: u64, align: Option<u64>) -> Vec<u8> {
    let mut records = Vec::new();
    let mut binary = false;

    let mut path = spec.path.to_vec();
    if spec.kind == MemberKind::Dir && !path.ends_with(b"/") {
        path.push(b'/');
    }
    // Valid UTF-8 that is not ASCII goes to pax (as GNU tar does); bytes
    // that are not UTF-8 stay raw in the ustar fields when they fit, since
    // a pax path must be UTF-8 unless marked hdrcharset=BINARY.
    let utf8 = std::str::from_utf8(&path).is_ok();
    let split = if is_ascii(&path) || !utf8 {
        split_ustar(&path)
    } else {
        None
    };
    if split.is_none() {
        binary |= !utf8;
        pax_record(&mut records, b"path", &path);
    }
    let (prefix, name): (&[u8], &[u8]) = split.unwrap_or((&[], &path[..path.len().min(100)]));

    let link = spec.link_target.unwrap_or(&[]);
    let link = match spec.kind {
        MemberKind::Symlink | MemberKind::HardLink => link,
        _ => &[],
    };
    let link_utf8 = std::str::from_utf8(link).is_ok();
    if link.len() > 100 || (!is_ascii(link) && link_utf8) || link.contains(&0) {
        binary |= !link_utf8;
        pax_record(&mut records, b"linkpath", link);
    }

    let size = spec.data_len();
    if size > MAX_OCTAL_11 {
        pax_record(&mut records, b"size", size.to_string().as_bytes());
    }
    for (key, v) in [(&b"uid"[..], spec.uid), (&b"gid"[..], spec.gid)] {
        if v > MAX_OCTAL_7 {
            pax_record(&mut records, key, v.to_string().as_bytes());
        }
    }
    let mut names = [&b""[..], &b""[..]];
    for (i, (key, v)) in [(&b"uname"[..], spec.uname), (&b"gname"[..], spec.gname)]
        .into_iter()
        .enumerate()
    {
        if let Some(v) = v {
            if v.len() > 32 || !is_ascii(v) {
                pax_record(&mut records, key, v);
            } else {
                names[i] = v;
            }
        }
    }
    let mtime_fits = spec.mtime_ns % 1_000_000_000 == 0
        && (0..=MAX_OCTAL_11 as i64).contains(&(spec.mtime_ns / 1_000_000_000));
    if !mtime_fits {
        pax_record(
            &mut records,
            b"mtime",
            format_pax_time(spec.mtime_ns).as_bytes(),
        );
    }
    if let Some(a) = spec.atime_ns {
        pax_record(&mut records, b"atime", format_pax_time(a).as_bytes());
    }
    for (n, v) in spec.xattrs {
        if n.is_empty() || n.contains(&b'=') || n.contains(&0) {
            continue;
        }
        let mut key = b"SCHILY.xattr.".to_vec();
        key.extend_from_slice(n);
        pax_record(&mut records, &key, v);
    }
    if binary {
        let mut r = Vec::new();
        pax_record(&mut r, b"hdrcharset", b"BINARY");
        r.extend_from_slice(&records);
        records = r;
    }

    let typeflag = match spec.kind {
        MemberKind::File => b'0',
        MemberKind::HardLink => b'1',
        MemberKind::Symlink => b'2',
        MemberKind::CharDev => b'3',
        MemberKind::BlockDev => b'4',
        MemberKind::Dir => b'5',
        MemberKind::Fifo => b'6',
    };
    let is_dev = matches!(spec.kind, MemberKind::CharDev | MemberKind::BlockDev);
    let main = Fields {
        name,
        prefix,
        mode: spec.mode,
        uid: if spec.uid > MAX_OCTAL_7 { 0 } else { spec.uid },
        gid: if spec.gid > MAX_OCTAL_7 { 0 } else { spec.gid },
        size: if size > MAX_OCTAL_11 { 0 } else { size },
        mtime: spec.mtime_ns.div_euclid(1_000_000_000),
        typeflag,
        linkname: &link[..link.len().min(100)],
        uname: names[0],
        gname: names[1],
        dev_major: if is_dev { spec.dev_major } else { 0 },
        dev_minor: if is_dev { spec.dev_minor } else { 0 },
    };

    let align = align.filter(|a| a.is_power_of_two() && *a >= BLOCK && pos.is_multiple_of(BLOCK));
    let blocks = |recs: u64| -> u64 {
        if recs == 0 {
            BLOCK
        } else {
            2 * BLOCK + recs.div_ceil(BLOCK) * BLOCK
        }
    };
    if let Some(a) = align {
        let natural = blocks(records.len() as u64);
        if !(pos + natural).is_multiple_of(a) {
            // Pad with a comment record so the pax data fill exactly k
            // blocks, k chosen so the member's data start on the boundary.
            const MIN_COMMENT: u64 = 13; // "13 comment=x\n"
            let base = records.len() as u64;
            let k_min = (base + MIN_COMMENT).div_ceil(BLOCK);
            // In blocks: (pos + k + 2) ≡ 0 (mod a), k ≥ k_min.
            let (pb, ab) = (pos / BLOCK, a / BLOCK);
            let mut k = (ab - (pb + 2) % ab) % ab;
            if k < k_min {
                k += (k_min - k).div_ceil(ab) * ab;
            }
            let rec_len = k * BLOCK - base;
            let digits = rec_len.to_string().len() as u64;
            let value_len = rec_len - digits - 10; // " comment=" + "\n"
            let mut value = b"cairn alignment padding ".to_vec();
            value.resize(value_len as usize, b'.');
            pax_record(&mut records, b"comment", &value);
            debug_assert_eq!(records.len() as u64, k * BLOCK);
        }
    }

    let mut out = Vec::with_capacity(blocks(records.len() as u64) as usize);
    if !records.is_empty() {
        let xname = pax_header_name(&path);
        let x = Fields {
            name: &xname,
            prefix: &[],
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: records.len() as u64,
            mtime: main.mtime,
            typeflag: b'x',
            linkname: &[],
            uname: &[],
            gname: &[],
            dev_major: 0,
            dev_minor: 0,
        };
        out.extend_from_slice(&ustar_block(&x));
        out.extend_from_slice(&records);
        out.resize(out.len() + data_padding(records.len() as u64) as usize, 0);
    }
    out.extend_from_slice(&ustar_block(&main));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_lengths_count_themselves() {
        for n in 0..2000 {
            let mut r = Vec::new();
            let v = vec![b'a'; n];
            pax_record(&mut r, b"path", &v);
            let sp = r.iter().position(|&c| c == b' ').unwrap();
            let len: usize = std::str::from_utf8(&r[..sp]).unwrap().parse().unwrap();
            assert_eq!(len, r.len(), "value length {n}");
        }
    }

    #[test]
    fn ustar_split() {
        let p = [b"a".repeat(150), b"/".to_vec(), b"b".repeat(99)].concat();
        let (pre, name) = split_ustar(&p).unwrap();
        assert_eq!(pre.len(), 150);
        assert_eq!(name.len(), 99);
        assert!(split_ustar(&b"a".repeat(120)).is_none());
    }
}
