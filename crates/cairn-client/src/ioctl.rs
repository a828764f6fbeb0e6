//! The ioctl protocol between a program and a Cairn mount (version 1).
//!
//! FUSE forwards ioctls on files of a mount to the daemon in "restricted"
//! mode: the kernel copies `_IOC_SIZE(cmd)` bytes in and out, so every
//! request is a fixed-size struct. Layouts are `repr(C)`, little-endian, and
//! mirrored in `include/cairn.h`.

/// `_IOC` type byte of every Cairn ioctl.
pub const IOC_TYPE: u32 = 0xCA;
/// Protocol version a probe reports. Version 2 names a splice's source by a
/// token from `IOC_SOURCE` on a descriptor of it; version 1's inode numbers
/// (`flags` 1) are refused with EINVAL.
pub const PROTOCOL_VERSION: u32 = 2;
/// Answer of a probe: "CAIRNFS1".
pub const PROBE_MAGIC: u64 = u64::from_le_bytes(*b"CAIRNFS1");
/// New bytes an rpwrite request carries inline; more go through a scratch file.
pub const INLINE_MAX: usize = 16 * 1024 - 128;
/// `Rpwrite::flags`: the new bytes are `nbyte` bytes from `src_offset` of
/// the file whose source token (`IOC_SOURCE`) is `src` (zero-copy), not `data`.
///
/// A program names the source the way `copy_file_range` and `FICLONE` do: by
/// a descriptor it opened for reading. FUSE cannot hand the daemon a
/// second descriptor, so the program first asks for a token on the source
/// descriptor (`IOC_SOURCE`): the daemon answers only on a handle opened
/// for reading, which the kernel allowed after checking the whole path, and
/// forgets the token when that handle is released. The kernel sends that
/// RELEASE after the last close of the descriptor (and its dups) without
/// waiting for it, so a token outlives its descriptor by that moment; it
/// never outlives what the caller could already read. An unknown token is
/// EBADF whatever inode it might name.
pub const RP_FROM_SOURCE: u32 = 2;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (IOC_TYPE << 8) | nr
}

/// Reply of `IOC_PROBE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    pub magic: u64,
    pub version: u32,
    pub inline_max: u32,
}

/// Request and reply of `IOC_RPWRITE`: replace `mbyte` bytes at `offset`
/// with `nbyte` new bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Rpwrite {
    pub offset: u64,
    pub mbyte: u64,
    pub nbyte: u64,
    /// With `RP_FROM_SOURCE`: a token from `IOC_SOURCE`.
    pub src: u64,
    pub src_offset: u64,
    pub flags: u32,
    pub _pad: u32,
    /// Out: the file's size afterwards.
    pub new_size: u64,
    /// Out: bytes re-chunked at the edges.
    pub rechunked: u64,
    /// Out: bytes of chunks new to the volume.
    pub new_bytes: u64,
    /// Out: old chunks read back and cut again at the edges.
    pub old_chunks: u64,
    pub data: [u8; INLINE_MAX],
}

/// Reply of `IOC_SOURCE`: a token naming the descriptor's open file (its
/// inode) while that file stays open.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Source {
    pub token: u64,
}

impl Source {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: repr(C), one u64.
        unsafe { std::slice::from_raw_parts((self as *const Source).cast::<u8>(), std::mem::size_of::<Source>()) }
    }
}

/// Bytes of `Rpwrite` before `data` (what a reply carries back).
pub const RPWRITE_HEADER: usize = std::mem::size_of::<Rpwrite>() - INLINE_MAX;

pub const IOC_PROBE: u32 = ioc(IOC_READ, 0, std::mem::size_of::<Probe>());
pub const IOC_RPWRITE: u32 = ioc(IOC_READ | IOC_WRITE, 1, std::mem::size_of::<Rpwrite>());
pub const IOC_SOURCE: u32 = ioc(IOC_READ, 2, std::mem::size_of::<Source>());

impl Rpwrite {
    /// A zeroed request.
    pub fn new() -> Box<Self> {
        // SAFETY: every field is an integer or a byte array: all-zero is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }

    /// Decodes a request from the bytes the kernel passed in.
    pub fn from_bytes(b: &[u8]) -> Option<Box<Self>> {
        if b.len() < RPWRITE_HEADER {
            return None;
        }
        let mut r = Self::new();
        let n = b.len().min(std::mem::size_of::<Rpwrite>());
        // SAFETY: `r` is a plain-old-data struct of at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), (&mut *r as *mut Rpwrite).cast::<u8>(), n) };
        Some(r)
    }

    /// The header bytes (for a reply).
    pub fn header_bytes(&self) -> &[u8] {
        // SAFETY: the header is the first RPWRITE_HEADER bytes of a repr(C) struct.
        unsafe { std::slice::from_raw_parts((self as *const Rpwrite).cast::<u8>(), RPWRITE_HEADER) }
    }
}

impl Probe {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: repr(C), no padding (8 + 4 + 4).
        unsafe { std::slice::from_raw_parts((self as *const Probe).cast::<u8>(), std::mem::size_of::<Probe>()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_header() {
        assert_eq!(std::mem::size_of::<Probe>(), 16);
        assert_eq!(RPWRITE_HEADER, 80);
        assert!(std::mem::size_of::<Rpwrite>() < 1 << 14, "must fit _IOC_SIZE's 14 bits");
        // The numbers cairn.h spells out.
        assert_eq!(IOC_PROBE, 0x8010_CA00);
        assert_eq!(IOC_RPWRITE, 0xFFD0_CA01);
        assert_eq!(IOC_SOURCE, 0x8008_CA02);
    }
}
