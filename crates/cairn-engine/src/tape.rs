//! Volumes on tape (docs/tape.md): the home is a tape, reached as
//! `tape:/dev/nstN` (a drive through the Linux st driver) or `tape-emu:DIR`
//! (the emulated drive of `cairn-tape`), and everything else is a volume in
//! a bucket's machinery (`cloud`) obeying the store's capabilities.
//!
//! With `--mirror DIR` the home is the tape and a directory beside it
//! written at the same time (`crate::mirror`, the CDP mirror).
//!
//! A tape can be opened by one process once; the engine opens its home in
//! several places (the config probe, the volume), so the open store is
//! shared within the process for as long as anyone holds it.

use crate::error::{Error, ErrorKind, Result};
use crate::mirror::Mirrored;
use cairn_backend::Backend;
use cairn_tape::store::{StoreOptions, TapeStore};
use cairn_tape::{Clock, EmuDrive, EmuParams, TapeDevice};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// `virtual` runs emulated drives on a virtual clock (tests): positioning
/// and streaming take no real time.
pub const CLOCK_ENV: &str = "CAIRN_TAPE_CLOCK";

pub use crate::config::{is_tape_url, DRIVE_SCHEME, EMU_SCHEME};

/// How this process opens tapes (set by the command before the first open).
#[derive(Clone, Debug, Default)]
pub struct TapeOptions {
    /// Memory, read-ahead and batching of the store.
    pub store: StoreOptions,
    /// Run emulated drives on a virtual clock (also with
    /// `CAIRN_TAPE_CLOCK=virtual`).
    pub virtual_clock: bool,
}

fn options() -> &'static Mutex<TapeOptions> {
    static O: std::sync::OnceLock<Mutex<TapeOptions>> = std::sync::OnceLock::new();
    O.get_or_init(Default::default)
}

/// Sets how tapes are opened from now on in this process.
pub fn configure(o: TapeOptions) {
    *options().lock().expect("tape options lock") = o;
}

fn open_stores() -> &'static Mutex<HashMap<String, Weak<TapeStore>>> {
    static S: std::sync::OnceLock<Mutex<HashMap<String, Weak<TapeStore>>>> = std::sync::OnceLock::new();
    S.get_or_init(Default::default)
}

/// The device a tape URL names, opened.
/// With `create`, an emulated tape that does not exist is made with
/// `params` (default: the scaled LTO-9 of `cairn-tape`).
pub fn open_device(url: &str, o: &TapeOptions, create: Option<Option<EmuParams>>) -> Result<Box<dyn TapeDevice>> {
    let params = create.clone().flatten();
    let create = create.is_some();
    if let Some(dir) = url.strip_prefix(EMU_SCHEME) {
        let dir = Path::new(dir);
        let clock = if o.virtual_clock || std::env::var(CLOCK_ENV).is_ok_and(|v| v == "virtual") { Clock::virtual_clock() } else { Clock::real() };
        let exists = dir.join("params.json").exists();
        let dev = if !exists && create {
            EmuDrive::create(dir, params.unwrap_or_default(), clock)
        } else if !exists {
            return Err(Error::config(format!("{url}: no emulated tape in {} (`cairn init {url}` creates one)", dir.display())));
        } else {
            EmuDrive::open(dir, clock)
        };
        return dev.map(|d| Box::new(d) as Box<dyn TapeDevice>).map_err(|e| Error::new(ErrorKind::Io, e.to_string()));
    }
    if let Some(path) = url.strip_prefix(DRIVE_SCHEME) {
        #[cfg(target_os = "linux")]
        {
            let path = PathBuf::from(path);
            // The label's record size is the tape's block size; a blank tape
            // being formatted takes the default.
            let bs = match cairn_tape::st::StDrive::detect_block_size(&path) {
                Ok(n) => n,
                Err(cairn_tape::DeviceError::EndOfData { .. }) if create => params.map_or(EmuParams::default().block_size, |p| p.block_size) as usize,
                Err(e) => return Err(Error::new(ErrorKind::Io, e.to_string())),
            };
            return cairn_tape::st::StDrive::open(&path, bs).map(|d| Box::new(d) as Box<dyn TapeDevice>).map_err(|e| Error::new(ErrorKind::Io, e.to_string()));
        }
        #[cfg(not(target_os = "linux"))]
        return Err(Error::new(ErrorKind::NotSupported, format!("{url}: tape drives are reached through the Linux st driver")));
    }
    Err(Error::invalid(format!("{url} is not a tape (tape:/dev/nstN or tape-emu:DIR)")))
}

