//! `cairn-bench`: benchmarks of Cairn outside the file system.
//!
//! `cairn-bench ingest` measures, on incompressible pseudo-random data held in
//! memory, the throughput of each stage of the write path alone (FastCDC
//! chunking, keyed BLAKE3 chunk ids, zstd compression, AES-256-GCM sealing)
//! and of the whole pipeline as the engine's flush runs it
//! (`volume/flush.rs`: chunk a 16 MiB window on one thread, then compute the
//! ids and encode the blobs with rayon). It prints a JSON object of medians.
//! The file-system benchmarks live in `bench/run.sh`.

use anyhow::{bail, Result};
use cairn_engine::crypto::{ChunkId, Keys};
use cairn_engine::pack::{blob_aad, encode_blob};
use cairn_engine::ChunkerParams;
use clap::{Parser, Subcommand};
use rayon::prelude::*;
use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::time::Instant;

/// Bytes of content the engine chunks per step (`flush.rs`, `WINDOW`).
const ENGINE_WINDOW: usize = 16 << 20;

/// Benchmarks of Cairn's ingest path (see also bench/run.sh for the
/// file-system benchmarks).
#[derive(Parser)]
#[command(name = "cairn-bench", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Throughput (MB/s, 10^6 bytes/s) of chunking, hashing, compression,
    /// encryption alone and of the engine's full ingest pipeline, on
    /// incompressible data in memory. Prints a JSON object of medians on
    /// stdout; progress goes to stderr.
    Ingest(IngestArgs),
    /// Prices reading one file back from a tape layout with the emulated
    /// drive's timing model (docs/tape.md, B3: the default drive, virtual
    /// clock): a tape of `blocks` blocks is written, the drive is put at
    /// the end of data (where a mount leaves it), then the file's runs are
    /// read in file order, each located to (`locate`, as LTFS reads an
    /// extent) or, when it lies less than 256 MiB ahead, read on to
    /// (`read-through`, as Cairn's store does); and reading through from
    /// the file's first block (`streaming`). Reads a JSON layout
    /// `{"block_size": N, "blocks": N, "runs": [[start, count], ...]}` on
    /// stdin; prints seconds, locates and the rate for both ways.
    TapePrice,
    /// Flush cost of byte-sized edits through the engine API (issue 50):
    /// for each n, n one-byte writes 40 bytes apart into a stored file of
    /// 40·n bytes, then (apart) n one-byte hole punches there, each flushed
    /// in one round. Prints one JSON row per n and kind, with the seconds
    /// to make the edits and to flush them and nanoseconds of flush per
    /// edit: linear cost keeps the last column flat as n grows.
    Bytewise(BytewiseArgs),
}

#[derive(clap::Args)]
struct BytewiseArgs {
    /// Numbers of edits (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    n: Vec<u64>,
}

#[derive(clap::Args)]
struct IngestArgs {
    /// MiB of pseudo-random data to ingest (held in memory).
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Measurements per stage; the medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// zstd level (the volume default is 1).
    #[arg(long, default_value_t = 1)]
    zstd_level: i32,
    /// Seed of the pseudo-random data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run only these stages (comma-separated names as in the JSON, e.g.
    /// `seal_1t,pipeline`), for profiling. The summary fields need all.
    #[arg(long, value_delimiter = ',')]
    stages: Vec<String>,
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Ingest(a) => ingest(&a),
        Cmd::TapePrice => tape_price(),
        Cmd::Bytewise(a) => bytewise(&a),
    }
}

