//! An emulated tape drive in a directory, with tape semantics and a timing
//! model.
//!
//! ```text
//! DIR/params.json   EmuParams (JSON): block size, capacity, timing, crash model, write-protect
//! DIR/tape.img      the tape: position p is the slot at offset p × (8 + block_size)
//!                   slot = "CTS1" | kind u8 (1 block, 2 filemark) | 3 zero bytes | block_size bytes
//! ```
//!
//! The end of data is the number of whole slots in `tape.img`; writing at a
//! position truncates the file there first. A slot cut short by a crash
//! (the file length not a multiple of the slot size) is dropped when the
//! tape is opened. `tape.img` is held with `flock(LOCK_EX)` while open, so a
//! second opener gets a clear "busy" error, as a real drive would.
//! `write_filemarks` and `flush` fsync `tape.img`.

mod clock;
mod model;
mod params;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub use clock::{Clock, VirtualClock};
pub use params::{CrashModel, EmuParams, EMU_FORMAT};

use crate::device::{DeviceError, ReadOutcome, Result, Status, TapeDevice};
use model::Transport;

const SLOT_MAGIC: &[u8; 4] = b"CTS1";
const SLOT_HEADER: usize = 8;
const KIND_BLOCK: u8 = 1;
const KIND_FILEMARK: u8 = 2;

/// What the emulated drive did, measured by its timing model.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EmuStats {
    /// Metres of tape that passed the head: streaming, locating, rewinding
    /// and backhitching.
    pub metres: f64,
    /// Stops and restarts in the middle of a stream (buffer underrun while
    /// writing, full buffer while reading, a write after a flush).
    pub backhitches: u64,
    /// Time the tape moved while reading or writing data, seconds.
    pub streaming_secs: f64,
    /// Time spent locating, rewinding, loading and backhitching, seconds.
    pub positioning_secs: f64,
    /// Time the tape stood still with nothing to do, seconds.
    pub idle_secs: f64,
    /// Locates and rewinds that moved the tape.
    pub locates: u64,
    /// Bytes the host wrote (blocks and filemarks, at block size each).
    pub bytes_written: u64,
    /// Bytes the host read (blocks and filemarks, at block size each).
    pub bytes_read: u64,
}

/// An emulated drive with its cartridge in a directory (see the module docs
/// for the files). It follows the [`TapeDevice`] contract exactly.
pub struct EmuDrive {
    /// The clock's time at open (the session [`SESSION_FILE`] describes).
    opened_at: f64,
    dir: PathBuf,
    name: String,
    params: EmuParams,
    file: File,
    bs: usize,
    slot: u64,
    /// End of data, pending slots included.
    eod: u64,
    pos: u64,
    loaded: bool,
    /// The last operation was `write_blocks` (st writes a filemark before moving).
    wrote_last: bool,
    /// A write crossed the early-warning point and it has not been reported yet.
    ew_pending: bool,
    /// Early warning was reported; writes go on until the physical end.
    ew_reported: bool,
    /// PowerLoss model: slots the timing model has not yet put on tape.
    pending: VecDeque<(u64, Vec<u8>)>,
    model: Transport,
    clock: Clock,
}

fn io_err(device: &str, op: &'static str, source: std::io::Error) -> DeviceError {
    DeviceError::Io {
        device: device.to_string(),
        op,
        source,
    }
}

