//! The CDP mirror of a tape volume (docs/tape.md §4; seed 002 HPTFS §V-D):
//! every object goes to the tape and to a local directory at once, reads
//! are served from the directory, and the tape alone still restores
//! everything.
//!
//! The directory (`--mirror DIR`) is a [`LocalBackend`] holding the
//! objects verbatim (`DIR/config`, `DIR/packs/XY/NAME`, `DIR/meta/...`)
//! and `DIR/mirror.json`, which ties it to one tape and says which of its
//! files can be trusted (format.md, "CDP mirror"). The mirror path is kept
//! in the volume's local settings (`volume.json`), so a later mount from
//! the same `--cache-dir` mirrors without being told again; a machine with
//! only the tape (a fresh `--cache-dir`) mounts without it.

use crate::config::{Layout, LocalSettings};
use crate::error::{Error, ErrorKind, Result};
use cairn_backend::{Backend, Capabilities, LocalBackend, ObjectInfo};
use cairn_tape::store::TapeStore;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The marker file in a mirror directory.
pub const MARKER: &str = "mirror.json";
const MARKER_FORMAT: &str = "cairn-mirror";
const MARKER_VERSION: u32 = 1;

/// What a mount does about a tape volume's mirror.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MirrorChoice {
    /// Whatever the local settings name (none for a new `--cache-dir`).
    #[default]
    Remembered,
    /// Mirror into this directory (created if missing) from now on.
    Use(PathBuf),
    /// Stop mirroring (the directory is left as it is).
    Off,
}

/// `DIR/mirror.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct Marker {
    format: String,
    version: u32,
    /// The tape's volume id (its label's), 32 hex digits.
    tape: String,
    /// Every live object the tape put with an id below this is, if the
    /// directory has a file of its name, that file byte for byte.
    consistent_below: u64,
}

/// Counters of a mirror since it was opened.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct MirrorStats {
    /// Reads the directory served.
    pub reads_from_mirror: u64,
    /// Reads that went to the tape because the directory lacked the object.
    pub fallbacks: u64,
    /// Whole objects read from the tape and written into the directory.
    pub filled: u64,
    /// Objects written to both.
    pub puts: u64,
}

/// A tape with a local directory beside it (the CDP mirror).
///
/// Contract, beyond [`Backend`]'s (which it keeps, with the tape's
/// capabilities):
/// - **The tape is the truth.** `list`, `size` and whether an object
///   exists are the tape's; the directory never serves an object the tape
///   does not hold live, nor one whose size differs from the tape's.
/// - **Writes go to both at once.** `put`/`put_if_absent` write the
///   directory (a scoped thread) while the tape store queues the object,
///   and return when both have it. An error of either is returned, and the
///   directory's copy is then removed, so the directory never holds bytes
///   the tape does not (a failed removal stops the marker from advancing:
///   the next open discards the copies of everything put since).
/// - **Reads are served by the directory**: `get`, `get_range` of an object
///   whose file is there with the tape's size. Otherwise (the mirror was
///   added after the object was written, or was wiped, or a file is
///   unreadable) the tape serves it, logged once at warn and counted; an
///   object read whole from the tape is written into the directory, so
///   the config and metadata versions come back by themselves.
/// - **Deletes** go to both: the directory frees the space, the tape marks
///   the object dead.
/// - **`sync`** syncs the tape; the directory's puts are durable when they
///   return (staged, fsync'd, renamed, directory fsync'd), so what sync adds
///   is the marker: `consistent_below` becomes the tape's next id as it was
///   before the tape's sync, which no later crash of the tape can take back.
/// - **Opening** refuses a directory that mirrors another tape or that is
///   neither empty nor a mirror, and removes the files of every object the
///   tape holds with an id at or above `consistent_below`: those were put
///   after the directory last synced, possibly without it (a mount that did
///   not mirror, a crash between the two writes), so their files may be
///   older copies. Everything else in the directory is the tape's bytes.
/// - **No plaintext**: objects are stored as the tape gets them. Packs are
///   sealed before they reach any backend (blobs and index: AES-256-GCM on
///   an encrypted volume), metadata versions are sealed, and the config
///   holds the master key only wrapped by the passphrase; the journal,
///   which holds unsealed writes only on an unencrypted volume, is never a
///   backend object.
pub struct Mirrored {
    tape: Arc<TapeStore>,
    dir: LocalBackend,
    root: PathBuf,
    /// Held shared by every write, exclusively where the marker's value is
    /// read (no write is then half done) and where a read from the tape is
    /// written into the directory (no write can overtake it).
    gate: RwLock<()>,
    /// Serialises conditional creates: the tape's check and its put are
    /// one step only if no other create runs between them, and a create
    /// that loses must not have replaced the winner's copy meanwhile.
    creates: Mutex<()>,
    /// Writes started (puts and deletes), to see whether one ran while an
    /// object was read from the tape.
    writes: AtomicU64,
    /// A copy the directory should not hold could not be removed: the
    /// marker must not advance past it.
    tainted: AtomicBool,
    /// The marker's value on disk (and the lock of its writes).
    marker_at: Mutex<u64>,
    warned: AtomicBool,
    stats: Mutex<MirrorStats>,
}

