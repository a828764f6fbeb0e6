//! A real drive through the Linux SCSI tape driver (st) on a non-rewinding
//! device `/dev/nstN`, in fixed-block mode.
//!
//! The structures and request numbers are those of `<linux/mtio.h>`
//! (checked in the tests against the values gcc computes from the header
//! on x86_64). The `libc` crate does not define them. The `_IOW`/`_IOR`
//! encoding is the asm-generic one (x86, x86_64, arm, aarch64, riscv,
//! loongarch, s390x); architectures with another encoding (powerpc, mips,
//! sparc, alpha) are not supported and the module does not build there.
//!
//! Positions: st's `MTSEEK`/`MTIOCPOS` use SCSI logical object numbers
//! (filemarks count) only with the driver option `MT_ST_SCSI2LOGICAL`;
//! otherwise they are device-specific addresses. [`StDrive::open`] sets it
//! (with `MT_ST_FAST_MTEOM`, so `MTEOM` is one SCSI SPACE to end of data)
//! through `MTSETDRVBUFFER`, which needs `CAP_SYS_ADMIN`; without it, set
//! the options once as root (`mt-st -f /dev/nst0 stsetoptions scsi2logical
//! fast-mteom`) — [`StDrive::logical_positions`] says whether `open` could.
//!
//! Nothing here can run on a machine without a drive; the conformance
//! suite runs against one through the ignored test `st_conformance`.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::device::{DeviceError, ReadOutcome, Result, Status, TapeDevice};

#[cfg(not(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "arm",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x"
)))]
compile_error!("cairn-tape's st module assumes the asm-generic ioctl encoding");

/// `struct mtop` (`MTIOCTOP`): an operation and its count.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MtOp {
    /// The operation (`MTWEOF`, `MTREW`...).
    pub mt_op: libc::c_short,
    /// How many times, or its argument.
    pub mt_count: libc::c_int,
}

/// `struct mtget` (`MTIOCGET`): the drive's status.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MtGet {
    /// Type of the device.
    pub mt_type: libc::c_long,
    /// Residual count (st: the partition).
    pub mt_resid: libc::c_long,
    /// Block size and density.
    pub mt_dsreg: libc::c_long,
    /// Generic status (`GMT_*` bits).
    pub mt_gstat: libc::c_long,
    /// Error register.
    pub mt_erreg: libc::c_long,
    /// File number (`__kernel_daddr_t`, an int).
    pub mt_fileno: libc::c_int,
    /// Block number within the file.
    pub mt_blkno: libc::c_int,
}

