//! The medium a volume's packs go to (a local directory, a bucket, a
//! tape) and what it asks of the flush, chosen once at open
//! ([`choose`]): when a file is due, whether rounds are grouped, where a
//! round's short last pack waits, which chosen files go in what order (on
//! a tape, rounds feed the drive long runs of one file in the order a
//! restore reads them) and how packs no metadata names go. One `dyn` call
//! per round or per pack, none per write (docs/design.md "The volume's
//! parts").

use super::file::{FileState, WalkKey};
use super::Volume;
use crate::cache::CachedBackend;
use crate::error::Result;
use crate::types::Ino;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the place a volume's packs go to asks of the flush.
pub(crate) trait Medium: Send + Sync {
    /// The age and the dirty bytes after which a dirty file is due.
    fn due(&self, vol: &Volume) -> (Duration, u64) {
        (vol.opts.flush_age, vol.opts.flush_bytes)
    }

    /// Whether a round nobody asked for one file of is grouped
    /// (docs/frugal.md §7): it also takes the files half its age old, and
    /// every closed file once they fill a pack.
    fn groups_rounds(&self) -> bool {
        false
    }

    /// Where a grouped round's short last pack waits for the next round
    /// (None: nowhere, every pack goes at once).
    fn held(&self) -> Option<&HeldPacks> {
        None
    }

    /// Which of a round's `chosen` files go, in what order (`all`: every
    /// dirty file was asked for; `pressure`: the journal is past half its
    /// limit; `only`: a round for one file).
    fn order_round(&self, vol: &Volume, chosen: &mut Vec<Arc<FileState>>, all: bool, pressure: bool, only: Option<Ino>) {
        let _ = (vol, all, pressure, only);
        // Inode order, so packs hold related files together (a
        // directory's files, created together, have neighbouring numbers):
        // one ranged GET of a pack then brings the files read next too
        // (docs/frugal.md §3).
        chosen.sort_unstable_by_key(|st| st.ino);
    }

    /// Whether a sync must reach the medium itself, every pack uploaded
    /// and the metadata shipped (a cloud volume's `--durability remote`),
    /// not only the local outbox.
    fn durable_remotely(&self) -> bool {
        false
    }

    /// After a round someone asked for (`sync`, a close that waits, an
    /// archive): nothing stays held.
    fn release_held(&self) {}

    /// Whether the last page of each chunk is kept in memory for the
    /// kernel's read before an append (a read costs a request or a
    /// locate here; a local store that reads remotely keeps them too).
    fn keeps_tails(&self) -> bool {
        true
    }

    /// Rule 3: packs that no committed metadata names any more go (the
    /// caller made those commits durable). Returns how many went.
    fn drop_packs(&self, vol: &Volume, who: cairn_backend::Subsystem, names: Vec<&str>) -> Result<u64> {
        let mut n = 0;
        for name in names {
            vol.chunks.paid(who).delete(name)?;
            n += 1;
        }
        Ok(n)
    }
}

/// Chooses the medium of a volume at open: a tape when its store's reads
/// position a medium, a bucket when the volume has cloud parts, else a
/// local directory.
pub(crate) fn choose(cloud: Option<&crate::cloud::Cloud>, backend: &dyn cairn_backend::Backend) -> Box<dyn Medium> {
    let caps = backend.capabilities();
    match cloud {
        _ if !caps.cheap_ranged_reads => Box::new(TapeHome { in_bucket: cloud.is_some(), remote: cloud.is_some_and(remote), last_fed: AtomicU64::new(0), last_fed_at: Mutex::new(None) }),
        Some(c) => {
            // With local durability and metadata that only this machine
            // ships, a grouped round's last, short pack waits in the outbox
            // for the next round to fill it (docs/frugal.md §7). Never on a
            // shared volume: other machines read what this one commits at
            // once, from the bucket.
            let holds = c.ships_metadata && c.opts.durability == crate::cache::Durability::Local;
            let held = holds.then(|| HeldPacks { cache: c.cache.clone(), ship_lock: c.ship_lock.clone(), interval: c.opts.meta_interval, pack: Mutex::new(None) });
            Box::new(BucketHome { cache: c.cache.clone(), held, remote: remote(c) })
        }
        None => Box::new(LocalHome),
    }
}

