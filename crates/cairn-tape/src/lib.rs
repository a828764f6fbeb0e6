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
//! - [`index`] is what the catalog says: the objects on the tape and the
//!   metadata a mount reads first, inline.
//! - [`raw`] copies raw blocks between a tape and a byte stream
//!   (`cairn tape dd`).
//! - [`store`] is a tape as the engine's backend: one drive thread, reads
//!   batched in tape order.
//!
//! `docs/tape.md` explains the design; `docs/format.md` ("Tape") gives the
//! bytes.
//!
//! ```
//! use cairn_tape::{layout, Clock, EmuDrive, EmuParams, TapeDevice};
//! let dir = tempfile::tempdir().unwrap();
//! let mut params = EmuParams::default();
//! params.block_size = 4096;
//! let mut dev = EmuDrive::create(&dir.path().join("tape"), params, Clock::virtual_clock()).unwrap();
//! let label = layout::Label::new(layout::VolumeId([7; 16]), 4096, 0, b"");
//! let cat = layout::format(&mut dev, &label, b"empty catalog").unwrap();
//! let mut w = layout::TapeWriter::new(&label, cat.append_point());
//! let extent = w.write(&mut dev, 1, b"hello tape", true).unwrap();
//! let cat = w.write_catalog(&mut dev, b"catalog naming object 1").unwrap();
//! let got = layout::read_object(&mut dev, &label, &[extent]).unwrap();
//! assert_eq!(got, b"hello tape");
//! let read = layout::read_catalog(&mut dev, &label, Some(cat.start)).unwrap();
//! assert_eq!(read.bytes, b"catalog naming object 1");
//! ```
#![deny(missing_docs)]

pub mod conformance;
mod device;
mod emu;
pub mod index;
pub mod layout;
pub mod raw;
#[cfg(target_os = "linux")]
pub mod st;
pub mod store;

pub use device::{read_exact_blocks, DeviceError, ReadOutcome, Result, Status, TapeDevice};
pub use emu::{Clock, CrashModel, EmuDrive, EmuParams, EmuStats, Session, VirtualClock, EMU_FORMAT, SESSION_FILE};
#[cfg(target_os = "linux")]
pub use st::StDrive;
