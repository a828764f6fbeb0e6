//! The device seam: what a tape drive does, independent of how it is reached.

use std::fmt;

/// A device error. Every variant names the device (its path, or the
/// emulated tape's directory) so a message is clear without context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// No medium in the drive (`ENOMEDIUM` from st; an unloaded emulated drive).
    #[error("{device}: no tape in the drive")]
    NoTape {
        /// The device.
        device: String,
    },
    /// The medium is write-protected (st: `EACCES` from a write or a filemark,
    /// `EROFS` when opening a protected tape for writing).
    #[error("{device}: the tape is write-protected")]
    WriteProtected {
        /// The device.
        device: String,
    },
    /// The end of the medium was reached while writing (st: `ENOSPC`).
    /// `written_blocks` blocks of the failed call are on the medium (or in
    /// the drive's buffer, made durable by the next flush); everything
    /// accepted by earlier calls is too. See the contract of [`TapeDevice`].
    #[error("{device}: end of medium ({written_blocks} blocks of this write were accepted)")]
    EndOfMedium {
        /// The device.
        device: String,
        /// Blocks of the failed call that were written.
        written_blocks: u64,
    },
    /// An operation needed recorded data and found none: a locate past the
    /// end of data (st: blank check).
    #[error("{device}: no data at block {position} (end of data)")]
    EndOfData {
        /// The device.
        device: String,
        /// Where data was needed.
        position: u64,
    },
    /// A read that needed data met a filemark (used by
    /// [`read_exact_blocks`]; [`TapeDevice::read_blocks`] reports filemarks
    /// as [`ReadOutcome::Filemark`]).
    #[error("{device}: filemark at block {position}")]
    Filemark {
        /// The device.
        device: String,
        /// The filemark's position.
        position: u64,
    },
    /// A call the device cannot honour (a length that is not a multiple of
    /// the block size, a position out of range).
    #[error("{device}: {message}")]
    InvalidArgument {
        /// The device.
        device: String,
        /// What was wrong.
        message: String,
    },
    /// Any other failure; the OS error (errno) is kept in `source`.
    #[error("{device}: {op}: {source}")]
    Io {
        /// The device.
        device: String,
        /// What was being done (`open`, `write`, `MTSEEK`...).
        op: &'static str,
        /// The underlying error (`raw_os_error()` is the errno when there is one).
        #[source]
        source: std::io::Error,
    },
}

impl DeviceError {
    /// The errno behind an [`DeviceError::Io`], if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            DeviceError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The device the error is about.
    pub fn device(&self) -> &str {
        match self {
            DeviceError::NoTape { device }
            | DeviceError::WriteProtected { device }
            | DeviceError::EndOfMedium { device, .. }
            | DeviceError::EndOfData { device, .. }
            | DeviceError::Filemark { device, .. }
            | DeviceError::InvalidArgument { device, .. }
            | DeviceError::Io { device, .. } => device,
        }
    }
}

/// Result of a device operation.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// What [`TapeDevice::read_blocks`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// This many whole blocks were read into the front of the buffer (≥ 1).
    Blocks(usize),
    /// The next position held a filemark; the tape is now past it.
    Filemark,
    /// The tape is at the end of recorded data; nothing was read and the
    /// position did not change.
    EndOfData,
}

/// The drive's state, as `MTIOCGET` reports it (the `GMT_*` bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// A tape is loaded and ready (`GMT_ONLINE`).
    pub online: bool,
    /// No tape in the drive (`GMT_DR_OPEN`).
    pub no_tape: bool,
    /// The tape is write-protected (`GMT_WR_PROT`).
    pub write_protected: bool,
    /// At the beginning of the tape (`GMT_BOT`).
    pub bot: bool,
    /// Just past a filemark (`GMT_EOF`).
    pub filemark: bool,
    /// At the end of recorded data (`GMT_EOD`).
    pub eod: bool,
    /// In the early-warning zone near the end of the medium (`GMT_EOT`).
    pub early_warning: bool,
}

