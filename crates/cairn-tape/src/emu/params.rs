//! Parameters of the emulated drive; stored as `params.json` beside the tape.

use serde::{Deserialize, Serialize};

/// What a crash (the process killed, `kill -9`) leaves on the emulated tape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrashModel {
    /// Only the host died; the drive lives on and writes out its buffer, as
    /// a real drive does when the host crashes. Every block passed to
    /// `write_blocks` reaches the tape file at once (without fsync: a crash
    /// of the whole machine keeps only what was flushed).
    HostCrash,
    /// The drive lost power with the host: blocks still in the modelled
    /// drive buffer (not yet "written" by the timing model) are lost. The
    /// emulator keeps them in memory and writes them to the tape file only
    /// when the model says they reached the tape, or at a flush.
    PowerLoss,
}

/// Parameters of an emulated drive and its cartridge.
///
/// Defaults ([`EmuParams::default`]) are [`EmuParams::lto9_scaled`]`(0.2)`:
/// an LTO-9 full-height drive with rates, buffer and capacity scaled by 0.2
/// so that a 2-core machine's ingest pipeline (~100–150 MB/s) can feed it;
/// times and the tape's geometry are not scaled, so locates, backhitches and
/// loads cost what they cost on the real drive. `docs/tape.md` gives the
/// source of every figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmuParams {
    /// Always `"cairn-tape-emu-1"`.
    pub format: String,
    /// Record size in bytes.
    pub block_size: u32,
    /// Bytes the tape holds up to the physical end of medium.
    pub capacity_bytes: u64,
    /// The early-warning point lies this many bytes before the physical end.
    pub early_warning_bytes: u64,
    /// Streaming rate at full speed, bytes per second.
    pub native_rate: f64,
    /// Slowest speed-matching rate, bytes per second; below it the buffer
    /// runs dry and the drive backhitches.
    pub min_rate: f64,
    /// The drive's buffer, bytes.
    pub buffer_bytes: u64,
    /// A stopped drive starts writing (or resumes reading) once this
    /// fraction of the buffer is filled (or free).
    pub start_threshold: f64,
    /// Speed matching aims at a buffer this full (fraction).
    pub target_level: f64,
    /// How fast speed matching corrects the buffer level, seconds.
    pub control_secs: f64,
    /// The host's rate is measured over this window, seconds.
    pub rate_window_secs: f64,
    /// Time lost by one backhitch (stop, reverse, restart), seconds.
    pub backhitch_secs: f64,
    /// Tape moved by one backhitch, metres.
    pub backhitch_metres: f64,
    /// Fixed part of every locate (and rewind), seconds.
    pub locate_fixed_secs: f64,
    /// Tape speed while locating or rewinding, metres per second.
    pub locate_speed_mps: f64,
    /// Length of the recorded part of the tape, metres.
    pub tape_length_m: f64,
    /// Serpentine wraps (end-to-end passes) the capacity is spread over.
    pub wraps: u32,
    /// Load and thread to ready, seconds.
    pub load_secs: f64,
    /// Unload (after the rewind), seconds.
    pub unload_secs: f64,
    /// What a crash leaves behind.
    pub crash: CrashModel,
    /// The cartridge's write-protect switch.
    pub write_protected: bool,
}

/// `EmuParams::format` of this version.
pub const EMU_FORMAT: &str = "cairn-tape-emu-1";

impl EmuParams {
    /// An LTO-9 full-height drive and cartridge as published (unscaled).
    pub fn lto9() -> Self {
        EmuParams {
            format: EMU_FORMAT.to_string(),
            block_size: 256 * 1024,
            capacity_bytes: 18_000_000_000_000,
            early_warning_bytes: 4_000_000_000,
            native_rate: 400e6,
            min_rate: 177e6,
            buffer_bytes: 1 << 30,
            start_threshold: 0.25,
            target_level: 0.5,
            control_secs: 5.0,
            rate_window_secs: 2.0,
            backhitch_secs: 3.0,
            backhitch_metres: 10.0,
            locate_fixed_secs: 3.0,
            locate_speed_mps: 8.35,
            tape_length_m: 1035.0,
            wraps: 280,
            load_secs: 16.0,
            unload_secs: 56.0,
            crash: CrashModel::HostCrash,
            write_protected: false,
        }
    }

    /// [`lto9`](Self::lto9) with rates, buffer and capacities multiplied by
    /// `scale`; times and geometry unchanged.
    pub fn lto9_scaled(scale: f64) -> Self {
        let mut p = Self::lto9();
        p.native_rate *= scale;
        p.min_rate *= scale;
        p.buffer_bytes = (p.buffer_bytes as f64 * scale) as u64;
        p.capacity_bytes = (p.capacity_bytes as f64 * scale) as u64;
        p.early_warning_bytes = (p.early_warning_bytes as f64 * scale) as u64;
        p
    }

    /// Checks that the numbers make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != EMU_FORMAT {
            return Err(format!(
                "unknown emulated tape format {:?} (expected {EMU_FORMAT:?})",
                self.format
            ));
        }
        let pos = |v: f64| v.is_finite() && v > 0.0;
        let frac = |v: f64| v.is_finite() && v > 0.0 && v <= 1.0;
        if self.block_size < 512 || self.block_size > 64 << 20 {
            return Err(format!(
                "block size {} out of range (512 B to 64 MiB)",
                self.block_size
            ));
        }
        if self.capacity_bytes < 2 * self.block_size as u64
            || self.early_warning_bytes >= self.capacity_bytes
        {
            return Err("capacity must hold two blocks and exceed the early-warning zone".into());
        }
        if !pos(self.native_rate) || !pos(self.min_rate) || self.min_rate > self.native_rate {
            return Err("rates must be positive with min_rate <= native_rate".into());
        }
        if self.buffer_bytes < self.block_size as u64 {
            return Err("the buffer must hold at least one block".into());
        }
        if !frac(self.start_threshold) || !frac(self.target_level) {
            return Err("start_threshold and target_level are fractions in (0, 1]".into());
        }
        if !pos(self.control_secs)
            || !pos(self.rate_window_secs)
            || !pos(self.locate_speed_mps)
            || !pos(self.tape_length_m)
        {
            return Err("control_secs, rate_window_secs, locate_speed_mps and tape_length_m must be positive".into());
        }
        for (v, name) in [
            (self.backhitch_secs, "backhitch_secs"),
            (self.backhitch_metres, "backhitch_metres"),
            (self.locate_fixed_secs, "locate_fixed_secs"),
            (self.load_secs, "load_secs"),
            (self.unload_secs, "unload_secs"),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be a non-negative number"));
            }
        }
        if self.wraps == 0 {
            return Err("wraps must be at least 1".into());
        }
        Ok(())
    }
}

impl Default for EmuParams {
    fn default() -> Self {
        Self::lto9_scaled(0.2)
    }
}