fn backend_err(e: impl std::fmt::Display) -> cairn_backend::Error {
    cairn_backend::Error::new(cairn_backend::ErrorKind::Permanent, e.to_string())
}

impl Mirrored {
    /// Opens the mirror in `root` (which must exist) beside `tape`: a new
    /// one if the directory is empty, else one this tape's mirror left.
    pub fn open(tape: Arc<TapeStore>, root: &Path) -> Result<Mirrored> {
        if !root.is_dir() {
            return Err(Error::config(format!(
                "the CDP mirror {r} does not exist (wiped, or its disk is not mounted). Mount with `--mirror {r}` to start it again (empty: reads go to the tape until it fills) or with `--no-mirror` to stop mirroring",
                r = root.display()
            )));
        }
        let id = tape.label().volume_id.to_string();
        let marker = read_marker(root)?;
        match &marker {
            Some(m) if m.tape != id => {
                return Err(Error::config(format!(
                    "{} is the CDP mirror of tape volume {}, not of this tape ({id}); give another --mirror directory",
                    root.display(),
                    m.tape
                )));
            }
            Some(_) => {}
            None => {
                let mut rd = std::fs::read_dir(root).map_err(|e| Error::os(format_args!("reading {}", root.display()), &e))?;
                // (tmp/ and a marker being written: a first open that crashed)
                if rd.any(|e| e.is_ok_and(|e| e.file_name() != "tmp" && e.file_name() != "mirror.json.tmp")) {
                    return Err(Error::new(
                        ErrorKind::Exists,
                        format!("{} is neither empty nor a CDP mirror (no {MARKER}); give a new or empty directory to --mirror", root.display()),
                    ));
                }
            }
        }
        let dir = LocalBackend::create(root)?;
        let m = Mirrored {
            tape,
            dir,
            root: root.to_path_buf(),
            gate: RwLock::new(()),
            creates: Mutex::new(()),
            writes: AtomicU64::new(0),
            tainted: AtomicBool::new(false),
            marker_at: Mutex::new(0),
            warned: AtomicBool::new(false),
            stats: Mutex::new(MirrorStats::default()),
        };
        let next = m.tape.next_id();
        if let Some(old) = &marker {
            // Put since the directory last synced: maybe without it.
            let stale = m.tape.names_since(old.consistent_below);
            let mut dirs = std::collections::BTreeSet::new();
            let mut dropped = 0;
            for name in &stale {
                let p = root.join(name);
                match std::fs::remove_file(&p) {
                    Ok(()) => {
                        dropped += 1;
                        dirs.insert(p.parent().unwrap_or(root).to_path_buf());
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::os(format_args!("removing {} from the mirror", p.display()), &e)),
                }
            }
            for d in &dirs {
                crate::fsutil::fsync_dir(d)?;
            }
            if dropped > 0 {
                tracing::info!(
                    "{}: dropped {dropped} copies of objects put on the tape since the mirror last synced (they are read from the tape)",
                    root.display()
                );
            }
        }
        m.write_marker(next)?;
        tracing::info!("{}: mirroring to {}", m.tape.describe(), root.display());
        Ok(m)
    }

    /// The tape behind the mirror.
    pub fn tape(&self) -> &Arc<TapeStore> {
        &self.tape
    }

    /// The mirror's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Counters since the mirror was opened.
    pub fn stats(&self) -> MirrorStats {
        *self.stats.lock()
    }

