//! `cairn info PATH`, `cairn warmup PATH...` and `cairn stats DIR` of a
//! tree inside a mount: what users of JuiceFS (`info`, `warmup`, `summary`),
//! restic and rclone reach for. All go through the mount's control socket
//! (the daemon checks that the calling user may reach and read the paths).

use crate::edit::{ask, locate};
use anyhow::{bail, Context, Result};
use cairn_engine::control::{self, Request};
use cairn_engine::{FileInfo, RecallReport, TreeStats};
use std::path::{Path, PathBuf};

/// `dir` if it names a file or directory inside a Cairn mount that is not
/// the mount's root (a volume directory, a URL or a mountpoint: None).
pub fn tree_path(dir: &str) -> Option<PathBuf> {
    let p = Path::new(dir);
    p.symlink_metadata().ok()?;
    let m = locate(p).ok()?;
    (!m.rel.is_empty()).then(|| p.to_path_buf())
}

/// `cairn info PATH`.
pub fn info(path: &Path, json: bool) -> Result<i32> {
    let m = locate(path)?;
    let v = ask(&m, &Request::Info { path: m.rel.clone() }).with_context(|| format!("{}", path.display()))?;
    let i: FileInfo = serde_json::from_value(v).context("reading the mount's answer")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&i)?);
        return Ok(0);
    }
    let h = crate::size::human;
    match i.kind.as_str() {
        "dir" => {
            println!("{}: directory, {} entries (`cairn stats {}` sums the tree)", path.display(), i.entries.unwrap_or(0), path.display());
            return Ok(0);
        }
        "file" => {}
        k => {
            println!("{}: {k}, no data", path.display());
            return Ok(0);
        }
    }
    let placed: Vec<String> = i.placed.iter().map(|(k, n)| format!("{} {k}", h(*n))).collect();
    println!(
        "{}: {} in {} chunks: {} exclusive, {} shared{}{}; {}",
        path.display(),
        h(i.size),
        i.chunks,
        h(i.exclusive_bytes),
        h(i.shared_bytes),
        if i.hole_bytes > 0 { format!(", {} in holes", h(i.hole_bytes)) } else { String::new() },
        if i.map_links > 1 { format!(" (its map is shared with {} whole-file clones)", i.map_links - 1) } else { String::new() },
        if placed.is_empty() { "no data".to_string() } else { placed.join(", ") }
    );
    if !i.runs.is_empty() {
        println!("{:>12} {:>10} {:>10} {:>10} {:>5}  {:<8} pack@offset", "offset", "length", "chunk", "stored", "refs", "where");
    }
    for r in &i.runs {
        let chunk = r.chunk.map_or("-".to_string(), |c| format!("#{c}"));
        let pack = r.pack.as_ref().map_or("-".to_string(), |p| format!("{p}@{}", r.pack_offset));
        let stored = if r.chunk.is_some() { h(r.stored_len) } else { "-".into() };
        println!("{:>12} {:>10} {:>10} {:>10} {:>5}  {:<8} {pack}", r.offset, h(r.len), chunk, stored, r.refs, r.place.name());
    }
    Ok(0)
}

/// `cairn warmup PATH...` (and `cairn tape recall`, whose name `what` is
/// on the progress bar).
pub fn warmup(paths: &[PathBuf], json: bool, what: &str) -> Result<i32> {
    let first = locate(&paths[0])?;
    let mut rels = vec![first.rel.clone()];
    for p in &paths[1..] {
        let m = locate(p)?;
        if m.socket != first.socket {
            bail!("{} and {} are not in the same Cairn volume ({what} one mount at a time)", paths[0].display(), p.display());
        }
        rels.push(m.rel);
    }
    // Bytes the kernel still caches must reach the daemon first.
    cairn_fuse::push_cached_writes(&first.mountpoint).with_context(|| format!("syncfs {}", first.mountpoint.display()))?;
    let bar = (!json && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(indicatif::ProgressStyle::with_template("{prefix:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}").expect("template").progress_chars("=> "));
        b.set_prefix(what.to_string());
        b
    });
    let reply = control::call_with_progress(&first.socket, &Request::Recall { paths: rels }, &mut |p| {
        if let Some(b) = &bar {
            b.set_length(p.total);
            b.set_position(p.done);
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let v = match reply {
        Ok(Some(v)) => v,
        Ok(None) => bail!("the mount at {} does not answer on {} (is its daemon running?)", first.mountpoint.display(), first.socket.display()),
        Err(e) => return Err(anyhow::Error::from(e).context(format!("{what} in {}", first.mountpoint.display()))),
    };
    let r: RecallReport = serde_json::from_value(v).context("reading the mount's report")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    let h = crate::size::human;
    let rate = if r.seconds > 0.0 { r.fetched_bytes as f64 / r.seconds / 1e6 } else { 0.0 };
    if r.local {
        println!(
            "read {} files' packs once ({} in {} reads, {:.1} s, {rate:.1} MB/s): the OS page cache holds them until memory is needed",
            r.files,
            h(r.fetched_bytes),
            r.reads,
            r.seconds
        );
        return Ok(0);
    }
    println!(
        "{} {} files: {} stored, {} already cached, {} read in {} reads, {:.1} s ({rate:.1} MB/s)",
        if what == "recall" { "recalled" } else { "warmed" },
        r.files,
        h(r.stored_bytes),
        h(r.cached_bytes),
        h(r.fetched_bytes),
        r.reads,
        r.seconds
    );
    if r.overflow {
        println!("warning: more than the cache holds ({}): the first data read may have been evicted again; raise --cache-dir-size or {what} less at once", h(r.cache_capacity));
    }
    if !r.restores_requested.is_empty() || !r.restores_ongoing.is_empty() {
        // Packs in an archive class: restores sent (one per pack), not waited for.
        println!(
            "{} of it is archived in {} packs: {} restores requested now, {} under way already; {what} again once they are ready",
            h(r.archived_bytes),
            r.restores_requested.len() + r.restores_ongoing.len(),
            r.restores_requested.len(),
            r.restores_ongoing.len()
        );
        for (pack, what) in &r.restores_requested {
            println!("  pack {pack}: {what}");
        }
        for pack in &r.restores_ongoing {
            println!("  pack {pack}: restore under way");
        }
    }
    Ok(0)
}

/// `cairn stats PATH` of a tree inside a mount.
pub fn tree_stats(path: &Path, json: bool) -> Result<i32> {
    let m = locate(path)?;
    let v = ask(&m, &Request::TreeStats { path: m.rel.clone() }).with_context(|| format!("{}", path.display()))?;
    let s: TreeStats = serde_json::from_value(v).context("reading the mount's answer")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(0);
    }
    let h = crate::size::human;
    println!("{}", path.display());
    println!("files              {:>14}   directories {}   symlinks {}", s.files, s.directories, s.symlinks);
    println!("logical size       {:>14}   ({} in holes)", h(s.logical_bytes), h(s.hole_bytes));
    println!("unique data        {:>14}   in {} chunks, stored in {}", h(s.unique_bytes), s.chunks, h(s.stored_bytes));
    println!("dedup ratio        {:>14.2}x  (inside the tree)", s.dedup_ratio);
    println!("exclusive          {:>14}   in {} chunks, stored in {} (deleting the tree frees this)", h(s.exclusive_bytes), s.exclusive_chunks, h(s.exclusive_stored_bytes));
    println!("shared             {:>14}   in {} chunks with files outside the tree", h(s.shared_bytes), s.shared_chunks);
    Ok(0)
}
