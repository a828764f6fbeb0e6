//! `cairn tape ...`: what a tape needs beyond a mount (docs/tape.md).

use anyhow::{bail, Context, Result};
use cairn_engine::tape::{self, TapeOptions};
use cairn_tape::store;
use cairn_tape::EmuParams;
use std::path::PathBuf;
use std::time::Instant;

/// Tapes: rebuild a lost catalog, show what a tape holds, stream raw
/// blocks (docs/tape.md). A volume on a tape is created and mounted as
/// any other: `cairn init tape-emu:DIR`, `cairn mount tape:/dev/nst0 MNT`.
#[derive(clap::Args)]
pub struct TapeArgs {
    #[command(subcommand)]
    pub op: TapeCmd,
}

#[derive(clap::Subcommand)]
pub enum TapeCmd {
    /// Rebuild a tape's catalog from its blocks, after a crash or power cut
    /// left the tape without one (or with a damaged one). Every object
    /// whose blocks all arrived comes back under its name; the others are
    /// listed. The volume then mounts as usual.
    Recover {
        /// tape:/dev/nstN or tape-emu:DIR
        tape: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show what a tape holds: the volume on it (its id as `cairn init`
    /// printed it) and the tape's own id, block size, objects, live and dead
    /// bytes, and for an emulated tape its capacity and the room left. A
    /// mounted tape is described by its mount (the drive is the mount's).
    Info {
        /// tape:/dev/nstN or tape-emu:DIR
        tape: String,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read many files of a mounted tape volume into the local cache in one
    /// pass: their data is read in the order it lies on the tape (seed 002
    /// fig. 6), so N files cost one sweep of the tape instead of up to N
    /// locates of seconds each. Directories are taken whole. Later reads
    /// of the files are served from the cache (bounded by the mount's
    /// --cache-dir-size: a recall larger than that keeps only its end).
    /// Works on a volume in a bucket too (warms the cache with few large
    /// ranged GETs). The same as `cairn warmup`.
    Recall {
        /// Files or directories inside one mounted volume.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy the live objects of tape SRC to the blank tape DST in one pass,
    /// in SRC's order, then write DST's catalog: the dead bytes of deleted
    /// and replaced objects stay behind. The volume then mounts from DST
    /// alone, with a new --cache-dir (a local directory belongs to the tape
    /// it was attached to). An emulated DST that does not exist is created
    /// with SRC's drive parameters; a DST holding anything is refused. SRC
    /// is only read.
    Reclaim {
        /// tape:/dev/nstN or tape-emu:DIR to copy from
        src: String,
        /// tape:/dev/nstN or tape-emu:DIR to copy to (blank)
        dst: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stream raw fixed-size blocks to or from a tape, with no file system:
    /// standard input to the tape (--to) or the tape to standard output
    /// (--from), as `dd` does with /dev/nst0. Measures the drive's raw rate
    /// and carries conventional archives (`tar -cf - DIR | cairn tape dd
    /// --to tape-emu:T`). Overwrites the tape from its beginning.
    Dd {
        /// Write standard input to this tape.
        #[arg(long, value_name = "TAPE", conflicts_with = "from", required_unless_present = "from")]
        to: Option<String>,
        /// Read this tape to standard output (up to its first filemark).
        #[arg(long, value_name = "TAPE")]
        from: Option<String>,
        /// Create the emulated tape first (tape-emu: only), with the drive
        /// parameters in this JSON file (default: the scaled LTO-9).
        #[arg(long, value_name = "FILE")]
        create: Option<Option<PathBuf>>,
    },
}

fn emu_params(file: Option<PathBuf>) -> Result<Option<EmuParams>> {
    file.map(|f| {
        let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not emulated drive parameters", f.display()))
    })
    .transpose()
}

/// `cairn tape recall PATH...` (docs/tape.md §3): `cairn warmup`.
fn recall(paths: &[PathBuf], json: bool) -> Result<i32> {
    crate::inspect::warmup(paths, json, "recall")
}

pub fn run(a: TapeArgs, verbose: u8) -> Result<i32> {
    crate::logging::init(verbose, None)?;
    match a.op {
        TapeCmd::Recall { paths, json } => recall(&paths, json),
        TapeCmd::Recover { tape: url, json } => recover(&url, json),
        TapeCmd::Info { tape: url, json } => info(&url, json),
        TapeCmd::Reclaim { src, dst, json } => reclaim(&src, &dst, json),
        TapeCmd::Dd { to, from, create } => dd(to, from, create),
    }
}

/// `cairn tape recover TAPE`: a new catalog from the blocks.
fn recover(url: &str, json: bool) -> Result<i32> {
    let url = tape::absolute(url)?;
    let dev = tape::open_device(&url, &TapeOptions::default(), None)?;
    use cairn_engine::maintenance::Progress;
    let bars = crate::progress::Bars::new(!json);
    eprintln!("{url}: reading every block header (the whole tape)...");
    let (r, _dev) = store::recover(dev, None, &mut |done, total| {
        if done == 1 {
            bars.phase("objects", total);
        }
        bars.inc(1);
    })?;
    bars.finish();
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!("{url}: {} objects recovered, {} incomplete, {} bad blocks; a new catalog follows the data", r.recovered.len(), r.incomplete.len(), r.bad_blocks);
        for n in &r.incomplete {
            println!("  incomplete (its blocks did not all reach the tape): {n}");
        }
    }
    Ok(0)
}

/// `cairn tape reclaim SRC DST`: the live objects copied to a blank tape.
fn reclaim(src: &str, dst: &str, json: bool) -> Result<i32> {
    let (src, dst) = (tape::absolute(src)?, tape::absolute(dst)?);
    // The destination's queue keeps its drive streaming while the
    // next object is read; with one object in hand it bounds memory.
    let o = TapeOptions { store: store::StoreOptions { queue_bytes: 512 << 20, ..Default::default() }, ..Default::default() };
    let (s, d) = tape::open_reclaim(&src, &dst, &o)?;
    use cairn_engine::maintenance::Progress;
    let bars = crate::progress::Bars::new(!json);
    if !json {
        eprintln!("{src} -> {dst}: copying the live objects in tape order...");
    }
    let mut shown = 0;
    let r = store::reclaim(&s, &d, &mut |done, total| {
        if done == 0 {
            bars.phase("bytes", total);
        }
        bars.inc(done - shown);
        shown = done;
    });
    bars.finish();
    drop(s);
    drop(d);
    let r = r.with_context(|| format!("reclaiming {src} to {dst}"))?;
    let rate = r.bytes as f64 / r.seconds.max(1e-9) / 1e6;
    if json {
        println!("{}", serde_json::json!({"src": src, "dst": dst, "report": r, "mb_per_sec": rate}));
    } else {
        println!(
            "{dst}: {} objects, {} copied from {src} in {:.1} s ({rate:.1} MB/s); {} of dead data left behind on {src}",
            r.objects,
            crate::size::human(r.bytes),
            r.seconds,
            crate::size::human(r.dead_bytes_left)
        );
        println!("Mount the volume from {dst} with a new --cache-dir: a local directory belongs to the tape it was attached to and refuses {dst}. {src} is unchanged: keep it until `cairn fsck --read-data` has checked the volume on {dst}.");
    }
    Ok(0)
}

/// `cairn tape dd`: raw blocks between a tape and standard input or output.
fn dd(to: Option<String>, from: Option<String>, create: Option<Option<PathBuf>>) -> Result<i32> {
    let url = tape::absolute(to.as_deref().or(from.as_deref()).expect("clap requires one"))?;
    let o = TapeOptions::default();
    let mut dev = match create {
        Some(params) => {
            if !url.starts_with(tape::EMU_SCHEME) {
                bail!("--create makes emulated tapes (tape-emu:DIR) only");
            }
            tape::open_device(&url, &o, Some(emu_params(params)?))?
        }
        None => tape::open_device(&url, &o, None)?,
    };
    let t0 = Instant::now();
    let total = if to.is_some() {
        cairn_tape::raw::write_stream(&mut dev, std::io::stdin().lock()).with_context(|| format!("writing standard input to {url}"))?
    } else {
        cairn_tape::raw::read_stream(&mut dev, std::io::stdout().lock()).with_context(|| format!("reading {url} to standard output"))?
    };
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("{} bytes in {secs:.2} s: {:.1} MB/s", total, total as f64 / secs / 1e6);
    Ok(0)
}

/// `cairn tape info TAPE`.
fn info(url: &str, json: bool) -> Result<i32> {
    let url = tape::absolute(url)?;
    let h = crate::size::human;
    // A mounted tape's drive belongs to the mount: ask the mount.
    if let Some(m) = crate::resolve::mount_of(&url, None) {
        use cairn_engine::control::{self, Request};
        let sock = control::socket_path(&m.local_dir);
        let v = control::call(&sock, &Request::Stats)?.with_context(|| format!("{url} is mounted at {}, whose daemon does not answer on {}", m.mountpoint.display(), sock.display()))?;
        let st: cairn_engine::maintenance::Stats = serde_json::from_value(v).context("reading stats from the mount")?;
        // The mount's local directory records the volume's id (opening
        // the config would open the tape, which is the mount's).
        let settings = std::fs::read(m.local_dir.join("volume.json")).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let volume_id = settings.as_ref().and_then(|s| s["volume_id"].as_str().map(str::to_string));
        let medium = st.medium.unwrap_or_default();
        if json {
            println!("{}", serde_json::json!({"tape": url, "mounted_at": m.mountpoint, "volume_id": volume_id, "live_bytes": medium.live_bytes, "dead_bytes": medium.dead_bytes, "free_bytes": medium.free_bytes}));
        } else {
            println!("tape        {url} (mounted at {}, pid {})", m.mountpoint.display(), m.pid);
            println!("volume      {}", volume_id.as_deref().unwrap_or("(not recorded in the mount's local directory)"));
            println!("live        {}", h(medium.live_bytes));
            println!("dead        {}   (deleted or replaced; `cairn tape reclaim` copies the live data to a new tape)", h(medium.dead_bytes));
            if let Some(f) = medium.free_bytes {
                println!("room left   {}", h(f));
            }
            println!("(the label, the catalog and the drive's session: unmount, then `cairn tape info {url}`)");
        }
        return Ok(0);
    }
    let t = tape::describe(&url)?;
    if json {
        println!(
            "{}",
            serde_json::json!({"tape": url, "volume_id": t.volume_id, "tape_id": t.tape_id, "block_size": t.block_size, "created": t.created, "objects": t.live_objects, "live_bytes": t.live_bytes, "dead_bytes": t.dead_bytes, "used_bytes": t.used_bytes, "capacity_bytes": t.capacity_bytes, "free_bytes": t.free_bytes, "last_session": t.last_session})
        );
        return Ok(0);
    }
    println!("tape        {url}");
    match &t.volume_id {
        Some(v) => println!("volume      {v}"),
        None => println!("volume      none (no readable config object: not a Cairn volume, or a damaged one)"),
    }
    println!("label       tape id {}, {}-byte blocks, format version {}", t.tape_id, t.block_size, t.format_version);
    println!("objects     {} live", t.live_objects);
    println!("live        {}", h(t.live_bytes));
    println!("dead        {}   (deleted or replaced; `cairn tape reclaim` copies the live data to a new tape)", h(t.dead_bytes));
    match (t.capacity_bytes, t.free_bytes) {
        (Some(c), Some(f)) => println!("capacity    {} (to the early-warning point), {} used, {} left", h(c), h(t.used_bytes), h(f)),
        _ => println!("used        {}   (capacity: the st driver does not report a cartridge's)", h(t.used_bytes)),
    }
    if let Some(x) = &t.last_session {
        let t = &x.stats;
        println!(
            "last session {:.1} s: {} written, {} read, streaming {:.1} s, positioning {:.1} s, idle {:.1} s, {} backhitches, {} locates, {:.0} m of tape",
            x.seconds,
            h(t.bytes_written),
            h(t.bytes_read),
            t.streaming_secs,
            t.positioning_secs,
            t.idle_secs,
            t.backhitches,
            t.locates,
            t.metres
        );
    }
    Ok(0)
}