impl EmuDrive {
    /// Creates an emulated tape (a blank cartridge, loaded) in `dir`, which
    /// must not already hold one.
    pub fn create(dir: &Path, params: EmuParams, clock: Clock) -> Result<Self> {
        let name = dir.display().to_string();
        params
            .validate()
            .map_err(|message| DeviceError::InvalidArgument {
                device: name.clone(),
                message,
            })?;
        std::fs::create_dir_all(dir).map_err(|e| io_err(&name, "create directory", e))?;
        if dir.join("tape.img").exists() || dir.join("params.json").exists() {
            return Err(io_err(
                &name,
                "create",
                std::io::Error::from_raw_os_error(libc::EEXIST),
            ));
        }
        write_params(dir, &params).map_err(|e| io_err(&name, "write params.json", e))?;
        let f = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(dir.join("tape.img"))
            .map_err(|e| io_err(&name, "create tape.img", e))?;
        f.sync_all()
            .map_err(|e| io_err(&name, "fsync tape.img", e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(&name, "fsync directory", e))?;
        drop(f);
        Self::open(dir, clock)
    }

    /// Opens an existing emulated tape in `dir` (loaded, at the beginning).
    pub fn open(dir: &Path, clock: Clock) -> Result<Self> {
        let name = dir.display().to_string();
        let text = std::fs::read_to_string(dir.join("params.json"))
            .map_err(|e| io_err(&name, "read params.json", e))?;
        let params: EmuParams =
            serde_json::from_str(&text).map_err(|e| DeviceError::InvalidArgument {
                device: name.clone(),
                message: format!("params.json: {e}"),
            })?;
        params
            .validate()
            .map_err(|message| DeviceError::InvalidArgument {
                device: name.clone(),
                message,
            })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("tape.img"))
            .map_err(|e| io_err(&name, "open tape.img", e))?;
        lock(&file).map_err(|e| io_err(&name, "lock tape.img", e))?;
        let bs = params.block_size as usize;
        let slot = (SLOT_HEADER + bs) as u64;
        let len = file
            .metadata()
            .map_err(|e| io_err(&name, "stat tape.img", e))?
            .len();
        // A slot cut short by a crash never made it to "tape".
        if len % slot != 0 {
            file.set_len(len - len % slot)
                .map_err(|e| io_err(&name, "truncate torn slot", e))?;
        }
        let eod = len / slot;
        let model = Transport::new(&params, clock.now());
        let opened_at = clock.now();
        Ok(EmuDrive {
            opened_at,
            dir: dir.to_path_buf(),
            name,
            params,
            file,
            bs,
            slot,
            eod,
            pos: 0,
            loaded: true,
            wrote_last: false,
            ew_pending: false,
            ew_reported: false,
            pending: VecDeque::new(),
            model,
            clock,
        })
    }

    /// The parameters in use.
    pub fn params(&self) -> &EmuParams {
        &self.params
    }

    /// The clock the drive runs on.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// What the timing model measured so far (brought up to the clock's time).
    pub fn stats(&mut self) -> EmuStats {
        self.model.tick(self.clock.now());
        self.model.stats.clone()
    }

    /// Starts the statistics again from zero.
    pub fn reset_stats(&mut self) {
        self.model.tick(self.clock.now());
        self.model.stats = EmuStats::default();
    }

    /// The end of recorded data (a position), including blocks still in the
    /// modelled drive buffer.
    pub fn end_of_data(&self) -> u64 {
        self.eod
    }

    /// Sets the cartridge's write-protect switch (kept in `params.json`).
    pub fn set_write_protected(&mut self, on: bool) -> Result<()> {
        self.params.write_protected = on;
        write_params(&self.dir, &self.params)
            .map_err(|e| io_err(&self.name, "write params.json", e))
    }

    /// Simulates the drive losing power: blocks in the modelled buffer
    /// (PowerLoss model) are dropped, nothing is flushed and no filemark is
    /// written. The tape then holds what a `kill -9` would have left.
    pub fn simulate_power_loss(mut self) {
        self.model.tick(self.clock.now());
        let _ = self.commit_model();
        self.pending.clear();
        self.wrote_last = false;
        // Drop closes the file (and its lock) without writing anything more.
    }

    fn check_loaded(&self) -> Result<()> {
        if self.loaded {
            Ok(())
        } else {
            Err(DeviceError::NoTape {
                device: self.name.clone(),
            })
        }
    }

    fn check_writable(&self) -> Result<()> {
        self.check_loaded()?;
        if self.params.write_protected {
            return Err(DeviceError::WriteProtected {
                device: self.name.clone(),
            });
        }
        Ok(())
    }

    fn max_positions(&self) -> u64 {
        self.params.capacity_bytes / self.bs as u64
    }

    fn ew_position(&self) -> u64 {
        (self.params.capacity_bytes - self.params.early_warning_bytes) / self.bs as u64
    }

    /// Writes slots whose time has come (PowerLoss) to the tape file.
    fn commit_model(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let buffered = self.model.buffered();
        let keep = (buffered / self.bs as f64).ceil() as usize;
        let n = self.pending.len().saturating_sub(keep);
        self.commit_front(n)
    }