/// The tape at `url` as a backend: the store already open in this process,
/// or a new one.
pub fn open(url: &str) -> Result<Arc<TapeStore>> {
    open_with(url, None)
}

/// Opens the tape at `url` for `cairn init`, formatting it if it is blank
/// (an emulated tape that does not exist is created with `params`). Hold
/// the store while the volume is created: the engine's own opens share it.
pub fn create(url: &str, params: Option<EmuParams>) -> Result<Arc<TapeStore>> {
    open_with(url, Some(params))
}

fn open_with(url: &str, create: Option<Option<EmuParams>>) -> Result<Arc<TapeStore>> {
    let mut open = open_stores().lock().expect("open tapes lock");
    if let Some(s) = open.get(url).and_then(Weak::upgrade) {
        return Ok(s);
    }
    let o = options().lock().expect("tape options lock").clone();
    let format = create.is_some();
    let dev = open_device(url, &o, create)?;
    let store = StoreOptions { inline: o.store.inline.clone().or_else(|| Some(metadata_chain())), ..o.store };
    let s = Arc::new(TapeStore::open(dev, store, None, format).map_err(|e| Error::from(e).context(url))?);
    open.insert(url.to_string(), Arc::downgrade(&s));
    Ok(s)
}

/// What a tape's catalog carries inline (docs/tape.md §8): what a mount
/// reads first, the volume's `config` and its metadata chain (the newest
/// base and every delta after it), so a machine with only the tape opens
/// the volume in two locates.
pub fn metadata_chain() -> cairn_tape::store::InlinePolicy {
    use crate::versions;
    cairn_tape::store::InlinePolicy {
        prefixes: vec![crate::config::CONFIG_OBJECT.to_string(), versions::PREFIX.to_string()],
        max_bytes: cairn_tape::store::INLINE_MAX,
        choose: Arc::new(|names: &[&str]| {
            let mut all: Vec<versions::VersionInfo> = names.iter().filter_map(|n| versions::parse_name(n, 0)).collect();
            all.sort_by_key(|v| (v.version, v.kind == versions::Kind::Delta));
            // A chain with a hole is not what a mount can use: only the config.
            let chain = versions::chain(&all, None).map(|c| c.iter().map(versions::VersionInfo::object).collect::<Vec<_>>()).unwrap_or_default();
            names.iter().filter(|n| **n == crate::config::CONFIG_OBJECT).map(|n| n.to_string()).chain(chain).collect()
        }),
    }
}

/// Parks every tape store open in this process ([`TapeStore::park`]): no
/// thread of theirs remains, so the process may fork and the child go on
/// with the tapes as they are ([`resume_after_fork`]) instead of opening
/// them again, which on a full tape costs the label, a space to the end
/// of data and the catalog's locate a second time (docs/tape.md §8). The
/// parent must then forget its references to the stores.
pub fn park_for_fork() {
    for s in open_stores().lock().expect("open tapes lock").values().filter_map(Weak::upgrade) {
        s.park();
    }
}

/// Starts the drive threads of the stores [`park_for_fork`] parked (in the
/// child).
pub fn resume_after_fork() {
    for s in open_stores().lock().expect("open tapes lock").values().filter_map(Weak::upgrade) {
        s.unpark();
    }
}