/// `cairn-bench bytewise`: see [`Cmd::Bytewise`].
fn bytewise(a: &BytewiseArgs) -> Result<()> {
    use cairn_engine::{Caller, FileKind, InitOptions, OpenOptions, Volume, ROOT_INO};
    for &n in &a.n {
        for kind in ["write", "punch"] {
            let d = tempfile::tempdir()?;
            cairn_engine::init(d.path(), &InitOptions::default())?;
            let v = Volume::load(d.path(), OpenOptions::default())?;
            let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, Caller { uid: 0, gid: 0 })?;
            let len = (40 * n) as usize;
            v.open(f.ino)?;
            for (i, piece) in random_data(len, n).chunks(1 << 20).enumerate() {
                v.write(f.ino, (i << 20) as u64, piece)?;
            }
            v.flush_file_now(f.ino)?;
            let t = Instant::now();
            for i in 0..n {
                match kind {
                    "write" => {
                        v.write(f.ino, 1 + 40 * i, &[i as u8])?;
                    }
                    _ => v.fallocate(f.ino, 1 + 40 * i, 1, libc_punch())?,
                }
            }
            let made = t.elapsed().as_secs_f64();
            let t = Instant::now();
            v.flush_file_now(f.ino)?;
            let flushed = t.elapsed().as_secs_f64();
            v.release(f.ino)?;
            v.close()?;
            let row = json!({"bench": "bytewise", "kind": kind, "n": n, "make_s": made, "flush_s": flushed, "flush_ns_per_edit": flushed * 1e9 / n as f64});
            println!("{row}");
        }
    }
    Ok(())
}

/// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` (Linux values).
fn libc_punch() -> i32 {
    0x02 | 0x01
}

/// Fills a buffer with incompressible bytes: the BLAKE3 extendable output of
/// the seed, generated in parallel (the stream is seekable).
fn random_data(len: usize, seed: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut h = blake3::Hasher::new();
    h.update(b"cairn-bench data");
    h.update(&seed.to_le_bytes());
    const PIECE: usize = 8 << 20;
    buf.par_chunks_mut(PIECE).enumerate().for_each(|(i, piece)| {
        let mut r = h.finalize_xof();
        r.set_position((i * PIECE) as u64);
        r.fill(piece);
    });
    buf
}

/// The chunks FastCDC 2020 cuts from `buf` with the engine's parameters.
fn chunk_all<'a>(buf: &'a [u8], p: &ChunkerParams) -> Vec<&'a [u8]> {
    fastcdc::v2020::FastCDC::new(buf, p.min as usize, p.avg as usize, p.max as usize).map(|c| &buf[c.offset..c.offset + c.length]).collect()
}

/// The engine's flush on one new file (`Volume::rechunk` with nothing old to
/// fall back on, then `Batch::store` without the metadata look-ups): windows
/// are pipelined as in the engine — while rayon computes one window's ids
/// and blobs, this thread cuts the next window (`rayon::join`). A window's
/// last chunk was cut by the window, not by content, so it is chunked again
/// at the start of the next window. Returns the bytes of blobs produced.
/// Wall time spent in each phase of [`pipeline_engine`]: chunking, ids,
/// blobs (chunking overlaps the other two, so they can sum past the total).
#[derive(Default)]
struct PhaseTimes([f64; 3]);

fn pipeline_engine(keys: &Keys, buf: &[u8], p: &ChunkerParams, level: i32, times: &mut PhaseTimes) -> usize {
    let window = ENGINE_WINDOW.max(4 * p.max as usize);
    let cut = |pos: usize, times: &mut f64| -> Vec<&[u8]> {
        let t = Instant::now();
        let win_end = (pos + window).min(buf.len());
        let mut chunks = chunk_all(&buf[pos..win_end], p);
        if win_end < buf.len() {
            let keep = chunks.len().saturating_sub(1).max(1);
            chunks.truncate(keep);
        }
        *times += t.elapsed().as_secs_f64();
        chunks
    };
    let mut stored = 0;
    let mut pos = 0;
    let mut chunk_time = 0.0;
    let mut cur = if buf.is_empty() { None } else { Some(cut(0, &mut chunk_time)) };
    while let Some(chunks) = cur.take() {
        let next_pos = pos + chunks.iter().map(|c| c.len()).sum::<usize>();
        let mut t_next = 0.0;
        let mut enc_times = PhaseTimes::default();
        let (n, next) = rayon::join(
            || encode_window(keys, &chunks, level, &mut enc_times),
            || if next_pos < buf.len() { Some(cut(next_pos, &mut t_next)) } else { None },
        );
        stored += n;
        chunk_time += t_next;
        times.0[1] += enc_times.0[1];
        times.0[2] += enc_times.0[2];
        pos = next_pos;
        cur = next;
    }
    times.0[0] += chunk_time;
    stored
}