/// `struct mtpos` (`MTIOCPOS`): the current block.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MtPos {
    /// The logical block (see the module docs).
    pub mt_blkno: libc::c_long,
}

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)` of asm-generic/ioctl.h: nr in bits 0–7,
/// type in 8–15, size in 16–29, direction in 30–31.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `_IOW('m', 1, struct mtop)`.
pub const MTIOCTOP: u32 = ioc(IOC_WRITE, b'm', 1, std::mem::size_of::<MtOp>());
/// `_IOR('m', 2, struct mtget)`.
pub const MTIOCGET: u32 = ioc(IOC_READ, b'm', 2, std::mem::size_of::<MtGet>());
/// `_IOR('m', 3, struct mtpos)`.
pub const MTIOCPOS: u32 = ioc(IOC_READ, b'm', 3, std::mem::size_of::<MtPos>());

/// Write `mt_count` filemarks (0: flush the drive buffer).
pub const MTWEOF: i16 = 5;
/// Write `mt_count` filemarks in immediate mode (no flush).
pub const MTWEOFI: i16 = 35;
/// Rewind.
pub const MTREW: i16 = 6;
/// Space to the end of recorded data.
pub const MTEOM: i16 = 12;
/// Set the block size (0: variable).
pub const MTSETBLK: i16 = 20;
/// Seek to a block.
pub const MTSEEK: i16 = 22;
/// Set driver options (`MT_ST_*`).
pub const MTSETDRVBUFFER: i16 = 24;
/// Load the tape.
pub const MTLOAD: i16 = 30;
/// Unload the tape.
pub const MTUNLOAD: i16 = 31;

/// `MTSETDRVBUFFER` subcommand: set the option bits given.
pub const MT_ST_SETBOOLEANS: i32 = 0x3000_0000;
/// Option: `MTEOM` spaces directly to end of data.
pub const MT_ST_FAST_MTEOM: i32 = 0x20;
/// Option: `MTSEEK`/`MTIOCPOS` use SCSI logical block numbers.
pub const MT_ST_SCSI2LOGICAL: i32 = 0x800;

/// `GMT_EOF`: just past a filemark.
pub const GMT_EOF: u32 = 0x8000_0000;
/// `GMT_BOT`: at the beginning of the tape.
pub const GMT_BOT: u32 = 0x4000_0000;
/// `GMT_EOT`: at the end of the tape (early warning).
pub const GMT_EOT: u32 = 0x2000_0000;
/// `GMT_EOD`: at the end of recorded data.
pub const GMT_EOD: u32 = 0x0800_0000;
/// `GMT_WR_PROT`: write-protected.
pub const GMT_WR_PROT: u32 = 0x0400_0000;
/// `GMT_ONLINE`: a tape is loaded and ready.
pub const GMT_ONLINE: u32 = 0x0100_0000;
/// `GMT_DR_OPEN`: no tape in the drive.
pub const GMT_DR_OPEN: u32 = 0x0004_0000;

/// Decodes `mt_gstat`.
pub fn status_from_gstat(gstat: u64) -> Status {
    let g = gstat as u32;
    Status {
        online: g & GMT_ONLINE != 0,
        no_tape: g & GMT_DR_OPEN != 0,
        write_protected: g & GMT_WR_PROT != 0,
        bot: g & GMT_BOT != 0,
        filemark: g & GMT_EOF != 0,
        eod: g & GMT_EOD != 0,
        early_warning: g & GMT_EOT != 0,
    }
}

/// What an errno from st means for an operation other than `open`.
pub fn map_errno(device: &str, op: &'static str, errno: i32) -> DeviceError {
    let device = device.to_string();
    match errno {
        libc::ENOMEDIUM => DeviceError::NoTape { device },
        // st_write and MTWEOF return EACCES on a protected tape.
        libc::EACCES | libc::EROFS => DeviceError::WriteProtected { device },
        libc::ENOSPC => DeviceError::EndOfMedium {
            device,
            written_blocks: 0,
        },
        _ => DeviceError::Io {
            device,
            op,
            source: std::io::Error::from_raw_os_error(errno),
        },
    }
}

/// What an errno from `open` means (EACCES there is a file permission,
/// not a write-protected tape; st says EROFS for that).
pub fn map_open_errno(device: &str, errno: i32) -> DeviceError {
    let device = device.to_string();
    match errno {
        libc::ENOMEDIUM => DeviceError::NoTape { device },
        libc::EROFS => DeviceError::WriteProtected { device },
        _ => DeviceError::Io {
            device,
            op: "open",
            source: std::io::Error::from_raw_os_error(errno),
        },
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A drive behind `/dev/nstN` in fixed-block mode.
pub struct StDrive {
    file: File,
    name: String,
    bs: usize,
    /// The early warning was reported by a failed write; st lets the next one through.
    ew_reported: bool,
    logical: bool,
}

impl StDrive {
    /// Opens the drive for reading and writing with `block_size`-byte
    /// records (the block size of the volume, from its label).
    pub fn open(path: &Path, block_size: usize) -> Result<Self> {
        Self::open_with(path, block_size, true)
    }

    /// Opens the drive read-only (a write-protected tape opens this way).
    pub fn open_read_only(path: &Path, block_size: usize) -> Result<Self> {
        Self::open_with(path, block_size, false)
    }

    fn open_with(path: &Path, block_size: usize, write: bool) -> Result<Self> {
        let name = path.display().to_string();
        if block_size == 0 || block_size > i32::MAX as usize {
            return Err(DeviceError::InvalidArgument {
                device: name,
                message: format!("block size {block_size}"),
            });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(|e| map_open_errno(&name, e.raw_os_error().unwrap_or(libc::EIO)))?;
        let mut d = StDrive {
            file,
            name,
            bs: block_size,
            ew_reported: false,
            logical: false,
        };
        // Needs CAP_SYS_ADMIN; without it the options must have been set by root.
        d.logical = d
            .op(
                MTSETDRVBUFFER,
                MT_ST_SETBOOLEANS | MT_ST_SCSI2LOGICAL | MT_ST_FAST_MTEOM,
                "MTSETDRVBUFFER",
            )
            .is_ok();
        d.op(MTSETBLK, block_size as i32, "MTSETBLK")?;
        Ok(d)
    }

    /// Reads the size of the first record on the tape (the label), in
    /// variable-block mode, and rewinds: the block size to open the tape with.
    pub fn detect_block_size(path: &Path) -> Result<usize> {
        let mut d = Self::open_with(path, 1, false)?;
        d.op(MTSETBLK, 0, "MTSETBLK")?;
        d.op(MTREW, 1, "MTREW")?;
        let mut buf = vec![0u8; 16 << 20];
        // SAFETY: reading into a buffer we own, of the length given.
        let n = unsafe { libc::read(d.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let e = errno();
        d.op(MTREW, 1, "MTREW")?;
        match n {
            n if n > 0 => Ok(n as usize),
            0 => Err(DeviceError::Filemark {
                device: d.name.clone(),
                position: 0,
            }),
            _ if e == libc::EIO => Err(DeviceError::EndOfData {
                device: d.name.clone(),
                position: 0,
            }),
            _ => Err(map_errno(&d.name, "read", e)),
        }
    }

    /// Whether `open` could switch st to logical block numbers (see the module docs).
    pub fn logical_positions(&self) -> bool {
        self.logical
    }

    /// `MTWEOF`/`MTWEOFI` with a count that must fit st's `int`.
    fn filemark_op(&mut self, op: i16, count: u32, what: &'static str) -> Result<()> {
        let count = i32::try_from(count).map_err(|_| DeviceError::InvalidArgument {
            device: self.name.clone(),
            message: format!("{count} filemarks"),
        })?;
        self.op(op, count, what)
    }

    fn op(&mut self, op: i16, count: i32, what: &'static str) -> Result<()> {
        let mt = MtOp {
            mt_op: op,
            mt_count: count,
        };
        // SAFETY: MTIOCTOP reads one struct mtop, which `mt` is (layout tested).
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                MTIOCTOP as libc::Ioctl,
                &mt as *const MtOp,
            )
        };
        if r < 0 {
            return Err(map_errno(&self.name, what, errno()));
        }
        Ok(())
    }

    fn get(&mut self) -> Result<MtGet> {
        let mut g = MtGet::default();
        // SAFETY: MTIOCGET writes one struct mtget into `g` (layout tested).
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                MTIOCGET as libc::Ioctl,
                &mut g as *mut MtGet,
            )
        };
        if r < 0 {
            return Err(map_errno(&self.name, "MTIOCGET", errno()));
        }
        Ok(g)
    }

    fn at_eod(&mut self) -> bool {
        self.get()
            .map(|g| status_from_gstat(g.mt_gstat as u64).eod)
            .unwrap_or(false)
    }

    fn write_once(&mut self, data: &[u8]) -> std::result::Result<usize, i32> {
        loop {
            // SAFETY: writing from a buffer we own, of the length given.
            let n = unsafe { libc::write(self.file.as_raw_fd(), data.as_ptr().cast(), data.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = errno();
            if e != libc::EINTR {
                return Err(e);
            }
        }
    }
}

impl TapeDevice for StDrive {
    fn name(&self) -> &str {
        &self.name
    }

    fn block_size(&self) -> usize {
        self.bs
    }

    fn write_blocks(&mut self, data: &[u8]) -> Result<()> {
        if data.is_empty() || !data.len().is_multiple_of(self.bs) {
            return Err(DeviceError::InvalidArgument {
                device: self.name.clone(),
                message: format!(
                    "write of {} bytes is not a positive multiple of the block size {}",
                    data.len(),
                    self.bs
                ),
            });
        }
        let mut done = 0;
        let mut retried = false;
        while done < data.len() {
            match self.write_once(&data[done..]) {
                Ok(0) => return Err(map_errno(&self.name, "write", libc::EIO)),
                Ok(n) => done += n,
                // After the early-warning ENOSPC st lets the next write
                // through (then alternates); one retry makes "writes go on
                // until the physical end" hold.
                Err(libc::ENOSPC) if self.ew_reported && !retried => retried = true,
                Err(libc::ENOSPC) => {
                    self.ew_reported = true;
                    return Err(DeviceError::EndOfMedium {
                        device: self.name.clone(),
                        written_blocks: (done / self.bs) as u64,
                    });
                }
                Err(e) => return Err(map_errno(&self.name, "write", e)),
            }
        }
        Ok(())
    }

    fn write_filemarks(&mut self, count: u32) -> Result<()> {
        self.filemark_op(MTWEOF, count, "MTWEOF")
    }

    fn write_filemarks_immediate(&mut self, count: u32) -> Result<()> {
        self.filemark_op(MTWEOFI, count, "MTWEOFI")
    }

    fn read_blocks(&mut self, buf: &mut [u8]) -> Result<ReadOutcome> {
        let want = buf.len() / self.bs * self.bs;
        if want == 0 {
            return Err(DeviceError::InvalidArgument {
                device: self.name.clone(),
                message: format!(
                    "read buffer of {} bytes is smaller than a block ({})",
                    buf.len(),
                    self.bs
                ),
            });
        }
        let n = loop {
            // SAFETY: reading into a buffer we own, of the length given.
            let n = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), want) };
            if n >= 0 || errno() != libc::EINTR {
                break n;
            }
        };
        if n > 0 {
            let n = n as usize;
            if !n.is_multiple_of(self.bs) {
                return Err(map_errno(
                    &self.name,
                    "read (record shorter than the block size)",
                    libc::EIO,
                ));
            }
            return Ok(ReadOutcome::Blocks(n / self.bs));
        }
        if n == 0 {
            // st returns 0 for a filemark, and once for the blank after a filemark.
            return Ok(if self.at_eod() {
                ReadOutcome::EndOfData
            } else {
                ReadOutcome::Filemark
            });
        }
        let e = errno();
        if e == libc::EIO && self.at_eod() {
            return Ok(ReadOutcome::EndOfData); // blank check
        }
        Err(map_errno(&self.name, "read", e))
    }

    fn rewind(&mut self) -> Result<()> {
        self.ew_reported = false;
        self.op(MTREW, 1, "MTREW")
    }

    fn space_to_eod(&mut self) -> Result<()> {
        self.op(MTEOM, 1, "MTEOM")
    }

    fn locate(&mut self, block: u64) -> Result<()> {
        let count = i32::try_from(block).map_err(|_| DeviceError::InvalidArgument {
            device: self.name.clone(),
            message: format!("block {block} is beyond MTSEEK's range"),
        })?;
        self.ew_reported = false;
        match self.op(MTSEEK, count, "MTSEEK") {
            // A seek past the end of data fails with a blank check, which st
            // reports as EIO.
            Err(DeviceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO) => {
                Err(DeviceError::EndOfData {
                    device: self.name.clone(),
                    position: block,
                })
            }
            other => other,
        }
    }

    fn position(&mut self) -> Result<u64> {
        let mut p = MtPos::default();
        // SAFETY: MTIOCPOS writes one struct mtpos into `p` (layout tested).
        let r = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                MTIOCPOS as libc::Ioctl,
                &mut p as *mut MtPos,
            )
        };
        if r < 0 {
            return Err(map_errno(&self.name, "MTIOCPOS", errno()));
        }
        Ok(p.mt_blkno as u64)
    }

    fn status(&mut self) -> Result<Status> {
        match self.get() {
            Ok(g) => Ok(status_from_gstat(g.mt_gstat as u64)),
            Err(DeviceError::NoTape { .. }) => Ok(Status {
                no_tape: true,
                ..Status::default()
            }),
            Err(e) => Err(e),
        }
    }

    fn load(&mut self) -> Result<()> {
        self.op(MTLOAD, 1, "MTLOAD")
    }

    fn unload(&mut self) -> Result<()> {
        self.op(MTUNLOAD, 1, "MTUNLOAD")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // Values printed by a C program compiled with gcc against this
    // machine's <linux/mtio.h> (x86_64, Debian 12): sizeof, _Alignof,
    // offsetof and the request numbers.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn structs_match_linux_mtio_h() {
        assert_eq!((size_of::<MtOp>(), align_of::<MtOp>()), (8, 4));
        assert_eq!(
            (offset_of!(MtOp, mt_op), offset_of!(MtOp, mt_count)),
            (0, 4)
        );
        assert_eq!((size_of::<MtGet>(), align_of::<MtGet>()), (48, 8));
        assert_eq!(
            [
                offset_of!(MtGet, mt_type),
                offset_of!(MtGet, mt_resid),
                offset_of!(MtGet, mt_dsreg),
                offset_of!(MtGet, mt_gstat),
                offset_of!(MtGet, mt_erreg),
                offset_of!(MtGet, mt_fileno),
                offset_of!(MtGet, mt_blkno)
            ],
            [0, 8, 16, 24, 32, 40, 44]
        );
        assert_eq!(size_of::<MtPos>(), 8);
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn request_numbers_match_linux_mtio_h() {
        // gcc: MTIOCTOP=0x40086d01 MTIOCGET=0x80306d02 MTIOCPOS=0x80086d03
        assert_eq!(MTIOCTOP, 0x4008_6d01);
        assert_eq!(MTIOCGET, 0x8030_6d02);
        assert_eq!(MTIOCPOS, 0x8008_6d03);
    }

    #[test]
    fn request_numbers_follow_the_ioc_macros() {
        // _IOW(type, nr, T) = _IOC(_IOC_WRITE, type, nr, sizeof(T)), the fields
        // laid out by hand here: dir << 30 | size << 16 | type << 8 | nr.
        let by_hand = |dir: u32, nr: u32, size: usize| {
            dir * (1 << 30) + size as u32 * 65536 + 0x6d * 256 + nr
        };
        assert_eq!(MTIOCTOP, by_hand(1, 1, size_of::<MtOp>()));
        assert_eq!(MTIOCGET, by_hand(2, 2, size_of::<MtGet>()));
        assert_eq!(MTIOCPOS, by_hand(2, 3, size_of::<MtPos>()));
        // The size field is 14 bits wide: every struct fits.
        assert!(size_of::<MtGet>() < 1 << 14);
    }

    #[test]
    fn operation_codes_match_linux_mtio_h() {
        assert_eq!(
            (
                MTWEOF,
                MTREW,
                MTEOM,
                MTSETBLK,
                MTSEEK,
                MTSETDRVBUFFER,
                MTLOAD,
                MTUNLOAD,
                MTWEOFI
            ),
            (5, 6, 12, 20, 22, 24, 30, 31, 35)
        );
        assert_eq!(
            (MT_ST_SETBOOLEANS, MT_ST_SCSI2LOGICAL, MT_ST_FAST_MTEOM),
            (0x3000_0000, 0x800, 0x20)
        );
    }

    #[test]
    fn gstat_bits_decode() {
        // gcc: GMT EOF=80000000 BOT=40000000 EOT=20000000 EOD=8000000 WRP=4000000 ONL=1000000 DR_OPEN=40000
        assert_eq!(status_from_gstat(0), Status::default());
        let s = status_from_gstat((GMT_ONLINE | GMT_BOT | GMT_WR_PROT) as u64);
        assert!(
            s.online
                && s.bot
                && s.write_protected
                && !s.eod
                && !s.filemark
                && !s.no_tape
                && !s.early_warning
        );
        let s = status_from_gstat((GMT_ONLINE | GMT_EOD | GMT_EOF | GMT_EOT) as u64);
        assert!(s.eod && s.filemark && s.early_warning && !s.bot);
        assert!(status_from_gstat(GMT_DR_OPEN as u64).no_tape);
        // mt_gstat is a long: bits above 32 are not status.
        assert_eq!(status_from_gstat(1 << 40), Status::default());
    }

    #[test]
    fn errnos_map_to_typed_errors() {
        assert!(matches!(
            map_errno("/dev/nst0", "read", libc::ENOMEDIUM),
            DeviceError::NoTape { .. }
        ));
        assert!(matches!(
            map_errno("/dev/nst0", "write", libc::EACCES),
            DeviceError::WriteProtected { .. }
        ));
        assert!(matches!(
            map_errno("/dev/nst0", "write", libc::EROFS),
            DeviceError::WriteProtected { .. }
        ));
        assert!(matches!(
            map_errno("/dev/nst0", "write", libc::ENOSPC),
            DeviceError::EndOfMedium {
                written_blocks: 0,
                ..
            }
        ));
        let e = map_errno("/dev/nst0", "MTSEEK", libc::EBUSY);
        assert_eq!(e.errno(), Some(libc::EBUSY));
        assert!(e.to_string().starts_with("/dev/nst0: MTSEEK: "), "{e}");
        assert!(matches!(
            map_open_errno("/dev/nst0", libc::EROFS),
            DeviceError::WriteProtected { .. }
        ));
        assert!(matches!(
            map_open_errno("/dev/nst0", libc::ENOMEDIUM),
            DeviceError::NoTape { .. }
        ));
        // At open, EACCES is the device file's permissions, not the tape.
        assert_eq!(
            map_open_errno("/dev/nst0", libc::EACCES).errno(),
            Some(libc::EACCES)
        );
    }

    #[test]
    fn opening_a_missing_device_names_it() {
        let e = StDrive::open(Path::new("/dev/nst-cairn-missing"), 262144)
            .err()
            .expect("no such device");
        assert_eq!(e.errno(), Some(libc::ENOENT));
        let msg = e.to_string();
        assert!(
            msg.contains("/dev/nst-cairn-missing") && msg.contains("open"),
            "{msg}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_tape_is_refused_at_open() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let e = StDrive::open(f.path(), 262144)
            .err()
            .expect("a regular file is not a tape");
        assert_eq!(e.errno(), Some(libc::ENOTTY), "{e}");
        assert!(e.to_string().contains("MTSETBLK"), "{e}");
    }
}