/// [`open`] as the engine's backend.
pub fn open_backend(url: &str) -> Result<Arc<dyn Backend>> {
    Ok(open(url)? as Arc<dyn Backend>)
}

fn open_mirrors() -> &'static Mutex<HashMap<String, Weak<Mirrored>>> {
    static M: std::sync::OnceLock<Mutex<HashMap<String, Weak<Mirrored>>>> = std::sync::OnceLock::new();
    M.get_or_init(Default::default)
}

/// The tape at `url` with its CDP mirror in `dir` (docs/tape.md §4),
/// shared within the process as the store is: the engine's several opens
/// of a volume's home get the one mirror.
pub fn open_mirrored(url: &str, dir: &Path) -> Result<Arc<Mirrored>> {
    let mut open_m = open_mirrors().lock().expect("open mirrors lock");
    if let Some(m) = open_m.get(url).and_then(Weak::upgrade) {
        if m.root() != dir {
            return Err(Error::new(ErrorKind::Busy, format!("{url} is open in this process mirrored to {}, not {}", m.root().display(), dir.display())));
        }
        return Ok(m);
    }
    let m = Arc::new(Mirrored::open(open(url)?, dir).map_err(|e| e.context(url))?);
    open_m.insert(url.to_string(), Arc::downgrade(&m));
    Ok(m)
}

/// The backend of a tape volume: the tape, or the tape and its mirror
/// when the volume's settings name one.
pub fn open_backend_mirrored(url: &str, mirror: Option<&Path>) -> Result<Arc<dyn Backend>> {
    match mirror {
        Some(dir) => Ok(open_mirrored(url, dir)? as Arc<dyn Backend>),
        None => open_backend(url),
    }
}

/// The absolute form of a tape URL (an emulated tape's directory made
/// absolute, so the volume's settings name it from anywhere).
pub fn absolute(url: &str) -> Result<String> {
    match url.strip_prefix(EMU_SCHEME) {
        Some(dir) if !dir.starts_with('/') => {
            let cwd = std::env::current_dir().map_err(|e| Error::io(format!("the current directory: {e}")))?;
            Ok(format!("{EMU_SCHEME}{}", cwd.join(dir).display()))
        }
        _ => Ok(url.to_string()),
    }
}

/// Opens the two tapes of `cairn tape reclaim` (docs/tape.md §5): the
/// source as it is (its catalog needed), the destination blank. An
/// emulated destination that does not exist is created with the source's
/// drive parameters; one that holds anything is refused. The source reads
/// with no read-ahead and no read buffer (each object is read whole, once)
/// and the destination queues at most `queue_bytes`, which bounds memory.
pub fn open_reclaim(src: &str, dst: &str, o: &TapeOptions) -> Result<(TapeStore, TapeStore)> {
    let (src, dst) = (absolute(src)?, absolute(dst)?);
    let same = match (src.strip_prefix(EMU_SCHEME), dst.strip_prefix(EMU_SCHEME)) {
        (Some(a), Some(b)) => Path::new(a).canonicalize().ok().is_some_and(|a| Path::new(b).canonicalize().ok() == Some(a)) || a == b,
        _ => src == dst,
    };
    if same {
        return Err(Error::invalid(format!("{src}: the source and the destination are the same tape")));
    }
    let s = TapeStore::open(open_device(&src, o, None).map_err(|e| e.context(format!("source {src}")))?, StoreOptions { read_ahead: 0, read_buffer: 0, ..o.store.clone() }, None, false)
        .map_err(|e| Error::from(e).context(format!("source {src}")))?;
    // The destination's drive as the source's, for an emulated tape made here.
    let params = match src.strip_prefix(EMU_SCHEME) {
        Some(dir) => {
            let f = Path::new(dir).join("params.json");
            let text = std::fs::read_to_string(&f).map_err(|e| Error::io(format!("{}: {e}", f.display())))?;
            serde_json::from_str::<EmuParams>(&text).map_err(|e| Error::config(format!("{}: {e}", f.display())))?
        }
        None => EmuParams { block_size: s.label().block_size, ..Default::default() },
    };
    let d = cairn_tape::store::open_blank(open_device(&dst, o, Some(Some(params))).map_err(|e| e.context(format!("destination {dst}")))?, o.store.clone())
        .map_err(|e| Error::from(e).context(format!("destination {dst}")))?;
    Ok((s, d))
}