/// `Batch::store` minus the metadata: ids in parallel, then blobs in parallel.
fn encode_window(keys: &Keys, chunks: &[&[u8]], level: i32, times: &mut PhaseTimes) -> usize {
    let t = Instant::now();
    let ids: Vec<ChunkId> = chunks.par_iter().map(|c| keys.chunk_id(c)).collect();
    let t1 = Instant::now();
    let blobs: Vec<(std::borrow::Cow<[u8]>, u8)> = chunks.par_iter().zip(ids.par_iter()).map(|(c, id)| encode_blob(keys, id, c, level)).collect();
    let t2 = Instant::now();
    times.0[1] += (t1 - t).as_secs_f64();
    times.0[2] += (t2 - t1).as_secs_f64();
    blobs.iter().map(|(b, _)| b.len()).sum()
}

/// Not what the engine does: the same windows and work, but the next window
/// is chunked on its own thread while rayon encodes the current one. Shows
/// what overlapping the sequential chunker with the parallel stages buys.
fn pipeline_overlapped(keys: &Keys, buf: &[u8], p: &ChunkerParams, level: i32) -> usize {
    let window = ENGINE_WINDOW.max(4 * p.max as usize);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<&[u8]>>(1);
        s.spawn(move || {
            let mut pos = 0;
            while pos < buf.len() {
                let win_end = (pos + window).min(buf.len());
                let mut chunks = chunk_all(&buf[pos..win_end], p);
                if win_end < buf.len() && chunks.len() > 1 {
                    chunks.pop();
                }
                pos += chunks.iter().map(|c| c.len()).sum::<usize>();
                if tx.send(chunks).is_err() {
                    return;
                }
            }
        });
        let mut times = PhaseTimes::default();
        rx.iter().map(|chunks| encode_window(keys, &chunks, level, &mut times)).sum()
    })
}

