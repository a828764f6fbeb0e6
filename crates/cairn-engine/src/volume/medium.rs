//! The medium a volume's packs go to (a local directory, a bucket, a
//! tape) and what it asks of the flush: on a tape, rounds feed the drive
//! long runs of one file in the order a restore reads them.

use super::file::{FileState, WalkKey};
use super::Volume;
use std::sync::Arc;

/// Bounds of a file's run on a store where positioning costs seconds.
const RUN_MIN: u64 = 64 << 20;
const RUN_MAX: u64 = 1 << 30;
/// How long an open file's data may wait for its run to fill there.
const RUN_AGE: std::time::Duration = std::time::Duration::from_secs(60);
/// How recently the drive must have been fed a file for other files to
/// wait for it ([`Volume::feeding_an_open_file`]): a writer that has not
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

impl Volume {
    /// When a dirty file is due on a store where reads must position the
    /// medium (a tape): when closed or fsync'd, or when its dirty bytes
    /// fill a run, so that one file's data lies in few long runs however
    /// many files are written at once; age flushes only after
    /// [`RUN_AGE`].
    pub(super) fn run_policy(&self) -> (std::time::Duration, u64) {
        let writers = self.files.iter().filter(|e| e.value().inner.lock().is_dirty()).count() as u64;
        (self.opts.flush_age.max(RUN_AGE), run_size(self.opts.journal_limit, writers))
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
    pub(super) fn file_to_feed(&self, first: Option<&WalkKey>) -> Option<Arc<FileState>> {
        let b = self.chunks.backend.sequential()?.backlog();
        if b.queued_bytes >= 2 * self.chunks.backend.capabilities().preferred_pack_size {
            return None;
        }
        let fed = self.last_fed.load(std::sync::atomic::Ordering::Relaxed);
        let dirty: Vec<(bool, u64, Arc<FileState>)> = self
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
        self.last_fed.store(st.ino, std::sync::atomic::Ordering::Relaxed);
        *self.last_fed_at.lock() = Some(std::time::Instant::now());
        Some(st)
    }

    /// Whether the file the drive is being fed is still being written:
    /// open, dirty, and fed within [`FEEDING`]. Files that close meanwhile
    /// then wait for it (unless the journal is pressed), so its runs stay
    /// back to back on the tape: a round that took a closed file between
    /// two of them put the fed file's last part after it, a locate more to
    /// read it back.
    pub(super) fn feeding_an_open_file(&self) -> bool {
        if !self.last_fed_at.lock().is_some_and(|t| t.elapsed() < FEEDING) {
            return false;
        }
        let fed = self.last_fed.load(std::sync::atomic::Ordering::Relaxed);
        self.files.get(&fed).is_some_and(|e| {
            let g = e.value().inner.lock();
            !g.evicted && g.open > 0 && g.is_dirty()
        })
    }

    /// Of the files being written at speed (see [`writing_at_speed`]),
    /// the walk key of the first in a walk of the tree: files after it
    /// that closed wait for it, so files written at once go down on a tape
    /// in the order a restore reads them back (docs/tape.md §10).
    pub(super) fn first_writer_key(&self) -> Option<WalkKey> {
        let now = crate::types::Timestamp::now();
        self.files
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
