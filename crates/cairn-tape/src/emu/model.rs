//! The timing model of the emulated drive: a buffer between the host and a
//! tape that streams at a speed-matched rate, stops when the buffer runs
//! dry (writing) or full (reading), and pays a backhitch to start again.
//!
//! Everything is in bytes and seconds. The model is evaluated lazily: each
//! host call brings it up to the call's time, applies the call, and says
//! when the host may continue. Between host calls the streaming rate is
//! constant (it is re-chosen at every call).

use std::collections::VecDeque;

use super::params::EmuParams;
use super::EmuStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Write,
    Read,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The tape is not moving.
    Stopped,
    /// Repositioning after an underrun or a sync; streams from `until`.
    Backhitch { until: f64 },
    /// Moving at `Transport::rate`.
    Streaming,
}

const EPS: f64 = 1e-9;
/// Byte amounts closer than this are equal (rates × times are not exact).
const BYTES_EPS: f64 = 1e-3;

#[derive(Debug)]
pub(crate) struct Transport {
    native: f64,
    min: f64,
    buffer: f64,
    start_threshold: f64,
    target: f64,
    control_secs: f64,
    window_secs: f64,
    backhitch_secs: f64,
    backhitch_m: f64,
    locate_fixed: f64,
    locate_speed: f64,
    length_m: f64,
    wrap_bytes: f64,

    t: f64,
    dir: Option<Dir>,
    phase: Phase,
    rate: f64,
    /// Writing: bytes accepted but not yet on tape. Reading: bytes read
    /// ahead but not yet taken by the host.
    level: f64,
    /// Where the head is, in bytes along the recording.
    head: f64,
    /// Reading ahead stops here (the end of data).
    read_limit: f64,
    /// The tape stopped in the middle of a stream: starting again needs a backhitch.
    needs_backhitch: bool,
    /// Recent host transfers (time, bytes) for the rate estimate.
    window: VecDeque<(f64, f64)>,
    window_start: f64,
    pub(crate) stats: EmuStats,
}

impl Transport {
    pub(crate) fn new(p: &EmuParams, t: f64) -> Self {
        let buffer = p.buffer_bytes as f64;
        Transport {
            native: p.native_rate,
            min: p.min_rate,
            buffer,
            start_threshold: buffer * p.start_threshold,
            target: buffer * p.target_level,
            control_secs: p.control_secs,
            window_secs: p.rate_window_secs,
            backhitch_secs: p.backhitch_secs,
            backhitch_m: p.backhitch_metres,
            locate_fixed: p.locate_fixed_secs,
            locate_speed: p.locate_speed_mps,
            length_m: p.tape_length_m,
            wrap_bytes: p.capacity_bytes as f64 / p.wraps.max(1) as f64,
            t,
            dir: None,
            phase: Phase::Stopped,
            rate: p.native_rate,
            level: 0.0,
            head: 0.0,
            read_limit: 0.0,
            needs_backhitch: false,
            window: VecDeque::new(),
            window_start: t,
            stats: EmuStats::default(),
        }
    }

    /// Longitudinal position (metres from the beginning) of a byte offset,
    /// on a serpentine recording: even wraps run forward, odd ones back.
    pub(crate) fn x_of(&self, b: f64) -> f64 {
        let wrap = (b / self.wrap_bytes).floor();
        let f = (b - wrap * self.wrap_bytes) / self.wrap_bytes;
        if (wrap as u64).is_multiple_of(2) {
            f * self.length_m
        } else {
            (1.0 - f) * self.length_m
        }
    }

    /// Metres of tape that pass the head while `bytes` are streamed.
    fn metres_of(&self, bytes: f64) -> f64 {
        bytes / self.wrap_bytes * self.length_m
    }

    fn stream(&mut self, bytes: f64, secs: f64) {
        self.head += bytes;
        self.stats.metres += self.metres_of(bytes);
        self.stats.streaming_secs += secs;
    }