/// Whether a sync of cloud volume `c` waits for the bucket.
fn remote(c: &crate::cloud::Cloud) -> bool {
    c.opts.durability == crate::cache::Durability::Remote
}

/// Packs in a local directory (or an injected store that reads ranges
/// cheaply): the trait's defaults.
pub(crate) struct LocalHome;

impl Medium for LocalHome {
    fn keeps_tails(&self) -> bool {
        false
    }
}

/// Packs in a bucket, behind the cloud's cache and outbox: grouped
/// rounds, short packs held, packs no metadata names to the trash.
pub(crate) struct BucketHome {
    cache: Arc<CachedBackend>,
    held: Option<HeldPacks>,
    /// `--durability remote`: a sync waits for the bucket.
    remote: bool,
}

impl Medium for BucketHome {
    fn groups_rounds(&self) -> bool {
        true
    }

    fn held(&self) -> Option<&HeldPacks> {
        self.held.as_ref()
    }

    fn durable_remotely(&self) -> bool {
        self.remote
    }

    fn release_held(&self) {
        self.cache.release_held();
    }

    fn drop_packs(&self, vol: &Volume, _who: cairn_backend::Subsystem, names: Vec<&str>) -> Result<u64> {
        // Older metadata versions may still name them: to the trash, whose
        // requests are metadata's whoever asked.
        let names: Vec<String> = names.into_iter().map(str::to_string).collect();
        vol.trash_objects(&names)
    }
}

/// The last flush round's partly filled pack, held in a bucket's outbox
/// for the next round to copy into a larger one (docs/frugal.md §7).
pub(crate) struct HeldPacks {
    /// The outbox holding it (it says whether the pack is still held).
    pub(crate) cache: Arc<CachedBackend>,
    /// The cloud's ship lock: a ship under way may name the held pack.
    pub(crate) ship_lock: Arc<Mutex<()>>,
    /// How long a pack is held at most (the metadata interval).
    pub(crate) interval: Duration,
    /// The held pack: name, metadata id, when written.
    pub(crate) pack: Mutex<Option<(String, u64, Instant)>>,
}

/// Packs on a tape (a store whose reads position a medium): a file is
/// due when its run fills, rounds feed the drive in the order of a walk
/// of the tree.
pub(crate) struct TapeHome {
    /// The tape is a cloud volume's (packs no metadata names go to the
    /// trash, as in a bucket), not an injected store's.
    in_bucket: bool,
    /// A cloud volume's `--durability remote`: a sync waits for the tape.
    remote: bool,
    /// The file the drive was last fed (0: none): fed again first, its
    /// runs follow one another on the tape.
    last_fed: AtomicU64,
    /// When the drive was last fed that file (a flush round took it to
    /// keep the drive moving): while it is still being written, other
    /// files wait so that its runs stay back to back.
    last_fed_at: Mutex<Option<Instant>>,
}

impl Medium for TapeHome {
    fn due(&self, vol: &Volume) -> (Duration, u64) {
        self.run_policy(vol)
    }

    fn durable_remotely(&self) -> bool {
        self.remote
    }

