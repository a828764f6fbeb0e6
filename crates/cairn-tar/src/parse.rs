//! The header parser.

use std::collections::HashMap;
use std::io;

use crate::error::quote;
use crate::num::{parse_numeric, parse_pax_time, parse_pax_u64, parse_u64};
use crate::{
    DataRun, Member, MemberKind, ReadAt, TarError, BLOCK, NAME_MAX, PATH_MAX, XATTR_LIST_MAX,
    XATTR_NAME_MAX, XATTR_SIZE_MAX,
};

/// Largest extended header (pax `x`/`g` data, GNU long name or link) held in
/// memory. Real ones are a few hundred bytes; a pax 0.1 sparse map of a
/// badly fragmented file can reach megabytes.
const MAX_EXTENDED: u64 = 64 << 20;

/// Largest pax global (`g`) header. Its records apply to every later
/// member; real ones hold a handful of keys.
const MAX_GLOBAL: u64 = 4 << 20;

/// Largest number of sparse runs accepted for one member.
const MAX_SPARSE_RUNS: usize = 1 << 22;

/// Why `path` cannot be a member path on Linux (a component longer than
/// [`NAME_MAX`], or more than [`PATH_MAX`] bytes in all).
pub(crate) fn path_too_long(path: &[u8]) -> Option<String> {
    if path.len() > PATH_MAX {
        return Some(format!(
            "the path is {} bytes long, more than the {PATH_MAX} a Linux path can have",
            path.len()
        ));
    }
    let c = path.split(|&b| b == b'/').find(|c| c.len() > NAME_MAX)?;
    Some(format!(
        "its path has a component of {} bytes ({}), more than the {NAME_MAX} a file name can have",
        c.len(),
        quote(&c[..c.len().min(40)])
    ))
}

/// Parses every member header of an archive of `archive_len` bytes.
///
/// Reads only header blocks (and pax 1.0 sparse maps); member data are
/// located, not read. Stops at the end-of-archive marker (a zero block),
/// or at end of file on a block boundary between members.
pub fn parse<R: ReadAt + ?Sized>(r: &R, archive_len: u64) -> Result<Vec<Member>, TarError> {
    Parser::new(r, archive_len).collect()
}

/// Streaming form of [`parse`]: yields members one at a time, so memory
/// stays proportional to one member's headers. After an error it yields
/// nothing more.
pub struct Parser<'a, R: ReadAt + ?Sized> {
    r: &'a R,
    len: u64,
    pos: u64,
    /// What the pax `g` records in force say, applied once when read (a
    /// member starts from a copy of it).
    global: Ext,
    done: bool,
}

impl<'a, R: ReadAt + ?Sized> Parser<'a, R> {
    /// A parser over the first `archive_len` bytes of `r`.
    pub fn new(r: &'a R, archive_len: u64) -> Self {
        Parser {
            r,
            len: archive_len,
            pos: 0,
            global: Ext::default(),
            done: false,
        }
    }

    /// Archive offset of the next header block to be read (after the end
    /// marker: the offset of the marker).
    pub fn position(&self) -> u64 {
        self.pos
    }
}