/// A tape drive with a medium of fixed-size records.
///
/// # Contract
///
/// Every implementation ([`crate::StDrive`], [`crate::EmuDrive`]) behaves
/// like the Linux st driver in fixed-block mode, and the shared suite in
/// [`crate::conformance`] checks it:
///
/// - **Records.** Data is written and read in blocks of exactly
///   [`block_size`](Self::block_size) bytes; `write_blocks` takes a
///   multiple of it (otherwise [`DeviceError::InvalidArgument`]), and
///   `read_blocks` a buffer of at least one block. Callers pad partial
///   data themselves.
/// - **Positions** are logical object numbers from 0 at the beginning of
///   the tape, as SCSI `READ POSITION` counts them and st's `MTIOCPOS` and
///   `MTSEEK` use them (with the `MT_ST_SCSI2LOGICAL` option): **a filemark
///   occupies one position**, like a block. After writing `n` blocks and a
///   filemark from position `p`, the position is `p + n + 1`.
/// - **Writing truncates.** Writing (blocks or filemarks) at position `p`
///   makes `p` plus what was written the new end of data; everything that
///   was recorded after it is gone.
/// - **End of data.** Reading at the end of data returns
///   [`ReadOutcome::EndOfData`] and does not move; `locate` beyond the end
///   of data fails with [`DeviceError::EndOfData`]; `locate` to exactly the
///   end of data succeeds (that is where appending starts).
/// - **Filemarks on read.** `read_blocks` reads up to `buf.len() /
///   block_size` blocks but stops before a filemark: if it read at least one
///   block it returns them and leaves the filemark for the next call, which
///   returns [`ReadOutcome::Filemark`] and moves past it.
/// - **Durability.** `write_blocks` may return while data is still in the
///   drive's buffer. `write_filemarks(n)` (any `n`, including 0) returns only
///   when everything written before it, and the marks, are on the medium;
///   [`flush`](Self::flush) is `write_filemarks(0)` (st: `MTWEOF` with count
///   0). What an unflushed write leaves after a power cut is not specified.
/// - **Implicit filemark.** As st does, a `rewind` or `locate` (and closing
///   the device) *directly after* `write_blocks` first writes one filemark
///   at the current position. Callers that want an exact layout end each
///   run of writes with `write_filemarks` (or `flush`) before moving.
///   `space_to_eod` and `unload` add no filemark.
/// - **End of medium.** When a write crosses the early-warning point, that
///   call completes; the *next* `write_blocks` fails with
///   [`DeviceError::EndOfMedium`] with `written_blocks = 0`. Writes after
///   that succeed again (blocks and filemarks, e.g. a trailer or catalog)
///   until the physical end, where `EndOfMedium` reports how many blocks of
///   the call fitted; every block accepted before an `EndOfMedium` is kept.
/// - **Errors** are typed: [`DeviceError::NoTape`],
///   [`DeviceError::WriteProtected`], [`DeviceError::EndOfMedium`],
///   [`DeviceError::EndOfData`], and [`DeviceError::Io`] with the errno.
///
/// Implementations are synchronous and `Send`; one owner drives a device at
/// a time (`&mut self`).
pub trait TapeDevice: Send {
    /// A name for messages: the device path or the emulated tape's directory.
    fn name(&self) -> &str;
    /// The fixed block size in bytes.
    fn block_size(&self) -> usize;
    /// Writes `data` (a multiple of the block size) as blocks at the current
    /// position, which advances by `data.len() / block_size`.
    fn write_blocks(&mut self, data: &[u8]) -> Result<()>;
    /// Writes `count` filemarks and makes everything written so far durable.
    fn write_filemarks(&mut self, count: u32) -> Result<()>;
    /// Writes `count` filemarks without waiting for them, or anything
    /// before them, to reach the medium (st: `MTWEOFI`): they pass through
    /// the drive's buffer in order, like blocks, and a moving tape keeps
    /// moving. A later `write_filemarks` or `flush` makes them durable.
    /// Waiting (the default: `write_filemarks`) always keeps the contract.
    fn write_filemarks_immediate(&mut self, count: u32) -> Result<()> {
        self.write_filemarks(count)
    }
    /// Makes everything written so far durable (`write_filemarks(0)`).
    fn flush(&mut self) -> Result<()> {
        self.write_filemarks(0)
    }
    /// Reads whole blocks into `buf` (see the contract for filemarks and the
    /// end of data).
    fn read_blocks(&mut self, buf: &mut [u8]) -> Result<ReadOutcome>;
    /// Moves to position 0.
    fn rewind(&mut self) -> Result<()>;
    /// Moves to the end of recorded data (st `MTEOM`), where appending starts.
    fn space_to_eod(&mut self) -> Result<()>;
    /// Moves to the absolute position `block` (st `MTSEEK`).
    fn locate(&mut self, block: u64) -> Result<()>;
    /// The current position (st `MTIOCPOS`).
    fn position(&mut self) -> Result<u64>;
    /// The drive's status (st `MTIOCGET`).
    fn status(&mut self) -> Result<Status>;
    /// Loads the tape and positions it at the beginning (st `MTLOAD`).
    fn load(&mut self) -> Result<()>;
    /// Rewinds and ejects the tape (st `MTUNLOAD`); later operations fail
    /// with [`DeviceError::NoTape`] until [`load`](Self::load).
    fn unload(&mut self) -> Result<()>;
}

