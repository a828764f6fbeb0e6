//! The cost-optimal cleaner (docs/frugal.md §5; seed 004 §3.5.3, theorem 1).
//!
//! A pack's dead bytes cost storage for as long as they stay; cleaning the
//! pack (download its live chunks, upload them into a new pack, delete the
//! old one) costs requests and transfer once. Theorem 1: the total is least
//! when the pack is cleaned at the moment the storage its dead bytes have
//! cost so far, C_store, reaches the cost of cleaning it, C_clean; the total
//! is then 2·C_clean. [`plan`] prices every pack with dead bytes at a given
//! time (a parameter, so tests run a fake clock); [`clean_due`] cleans the
//! packs that are due, inside a mount, without stopping writers.
//!
//! On every kind of volume but a tape (docs/frugal.md §8), with a local
//! disk's prices in a directory, and two more rules that [`clean`] adds to
//! theorem 1 so a steady rewrite load reaches a steady state: a hard
//! bound on dead bytes ([`DeadBound`]: at most a share of the live bytes,
//! or a floor), and small packs merged once [`SMALL_PACKS`] of them are
//! there, so the pack count follows the live data, not the flush count.

pub use crate::cleaner_rules::{CleanReport, DeadBound, Standing, SMALL_PACKS, SMALL_PACK_SHARE};
use crate::cost::{Prices, GB, MONTH_SECS};
use crate::error::Result;
use crate::maintenance::{live_runs, run_span, Mover};
use crate::meta::ChunkRow;
use crate::pack;
use crate::volume::Volume;
use cairn_backend::meter::{RequestKind, Subsystem};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How long a round waits for a moment with no write batch under way
/// before it gives up (and tries again next round).
const GUARD_PATIENCE: Duration = Duration::from_secs(30);

/// How often the cleaner's thread looks at the bound and the small packs
/// (two aggregate queries on the packs table) between its rounds.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The WAL of a SQLite store is checkpointed (and cut back) after a
/// round once it is this large.
const WAL_CHECKPOINT_AT: u64 = 16 << 20;

/// What one round may clean.
pub struct Policy<'a> {
    /// Theorem 1's prices.
    pub prices: &'a Prices,
    /// Live bytes a round moves at most (at least one pack's).
    pub max_bytes: u64,
    /// The hard bound on dead bytes, if any.
    pub bound: Option<&'a DeadBound>,
    /// Merge small packs once [`SMALL_PACKS`] of them are there.
    pub merge_small: bool,
}

/// The volume's totals against `bound` (two aggregate queries).
pub fn standing(vol: &Volume, bound: Option<&DeadBound>) -> Result<Standing> {
    let small = vol.cfg.pack_target / SMALL_PACK_SHARE;
    let ((pack_bytes, dead_bytes), (packs, small_packs)) = vol.meta.read(|t| Ok((t.pack_bytes()?, t.pack_counts(small)?)))?;
    let dead_bound = bound.map(|b| b.of(pack_bytes.saturating_sub(dead_bytes)));
    Ok(Standing { pack_bytes, dead_bytes, dead_bound, packs, small_packs })
}

/// What a pack with dead bytes costs, and when cleaning it is due.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PackCost {
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub dead_bytes: u64,
    pub live_bytes: u64,
    /// Dead byte-seconds accrued until `mark` (ns since the epoch); the
    /// pack has held `dead_bytes` dead since.
    pub dead_acc: f64,
    pub mark: i64,
    /// Ranged GETs cleaning needs (runs of live chunks not held locally).
    pub gets: u64,
    /// Bytes those GETs download.
    pub download_bytes: u64,
    /// Dollars its dead bytes have cost so far (eq. 9–10).
    pub c_store: f64,
    /// Dollars cleaning it costs (eq. 12).
    pub c_clean: f64,
    /// When C_store reaches C_clean (ns since the epoch); None if never
    /// (storage is free).
    pub due_at: Option<i64>,
    /// Dollars a month its dead bytes cost while they stay.
    pub dead_per_month: f64,
    /// Written but not uploaded yet: not cleaned before it is.
    pub uploading: bool,
}

impl PackCost {
    /// Theorem 1's moment has come.
    pub fn due(&self) -> bool {
        !self.uploading && self.c_store >= self.c_clean
    }
}