impl<R: ReadAt + ?Sized> Iterator for Parser<'_, R> {
    type Item = Result<Member, TarError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let res = self.next_member();
        match res {
            Ok(Some(m)) => Some(Ok(m)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads exactly `buf.len()` bytes at `offset` (callers have checked the
/// range lies inside the archive, so a short read means the file shrank).
fn read_full<R: ReadAt + ?Sized>(r: &R, buf: &mut [u8], offset: u64) -> Result<(), TarError> {
    let mut done = 0;
    while done < buf.len() {
        let at = offset + done as u64;
        match r.read_at(&mut buf[done..], at) {
            Ok(0) => {
                return Err(TarError::Io {
                    offset: at,
                    source: io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the archive is shorter than its stated length",
                    ),
                })
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(TarError::Io {
                    offset: at,
                    source: e,
                })
            }
        }
    }
    Ok(())
}

fn round_up(n: u64) -> Option<u64> {
    n.checked_add(BLOCK - 1).map(|v| v / BLOCK * BLOCK)
}

/// Bytes of a NUL-terminated field.
fn cstr(field: &[u8]) -> &[u8] {
    match field.iter().position(|&c| c == 0) {
        Some(p) => &field[..p],
        None => field,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    V7,
    Ustar,
    Gnu,
}

/// Field offsets in a header block.
mod off {
    pub const NAME: std::ops::Range<usize> = 0..100;
    pub const MODE: std::ops::Range<usize> = 100..108;
    pub const UID: std::ops::Range<usize> = 108..116;
    pub const GID: std::ops::Range<usize> = 116..124;
    pub const SIZE: std::ops::Range<usize> = 124..136;
    pub const MTIME: std::ops::Range<usize> = 136..148;
    pub const CHKSUM: std::ops::Range<usize> = 148..156;
    pub const TYPEFLAG: usize = 156;
    pub const LINKNAME: std::ops::Range<usize> = 157..257;
    pub const MAGIC: std::ops::Range<usize> = 257..263;
    pub const VERSION: std::ops::Range<usize> = 263..265;
    pub const UNAME: std::ops::Range<usize> = 265..297;
    pub const GNAME: std::ops::Range<usize> = 297..329;
    pub const DEVMAJOR: std::ops::Range<usize> = 329..337;
    pub const DEVMINOR: std::ops::Range<usize> = 337..345;
    pub const PREFIX: std::ops::Range<usize> = 345..500;
    // GNU layout of the same area.
    pub const GNU_ATIME: std::ops::Range<usize> = 345..357;
    pub const GNU_CTIME: std::ops::Range<usize> = 357..369;
    pub const GNU_SPARSE: usize = 386;
    pub const GNU_ISEXTENDED: usize = 482;
    pub const GNU_REALSIZE: std::ops::Range<usize> = 483..495;
}

/// Checks a header block's checksum (unsigned sum, or the signed sum some
/// old tars wrote).
fn check_checksum(block: &[u8; 512], offset: u64) -> Result<(), TarError> {
    let mut unsigned: u64 = 0;
    let mut signed: i64 = 0;
    for (i, &b) in block.iter().enumerate() {
        let b = if off::CHKSUM.contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    let stored = parse_numeric(&block[off::CHKSUM]).ok();
    let ok = stored.is_some_and(|s| s == i128::from(unsigned) || s == i128::from(signed));
    if ok {
        Ok(())
    } else {
        Err(TarError::BadChecksum {
            offset,
            stored: stored.and_then(|s| u64::try_from(s).ok()),
            computed: unsigned,
        })
    }
}

/// The compression format whose magic starts `b`, if any.
fn compressed(b: &[u8]) -> Option<&'static str> {
    const MAGIC: [(&[u8], &str); 5] = [
        (b"\x1f\x8b", "gzip"),
        (b"BZh", "bzip2"),
        (b"\xfd7zXZ\0", "xz"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\x04\x22\x4d\x18", "lz4"),
    ];
    MAGIC
        .iter()
        .find(|(m, _)| b.starts_with(m))
        .map(|(_, k)| *k)
}

/// Everything extended headers said about the member that follows.
#[derive(Default, Clone)]
struct Ext {
    /// Offset of the first `x`/`L`/`K` header of the member.
    first_header: Option<u64>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    uname: Option<Vec<u8>>,
    gname: Option<Vec<u8>>,
    mtime: Option<i64>,
    atime: Option<i64>,
    ctime: Option<i64>,
    devmajor: Option<u32>,
    devminor: Option<u32>,
    /// In order of first appearance; None: removed by a later global record.
    xattrs: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Where each live name is in `xattrs` (records may repeat a name).
    xattr_at: HashMap<Vec<u8>, usize>,
    /// listxattr bytes of `xattrs` (each name and its NUL).
    xattr_list: usize,
    /// The first xattr over a Linux limit: reported, naming the member,
    /// once its path is known. Its value is not kept.
    xattr_error: Option<String>,
    sparse: Sparse,
}

/// pax GNU.sparse.* state.
#[derive(Default, Clone)]
struct Sparse {
    seen: bool,
    major: Option<u64>,
    minor: Option<u64>,
    name: Option<Vec<u8>>,
    realsize: Option<u64>,
    map: Vec<(u64, u64)>,
    pending_offset: Option<u64>,
}

/// Splits pax extended header data into (key, value) records.
/// A pax record: keyword and value.
type Record<'a> = (&'a [u8], &'a [u8]);

/// Calls `f` on each record in turn (no list of them is built: a 64 MiB
/// header can hold millions).
fn pax_records<'a>(
    data: &'a [u8],
    offset: u64,
    mut f: impl FnMut(Record<'a>) -> Result<(), TarError>,
) -> Result<(), TarError> {
    let mut p = 0usize;
    while p < data.len() {
        let rest = &data[p..];
        // Some writers pad the data with NULs.
        if rest.iter().all(|&c| c == 0) {
            break;
        }
        let bad = |why: &str| {
            TarError::bad(
                offset,
                "pax record",
                format!("{why} at byte {p} of the extended header"),
            )
        };
        let sp = rest
            .iter()
            .take(21)
            .position(|&c| c == b' ')
            .ok_or_else(|| bad("no length field"))?;
        let len = parse_pax_u64(&rest[..sp]).ok_or_else(|| bad("a length that is not a number"))?;
        let len = usize::try_from(len).map_err(|_| bad("a length out of range"))?;
        if len <= sp + 1 || len > rest.len() {
            return Err(bad("a length that does not fit the header"));
        }
        let rec = &rest[sp + 1..len];
        if rec.last() != Some(&b'\n') {
            return Err(bad("a record not ending in a newline"));
        }
        let rec = &rec[..rec.len() - 1];
        let eq = rec
            .iter()
            .position(|&c| c == b'=')
            .ok_or_else(|| bad("a record without '='"))?;
        if eq == 0 {
            return Err(bad("a record with an empty keyword"));
        }
        f((&rec[..eq], &rec[eq + 1..]))?;
        p += len;
    }
    Ok(())
}

fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let s: Vec<u8> = s.iter().copied().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

fn url_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let h = s.get(i + 1..i + 3)?;
            let h = std::str::from_utf8(h).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Sets (or, with `value` None, removes) an xattr, in constant time.
/// Names and values over the Linux limits are not kept: the first is
/// noted in `xattr_error` (the member is refused once its name is known).
fn set_xattr(ext: &mut Ext, name: Vec<u8>, value: Option<Vec<u8>>) {
    let Some(value) = value else {
        if let Some(i) = ext.xattr_at.remove(&name) {
            ext.xattr_list -= name.len() + 1;
            ext.xattrs[i].1 = None;
        }
        return;
    };
    let err = if name.len() > XATTR_NAME_MAX {
        Some(format!(
            "xattr name {} is {} bytes, more than the {XATTR_NAME_MAX} Linux allows",
            quote(&name[..60]),
            name.len()
        ))
    } else if value.len() > XATTR_SIZE_MAX {
        Some(format!(
            "xattr {} has a value of {} bytes, more than the {XATTR_SIZE_MAX} Linux can return",
            quote(&name),
            value.len()
        ))
    } else if !ext.xattr_at.contains_key(&name)
        && ext.xattr_list + name.len() + 1 > XATTR_LIST_MAX
    {
        Some(format!(
            "more xattrs than fit the {XATTR_LIST_MAX} bytes Linux lists (at {})",
            quote(&name)
        ))
    } else {
        None
    };
    if let Some(e) = err {
        ext.xattr_error.get_or_insert(e);
        return;
    }
    match ext.xattr_at.get(&name) {
        Some(&i) => ext.xattrs[i].1 = Some(value),
        None => {
            ext.xattr_list += name.len() + 1;
            ext.xattr_at.insert(name.clone(), ext.xattrs.len());
            ext.xattrs.push((name, Some(value)));
        }
    }
}

impl Ext {
    /// Drops removed xattrs (after a global header: the template is copied
    /// for every member).
    fn compact_xattrs(&mut self) {
        if self.xattrs.len() == self.xattr_at.len() {
            return;
        }
        self.xattrs.retain(|(_, v)| v.is_some());
        self.xattr_at.clear();
        for (i, (n, _)) in self.xattrs.iter().enumerate() {
            self.xattr_at.insert(n.clone(), i);
        }
    }
}

/// Applies one pax record. `global` records skip the per-member sparse keys.
fn apply_pax(
    ext: &mut Ext,
    key: &[u8],
    value: &[u8],
    offset: u64,
    global: bool,
) -> Result<(), TarError> {
    let opt = |v: &[u8]| (!v.is_empty()).then(|| v.to_vec());
    let num = |field: &'static str| -> Result<Option<u64>, TarError> {
        if value.is_empty() {
            return Ok(None);
        }
        parse_pax_u64(value).map(Some).ok_or_else(|| {
            TarError::bad(
                offset,
                field,
                format!("{:?} is not a number", String::from_utf8_lossy(value)),
            )
        })
    };
    let time = |field: &'static str| -> Result<Option<i64>, TarError> {
        if value.is_empty() {
            return Ok(None);
        }
        parse_pax_time(value).map(Some).ok_or_else(|| {
            TarError::bad(
                offset,
                field,
                format!("{:?} is not a time", String::from_utf8_lossy(value)),
            )
        })
    };
    let small = |field: &'static str| -> Result<Option<u32>, TarError> {
        match num(field)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| TarError::bad(offset, field, "out of range")),
        }
    };
    match key {
        b"path" => ext.path = opt(value),
        b"linkpath" => ext.linkpath = opt(value),
        b"size" => ext.size = num("pax size")?,
        b"uid" => ext.uid = num("pax uid")?,
        b"gid" => ext.gid = num("pax gid")?,
        b"uname" => ext.uname = opt(value),
        b"gname" => ext.gname = opt(value),
        b"mtime" => ext.mtime = time("pax mtime")?,
        b"atime" => ext.atime = time("pax atime")?,
        b"ctime" => ext.ctime = time("pax ctime")?,
        b"SCHILY.devmajor" => ext.devmajor = small("SCHILY.devmajor")?,
        b"SCHILY.devminor" => ext.devminor = small("SCHILY.devminor")?,
        _ if key.starts_with(b"SCHILY.xattr.") => {
            let name = &key[b"SCHILY.xattr.".len()..];
            if !name.is_empty() {
                // An empty global value ends that global xattr.
                let v = (!global || !value.is_empty()).then(|| value.to_vec());
                set_xattr(ext, name.to_vec(), v);
            }
        }
        _ if key.starts_with(b"LIBARCHIVE.xattr.") => {
            let name = url_decode(&key[b"LIBARCHIVE.xattr.".len()..]).ok_or_else(|| {
                TarError::bad(offset, "LIBARCHIVE.xattr", "bad %-encoding in the name")
            })?;
            let value = base64_decode(value)
                .ok_or_else(|| TarError::bad(offset, "LIBARCHIVE.xattr", "bad base64 value"))?;
            if !name.is_empty() {
                let v = (!global || !value.is_empty()).then_some(value);
                set_xattr(ext, name, v);
            }
        }
        _ if global => {}
        _ if key.starts_with(b"GNU.sparse.") => {
            let s = &mut ext.sparse;
            s.seen = true;
            let field = &key[b"GNU.sparse.".len()..];
            let sparse_num = |v: &[u8]| {
                parse_pax_u64(v).ok_or_else(|| {
                    TarError::bad(
                        offset,
                        "GNU.sparse",
                        format!("{:?} is not a number", String::from_utf8_lossy(v)),
                    )
                })
            };
            match field {
                b"major" => s.major = Some(sparse_num(value)?),
                b"minor" => s.minor = Some(sparse_num(value)?),
                b"name" => s.name = opt(value),
                b"size" | b"realsize" => s.realsize = Some(sparse_num(value)?),
                b"numblocks" => {
                    sparse_num(value)?;
                }
                b"offset" => {
                    if s.pending_offset.is_some() {
                        return Err(TarError::bad(
                            offset,
                            "GNU.sparse.offset",
                            "two offsets without a numbytes",
                        ));
                    }
                    s.pending_offset = Some(sparse_num(value)?);
                }
                b"numbytes" => {
                    let o = s.pending_offset.take().ok_or_else(|| {
                        TarError::bad(
                            offset,
                            "GNU.sparse.numbytes",
                            "numbytes without a preceding offset",
                        )
                    })?;
                    if s.map.len() >= MAX_SPARSE_RUNS {
                        return Err(TarError::Unsupported {
                            offset,
                            what: "more than 4M sparse runs".into(),
                        });
                    }
                    s.map.push((o, sparse_num(value)?));
                }
                b"map" if !value.is_empty() => {
                    let nums = value
                        .split(|&c| c == b',')
                        .map(sparse_num)
                        .collect::<Result<Vec<u64>, _>>()?;
                    if nums.len() % 2 != 0 {
                        return Err(TarError::bad(
                            offset,
                            "GNU.sparse.map",
                            "an odd number of values",
                        ));
                    }
                    s.map = nums.chunks(2).map(|c| (c[0], c[1])).collect();
                }
                _ => {}
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks a sparse map against the real size and the stored data, and
/// turns it into data runs starting at `data_start`.
fn sparse_runs(
    map: &[(u64, u64)],
    realsize: u64,
    stored: u64,
    data_start: u64,
    offset: u64,
) -> Result<Vec<DataRun>, TarError> {
    let mut runs = Vec::with_capacity(map.len().min(1024));
    let mut file_end = 0u64;
    let mut archive_pos = 0u64;
    for (i, &(o, len)) in map.iter().enumerate() {
        let end = o
            .checked_add(len)
            .ok_or_else(|| TarError::bad(offset, "sparse map", "entry overflows"))?;
        if o < file_end {
            return Err(TarError::bad(
                offset,
                "sparse map",
                format!("entry {i} (offset {o}) overlaps or precedes the previous one"),
            ));
        }
        if end > realsize {
            return Err(TarError::bad(
                offset,
                "sparse map",
                format!("entry {i} ends at {end}, past the real size {realsize}"),
            ));
        }
        if len > 0 {
            runs.push(DataRun {
                file_offset: o,
                archive_offset: data_start + archive_pos,
                len,
            });
        }
        file_end = end;
        archive_pos = archive_pos
            .checked_add(len)
            .ok_or_else(|| TarError::bad(offset, "sparse map", "total overflows"))?;
    }
    if archive_pos != stored {
        return Err(TarError::bad(
            offset,
            "sparse map",
            format!("the map covers {archive_pos} bytes but {stored} are stored"),
        ));
    }
    Ok(runs)
}

/// One 12+12-byte GNU sparse entry; None when the slot is unused.
fn gnu_sparse_entry(b: &[u8], offset: u64) -> Result<Option<(u64, u64)>, TarError> {
    if b[..12].iter().all(|&c| c == 0) {
        return Ok(None);
    }
    let o = parse_u64(&b[..12]).map_err(|e| TarError::bad(offset, "GNU sparse offset", e))?;
    let n = parse_u64(&b[12..24]).map_err(|e| TarError::bad(offset, "GNU sparse numbytes", e))?;
    Ok(Some((o, n)))
}

/// Refuses a pax path or linkpath longer than a Linux path.
fn check_long(pos: u64, field: &'static str, v: Option<&[u8]>) -> Result<(), TarError> {
    match v {
        Some(p) if p.len() > PATH_MAX => Err(TarError::bad(
            pos,
            field,
            format!(
                "{} is {} bytes: a Linux path has at most {PATH_MAX} bytes",
                quote(p),
                p.len()
            ),
        )),
        _ => Ok(()),
    }
}

impl<R: ReadAt + ?Sized> Parser<'_, R> {
    fn read_block(&self, at: u64, what: &'static str) -> Result<[u8; 512], TarError> {
        if at.checked_add(BLOCK).is_none_or(|e| e > self.len) {
            return Err(TarError::Truncated { offset: at, what });
        }
        let mut b = [0u8; 512];
        read_full(self.r, &mut b, at)?;
        Ok(b)
    }

    /// Checks that `size` bytes of data after the header at `hdr` fit in the
    /// archive; returns the offset of the next header.
    fn data_end(
        &self,
        hdr: u64,
        data_start: u64,
        size: u64,
        what: &'static str,
    ) -> Result<u64, TarError> {
        let next = data_start
            .checked_add(size)
            .and_then(round_up)
            .ok_or_else(|| TarError::bad(hdr, "size", format!("{size} is not a possible size")))?;
        if next > self.len {
            return Err(TarError::Truncated { offset: hdr, what });
        }
        Ok(next)
    }

    /// Reads an extended header's data (pax, GNU long name).
    fn read_extended(&self, hdr: u64, size: u64) -> Result<(Vec<u8>, u64), TarError> {
        if size > MAX_EXTENDED {
            return Err(TarError::Unsupported {
                offset: hdr,
                what: format!("an extended header of {size} bytes (limit {MAX_EXTENDED})"),
            });
        }
        let next = self.data_end(hdr, hdr + BLOCK, size, "an extended header")?;
        let mut data = vec![0u8; size as usize];
        read_full(self.r, &mut data, hdr + BLOCK)?;
        Ok((data, next))
    }

    fn next_member(&mut self) -> Result<Option<Member>, TarError> {
        // Global records apply first; local ones override them.
        let mut ext = self.global.clone();
        loop {
            let pos = self.pos;
            if pos == self.len {
                return match ext.first_header {
                    Some(h) => Err(TarError::Truncated {
                        offset: h,
                        what: "a member (the archive ends after its extended headers)",
                    }),
                    None => Ok(None),
                };
            }
            if self.len - pos < BLOCK && ext.first_header.is_none() {
                // A short tail: accepted as the end if it is all zeros (a
                // cut end-of-archive marker), a truncated header otherwise.
                let mut tail = vec![0u8; (self.len - pos) as usize];
                read_full(self.r, &mut tail, pos)?;
                if tail.iter().all(|&c| c == 0) {
                    return Ok(None);
                }
            }
            let block = self.read_block(pos, "a header block")?;
            if block.iter().all(|&c| c == 0) {
                if let Some(h) = ext.first_header {
                    return Err(TarError::bad(
                        h,
                        "extended header",
                        "not followed by a member header (end of archive instead)",
                    ));
                }
                // End of archive: a zero block, whatever follows (GNU tar
                // stops there too, and EOF after one block is accepted).
                return Ok(None);
            }
            if let Err(e) = check_checksum(&block, pos) {
                if pos == 0 {
                    if let Some(kind) = compressed(&block) {
                        return Err(TarError::Unsupported {
                            offset: 0,
                            what: format!("a {kind}-compressed file: decompress it first"),
                        });
                    }
                }
                return Err(e);
            }
            let typeflag = block[off::TYPEFLAG];
            let hsize = parse_u64(&block[off::SIZE]).map_err(|e| TarError::bad(pos, "size", e))?;
            match typeflag {
                b'x' | b'X' | b'g' => {
                    if typeflag == b'g' && hsize > MAX_GLOBAL {
                        return Err(TarError::Unsupported {
                            offset: pos,
                            what: format!(
                                "a pax global header of {hsize} bytes (limit {MAX_GLOBAL})"
                            ),
                        });
                    }
                    let (data, next) = self.read_extended(pos, hsize)?;
                    if typeflag == b'g' {
                        let pending = ext.first_header.is_none();
                        pax_records(&data, pos, |(k, v)| {
                            apply_pax(&mut self.global, k, v, pos, true)?;
                            if pending {
                                apply_pax(&mut ext, k, v, pos, true)?;
                            }
                            Ok(())
                        })?;
                        if let Some(e) = self.global.xattr_error.take() {
                            return Err(TarError::bad(pos, "pax global header", e));
                        }
                        self.global.compact_xattrs();
                        check_long(pos, "pax global path", self.global.path.as_deref())?;
                        check_long(pos, "pax global linkpath", self.global.linkpath.as_deref())?;
                    } else {
                        ext.first_header.get_or_insert(pos);
                        pax_records(&data, pos, |(k, v)| apply_pax(&mut ext, k, v, pos, false))?;
                        check_long(pos, "pax path", ext.path.as_deref())?;
                        check_long(pos, "pax linkpath", ext.linkpath.as_deref())?;
                        if ext.sparse.pending_offset.is_some() {
                            return Err(TarError::bad(
                                pos,
                                "GNU.sparse.offset",
                                "offset without numbytes",
                            ));
                        }
                    }
                    self.pos = next;
                }
                b'L' | b'K' => {
                    // The name and its NUL; a longer one is refused unread.
                    if hsize > PATH_MAX as u64 + 1 {
                        return Err(TarError::bad(
                            pos,
                            if typeflag == b'L' { "GNU long name" } else { "GNU long link" },
                            format!(
                                "{hsize} bytes: a Linux path has at most {PATH_MAX} bytes"
                            ),
                        ));
                    }
                    let (data, next) = self.read_extended(pos, hsize)?;
                    ext.first_header.get_or_insert(pos);
                    let v = cstr(&data).to_vec();
                    if typeflag == b'L' {
                        ext.long_name = Some(v);
                    } else {
                        ext.long_link = Some(v);
                    }
                    self.pos = next;
                }
                b'V' => {
                    // A volume label: not a member.
                    self.pos = self.data_end(pos, pos + BLOCK, hsize, "a volume label")?;
                }
                b'M' => {
                    return Err(TarError::Unsupported {
                        offset: pos,
                        what: "a multi-volume continuation member (type M)".into(),
                    })
                }
                b'N' => {
                    return Err(TarError::Unsupported {
                        offset: pos,
                        what: "an old GNU long-name member (type N)".into(),
                    })
                }
                _ => {
                    let m = self.member(&block, pos, hsize, ext)?;
                    return Ok(Some(m));
                }
            }
        }
    }

    fn member(
        &mut self,
        block: &[u8; 512],
        pos: u64,
        hsize: u64,
        ext: Ext,
    ) -> Result<Member, TarError> {
        let magic = &block[off::MAGIC];
        let format = if magic == b"ustar\0" {
            Format::Ustar
        } else if magic == b"ustar " && &block[off::VERSION] == b" \0" {
            Format::Gnu
        } else {
            Format::V7
        };
        let typeflag = block[off::TYPEFLAG];

        // Path: GNU.sparse.name > pax path > GNU long name > header.
        let mut path = if let Some(n) = ext.sparse.name.clone() {
            n
        } else if let Some(p) = ext.path.clone() {
            p
        } else if let Some(l) = ext.long_name.clone() {
            l
        } else {
            let name = cstr(&block[off::NAME]);
            let prefix = cstr(&block[off::PREFIX]);
            if format == Format::Ustar && !prefix.is_empty() {
                let mut p = prefix.to_vec();
                p.push(b'/');
                p.extend_from_slice(name);
                p
            } else {
                name.to_vec()
            }
        };
        let trailing_slash = path.len() > 1 && path.ends_with(b"/");
        while path.len() > 1 && path.ends_with(b"/") {
            path.pop();
        }
        if path.is_empty() {
            return Err(TarError::bad(pos, "name", "empty member name"));
        }

        let kind = match typeflag {
            b'0' | 0 | b'7' if trailing_slash => MemberKind::Dir,
            b'1' => MemberKind::HardLink,
            b'2' => MemberKind::Symlink,
            b'3' => MemberKind::CharDev,
            b'4' => MemberKind::BlockDev,
            b'5' | b'D' => MemberKind::Dir,
            b'6' => MemberKind::Fifo,
            _ => MemberKind::File,
        };
        let link_target = match kind {
            MemberKind::HardLink | MemberKind::Symlink => {
                Some(if let Some(l) = ext.linkpath.clone() {
                    l
                } else if let Some(l) = ext.long_link.clone() {
                    l
                } else {
                    cstr(&block[off::LINKNAME]).to_vec()
                })
            }
            _ => None,
        };
        if link_target.as_ref().is_some_and(|l| l.is_empty()) {
            return Err(TarError::bad(pos, "linkname", "empty link target"));
        }
        // Names a Linux file system cannot hold are refused here, naming the
        // member, so no reader of the archive makes them.
        if let Some(why) = path_too_long(&path) {
            return Err(TarError::bad(pos, "name", format!("member {}: {why}", quote(&path))));
        }
        match (&link_target, kind) {
            (Some(t), MemberKind::Symlink) if t.len() > PATH_MAX => {
                return Err(TarError::bad(
                    pos,
                    "linkname",
                    format!(
                        "member {}: a symlink target of {} bytes, more than the {PATH_MAX} Linux allows",
                        quote(&path),
                        t.len()
                    ),
                ))
            }
            (Some(t), MemberKind::HardLink) => {
                if let Some(why) = path_too_long(t) {
                    return Err(TarError::bad(
                        pos,
                        "linkname",
                        format!("member {}: hard link target: {why}", quote(&path)),
                    ));
                }
            }
            _ => {}
        }
        if let Some(why) = &ext.xattr_error {
            return Err(TarError::bad(pos, "xattr", format!("member {}: {why}", quote(&path))));
        }

        let mode = parse_u64(&block[off::MODE]).map_err(|e| TarError::bad(pos, "mode", e))? as u32
            & 0o7777;
        let uid = match ext.uid {
            Some(v) => v,
            None => parse_u64(&block[off::UID]).map_err(|e| TarError::bad(pos, "uid", e))?,
        };
        let gid = match ext.gid {
            Some(v) => v,
            None => parse_u64(&block[off::GID]).map_err(|e| TarError::bad(pos, "gid", e))?,
        };
        let header_names = format != Format::V7;
        let uname = ext.uname.clone().or_else(|| {
            header_names
                .then(|| cstr(&block[off::UNAME]).to_vec())
                .filter(|v| !v.is_empty())
        });
        let gname = ext.gname.clone().or_else(|| {
            header_names
                .then(|| cstr(&block[off::GNAME]).to_vec())
                .filter(|v| !v.is_empty())
        });
        let secs_to_ns =
            |field: &'static str, r: std::ops::Range<usize>| -> Result<i64, TarError> {
                let s = parse_numeric(&block[r]).map_err(|e| TarError::bad(pos, field, e))?;
                i64::try_from(s)
                    .ok()
                    .and_then(|s| s.checked_mul(1_000_000_000))
                    .ok_or_else(|| TarError::bad(pos, field, "out of range"))
            };
        let mtime_ns = match ext.mtime {
            Some(t) => t,
            None => secs_to_ns("mtime", off::MTIME)?,
        };
        let gnu_time =
            |field: &'static str, r: std::ops::Range<usize>| -> Result<Option<i64>, TarError> {
                if format != Format::Gnu || block[r.clone()].iter().all(|&c| c == 0 || c == b' ') {
                    return Ok(None);
                }
                secs_to_ns(field, r).map(Some)
            };
        let atime_ns = match ext.atime {
            Some(t) => Some(t),
            None => gnu_time("atime", off::GNU_ATIME)?,
        };
        let ctime_ns = match ext.ctime {
            Some(t) => Some(t),
            None => gnu_time("ctime", off::GNU_CTIME)?,
        };
        let is_dev = matches!(kind, MemberKind::CharDev | MemberKind::BlockDev);
        let dev = |field: &'static str,
                   r: std::ops::Range<usize>,
                   pax: Option<u32>|
         -> Result<u32, TarError> {
            if let Some(v) = pax {
                return Ok(v);
            }
            if format == Format::V7 {
                return Ok(0);
            }
            match parse_u64(&block[r])
                .ok()
                .and_then(|v| u32::try_from(v).ok())
            {
                Some(v) => Ok(v),
                None if is_dev => Err(TarError::bad(pos, field, "not a device number")),
                None => Ok(0),
            }
        };
        let dev_major = if is_dev {
            dev("devmajor", off::DEVMAJOR, ext.devmajor)?
        } else {
            0
        };
        let dev_minor = if is_dev {
            dev("devminor", off::DEVMINOR, ext.devminor)?
        } else {
            0
        };

        // Stored bytes after the header(s).
        let stored = ext.size.unwrap_or(hsize);
        let mut data_start = pos + BLOCK;
        let header_offset = ext.first_header.unwrap_or(pos);

        let (size, data, next) = if typeflag == b'S' {
            // GNU old sparse: 4 entries in the header, 21 per extension block.
            let mut map = Vec::new();
            for i in 0..4 {
                let e = &block[off::GNU_SPARSE + 24 * i..off::GNU_SPARSE + 24 * (i + 1)];
                if let Some(entry) = gnu_sparse_entry(e, pos)? {
                    map.push(entry);
                }
            }
            let mut extended = block[off::GNU_ISEXTENDED] != 0;
            while extended {
                let eb = self.read_block(data_start, "a GNU sparse extension block")?;
                for i in 0..21 {
                    if let Some(entry) = gnu_sparse_entry(&eb[24 * i..24 * (i + 1)], data_start)? {
                        if map.len() >= MAX_SPARSE_RUNS {
                            return Err(TarError::Unsupported {
                                offset: pos,
                                what: "more than 4M sparse runs".into(),
                            });
                        }
                        map.push(entry);
                    }
                }
                extended = eb[504] != 0;
                data_start += BLOCK;
            }
            let realsize = parse_u64(&block[off::GNU_REALSIZE])
                .map_err(|e| TarError::bad(pos, "GNU realsize", e))?;
            let next = self.data_end(pos, data_start, stored, "the data of a member")?;
            let realsize = ext.sparse.realsize.unwrap_or(realsize);
            let runs = sparse_runs(&map, realsize, stored, data_start, pos)?;
            (realsize, runs, next)
        } else if ext.sparse.seen {
            let next = self.data_end(pos, data_start, stored, "the data of a member")?;
            let realsize = ext.sparse.realsize.ok_or_else(|| {
                TarError::bad(
                    pos,
                    "GNU.sparse",
                    "a sparse member without GNU.sparse.size/realsize",
                )
            })?;
            let (map, map_len) = if ext.sparse.major == Some(1) {
                if ext.sparse.minor.unwrap_or(0) != 0 {
                    return Err(TarError::Unsupported {
                        offset: pos,
                        what: format!("GNU sparse format 1.{}", ext.sparse.minor.unwrap_or(0)),
                    });
                }
                self.sparse_map_v1(pos, data_start, stored)?
            } else if ext.sparse.major.is_some_and(|m| m > 1) {
                return Err(TarError::Unsupported {
                    offset: pos,
                    what: format!("GNU sparse format {}", ext.sparse.major.unwrap_or(0)),
                });
            } else {
                (ext.sparse.map, 0)
            };
            data_start += map_len;
            let runs = sparse_runs(&map, realsize, stored - map_len, data_start, pos)?;
            (realsize, runs, next)
        } else {
            let stored = if typeflag == b'5' { 0 } else { stored };
            let next = self.data_end(pos, data_start, stored, "the data of a member")?;
            match kind {
                MemberKind::File | MemberKind::HardLink if stored > 0 => (
                    stored,
                    vec![DataRun {
                        file_offset: 0,
                        archive_offset: data_start,
                        len: stored,
                    }],
                    next,
                ),
                _ => (0, Vec::new(), next),
            }
        };
        if ext.sparse.seen || typeflag == b'S' {
            // Sparse maps describe regular files only.
            if kind != MemberKind::File {
                return Err(TarError::bad(
                    pos,
                    "typeflag",
                    "a sparse map on a member that is not a regular file",
                ));
            }
        }
        self.pos = next;
        Ok(Member {
            path,
            kind,
            link_target,
            mode,
            uid,
            gid,
            uname,
            gname,
            mtime_ns,
            atime_ns,
            ctime_ns,
            dev_major,
            dev_minor,
            size,
            xattrs: ext
                .xattrs
                .into_iter()
                .filter_map(|(n, v)| Some((n, v?)))
                .collect(),
            data,
            header_offset,
        })
    }

    /// Reads a pax 1.0 sparse map from the start of the member's data: a
    /// count, then offset/length pairs, each a decimal line; padded to a
    /// block. Returns the map and the bytes it occupies.
    fn sparse_map_v1(
        &self,
        hdr: u64,
        data_start: u64,
        stored: u64,
    ) -> Result<(Vec<(u64, u64)>, u64), TarError> {
        let mut block = [0u8; 512];
        let mut block_at = u64::MAX;
        let mut p = 0u64; // position in the data area
        let mut next_num = |p: &mut u64| -> Result<u64, TarError> {
            let mut digits = Vec::with_capacity(20);
            loop {
                if *p >= stored {
                    return Err(TarError::bad(
                        hdr,
                        "GNU sparse 1.0 map",
                        "runs past the member's data",
                    ));
                }
                let b = *p / BLOCK * BLOCK;
                if b != block_at {
                    read_full(self.r, &mut block, data_start + b)?;
                    block_at = b;
                }
                let c = block[(*p - b) as usize];
                *p += 1;
                if c == b'\n' {
                    break;
                }
                if !c.is_ascii_digit() || digits.len() >= 20 {
                    return Err(TarError::bad(
                        hdr,
                        "GNU sparse 1.0 map",
                        "not a decimal number",
                    ));
                }
                digits.push(c);
            }
            parse_pax_u64(&digits)
                .ok_or_else(|| TarError::bad(hdr, "GNU sparse 1.0 map", "not a decimal number"))
        };
        let count = next_num(&mut p)?;
        // Each entry takes at least 4 bytes ("0\n0\n").
        if count > stored / 4 || count > MAX_SPARSE_RUNS as u64 {
            return Err(TarError::bad(
                hdr,
                "GNU sparse 1.0 map",
                format!("{count} entries cannot fit in {stored} bytes"),
            ));
        }
        let mut map = Vec::with_capacity((count as usize).min(1024));
        for _ in 0..count {
            let o = next_num(&mut p)?;
            let n = next_num(&mut p)?;
            map.push((o, n));
        }
        let map_len = round_up(p).unwrap_or(u64::MAX);
        if map_len > stored {
            return Err(TarError::bad(
                hdr,
                "GNU sparse 1.0 map",
                "runs past the member's data",
            ));
        }
        Ok((map, map_len))
    }
}
