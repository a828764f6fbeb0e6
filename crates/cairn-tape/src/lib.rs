//! Tape volumes for Cairn: the layer below the engine.
//!
//! - [`TapeDevice`] is the device seam: fixed-size records, filemarks,
//!   locate/position, rewind, space to end of data, status — the Linux st
//!   driver's semantics, written down as a contract on the trait.
//! - [`StDrive`] drives a real drive through `/dev/nstN` and the mtio ioctls.
//! - [`EmuDrive`] is an emulated drive in a directory, with tape semantics
//!   and a timing model (speed matching, backhitches, locate time growing
//!   with distance) on a virtual or a real clock.
//! - [`conformance`] is the suite every device passes.
//! - [`layout`] is the self-describing on-tape format: a label, data blocks
//!   that each name their volume, object and sequence number, and a catalog
//!   after the data; [`layout::scan`] rebuilds everything from the blocks
//!   when the catalog is lost.
//!
//! `docs/tape.md` explains the design; `docs/format.md` ("Tape") gives the
//! bytes.
//!
//! ```
//! use cairn_tape::{Clock, EmuDrive, EmuParams, ReadOutcome, TapeDevice};
//! let dir = tempfile::tempdir().unwrap();
//! let mut params = EmuParams::default();
//! params.block_size = 4096;
//! let mut dev = EmuDrive::create(&dir.path().join("tape"), params, Clock::virtual_clock()).unwrap();
//! dev.write_blocks(&[7u8; 8192]).unwrap();
//! dev.write_filemarks(1).unwrap();
//! dev.rewind().unwrap();
//! let mut buf = vec![0u8; 4 * 4096];
//! assert_eq!(dev.read_blocks(&mut buf).unwrap(), ReadOutcome::Blocks(2));
//! assert_eq!(dev.read_blocks(&mut buf).unwrap(), ReadOutcome::Filemark);
//! ```
#![deny(missing_docs)]

pub mod conformance;
mod device;
mod emu;

pub use device::{read_exact_blocks, DeviceError, ReadOutcome, Result, Status, TapeDevice};
pub use emu::{Clock, CrashModel, EmuDrive, EmuParams, EmuStats, VirtualClock, EMU_FORMAT};