impl<T: TapeDevice + ?Sized> TapeDevice for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn block_size(&self) -> usize {
        (**self).block_size()
    }
    fn write_blocks(&mut self, data: &[u8]) -> Result<()> {
        (**self).write_blocks(data)
    }
    fn write_filemarks(&mut self, count: u32) -> Result<()> {
        (**self).write_filemarks(count)
    }
    fn write_filemarks_immediate(&mut self, count: u32) -> Result<()> {
        (**self).write_filemarks_immediate(count)
    }
    fn flush(&mut self) -> Result<()> {
        (**self).flush()
    }
    fn read_blocks(&mut self, buf: &mut [u8]) -> Result<ReadOutcome> {
        (**self).read_blocks(buf)
    }
    fn rewind(&mut self) -> Result<()> {
        (**self).rewind()
    }
    fn space_to_eod(&mut self) -> Result<()> {
        (**self).space_to_eod()
    }
    fn locate(&mut self, block: u64) -> Result<()> {
        (**self).locate(block)
    }
    fn position(&mut self) -> Result<u64> {
        (**self).position()
    }
    fn status(&mut self) -> Result<Status> {
        (**self).status()
    }
    fn load(&mut self) -> Result<()> {
        (**self).load()
    }
    fn unload(&mut self) -> Result<()> {
        (**self).unload()
    }
}

/// Reads exactly `buf.len() / block_size` blocks, calling `read_blocks` as
/// often as needed; a filemark or the end of data before that is an error
/// ([`DeviceError::Filemark`], [`DeviceError::EndOfData`]) naming the
/// position where it was met.
pub fn read_exact_blocks<D: TapeDevice + ?Sized>(dev: &mut D, buf: &mut [u8]) -> Result<()> {
    let bs = dev.block_size();
    if !buf.len().is_multiple_of(bs) {
        return Err(DeviceError::InvalidArgument {
            device: dev.name().to_string(),
            message: format!(
                "read of {} bytes is not a multiple of the block size {bs}",
                buf.len()
            ),
        });
    }
    let mut done = 0;
    while done < buf.len() {
        match dev.read_blocks(&mut buf[done..])? {
            ReadOutcome::Blocks(n) => done += n * bs,
            ReadOutcome::Filemark => {
                let position = dev.position()?.saturating_sub(1);
                return Err(DeviceError::Filemark {
                    device: dev.name().to_string(),
                    position,
                });
            }
            ReadOutcome::EndOfData => {
                let position = dev.position()?;
                return Err(DeviceError::EndOfData {
                    device: dev.name().to_string(),
                    position,
                });
            }
        }
    }
    Ok(())
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (on, name) in [
            (self.online, "online"),
            (self.no_tape, "no-tape"),
            (self.write_protected, "write-protected"),
            (self.bot, "BOT"),
            (self.filemark, "EOF"),
            (self.eod, "EOD"),
            (self.early_warning, "EOT"),
        ] {
            if on {
                parts.push(name);
            }
        }
        write!(f, "{}", parts.join(" "))
    }
}