/// How the pipeline's wall time divides between its phases, in percent.
fn phase_share(t: &PhaseTimes) -> Value {
    let total: f64 = t.0.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let pct = |x: f64| round1(100.0 * x / total);
    json!({ "chunk_sequential": pct(t.0[0]), "ids_rayon": pct(t.0[1]), "blobs_rayon": pct(t.0[2]) })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn ingest(a: &IngestArgs) -> Result<()> {
    if a.mib == 0 || a.runs == 0 {
        bail!("--mib and --runs must be at least 1");
    }
    let p = ChunkerParams::default();
    let keys = Keys::derive(&[7u8; 32], true);
    let level = a.zstd_level;
    let threads = rayon::current_num_threads();
    eprintln!("cairn-bench ingest: generating {} MiB of pseudo-random data", a.mib);
    let buf = random_data(a.mib << 20, a.seed);
    let bytes = buf.len() as f64;

    let chunks = chunk_all(&buf, &p);
    let ids: Vec<ChunkId> = chunks.par_iter().map(|c| keys.chunk_id(c)).collect();
    eprintln!("{} chunks, mean {:.0} bytes; rayon threads: {threads}", chunks.len(), bytes / chunks.len() as f64);
    let seal_one = |c: &&[u8], id: &ChunkId| keys.seal(&blob_aad(id, 0), c.to_vec()).len();

    let phase_times = std::cell::RefCell::new(PhaseTimes::default());
    // Each stage returns something derived from its output so none of the
    // work can be optimised away.
    type Stage<'s> = (&'static str, Box<dyn Fn() -> usize + 's>);
    let stages: Vec<Stage> = vec![
        ("chunk_1t", Box::new(|| chunk_all(&buf, &p).len())),
        ("hash_1t", Box::new(|| chunks.iter().map(|c| keys.chunk_id(c)[0] as usize).sum())),
        ("hash_par", Box::new(|| chunks.par_iter().map(|c| keys.chunk_id(c)[0] as usize).sum())),
        ("compress_1t", Box::new(|| chunks.iter().map(|c| zstd::bulk::compress(c, level).expect("zstd").len()).sum())),
        ("compress_par", Box::new(|| chunks.par_iter().map(|c| zstd::bulk::compress(c, level).expect("zstd").len()).sum())),
        ("seal_1t", Box::new(|| chunks.iter().zip(&ids).map(|(c, id)| seal_one(c, id)).sum())),
        ("seal_par", Box::new(|| chunks.par_iter().zip(ids.par_iter()).map(|(c, id)| seal_one(c, id)).sum())),
        ("copy_1t", Box::new(|| chunks.iter().map(|c| black_box(c.to_vec()).len()).sum())),
        ("pipeline", Box::new(|| pipeline_engine(&keys, &buf, &p, level, &mut phase_times.borrow_mut()))),
        ("pipeline_overlapped", Box::new(|| pipeline_overlapped(&keys, &buf, &p, level))),
    ];

    let mut medians_only = Map::new();
    let known: Vec<&str> = stages.iter().map(|(n, _)| *n).collect();
    if let Some(bad) = a.stages.iter().find(|s| !known.contains(&s.as_str())) {
        bail!("unknown stage {bad}; stages: {}", known.join(","));
    }
    let mut stages = stages;
    if !a.stages.is_empty() {
        stages.retain(|(n, _)| a.stages.iter().any(|s| s == n));
        for (name, f) in &stages {
            let mut v = Vec::new();
            for _ in 0..a.runs {
                let t = Instant::now();
                black_box(f());
                v.push(bytes / t.elapsed().as_secs_f64() / 1e6);
            }
            eprintln!("{name}: {v:.0?} MB/s");
            medians_only.insert(name.to_string(), json!(round1(median(&v))));
        }
        let share = phase_share(&phase_times.borrow());
        println!("{}", serde_json::to_string_pretty(&json!({ "bench": "ingest", "mib": a.mib, "median_mbps": Value::Object(medians_only), "pipeline_phase_share_pct": share }))?);
        return Ok(());
    }

    // Runs are interleaved (every stage once per round) so that a noisy
    // moment on the shared machine does not hit one stage only.
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); stages.len()];
    for run in 0..a.runs {
        let mut line = format!("run {}/{}:", run + 1, a.runs);
        for (i, (name, f)) in stages.iter().enumerate() {
            let t = Instant::now();
            black_box(f());
            let mbps = bytes / t.elapsed().as_secs_f64() / 1e6;
            samples[i].push(mbps);
            line.push_str(&format!(" {name} {mbps:.0}"));
        }
        eprintln!("{line}");
    }

    let med: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    let get = |n: &str| med[stages.iter().position(|(name, _)| *name == n).expect("stage")];
    // Slowest stage using both cores: chunking runs on one thread in the
    // engine (FastCDC is sequential), the other stages with rayon.
    let both_cores = ["chunk_1t", "hash_par", "compress_par", "seal_par"];
    let (slowest, slowest_mbps) = both_cores.iter().map(|&n| (n, get(n))).min_by(|a, b| a.1.total_cmp(&b.1)).expect("stages");
    // Throughput if the stages ran one after the other with no overlap.
    let serial_bound = 1.0 / both_cores.iter().map(|&n| 1.0 / get(n)).sum::<f64>();
    // The most any schedule can reach: all cores busy with the CPU time the
    // four stages take per byte on one core.
    let one_core = ["chunk_1t", "hash_1t", "compress_1t", "seal_1t"];
    let cpu_bound = threads as f64 / one_core.iter().map(|&n| 1.0 / get(n)).sum::<f64>();

    let mut medians = Map::new();
    let mut all = Map::new();
    for (i, (name, _)) in stages.iter().enumerate() {
        medians.insert(name.to_string(), json!(round1(med[i])));
        all.insert(name.to_string(), json!(samples[i].iter().map(|&x| round1(x)).collect::<Vec<_>>()));
    }
    let out = json!({
        "bench": "ingest",
        "mib": a.mib,
        "bytes": buf.len(),
        "runs": a.runs,
        "rayon_threads": threads,
        "chunker": { "algorithm": "fastcdc-2020", "min": p.min, "avg": p.avg, "max": p.max },
        "window_bytes": ENGINE_WINDOW.max(4 * p.max as usize),
        "zstd_level": level,
        "encrypted": keys.encrypted(),
        "chunks": chunks.len(),
        "mean_chunk_bytes": (bytes / chunks.len() as f64).round(),
        "unit": "MB/s (10^6 bytes per second), medians",
        "median_mbps": Value::Object(medians),
        "samples_mbps": Value::Object(all),
        "slowest_stage": slowest,
        "slowest_stage_mbps": round1(slowest_mbps),
        "serial_bound_mbps": round1(serial_bound),
        "cpu_bound_mbps": round1(cpu_bound),
        "pipeline_pct_of_slowest": round1(100.0 * get("pipeline") / slowest_mbps),
        "pipeline_phase_share_pct": phase_share(&phase_times.borrow()),
        "pipeline_overlapped_pct_of_slowest": round1(100.0 * get("pipeline_overlapped") / slowest_mbps),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

#[derive(serde::Deserialize)]
struct TapeLayout {
    block_size: u32,
    blocks: u64,
    runs: Vec<(u64, u64)>,
}

/// `cairn-bench tape-price` (see [`Cmd::TapePrice`]).
fn tape_price() -> Result<()> {
    use cairn_tape::{Clock, EmuDrive, EmuParams, ReadOutcome, TapeDevice, VirtualClock};
    let l: TapeLayout = serde_json::from_reader(std::io::stdin())?;
    let bs = l.block_size as usize;
    if bs == 0 || l.runs.iter().any(|&(s, n)| n == 0 || s + n > l.blocks) {
        bail!("the layout's runs must be non-empty and lie within its {} blocks", l.blocks);
    }
    let file_bytes: u64 = l.runs.iter().map(|r| r.1).sum::<u64>() * bs as u64;
    let t = tempfile::tempdir()?;
    let params = EmuParams { block_size: l.block_size, ..EmuParams::default() };
    let vc = VirtualClock::new();
    let mut dev = EmuDrive::create(&t.path().join("tape"), params, Clock::Virtual(vc.clone()))?;
    let batch = vec![0u8; 64 * bs];
    let mut left = l.blocks;
    while left > 0 {
        let n = left.min(64);
        dev.write_blocks(&batch[..n as usize * bs])?;
        left -= n;
    }
    dev.flush()?;
    let mut out = Map::new();
    let mut buf = vec![0u8; 64 * bs];
    for policy in ["locate", "read-through", "streaming"] {
        // From the end of data (where a mount leaves the tape); `streaming`
        // starts at the file's first block, reading through: what the
        // layout costs once the file is reached.
        match policy {
            "streaming" => dev.locate(l.runs[0].0)?,
            _ => dev.space_to_eod()?,
        }
        let (t0, l0) = (vc.now(), dev.stats().locates);
        for &(start, count) in &l.runs {
            let at = dev.position()?;
            let through = policy != "locate" && start > at && (start - at) * bs as u64 <= 256 << 20;
            if through {
                let mut gap = start - at;
                while gap > 0 {
                    let n = gap.min(64) as usize;
                    if !matches!(dev.read_blocks(&mut buf[..n * bs])?, ReadOutcome::Blocks(_)) {
                        bail!("the gap before block {start} is not all blocks");
                    }
                    gap -= n as u64;
                }
            } else if at != start {
                dev.locate(start)?;
            }
            let mut left = count;
            while left > 0 {
                let n = left.min(64) as usize;
                match dev.read_blocks(&mut buf[..n * bs])? {
                    ReadOutcome::Blocks(k) => left -= k as u64,
                    _ => bail!("run at block {start} is not all blocks"),
                }
            }
        }
        let secs = vc.now() - t0;
        out.insert(policy.into(), json!({"seconds": secs, "locates": dev.stats().locates - l0, "mb_per_s": file_bytes as f64 / secs / 1e6}));
    }
    out.insert("file_bytes".into(), json!(file_bytes));
    out.insert("runs".into(), json!(l.runs.len()));
    println!("{}", Value::Object(out));
    Ok(())
}