    fn order_round(&self, vol: &Volume, chosen: &mut Vec<Arc<FileState>>, all: bool, pressure: bool, only: Option<Ino>) {
        let mut fed = 0;
        if only.is_none() {
            if !all && !pressure && self.feeding_an_open_file(vol) {
                let fed = self.last_fed.load(Ordering::Relaxed);
                chosen.retain(|st| st.ino == fed);
            }
            // Once per round: a walk of the files with state.
            let first = if all { None } else { self.first_writer_key(vol) };
            if !pressure {
                if let Some(first) = &first {
                    let fed = self.last_fed.load(Ordering::Relaxed);
                    chosen.retain(|st| st.ino == fed || st.walk_key() <= *first);
                }
            }
            if chosen.is_empty() && !all {
                chosen.extend(self.file_to_feed(vol, first.as_ref()));
            }
            // The file the drive was fed goes first in any round, with what
            // it has: its run then goes on where it stopped on the tape,
            // not after the runs of files that closed meanwhile.
            fed = self.last_fed.load(Ordering::Relaxed);
            if !chosen.is_empty() && !chosen.iter().any(|st| st.ino == fed) {
                if let Some(st) = vol.files.get(&fed).map(|e| e.value().clone()) {
                    let g = st.inner.lock();
                    if !g.evicted && g.is_dirty() {
                        drop(g);
                        chosen.push(st);
                    }
                }
            }
        }
        // The order of a walk of the tree (names in order), which is the
        // order a restore reads them.
        chosen.sort_by_cached_key(|st| (st.ino != fed, st.walk_key()));
    }

    fn drop_packs(&self, vol: &Volume, who: cairn_backend::Subsystem, names: Vec<&str>) -> Result<u64> {
        if self.in_bucket {
            let names: Vec<String> = names.into_iter().map(str::to_string).collect();
            return vol.trash_objects(&names);
        }
        LocalHome.drop_packs(vol, who, names)
    }
}

/// Bounds of a file's run on a store where positioning costs seconds.
const RUN_MIN: u64 = 64 << 20;
const RUN_MAX: u64 = 1 << 30;
/// How long an open file's data may wait for its run to fill there.
const RUN_AGE: std::time::Duration = std::time::Duration::from_secs(60);
/// How recently the drive must have been fed a file for other files to
/// wait for it ([`TapeHome::feeding_an_open_file`]): a writer that has not
/// gathered a minimal run for this long is too slow to keep the drive
/// moving alone.
const FEEDING: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether an open file is being written fast enough that files after it
/// in a walk of the tree wait for it on a tape: written within
/// [`FEEDING`], and either dirty for less than that or gathering at least
/// a minimal run ([`RUN_MIN`]) per [`FEEDING`]. A log appended a line at a
/// time holds nothing back for longer than that.
fn writing_at_speed(g: &super::file::FileInner, now: crate::types::Timestamp) -> bool {
    let feeding = FEEDING.as_nanos() as i64;
    if now.0.saturating_sub(g.mtime.0) >= feeding {
        return false;
    }
    let Some(since) = g.dirty_since else { return false };
    let dirty_for = since.elapsed();
    dirty_for < FEEDING || g.dirty_bytes as u128 * FEEDING.as_nanos() >= RUN_MIN as u128 * dirty_for.as_nanos()
}

/// The run size on a sequential store (docs/tape.md §2): the journal's
/// room shared among the `writers` files with dirty data, half of it left
/// for the next runs to fill while one drains.
pub(crate) fn run_size(journal_limit: u64, writers: u64) -> u64 {
    (journal_limit / (2 * writers.max(1))).clamp(RUN_MIN, RUN_MAX)
}

impl TapeHome {
    /// When a dirty file is due on a store where reads must position the
    /// medium (a tape): when closed or fsync'd, or when its dirty bytes
    /// fill a run, so that one file's data lies in few long runs however
    /// many files are written at once; age flushes only after
    /// [`RUN_AGE`].
    fn run_policy(&self, vol: &Volume) -> (std::time::Duration, u64) {
        let writers = vol.files.iter().filter(|e| e.value().inner.lock().is_dirty()).count() as u64;
        (vol.opts.flush_age.max(RUN_AGE), run_size(vol.opts.journal_limit, writers))
    }