/// Dollars per byte-second of storage.
fn storage_per_byte_second(p: &Prices) -> f64 {
    p.storage_per_gb_month / GB / MONTH_SECS
}

/// Dollars to upload `bytes` as one object, as the backend would.
fn upload_cost(p: &Prices, bytes: u64) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    let r = &p.per_1000_requests;
    let (puts, posts) = cairn_backend::put_requests(bytes);
    (puts as f64 * r.of(RequestKind::Put) + posts as f64 * r.of(RequestKind::Post)) / 1000.0 + bytes as f64 / GB * p.transfer_up_per_gb
}

/// Prices every pack holding dead bytes at time `now` (ns since the epoch).
pub fn plan(vol: &Volume, now: i64, prices: &Prices) -> Result<Vec<PackCost>> {
    Ok(plan_where(vol, now, prices, false)?.into_iter().map(|(c, _)| c).collect())
}

/// [`plan`]; with `due_only`, only the packs due at `now`, without reading
/// the chunk rows of a pack whose C_store is below the least its cleaning
/// can cost (its live bytes' upload, known from the pack's size), so a
/// round costs a read of the packs table, not of every chunk. Each pack
/// comes with its chunk rows (offset order), which cleaning needs too.
fn plan_where(vol: &Volume, now: i64, prices: &Prices, due_only: bool) -> Result<Vec<(PackCost, Vec<ChunkRow>)>> {
    let packs = vol.meta.read(|tx| Ok(tx.dead_packs()?))?;
    let s = storage_per_byte_second(prices);
    let get = prices.per_1000_requests.of(RequestKind::Get) / 1000.0;
    let delete = prices.per_1000_requests.of(RequestKind::Delete) / 1000.0;
    let cache = vol.cloud().map(|c| c.cache.clone());
    let mut out = Vec::with_capacity(packs.len());
    for p in packs {
        let dead_secs = p.dead_acc + p.dead_bytes as f64 * ((now - p.mark).max(0) as f64 / 1e9);
        let c_store = dead_secs * s;
        if due_only {
            let live = pack::blob_bytes(p.size, p.blobs, vol.chunks.keys.encrypted()).saturating_sub(p.dead_bytes);
            if c_store < upload_cost(prices, live) + delete {
                continue;
            }
        }
        let chunks = vol.meta.read(|c| Ok(c.chunks_in_pack(p.id)?))?;
        let live_bytes: u64 = chunks.iter().filter(|c| c.refs > 0).map(|c| c.stored_len as u64).sum();
        let (mut gets, mut download_bytes) = (0, 0);
        for run in live_runs(&chunks) {
            let (off, len) = run_span(&chunks, run);
            if !cache.as_ref().is_some_and(|c| c.holds(&p.name, off, len)) {
                gets += 1;
                download_bytes += len;
            }
        }
        let c_clean = download_bytes as f64 / GB * prices.transfer_down_per_gb + gets as f64 * get + upload_cost(prices, live_bytes) + delete;
        let due_at = (s > 0.0).then(|| {
            let need = (c_clean / s - p.dead_acc) / p.dead_bytes as f64; // seconds after the mark
            p.mark.saturating_add((need.max(0.0) * 1e9).min(i64::MAX as f64 / 2.0) as i64)
        });
        let cost = PackCost {
            id: p.id,
            name: p.name.clone(),
            size: p.size,
            dead_bytes: p.dead_bytes,
            live_bytes,
            dead_acc: p.dead_acc,
            mark: p.mark,
            gets,
            download_bytes,
            c_store,
            c_clean,
            due_at,
            dead_per_month: p.dead_bytes as f64 / GB * prices.storage_per_gb_month,
            uploading: cache.as_ref().is_some_and(|c| c.is_pending(&p.name)),
        };
        if !due_only || cost.due() {
            out.push((cost, chunks));
        }
    }
    Ok(out)
}

/// Cleans the packs due at `now`, moving at most about `max_bytes` of live
/// chunks (the most overdue packs first, and at least one pack).
pub fn clean_due(vol: &Volume, now: i64, prices: &Prices, max_bytes: u64) -> Result<CleanReport> {
    clean(vol, now, &Policy { prices, max_bytes, bound: None, merge_small: false })
}

/// A pack a round takes, with its chunk rows (offset order).
struct Pick {
    id: u64,
    name: String,
    chunks: Vec<ChunkRow>,
}