    fn commit_front(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let first = self.pending[0].0;
        let mut buf = Vec::with_capacity(n * self.slot as usize);
        for (_, s) in self.pending.drain(..n) {
            buf.extend_from_slice(&s);
        }
        self.file
            .write_all_at(&buf, first * self.slot)
            .map_err(|e| io_err(&self.name, "write tape.img", e))?;
        // Start writing the pages to disk now, so a drive flush (an fsync
        // of the image) does not pay the host's disk for everything since
        // the last one: a real drive has already written them by then.
        // SAFETY: sync_file_range on a descriptor we own; a failure only
        // leaves the work to the fsync.
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), (first * self.slot) as i64, buf.len() as i64, libc::SYNC_FILE_RANGE_WRITE);
        }
        Ok(())
    }

    fn commit_all(&mut self) -> Result<()> {
        let n = self.pending.len();
        self.commit_front(n)
    }

    fn sync(&mut self) -> Result<()> {
        self.commit_all()?;
        self.file
            .sync_data()
            .map_err(|e| io_err(&self.name, "fsync tape.img", e))
    }

    /// Puts slots at the current position (truncating what follows).
    fn put_slots(&mut self, slots: Vec<u8>, count: u64) -> Result<()> {
        if self.pos < self.eod {
            // Writing erases everything after it. Pending slots only exist at
            // the end of data, where we write, so none is cut here.
            debug_assert!(self.pending.is_empty());
            self.file
                .set_len(self.pos * self.slot)
                .map_err(|e| io_err(&self.name, "truncate tape.img", e))?;
        }
        match self.params.crash {
            CrashModel::HostCrash => {
                self.file
                    .write_all_at(&slots, self.pos * self.slot)
                    .map_err(|e| io_err(&self.name, "write tape.img", e))?;
            }
            CrashModel::PowerLoss => {
                for (i, s) in slots.chunks(self.slot as usize).enumerate() {
                    self.pending.push_back((self.pos + i as u64, s.to_vec()));
                }
            }
        }
        self.pos += count;
        self.eod = self.pos;
        Ok(())
    }

    fn slot_bytes(&self, kind: u8, data: &[u8]) -> Vec<u8> {
        let mut s = Vec::with_capacity(self.slot as usize);
        s.extend_from_slice(SLOT_MAGIC);
        s.extend_from_slice(&[kind, 0, 0, 0]);
        s.extend_from_slice(data);
        s.resize(self.slot as usize, 0);
        s
    }

    /// st writes a filemark before rewinding or seeking right after a write.
    fn implicit_filemark(&mut self) -> Result<()> {
        if self.wrote_last {
            self.wrote_last = false;
            match self.write_filemarks(1) {
                // At the physical end there is no room for it; st reports
                // success there too and moves on.
                Err(DeviceError::EndOfMedium { .. }) => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Brings the timing model to `t` and lands what it wrote.
    /// Puts as many of `count` filemarks as fit at the position and hands
    /// them to the drive model; returns how many fit and when the host may
    /// go on.
    fn put_filemarks(&mut self, count: u32) -> Result<(u64, f64)> {
        self.check_writable()?;
        self.wrote_last = false;
        let fit = (count as u64).min(self.max_positions().saturating_sub(self.pos));
        let mut t = self.clock.now();
        if fit > 0 {
            let mut slots = Vec::with_capacity(fit as usize * self.slot as usize);
            for _ in 0..fit {
                slots.extend_from_slice(&self.slot_bytes(KIND_FILEMARK, &[]));
            }
            self.put_slots(slots, fit)?;
            t = self.model.host_write(self.clock.now(), (fit as usize * self.bs) as f64);
        }
        Ok((fit, t))
    }

    /// End of medium for filemarks that did not fit, and the early warning
    /// for the next write.
    fn filemarks_done(&mut self, fit: u64, count: u32) -> Result<()> {
        if fit < count as u64 {
            return Err(DeviceError::EndOfMedium {
                device: self.name.clone(),
                written_blocks: 0,
            });
        }
        if self.pos > self.ew_position() && !self.ew_reported {
            self.ew_pending = true;
        }
        Ok(())
    }

    /// Runs the model's locate to `block` and logs it at debug level
    /// (RUST_LOG=cairn_tape=debug): where a session's seconds went.
    fn timed_locate(&mut self, op: &str, block: u64) -> f64 {
        let now = self.clock.now();
        let t = self.model.locate(now, (block * self.bs as u64) as f64);
        tracing::debug!("{}: {op} from block {} to {block}: {:.2} s", self.name, self.pos, t - now);
        t
    }

    fn after_model(&mut self, t: f64) -> Result<()> {
        self.clock.wait_until(t);
        self.commit_model()
    }

    fn moved_to(&mut self, p: u64) {
        self.pos = p;
        if p < self.ew_position() {
            self.ew_pending = false;
            self.ew_reported = false;
        }
    }
}

/// Takes the tape's exclusive lock. A holder is given up to two seconds to
/// let go: a child process between fork and exec briefly keeps a copy of a
/// descriptor we have already closed.
fn lock(file: &File) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::new(
                e.kind(),
                "busy: another process has this tape open",
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn write_params(dir: &Path, params: &EmuParams) -> std::io::Result<()> {
    let tmp = dir.join("params.json.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(
        serde_json::to_string_pretty(params)
            .expect("params serialize")
            .as_bytes(),
    )?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join("params.json"))?;
    File::open(dir)?.sync_all()
}

impl TapeDevice for EmuDrive {
    fn name(&self) -> &str {
        &self.name
    }

    fn block_size(&self) -> usize {
        self.bs
    }

    fn write_blocks(&mut self, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        if !data.len().is_multiple_of(self.bs) || data.is_empty() {
            return Err(DeviceError::InvalidArgument {
                device: self.name.clone(),
                message: format!(
                    "write of {} bytes is not a positive multiple of the block size {}",
                    data.len(),
                    self.bs
                ),
            });
        }
        if self.ew_pending {
            self.ew_pending = false;
            self.ew_reported = true;
            self.wrote_last = false;
            return Err(DeviceError::EndOfMedium {
                device: self.name.clone(),
                written_blocks: 0,
            });
        }
        let want = (data.len() / self.bs) as u64;
        let fit = want.min(self.max_positions().saturating_sub(self.pos));
        if fit > 0 {
            let mut slots = Vec::with_capacity(fit as usize * self.slot as usize);
            for b in data.chunks(self.bs).take(fit as usize) {
                // Built in place: this is the hot path of a streaming write.
                slots.extend_from_slice(SLOT_MAGIC);
                slots.extend_from_slice(&[KIND_BLOCK, 0, 0, 0]);
                slots.extend_from_slice(b);
            }
            self.put_slots(slots, fit)?;
            let t = self
                .model
                .host_write(self.clock.now(), (fit as usize * self.bs) as f64);
            self.after_model(t)?;
            self.wrote_last = true;
        }
        if fit < want {
            self.ew_reported = true;
            return Err(DeviceError::EndOfMedium {
                device: self.name.clone(),
                written_blocks: fit,
            });
        }
        if self.pos > self.ew_position() && !self.ew_reported {
            self.ew_pending = true;
        }
        Ok(())
    }

    fn write_filemarks_immediate(&mut self, count: u32) -> Result<()> {
        let (fit, t) = self.put_filemarks(count)?;
        // Through the drive's buffer like a block: the tape keeps moving.
        self.after_model(t)?;
        self.filemarks_done(fit, count)
    }

    fn write_filemarks(&mut self, count: u32) -> Result<()> {
        // A flush in the middle of recorded data (count 0) writes nothing
        // and erases nothing.
        let (fit, _) = self.put_filemarks(count)?;
        let t = self.model.host_flush(self.clock.now());
        // The image's fsync runs while the model drains its buffer: the
        // host's disk is the emulator's cost, not the drive's, so it
        // overlaps the modelled time instead of adding to it.
        self.sync()?;
        self.clock.wait_until(t);
        self.filemarks_done(fit, count)
    }

    fn read_blocks(&mut self, buf: &mut [u8]) -> Result<ReadOutcome> {
        self.check_loaded()?;
        let want = buf.len() / self.bs;
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
        self.wrote_last = false;
        // The drive writes out its buffer before it reads.
        let t = self.model.host_flush(self.clock.now());
        self.clock.wait_until(t);
        self.commit_all()?;
        if self.pos >= self.eod {
            return Ok(ReadOutcome::EndOfData);
        }
        let n = (want as u64).min(self.eod - self.pos) as usize;
        let mut raw = vec![0u8; n * self.slot as usize];
        self.file
            .read_exact_at(&mut raw, self.pos * self.slot)
            .map_err(|e| io_err(&self.name, "read tape.img", e))?;
        let mut got = 0;
        for s in raw.chunks(self.slot as usize) {
            if &s[..4] != SLOT_MAGIC || (s[4] != KIND_BLOCK && s[4] != KIND_FILEMARK) {
                return Err(io_err(
                    &self.name,
                    "read",
                    std::io::Error::other(format!(
                        "medium error at block {}",
                        self.pos + got as u64
                    )),
                ));
            }
            if s[4] == KIND_FILEMARK {
                break;
            }
            buf[got * self.bs..(got + 1) * self.bs].copy_from_slice(&s[SLOT_HEADER..]);
            got += 1;
        }
        let limit = (self.eod * self.bs as u64) as f64;
        if got == 0 {
            let t = self
                .model
                .host_read(self.clock.now(), self.bs as f64, limit);
            self.clock.wait_until(t);
            self.pos += 1;
            return Ok(ReadOutcome::Filemark);
        }
        let t = self
            .model
            .host_read(self.clock.now(), (got * self.bs) as f64, limit);
        self.clock.wait_until(t);
        self.pos += got as u64;
        Ok(ReadOutcome::Blocks(got))
    }

    fn rewind(&mut self) -> Result<()> {
        self.check_loaded()?;
        self.implicit_filemark()?;
        let t = self.timed_locate("rewind", 0);
        self.after_model(t)?;
        self.commit_all()?;
        self.moved_to(0);
        Ok(())
    }

    fn space_to_eod(&mut self) -> Result<()> {
        self.check_loaded()?;
        self.wrote_last = false;
        let target = self.eod;
        let t = self.timed_locate("space to end of data", target);
        self.after_model(t)?;
        self.commit_all()?;
        self.moved_to(target);
        Ok(())
    }

    fn locate(&mut self, block: u64) -> Result<()> {
        self.check_loaded()?;
        self.implicit_filemark()?;
        if block > self.eod {
            return Err(DeviceError::EndOfData {
                device: self.name.clone(),
                position: block,
            });
        }
        let t = self.timed_locate("locate", block);
        self.after_model(t)?;
        self.commit_all()?;
        self.moved_to(block);
        Ok(())
    }

    fn position(&mut self) -> Result<u64> {
        self.check_loaded()?;
        Ok(self.pos)
    }

    fn status(&mut self) -> Result<Status> {
        if !self.loaded {
            return Ok(Status {
                no_tape: true,
                ..Status::default()
            });
        }
        let filemark = self.pos > 0 && {
            let mut h = [0u8; SLOT_HEADER];
            let p = self.pos - 1;
            match self.pending.iter().find(|(q, _)| *q == p) {
                Some((_, s)) => s[4] == KIND_FILEMARK,
                None => {
                    self.file.read_exact_at(&mut h, p * self.slot).is_ok() && h[4] == KIND_FILEMARK
                }
            }
        };
        Ok(Status {
            online: true,
            no_tape: false,
            write_protected: self.params.write_protected,
            bot: self.pos == 0,
            filemark,
            eod: self.pos == self.eod,
            early_warning: self.pos > self.ew_position(),
        })
    }

    fn load(&mut self) -> Result<()> {
        if self.loaded {
            return Ok(());
        }
        let t = self.model.load(self.clock.now(), self.params.load_secs);
        self.clock.wait_until(t);
        self.loaded = true;
        self.moved_to(0);
        Ok(())
    }

    fn unload(&mut self) -> Result<()> {
        self.check_loaded()?;
        self.wrote_last = false;
        let t = self.model.locate(self.clock.now(), 0.0);
        self.after_model(t)?;
        self.sync()?;
        let t = self.model.load(self.clock.now(), self.params.unload_secs);
        self.clock.wait_until(t);
        self.loaded = false;
        self.pos = 0;
        Ok(())
    }
}

impl Drop for EmuDrive {
    fn drop(&mut self) {
        // Closing st after a write writes a filemark; the drive also writes
        // out its buffer.
        if self.loaded && self.wrote_last {
            let _ = self.write_filemarks(1);
        }
        let _ = self.sync();
        // What this session did, for benchmarks and `cairn tape info`: the
        // drive is inside another process (a mount) while it runs.
        let secs = self.clock.now() - self.opened_at;
        let session = Session { format: SESSION_FORMAT.into(), seconds: secs, stats: self.stats() };
        if let Ok(j) = serde_json::to_vec_pretty(&session) {
            let tmp = self.dir.join(format!("{SESSION_FILE}.tmp"));
            if std::fs::write(&tmp, j).and_then(|_| std::fs::rename(&tmp, self.dir.join(SESSION_FILE))).is_err() {
                tracing::warn!("{}: could not write {SESSION_FILE}", self.name);
            }
        }
    }
}

/// The file in an emulated tape's directory describing the last session
/// (open to close) of the drive: its statistics and how long it lasted.
pub const SESSION_FILE: &str = "last-session.json";
const SESSION_FORMAT: &str = "cairn-tape-emu-session-1";

/// What [`SESSION_FILE`] holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Session {
    /// `cairn-tape-emu-session-1`.
    pub format: String,
    /// Seconds from open to close on the drive's clock.
    pub seconds: f64,
    /// The timing model's counters for the session.
    pub stats: EmuStats,
}

impl Session {
    /// The last session of the emulated tape in `dir`, if one was recorded.
    pub fn read(dir: &Path) -> Option<Session> {
        let s: Session = serde_json::from_slice(&std::fs::read(dir.join(SESSION_FILE)).ok()?).ok()?;
        (s.format == SESSION_FORMAT).then_some(s)
    }
}