    /// On a store that writes in the background, the file to flush now so
    /// a moving medium does not run dry: when the store is streaming and
    /// holds less than two packs (one being written, the next ready), an open file with at least [`RUN_MIN`]
    /// dirty bytes (a run shorter than that would cost more positioning
    /// when read back than the stop it saves). The file fed last is fed
    /// again while it has that much, so its runs follow one another on the
    /// tape as one; otherwise the first of them in a walk of the tree.
    ///
    /// A standing drive waits for full runs (a file closed or its run
    /// filled), unless one file alone is being written: its runs follow
    /// one another whatever their size, so its first [`RUN_MIN`] starts
    /// the drive. With several writers, starting on the oldest one's first
    /// run was tried twice (docs/tape.md §2 and §9): the writers and the
    /// flush share two cores, the drive ran dry and backhitched (3 s).
    ///
    /// `first` is the round's [`first_writer_key`](Self::first_writer_key).
    fn file_to_feed(&self, vol: &Volume, first: Option<&WalkKey>) -> Option<Arc<FileState>> {
        let b = vol.chunks.backend.sequential()?.backlog();
        if b.queued_bytes >= 2 * vol.chunks.backend.capabilities().preferred_pack_size {
            return None;
        }
        let fed = self.last_fed.load(Ordering::Relaxed);
        let dirty: Vec<(bool, u64, Arc<FileState>)> = vol
            .files
            .iter()
            .filter_map(|e| {
                let g = e.value().inner.lock();
                (!g.evicted && g.is_dirty()).then(|| (e.value().ino != fed, g.dirty_bytes, e.value().clone()))
            })
            .collect();
        if !b.streaming && dirty.len() != 1 {
            return None;
        }
        // The fed file while it has a run; else the first in a walk of the
        // tree, so files written at once go down in the order a restore
        // reads them (docs/tape.md §10). Not a file after one still being
        // written at speed: that one's next run comes soon, and a file fed
        // meanwhile would lie between its runs (docs/tape.md §11).
        let (_, _, st) = dirty
            .into_iter()
            .filter(|(_, d, _)| *d >= RUN_MIN)
            .map(|(other, _, st)| (other, st.walk_key(), st))
            .filter(|(_, key, _)| first.is_none_or(|f| key <= f))
            .min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)))?;
        self.last_fed.store(st.ino, Ordering::Relaxed);
        *self.last_fed_at.lock() = Some(std::time::Instant::now());
        Some(st)
    }

    /// Whether the file the drive is being fed is still being written:
    /// open, dirty, and fed within [`FEEDING`]. Files that close meanwhile
    /// then wait for it (unless the journal is pressed), so its runs stay
    /// back to back on the tape: a round that took a closed file between
    /// two of them put the fed file's last part after it, a locate more to
    /// read it back.
    fn feeding_an_open_file(&self, vol: &Volume) -> bool {
        if !self.last_fed_at.lock().is_some_and(|t| t.elapsed() < FEEDING) {
            return false;
        }
        let fed = self.last_fed.load(Ordering::Relaxed);
        vol.files.get(&fed).is_some_and(|e| {
            let g = e.value().inner.lock();
            !g.evicted && g.open > 0 && g.is_dirty()
        })
    }

    /// Of the files being written at speed (see [`writing_at_speed`]),
    /// the walk key of the first in a walk of the tree: files after it
    /// that closed wait for it, so files written at once go down on a tape
    /// in the order a restore reads them back (docs/tape.md §10).
    fn first_writer_key(&self, vol: &Volume) -> Option<WalkKey> {
        let now = crate::types::Timestamp::now();
        vol.files
            .iter()
            .filter(|e| {
                let g = e.value().inner.lock();
                !g.evicted && g.open > 0 && g.is_dirty() && writing_at_speed(&g, now)
            })
            .map(|e| e.value().walk_key())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::run_size;

    #[test]
    fn runs_share_the_journal_among_writers_within_bounds() {
        let j = 2u64 << 30;
        assert_eq!(run_size(j, 0), 1 << 30);
        assert_eq!(run_size(j, 1), 1 << 30);
        assert_eq!(run_size(j, 4), 256 << 20);
        assert_eq!(run_size(j, 1000), 64 << 20);
        assert_eq!(run_size(8u64 << 30, 1), 1 << 30);
    }
}