/// One cleaning round by `pol` at `now`: the packs due by theorem 1 (the
/// most overdue first), then, if the dead bytes are past the bound, the
/// packs that free the most dead bytes per live byte moved until they are
/// back under three quarters of it, then, once [`SMALL_PACKS`] small ones
/// are there, the small packs (oldest first); at most about
/// `pol.max_bytes` of live chunks moved in all (a pack with none costs
/// nothing to clean and is always taken). Never a pack still on its way to
/// the bucket, nor one with a chunk in its grace period.
pub fn clean(vol: &Volume, now: i64, pol: &Policy) -> Result<CleanReport> {
    vol.check_writable()?;
    let mut due = plan_where(vol, now, pol.prices, true)?;
    // A pack with a chunk that died within the grace waits (another
    // machine may be about to reference it again).
    let before = vol.collect_dead_before()?;
    due.retain(|(_, chunks)| !chunks.iter().any(|c| crate::maintenance::settling(c, before)));
    due.sort_by(|(a, _), (b, _)| (b.c_store - b.c_clean).total_cmp(&(a.c_store - a.c_clean)));
    let mut budget = 0u64;
    let mut rep = CleanReport::default();
    let mut picks: Vec<Pick> = Vec::new();
    for (p, chunks) in due {
        let take = budget == 0 || budget + p.live_bytes <= pol.max_bytes;
        budget += p.live_bytes;
        if take {
            rep.due += 1;
            picks.push(Pick { id: p.id, name: p.name, chunks });
        }
    }
    let cache = vol.cloud().map(|c| c.cache.clone());
    let pending = |name: &str| cache.as_ref().is_some_and(|c| c.is_pending(name));
    let fits = |budget: u64, live: u64| budget == 0 || live == 0 || budget + live <= pol.max_bytes;
    let live_of = |chunks: &[ChunkRow]| chunks.iter().filter(|c| c.refs > 0).map(|c| c.stored_len as u64).sum::<u64>();
    if let Some(bound) = pol.bound {
        let (size, dead) = vol.meta.read(|t| Ok(t.pack_bytes()?))?;
        let limit = bound.of(size.saturating_sub(dead));
        let taken: HashSet<u64> = picks.iter().map(|p| p.id).collect();
        let mut dead_after = dead.saturating_sub(vol.meta.read(|t| Ok(t.dead_packs()?))?.iter().filter(|p| taken.contains(&p.id)).map(|p| p.dead_bytes).sum());
        if dead_after > limit {
            let target = limit - limit / 4;
            let enc = vol.chunks.keys.encrypted();
            let mut cands: Vec<_> = vol.meta.read(|t| Ok(t.dead_packs()?))?.into_iter().filter(|p| !taken.contains(&p.id) && !pending(&p.name)).collect();
            // Dead bytes freed per byte moved (and a block's worth for the
            // files and requests a pack costs whatever its size).
            let worth = |p: &cairn_meta::DeadPack| p.dead_bytes as f64 / (pack::blob_bytes(p.size, p.blobs, enc).saturating_sub(p.dead_bytes) + 4096) as f64;
            cands.sort_by(|a, b| worth(b).total_cmp(&worth(a)));
            for p in cands {
                if dead_after <= target {
                    break;
                }
                let chunks = vol.meta.read(|c| Ok(c.chunks_in_pack(p.id)?))?;
                if chunks.iter().any(|c| crate::maintenance::settling(c, before)) {
                    continue;
                }
                let live = live_of(&chunks);
                if !fits(budget, live) {
                    continue;
                }
                budget += live;
                dead_after = dead_after.saturating_sub(p.dead_bytes);
                rep.over_bound += 1;
                picks.push(Pick { id: p.id, name: p.name, chunks });
            }
        }
    }
    if pol.merge_small {
        let small = vol.cfg.pack_target / SMALL_PACK_SHARE;
        let taken: HashSet<u64> = picks.iter().map(|p| p.id).collect();
        let smalls: Vec<_> = vol.meta.read(|t| Ok(t.all_packs()?))?.into_iter().filter(|p| p.size < small && !taken.contains(&p.id) && !pending(&p.name)).collect();
        if smalls.len() as u64 >= SMALL_PACKS {
            // Merging is worth it only if the result is fewer packs: at
            // least two, and a budget of at least a pack target's.
            let cap = pol.max_bytes.max(vol.cfg.pack_target);
            let mut merged: Vec<Pick> = Vec::new();
            let mut moved = 0u64;
            for p in smalls {
                let chunks = vol.meta.read(|c| Ok(c.chunks_in_pack(p.id)?))?;
                if chunks.iter().any(|c| crate::maintenance::settling(c, before)) {
                    continue;
                }
                let live = live_of(&chunks);
                if moved > 0 && moved + live > cap {
                    break;
                }
                moved += live;
                merged.push(Pick { id: p.id, name: p.name, chunks });
            }
            if merged.len() >= 2 {
                rep.small = merged.len() as u64;
                picks.extend(merged);
            }
        }
    }
    if picks.is_empty() {
        return Ok(rep);
    }
    // Copy the live chunks into new packs outside every lock: writers go on
    // meanwhile.
    let mut mover = Mover::new(vol, before);
    for p in &picks {
        mover.copy_live(&p.name, &p.chunks)?;
    }
    mover.finish()?;
    // Commit while no write batch holds a chunk id it found by hash.
    let Some(guard) = vol.chunk_guard.exclusive(GUARD_PATIENCE) else {
        mover.discard();
        let why = "writers kept the chunk guard".to_string();
        tracing::info!("cleaning round given up: {why}");
        rep.gave_up = Some(why);
        return Ok(rep);
    };
    let done = match vol.meta.write(|tx| mover.commit(tx, picks.iter().map(|p| p.id))) {
        Ok(done) => done,
        Err(e) => {
            // Nothing of the round is committed: its new packs name
            // nothing, so they go now rather than wait for gc.
            drop(guard);
            mover.discard();
            if e.kind() != crate::error::ErrorKind::Raced {
                return Err(e);
            }
            // Another machine moved, freed or revived chunks of the
            // chosen packs since they were read; the next round plans
            // from what is there now.
            let why = format!("another machine changed the chosen packs: {e}");
            tracing::info!("cleaning round given up: {why}");
            rep.gave_up = Some(why);
            return Ok(rep);
        }
    };
    vol.chunks.forget_chunks(&done.freed_chunks);
    // Readers that resolved a location before the commit may still find
    // the old pack (in a bucket it goes to the trash below, not away; in a
    // directory it goes, and such a reader asks the metadata again); new
    // lookups must see the new one. Under the guard, no batch can insert
    // a pack meanwhile.
    vol.chunks.forget_locations(mover.moved.iter().map(|m| m.id));
    for p in &picks {
        vol.chunks.forget_pack_name(p.id);
    }
    drop(guard);
    rep.packs_cleaned = (picks.len() - done.kept.len()) as u64;
    rep.packs_kept = done.kept.len() as u64;
    rep.packs_written = mover.sealed.len() as u64;
    // Only the chunks relocated: those of kept packs were copied in vain
    // (dead bytes of the new packs).
    let relocated = mover.moved.iter().filter(|m| !done.kept.contains(&m.from));
    (rep.chunks_moved, rep.bytes_moved) = relocated.fold((0, 0), |(n, b), m| (n + 1, b + m.stored_len as u64));
    rep.chunks_dropped = done.chunks_dropped;
    rep.dead_bytes_freed = done.dead_bytes_freed;
    // The barrier first (rule 3), inside.
    vol.delete_objects(Subsystem::Gc, picks.iter().filter(|p| !done.kept.contains(&p.id)).map(|p| p.name.as_str()))?;
    Ok(rep)
}