    /// Runs the model from its time to `t_new` with no host action.
    fn advance(&mut self, t_new: f64) {
        while self.t < t_new - EPS {
            match self.phase {
                Phase::Stopped => {
                    self.stats.idle_secs += t_new - self.t;
                    self.t = t_new;
                }
                Phase::Backhitch { until } => {
                    let end = until.min(t_new);
                    self.stats.positioning_secs += end - self.t;
                    self.t = end;
                    if end >= until - EPS {
                        self.phase = Phase::Streaming;
                    }
                }
                Phase::Streaming => {
                    let dt = t_new - self.t;
                    match self.dir {
                        Some(Dir::Write) => {
                            let dt_empty = self.level / self.rate;
                            if dt >= dt_empty - EPS {
                                let bytes = self.level;
                                self.stream(bytes, dt_empty);
                                self.level = 0.0;
                                self.t += dt_empty;
                                // Underrun: the tape overshoots and must back up.
                                self.phase = Phase::Stopped;
                                self.needs_backhitch = true;
                            } else {
                                self.stream(self.rate * dt, dt);
                                self.level -= self.rate * dt;
                                self.t = t_new;
                            }
                        }
                        Some(Dir::Read) => {
                            let room = (self.buffer - self.level)
                                .min(self.read_limit - self.head)
                                .max(0.0);
                            let dt_full = room / self.rate;
                            if dt >= dt_full - EPS {
                                self.stream(room, dt_full);
                                self.level += room;
                                self.t += dt_full;
                                self.phase = Phase::Stopped;
                                // Stopped by a full buffer: resuming needs a backhitch;
                                // stopped at the end of data: nothing more to read.
                                self.needs_backhitch = self.head < self.read_limit - EPS;
                            } else {
                                self.stream(self.rate * dt, dt);
                                self.level += self.rate * dt;
                                self.t = t_new;
                            }
                        }
                        None => {
                            self.phase = Phase::Stopped;
                        }
                    }
                }
            }
        }
        if self.t < t_new {
            self.t = t_new;
        }
    }

    /// Starts the tape if it is stopped (with a backhitch when it stopped mid-stream).
    fn start(&mut self) {
        if self.phase != Phase::Stopped {
            return;
        }
        if self.needs_backhitch {
            self.stats.backhitches += 1;
            self.stats.metres += self.backhitch_m;
            self.needs_backhitch = false;
            self.phase = Phase::Backhitch {
                until: self.t + self.backhitch_secs,
            };
        } else {
            self.phase = Phase::Streaming;
        }
    }

    /// The host's transfer rate over the recent window (infinite before any
    /// time has passed: a host that has not yet spent time is "fast").
    fn host_rate(&mut self) -> f64 {
        while let Some(&(t0, _)) = self.window.front() {
            if t0 < self.t - self.window_secs {
                self.window.pop_front();
            } else {
                break;
            }
        }
        let span = (self.t - self.window_start).min(self.window_secs);
        let bytes: f64 = self.window.iter().map(|&(_, b)| b).sum();
        if span <= EPS {
            f64::INFINITY
        } else {
            bytes / span
        }
    }

    fn note_host(&mut self, bytes: f64) {
        self.window.push_back((self.t, bytes));
    }

    /// Speed matching: follow the host's rate, nudged towards the target
    /// buffer level, within [min, native]; a full buffer means full speed.
    fn choose_rate(&mut self) {
        let h = self.host_rate();
        let r = match self.dir {
            Some(Dir::Write) if self.level >= self.buffer - EPS => self.native,
            Some(Dir::Write) => h + (self.level - self.target) / self.control_secs,
            Some(Dir::Read) => h - (self.level - self.target) / self.control_secs,
            None => self.native,
        };
        self.rate = if r.is_nan() {
            self.native
        } else {
            r.clamp(self.min, self.native)
        };
    }

    /// Enters a direction; a change of direction ends the old stream.
    fn set_dir(&mut self, dir: Dir) {
        if self.dir == Some(dir) {
            return;
        }
        match self.dir {
            Some(Dir::Write) => self.drain(),
            Some(Dir::Read) => {
                // The head ran ahead of the host: go back to where the host is.
                let logical = self.head - self.level;
                self.reposition(logical);
            }
            None => {}
        }
        self.dir = Some(dir);
        self.window.clear();
        self.window_start = self.t;
        self.level = 0.0;
    }

    /// The host hands `bytes` to the drive at time `t`; returns when the host
    /// may continue (later than `t` when the buffer is full).
    pub(crate) fn host_write(&mut self, t: f64, bytes: f64) -> f64 {
        self.advance(t);
        self.set_dir(Dir::Write);
        self.note_host(bytes);
        self.level += bytes;
        self.stats.bytes_written += bytes as u64;
        if self.phase == Phase::Stopped && self.level >= self.start_threshold - EPS {
            self.start();
        }
        self.choose_rate();
        while self.level > self.buffer + BYTES_EPS {
            self.start();
            self.rate = self.native;
            let wait = match self.phase {
                Phase::Backhitch { until } => until - self.t,
                _ => 0.0,
            };
            let t_free = self.t + wait + (self.level - self.buffer) / self.rate;
            let before = self.t;
            self.advance(t_free);
            if self.t <= before {
                self.level = self.level.min(self.buffer); // below the clock's resolution
            }
        }
        self.t
    }