    fn write_marker(&self, below: u64) -> Result<()> {
        let mut at = self.marker_at.lock();
        if below < *at {
            return Ok(());
        }
        let m = Marker {
            format: MARKER_FORMAT.into(),
            version: MARKER_VERSION,
            tape: self.tape.label().volume_id.to_string(),
            consistent_below: below,
        };
        let p = self.root.join(MARKER);
        let tmp = self.root.join("mirror.json.tmp");
        let w = || -> std::io::Result<()> {
            let mut f = crate::fsutil::create_private_file(&tmp)?;
            std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(&m).expect("the marker serialises"))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &p)
        };
        w().map_err(|e| Error::os(format_args!("writing {}", p.display()), &e))?;
        crate::fsutil::fsync_dir(&self.root)?;
        *at = below;
        Ok(())
    }

    /// Removes the directory's copy of `name` durably (after a failed
    /// write, so it never holds what the tape does not).
    fn drop_copy(&self, name: &str) {
        let p = self.root.join(name);
        let r = match std::fs::remove_file(&p) {
            Ok(()) => crate::fsutil::fsync_dir(p.parent().unwrap_or(&self.root)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::os(format_args!("removing {}", p.display()), &e)),
        };
        if let Err(e) = r {
            tracing::error!("{}: {e}; the mirror's copies of what is put from now on will be dropped at the next mount", self.root.display());
            self.tainted.store(true, Ordering::SeqCst);
        }
    }

    fn put_both(&self, name: &str, data: &[u8], only_if_absent: bool) -> cairn_backend::Result<()> {
        // Before anything touches a path made from it.
        cairn_backend::validate_name(name)?;
        let _create = only_if_absent.then(|| self.creates.lock());
        let _g = self.gate.read();
        self.writes.fetch_add(1, Ordering::SeqCst);
        if only_if_absent && self.tape.size(name).is_ok() {
            return Err(cairn_backend::Error::new(cairn_backend::ErrorKind::AlreadyExists, format!("object {name} already exists")).with_object(name));
        }
        // The directory's copy is replaced even for put_if_absent: the
        // tape decides whether the object is new, and a file of that name
        // can only be a leftover.
        let (t, m) = std::thread::scope(|s| {
            let m = s.spawn(|| self.dir.put(name, data));
            let t = if only_if_absent { self.tape.put_if_absent(name, data) } else { self.tape.put(name, data) };
            (t, m.join().unwrap_or_else(|_| Err(backend_err(format!("writing {name} to the mirror panicked")))))
        });
        if t.is_err() || m.is_err() {
            self.drop_copy(name);
        }
        t?;
        m.map_err(|e| cairn_backend::Error::new(e.kind(), format!("the CDP mirror {}: {e}", self.root.display())).with_object(name))?;
        self.stats.lock().puts += 1;
        Ok(())
    }

    /// Serves a read from the directory when it holds `name` at the tape's
    /// `size`, else from the tape.
    fn read<T>(&self, name: &str, size: u64, mirror: impl FnOnce(&LocalBackend) -> cairn_backend::Result<T>, tape: impl FnOnce() -> cairn_backend::Result<T>) -> cairn_backend::Result<T> {
        let why = match self.dir.size(name) {
            Ok(s) if s == size => match mirror(&self.dir) {
                Ok(v) => {
                    self.stats.lock().reads_from_mirror += 1;
                    return Ok(v);
                }
                Err(e) => format!("unreadable in the mirror ({e})"),
            },
            Ok(s) => format!("{s} bytes in the mirror, {size} on the tape"),
            Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound => "not in the mirror".to_string(),
            Err(e) => format!("unreadable in the mirror ({e})"),
        };
        self.stats.lock().fallbacks += 1;
        if !self.warned.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "{}: {name} is {why}; reading it from the tape (further objects the mirror lacks are read from the tape without a message)",
                self.root.display()
            );
        } else {
            tracing::debug!("{}: {name} is {why}; reading it from the tape", self.root.display());
        }
        tape()
    }
}

fn read_marker(root: &Path) -> Result<Option<Marker>> {
    let p = root.join(MARKER);
    let b = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::os(format_args!("reading {}", p.display()), &e)),
    };
    let m: Marker = serde_json::from_slice(&b).map_err(|e| Error::config(format!("{} is damaged: {e}", p.display())))?;
    if m.format != MARKER_FORMAT {
        return Err(Error::config(format!("{} is not a Cairn mirror marker ({:?})", p.display(), m.format)));
    }
    if m.version != MARKER_VERSION {
        return Err(Error::config(format!(
            "{}: mirror format version {} is not supported (this build reads {MARKER_VERSION})",
            p.display(),
            m.version
        )));
    }
    Ok(Some(m))
}

impl Backend for Mirrored {
    fn put(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
        self.put_both(name, data, false)
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
        self.put_both(name, data, true)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> cairn_backend::Result<Vec<u8>> {
        let size = self.tape.size(name)?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            // The tape says so from its index, without the drive.
            return self.tape.get_range(name, offset, len);
        }
        self.read(name, size, |d| d.get_range(name, offset, len), || self.tape.get_range(name, offset, len))
    }