/// The cleaner's thread: a round every `every` with `prices`, and in
/// between, every [`LOOK_EVERY`], a look at the volume's [`Standing`]: a
/// round at once when the dead bytes are past `bound` or the small packs
/// pile up. A round moves at most two packs' worth of live chunks. On a
/// volume many machines write, only the machine holding the maintenance
/// lock cleans (docs/shared-volume.md §7).
pub(crate) fn background(vol: &std::sync::Arc<Volume>, every: Duration, prices: Prices, bound: DeadBound) -> crate::background::Background {
    let weak = std::sync::Arc::downgrade(vol);
    let mut last_round = Instant::now();
    crate::background::Background::start("cairn-cleaner", every.min(LOOK_EVERY), move || {
        let Some(vol) = weak.upgrade() else { return false };
        if vol.check_writable().is_err() {
            return true; // read-only or the lease was lost: nothing to do now
        }
        let look = match standing(&vol, Some(&bound)) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("the cleaner's look at the packs failed (will retry): {e}");
                return true;
            }
        };
        vol.metrics.record_standing(&look);
        let full = last_round.elapsed() >= every;
        if !full && !look.wants_round() {
            return true;
        }
        // Many machines on one volume: the one holding the maintenance
        // lock cleans, the others skip their rounds.
        let _maintenance = match crate::maintenance::maintenance_lock(&vol, Duration::ZERO) {
            Ok(Some(g)) => g,
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!("taking the volume's maintenance lock failed (will retry): {e}");
                return true;
            }
        };
        if full {
            last_round = Instant::now();
            if let Err(e) = crate::maintenance::clean_up_sessions(&vol) {
                tracing::warn!("removing expired sessions failed (will retry): {e}");
            }
        }
        let now = crate::types::Timestamp::now().0;
        let pol = Policy { prices: &prices, max_bytes: 2 * vol.cfg.pack_target, bound: Some(&bound), merge_small: true };
        match clean(&vol, now, &pol) {
            Ok(r) => {
                vol.metrics.record_clean(&r);
                if r.packs_cleaned > 0 {
                    // A round the look started may come every few seconds
                    // under a rewrite load: at debug level.
                    if full {
                        tracing::info!(packs = r.packs_cleaned, due = r.due, over_bound = r.over_bound, small = r.small, moved = r.bytes_moved, freed = r.dead_bytes_freed, "cleaned packs");
                    } else {
                        tracing::debug!(packs = r.packs_cleaned, due = r.due, over_bound = r.over_bound, small = r.small, moved = r.bytes_moved, freed = r.dead_bytes_freed, "cleaned packs");
                    }
                    if let Ok(s) = standing(&vol, Some(&bound)) {
                        vol.metrics.record_standing(&s);
                    }
                    checkpoint_if_large(&vol);
                }
            }
            Err(e) => tracing::warn!("cleaning round failed (will retry): {e}"),
        }
        true
    })
}