    /// Writes out the buffer (a flush or filemark, or before moving);
    /// returns when it is on tape. The tape stops afterwards.
    pub(crate) fn host_flush(&mut self, t: f64) -> f64 {
        self.advance(t);
        self.drain();
        self.t
    }

    fn drain(&mut self) {
        if self.dir == Some(Dir::Write) && self.level > EPS {
            self.start();
            self.rate = self.native;
            let wait = match self.phase {
                Phase::Backhitch { until } => until - self.t,
                _ => 0.0,
            };
            let t_end = self.t + wait + self.level / self.rate;
            self.advance(t_end);
            // A sync leaves the tape stopped past the data: the next write backhitches.
            self.level = 0.0;
            self.phase = Phase::Stopped;
            self.needs_backhitch = true;
        }
    }

    /// The host takes `bytes` read at time `t`, with `limit` the end of data
    /// in bytes; returns when the data is in the host's hands.
    pub(crate) fn host_read(&mut self, t: f64, bytes: f64, limit: f64) -> f64 {
        self.advance(t);
        // A request larger than half the buffer is taken in pieces, as the
        // drive hands it over while it keeps reading.
        let piece = (self.buffer / 2.0).max(1.0);
        let mut left = bytes;
        while left > EPS {
            let b = left.min(piece);
            self.read_piece(b, limit);
            left -= b;
        }
        self.t
    }

    fn read_piece(&mut self, bytes: f64, limit: f64) {
        self.set_dir(Dir::Read);
        self.read_limit = limit;
        if self.level < bytes - BYTES_EPS {
            self.choose_rate();
            while self.level < bytes - BYTES_EPS {
                let room = self.read_limit - self.head;
                if room <= EPS {
                    break; // nothing more to read ahead
                }
                self.start();
                let wait = match self.phase {
                    Phase::Backhitch { until } => until - self.t,
                    _ => 0.0,
                };
                let need = (bytes - self.level).min(room);
                let before = self.t;
                self.advance(self.t + wait + need / self.rate);
                if self.t <= before {
                    self.level = bytes; // below the clock's resolution
                }
            }
        }
        self.level = (self.level - bytes).max(0.0);
        self.note_host(bytes);
        self.stats.bytes_read += bytes as u64;
        // Stopped on a full buffer: resume once there is room for a good run.
        if self.phase == Phase::Stopped
            && self.needs_backhitch
            && self.buffer - self.level >= self.start_threshold - EPS
        {
            self.start();
        }
        self.choose_rate();
    }

    fn reposition(&mut self, target: f64) {
        let dist = (self.x_of(self.head) - self.x_of(target)).abs();
        let moving = self.phase != Phase::Stopped;
        if dist > 0.0 || moving || (self.head - target).abs() > EPS {
            let secs = self.locate_fixed + dist / self.locate_speed;
            self.stats.metres += dist;
            self.stats.positioning_secs += secs;
            self.stats.locates += 1;
            self.t += secs;
        }
        self.head = target;
        self.level = 0.0;
        self.phase = Phase::Stopped;
        self.needs_backhitch = false;
    }

    /// Moves to `target` bytes at time `t` (writing out the buffer first);
    /// returns when the tape is there.
    pub(crate) fn locate(&mut self, t: f64, target: f64) -> f64 {
        self.advance(t);
        if self.dir == Some(Dir::Write) {
            self.drain();
        }
        self.dir = None;
        self.reposition(target);
        self.t
    }

    /// Loading (or unloading) takes `secs` and leaves the tape at the beginning.
    pub(crate) fn load(&mut self, t: f64, secs: f64) -> f64 {
        self.advance(t);
        self.dir = None;
        self.level = 0.0;
        self.phase = Phase::Stopped;
        self.needs_backhitch = false;
        self.head = 0.0;
        self.stats.positioning_secs += secs;
        self.t += secs;
        self.t
    }

    /// Bytes the model has not yet put on tape (writing).
    pub(crate) fn buffered(&self) -> f64 {
        if self.dir == Some(Dir::Write) {
            self.level
        } else {
            0.0
        }
    }

    /// Brings the model up to `t` (for statistics and the crash model).
    pub(crate) fn tick(&mut self, t: f64) {
        self.advance(t);
    }
}