/// Sets how a mount of a tape volume opens its tape: `memory` for data on
/// its way to the drive (at least [`cairn_tape::store::MIN_MEMORY`]), and
/// an idle drive waiting at the append point, or at the first data when
/// `read_only` (where a restore starts).
pub fn configure_for_mount(memory: u64, read_only: bool) -> Result<()> {
    if memory < cairn_tape::store::MIN_MEMORY {
        return Err(Error::invalid(format!("--tape-memory of {memory} bytes is too small: a tape needs at least 16M (two packs being built and two queued)")));
    }
    configure(TapeOptions { store: StoreOptions { prepare_append: !read_only, prepare_read: read_only, ..StoreOptions::for_memory(memory) }, ..Default::default() });
    Ok(())
}

/// What `cairn tape info` shows of an unmounted tape.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TapeInfo {
    /// The volume on it, from its config object (None: no readable one,
    /// not a Cairn volume or a damaged one).
    pub volume_id: Option<String>,
    /// The tape's own id, from its label.
    pub tape_id: String,
    pub block_size: u32,
    /// When it was formatted, seconds since the epoch.
    pub created: u64,
    /// The on-tape layout's format version.
    pub format_version: u32,
    pub live_objects: usize,
    pub live_bytes: u64,
    pub dead_bytes: u64,
    /// Bytes up to the end of the data.
    pub used_bytes: u64,
    /// An emulated tape's capacity to its early-warning point (the st
    /// driver reports no cartridge's), and the room left.
    pub capacity_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// What an emulated drive's last session did.
    pub last_session: Option<cairn_tape::Session>,
}

/// Opens the tape `url` (absolute, see [`absolute`]) and describes it.
pub fn describe(url: &str) -> Result<TapeInfo> {
    let s = TapeStore::open(open_device(url, &TapeOptions::default(), None)?, Default::default(), None, false).map_err(Error::from)?;
    let (live, dead) = s.space();
    let l = s.label();
    let live_objects = s.index().objects.values().filter(|o| !o.dead).count();
    // The volume's id, as `cairn init` printed it, is in its config object.
    let volume_id = s.get(crate::config::CONFIG_OBJECT).ok().and_then(|b| crate::config::VolumeConfig::parse(&b).ok()).map(|c| c.volume_id);
    // An emulated drive records what its last session did (the drive of a
    // mount is inside the mount's process), and knows its capacity.
    let emu_dir = url.strip_prefix(EMU_SCHEME).map(Path::new);
    let session = emu_dir.and_then(cairn_tape::Session::read);
    let params = emu_dir.and_then(|d| std::fs::read_to_string(d.join("params.json")).ok()).and_then(|t| serde_json::from_str::<EmuParams>(&t).ok());
    let used = s.data_end_at_open().saturating_mul(l.block_size as u64);
    let capacity = params.as_ref().map(|p| p.capacity_bytes.saturating_sub(p.early_warning_bytes));
    Ok(TapeInfo {
        volume_id,
        tape_id: l.volume_id.to_string(),
        block_size: l.block_size,
        created: l.created,
        format_version: cairn_tape::layout::FORMAT_VERSION,
        live_objects,
        live_bytes: live,
        dead_bytes: dead,
        used_bytes: used,
        capacity_bytes: capacity,
        free_bytes: capacity.map(|c| c.saturating_sub(used)),
        last_session: session,
    })
}