/// Folds a SQLite store's WAL back into the database and cuts it, once
/// it is [`WAL_CHECKPOINT_AT`] long (the rows the round deleted and every
/// write since otherwise sit in it until the next automatic checkpoint
/// at 64 MiB, which leaves the file that long).
fn checkpoint_if_large(vol: &Volume) {
    if vol.cfg.meta != crate::config::MetaKind::Sqlite {
        return;
    }
    let mut wal = vol.layout.meta_db().into_os_string();
    wal.push("-wal");
    if std::fs::metadata(&wal).is_ok_and(|m| m.len() >= WAL_CHECKPOINT_AT) {
        if let Err(e) = vol.meta.checkpoint() {
            tracing::warn!("checkpointing the metadata's WAL: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, len: u32, refs: i64) -> ChunkRow {
        ChunkRow { id: offset, hash: [0; 32], pack: 1, offset, stored_len: len, raw_len: len, flags: 0, refs, zero_since: None }
    }

    #[test]
    fn runs_break_at_dead_chunks() {
        let cs = [chunk(0, 10, 1), chunk(10, 10, 2), chunk(20, 5, 0), chunk(25, 10, 1), chunk(35, 1, 0), chunk(36, 1, 0)];
        let runs = live_runs(&cs);
        assert_eq!(runs, vec![(0, 1), (3, 3)]);
        assert_eq!(run_span(&cs, runs[0]), (0, 20));
        assert_eq!(run_span(&cs, runs[1]), (25, 10));
        assert!(live_runs(&[chunk(0, 1, 0)]).is_empty());
    }

    #[test]
    fn uploads_are_priced_as_the_backend_sends_them() {
        let p = Prices::aws();
        assert_eq!(upload_cost(&p, 0), 0.0);
        assert!((upload_cost(&p, 1 << 20) - 0.005 / 1000.0).abs() < 1e-12);
        // 64 MiB: one PUT; 128 MiB: create + complete (POST) and 8 parts (PUT).
        assert!((upload_cost(&p, 64 << 20) - 0.005 / 1000.0).abs() < 1e-12);
        assert!((upload_cost(&p, 128 << 20) - 10.0 * 0.005 / 1000.0).abs() < 1e-12);
    }
}