    fn get(&self, name: &str) -> cairn_backend::Result<Vec<u8>> {
        let size = self.tape.size(name)?;
        let writes = self.writes.load(Ordering::SeqCst);
        let mut from_tape = false;
        let data = self.read(
            name,
            size,
            |d| d.get(name),
            || {
                from_tape = true;
                self.tape.get(name)
            },
        )?;
        if from_tape {
            // Whole, so the directory can have it, unless a write ran
            // meanwhile (the bytes read may be older than the tape's now).
            if let Some(_g) = self.gate.try_write() {
                if self.writes.load(Ordering::SeqCst) == writes && self.dir.put(name, &data).is_ok() {
                    self.stats.lock().filled += 1;
                }
            }
        }
        Ok(data)
    }

    /// The tape's index answers (memory; the truth).
    fn size(&self, name: &str) -> cairn_backend::Result<u64> {
        self.tape.size(name)
    }

    fn delete(&self, name: &str) -> cairn_backend::Result<()> {
        let _g = self.gate.read();
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.tape.delete(name)?;
        self.dir
            .delete(name)
            .map_err(|e| cairn_backend::Error::new(e.kind(), format!("the CDP mirror {}: {e}", self.root.display())).with_object(name))
    }

    /// The tape's listing: the tape is the truth.
    fn list(&self, prefix: &str) -> cairn_backend::Result<Vec<ObjectInfo>> {
        self.tape.list(prefix)
    }

    /// The tape's. `cheap_ranged_reads` stays false although reads are
    /// served by the directory: the engine asks it only to choose how files
    /// are flushed (flush.rs: whole files as long runs when reads are not
    /// cheap), which shapes what goes on the tape, and the tape gets every
    /// pack whether or not a mirror is there. The runs are what lets the
    /// drive stream while writing and the tape alone restore at its
    /// streaming rate when the mirror is lost; the read path asks nothing
    /// and reads from the directory cost their bytes anyway.
    fn capabilities(&self) -> Capabilities {
        self.tape.capabilities()
    }

    fn sync(&self) -> cairn_backend::Result<()> {
        // No write is half done while the tape's counter is read: every
        // object put below it is in the directory (or was removed from it).
        let below = {
            let _g = self.gate.write();
            self.tape.next_id()
        };
        self.tape.sync()?;
        if !self.tainted.load(Ordering::SeqCst) {
            self.write_marker(below).map_err(|e| backend_err(format!("the CDP mirror: {e}")))?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("{} mirrored to {}", self.tape.describe(), self.root.display())
    }

    /// The tape's: the mirror's writes go with each put, the tape is the
    /// truth for positions and its space is what deletes did not free.
    fn sequential(&self) -> Option<&dyn cairn_backend::Sequential> {
        self.tape.sequential()
    }
}

/// Applies a mount's mirror choice to the volume's local settings in
/// `dir` (remembered there for the next mounts from it): only for a tape
/// volume. A directory to mirror into is created if missing and kept as an
/// absolute path.
pub fn choose(dir: &Path, choice: &MirrorChoice) -> Result<()> {
    if *choice == MirrorChoice::Remembered {
        return Ok(());
    }
    let layout = Layout::new(dir);
    let raw = std::fs::read(layout.settings()).map_err(|e| Error::os(format_args!("reading {}", layout.settings().display()), &e))?;
    let mut s: LocalSettings = serde_json::from_slice(&raw).map_err(|e| Error::config(format!("{} is damaged: {e}", layout.settings().display())))?;
    if !crate::config::is_tape_url(&s.backend) {
        return Err(Error::invalid(format!(
            "a CDP mirror is for volumes on a tape (tape:/dev/nstN, tape-emu:DIR); {} is not one",
            s.backend
        )));
    }
    let want = match choice {
        MirrorChoice::Remembered => unreachable!(),
        MirrorChoice::Off => None,
        MirrorChoice::Use(p) => {
            crate::fsutil::create_private_dir_all(p).map_err(|e| Error::os(format_args!("creating the mirror {}", p.display()), &e))?;
            let abs = std::fs::canonicalize(p).map_err(|e| Error::os(format_args!("the mirror {}", p.display()), &e))?;
            if abs.starts_with(&std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())) {
                return Err(Error::invalid(format!(
                    "the mirror {} is inside the volume's local directory {}; give a directory elsewhere (another disk, ideally)",
                    abs.display(),
                    dir.display()
                )));
            }
            Some(abs)
        }
    };
    if s.mirror != want {
        // Not under a mount that has the volume open.
        let _lock = crate::config::take_lock(&layout, true)?;
        match (&s.mirror, &want) {
            (Some(old), None) => tracing::info!("{}: no longer mirrored to {} (the directory is left as it is)", dir.display(), old.display()),
            (_, Some(new)) => tracing::info!("{}: mirrored to {} from now on", dir.display(), new.display()),
            _ => {}
        }
        s.mirror = want;
        crate::config::write_settings(&layout, &s)?;
    }
    Ok(())
}
