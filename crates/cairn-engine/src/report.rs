//! What the maintenance commands report, as data for a front end to show.
//!
//! `cairn gc --dry-run`, `cairn fsck` and `cairn meta list|restore` used to
//! compute part of their answer in the command line tool; the computing is
//! here, the tool only formats. Each function returns plain values
//! (serializable where a command prints them as JSON).

use crate::cleaner::{self, PackCost};
use crate::cost::Prices;
use crate::error::Result;
use crate::maintenance::{self, FsckReport, GcCandidate};
use crate::Volume;
use serde::Serialize;
use std::path::Path;

/// What `cairn gc --dry-run` shows: the cost-optimal cleaner's plan (a
/// mount's, or computed read-only) and the packs `gc` would clean now (only
/// for an unmounted volume: `gc` needs it to itself).
#[derive(Clone, Debug, Default, Serialize)]
pub struct GcPreview {
    /// Every pack with dead bytes, priced (None: not computed).
    pub cleaner: Option<Vec<PackCost>>,
    /// The packs `gc --repack-below` would clean (None: the volume is mounted).
    pub gc: Option<Vec<GcCandidate>>,
}

/// The cleaner's plan and `gc`'s candidates of an open (unmounted) volume
/// at `now` (ns since the epoch), changing nothing.
pub fn gc_preview(vol: &Volume, repack_below: f64, prices: &Prices, now: i64) -> Result<GcPreview> {
    let plan = cleaner::plan(vol, now, prices)?;
    let candidates = maintenance::gc_candidates(vol, repack_below)?;
    Ok(GcPreview { cleaner: Some(plan), gc: Some(candidates) })
}

/// Totals over `gc`'s candidates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CandidateTotals {
    pub packs: usize,
    /// Stored bytes of the packs.
    pub stored: u64,
    /// Dead bytes in them.
    pub dead: u64,
}

/// Sums the packs `gc` would clean.
pub fn candidate_totals(c: &[GcCandidate]) -> CandidateTotals {
    c.iter().fold(CandidateTotals { packs: c.len(), ..Default::default() }, |t, x| CandidateTotals { stored: t.stored + x.size, dead: t.dead + x.dead_bytes, ..t })
}

/// When the cleaner will clean a pack.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Due {
    /// Written but not uploaded: not before its upload.
    AfterUpload,
    /// Its dead bytes have cost what cleaning costs.
    Now,
    /// In this many seconds.
    In(f64),
    /// Never: storage is free.
    Never,
}

/// When `p` is due, seen at `now` (ns since the epoch).
pub fn due(p: &PackCost, now: i64) -> Due {
    if p.uploading {
        Due::AfterUpload
    } else if p.due() {
        Due::Now
    } else {
        p.due_at.map_or(Due::Never, |t| Due::In(secs_until(t, now)))
    }
}

fn secs_until(t: i64, now: i64) -> f64 {
    (t - now).max(0) as f64 / 1e9
}

/// The cleaner's plan in a few figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlanSummary {
    /// Packs with dead bytes.
    pub packs: usize,
    /// Of those, the ones due now.
    pub due: usize,
    /// Dollars cleaning the due ones costs.
    pub cost_due: f64,
    /// Dollars a month cleaning them saves.
    pub saves_per_month: f64,
    /// When none is due: seconds until the first one is (None: never,
    /// storage is free).
    pub next_due_in: Option<f64>,
}

/// Sums up `plan` at `now` (ns since the epoch).
pub fn plan_summary(plan: &[PackCost], now: i64) -> PlanSummary {
    let due: Vec<&PackCost> = plan.iter().filter(|p| p.due()).collect();
    PlanSummary {
        packs: plan.len(),
        due: due.len(),
        cost_due: due.iter().fold(0.0, |a, p| a + p.c_clean),
        saves_per_month: due.iter().fold(0.0, |a, p| a + p.dead_per_month),
        next_due_in: plan.iter().filter_map(|p| p.due_at).min().map(|t| secs_until(t, now)),
    }
}

/// What `fsck` finds in a volume's journal directory before opening it
/// (the open replays the journal, and may then delete its segments).
#[derive(Clone, Debug, Default)]
pub struct JournalFindings {
    /// Segments with a record that fails to verify: the volume does not
    /// open until they are salvaged.
    pub damaged: Vec<String>,
    /// Bytes past a segment's last record that verifies: (message, whether
    /// a whole record fails, i.e. damage rather than a torn write).
    pub tails: Vec<(String, bool)>,
}

/// Checks the journal of the volume whose local directory is `dir`.
pub fn journal_findings(dir: &Path) -> Result<JournalFindings> {
    let journal = dir.join("journal");
    Ok(JournalFindings { damaged: crate::journal::check_dir(&journal)?, tails: crate::journal::check_tails(&journal)? })
}

impl JournalFindings {
    /// Whether a plain open would refuse the journal.
    pub fn is_damaged(&self) -> bool {
        !self.damaged.is_empty()
    }

    /// Adds the findings to `rep`: damaged segments first among its errors
    /// (saying what `salvaged` did, or how to salvage them), damaged tails
    /// as errors and torn ones as warnings.
    pub fn add_to(self, rep: &mut FsckReport, salvaged: bool) {
        for (i, d) in self.damaged.into_iter().enumerate() {
            rep.errors.insert(
                i,
                if salvaged {
                    format!("{d}; salvaged: every record that verifies was replayed, the damaged ones are lost, a copy of the segment is in journal-damaged/")
                } else {
                    format!("{d}; the volume will not mount until `cairn fsck --salvage-journal` replays every record that verifies")
                },
            );
        }
        for (line, damaged) in self.tails {
            if damaged {
                rep.errors.push(line);
            } else {
                rep.warnings.push(line);
            }
        }
    }
}

/// One metadata version kept in the bucket, as `cairn meta list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct MetaVersion {
    pub version: u64,
    pub kind: crate::cloud::versions::Kind,
    /// Stored bytes.
    pub bytes: u64,
    /// Seconds since the epoch when it was written.
    pub time: u64,
    /// The local directory that wrote it (all zero: `cairn meta restore`).
    pub writer: [u8; 8],
    /// The newest version of the chain a mount would load.
    pub latest: bool,
}

/// The metadata versions in the bucket of the volume whose local directory
/// is `dir`, oldest first. The requests this takes are counted into the
/// volume's bill (a failure to count is logged).
pub fn meta_versions(dir: &Path) -> Result<Vec<MetaVersion>> {
    use crate::cloud::{self, versions};
    let (_, settings, _, _) = crate::read_config(dir)?;
    let remote = cloud::open_remote(&settings)?;
    let all = versions::list(remote.as_ref())?;
    let heads = versions::headers(remote.as_ref(), &all)?;
    save_requests(dir, remote.as_ref());
    let latest = versions::chain(&all, None).ok().and_then(|c| c.last().map(|v| v.version));
    Ok(all
        .iter()
        .zip(&heads)
        .map(|(v, h)| MetaVersion { version: v.version, kind: v.kind, bytes: v.size, time: h.time, writer: h.writer, latest: Some(v.version) == latest })
        .collect())
}

/// `cairn meta restore`: makes metadata version `version` the latest of the
/// volume `url` whose local directory is `dir` (see [`crate::cloud::restore`]);
/// returns the new version's number. Its requests are counted into the bill.
pub fn restore_meta_version(dir: &Path, passphrase: Option<&[u8]>, url: &str, version: u64) -> Result<u64> {
    let (_, settings, _, cfg) = crate::read_config(dir)?;
    let keys = cfg.keys(passphrase)?;
    let remote = crate::cloud::open_remote(&settings)?;
    let v = crate::cloud::restore(remote.as_ref(), &keys, url, version);
    save_requests(dir, remote.as_ref());
    v
}

/// Counts the requests of a command that does not open the volume into its
/// bill (`cairn cost` shows them).
fn save_requests(dir: &Path, remote: &dyn cairn_backend::Backend) {
    if let Err(e) = crate::cost::save_unsaved(dir, remote) {
        tracing::warn!("counting this command's requests into the bill: {e}");
    }
}

/// The prices the cleaner's plan is shown at: the table `name` (aws, coral,
/// local or a TOML file, see [`Prices::load`]), by default AWS's for a
/// volume in a bucket and a local disk's otherwise.
pub fn cleaner_prices(name: Option<&str>, in_bucket: bool) -> std::result::Result<Prices, crate::cost::PriceError> {
    match name {
        Some(p) => Prices::load(p),
        None if in_bucket => Ok(Prices::aws()),
        None => Ok(Prices::local_disk()),
    }
}

impl crate::cost::Bill {
    /// Dollars the stored bytes (live and dead) cost over the bill's span.
    pub fn storage_cost(&self) -> f64 {
        let months = |bs: u64| bs as f64 / crate::cost::GB / crate::cost::MONTH_SECS;
        (months(self.live_byte_seconds) + months(self.dead_byte_seconds)) * self.prices.storage_per_gb_month
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(name: &str, c_store: f64, c_clean: f64, due_at: Option<i64>, uploading: bool) -> PackCost {
        PackCost {
            id: 1,
            name: name.into(),
            size: 100,
            dead_bytes: 60,
            live_bytes: 40,
            dead_acc: 0.0,
            mark: 0,
            gets: 1,
            download_bytes: 40,
            c_store,
            c_clean,
            due_at,
            dead_per_month: 0.5,
            uploading,
        }
    }

    #[test]
    fn the_plan_sums_the_due_packs_and_says_when_the_next_is() {
        let now = 1_000_000_000_000;
        let plan = vec![pack("a", 2.0, 1.0, Some(now - 5), false), pack("b", 0.1, 1.0, Some(now + 90 * 1_000_000_000), false), pack("c", 3.0, 1.0, Some(now), true)];
        let s = plan_summary(&plan, now);
        assert_eq!((s.packs, s.due), (3, 1));
        assert_eq!((s.cost_due, s.saves_per_month), (1.0, 0.5));
        assert_eq!(due(&plan[0], now), Due::Now);
        assert_eq!(due(&plan[1], now), Due::In(90.0));
        assert_eq!(due(&plan[2], now), Due::AfterUpload, "not cleaned before its upload, however dear");
        assert_eq!(due(&pack("d", 0.0, 1.0, None, false), now), Due::Never);
        // The earliest due_at, in the past counting as 0 s.
        assert_eq!(s.next_due_in, Some(0.0));
        assert_eq!(plan_summary(&plan[1..2], now).next_due_in, Some(90.0));
        assert_eq!(plan_summary(&[], now), PlanSummary::default());
    }

    #[test]
    fn candidate_totals_add_stored_and_dead_bytes() {
        let c = [GcCandidate { name: "x".into(), size: 10, dead_bytes: 4, live_bytes: 6 }, GcCandidate { name: "y".into(), size: 20, dead_bytes: 20, live_bytes: 0 }];
        assert_eq!(candidate_totals(&c), CandidateTotals { packs: 2, stored: 30, dead: 24 });
        assert_eq!(candidate_totals(&[]), CandidateTotals::default());
    }

    #[test]
    fn journal_damage_comes_first_and_tails_by_their_kind() {
        let mut rep = FsckReport { errors: vec!["other".into()], ..Default::default() };
        let f = JournalFindings { damaged: vec!["seg 1".into()], tails: vec![("torn".into(), false), ("bad".into(), true)] };
        assert!(f.is_damaged());
        f.add_to(&mut rep, false);
        assert!(rep.errors[0].starts_with("seg 1; the volume will not mount until `cairn fsck --salvage-journal`"), "{:?}", rep.errors);
        assert_eq!(&rep.errors[1..], ["other", "bad"]);
        assert_eq!(rep.warnings, ["torn"]);
        let mut rep = FsckReport::default();
        JournalFindings { damaged: vec!["seg 2".into()], tails: vec![] }.add_to(&mut rep, true);
        assert!(rep.errors[0].starts_with("seg 2; salvaged:"), "{:?}", rep.errors);
    }

    #[test]
    fn cleaner_prices_default_by_place_and_storage_is_priced() {
        assert_eq!(cleaner_prices(None, true).unwrap().name, Prices::aws().name);
        assert_eq!(cleaner_prices(None, false).unwrap().name, Prices::local_disk().name);
        assert_eq!(cleaner_prices(Some("coral"), false).unwrap().name, Prices::load("coral").unwrap().name);
        assert!(cleaner_prices(Some("/nonexistent/prices.toml"), true).is_err());
        let prices = Prices::aws();
        let month_of_a_gb = (crate::cost::GB * crate::cost::MONTH_SECS) as u64;
        let bill = crate::cost::price(&[], &prices, None);
        assert_eq!(bill.storage_cost(), 0.0);
        let bill = crate::cost::Bill { live_byte_seconds: month_of_a_gb, dead_byte_seconds: month_of_a_gb, ..bill };
        assert!((bill.storage_cost() - 2.0 * prices.storage_per_gb_month).abs() < 1e-9);
    }

    #[test]
    fn init_picks_the_pack_size_by_place() {
        use crate::config::default_pack_target;
        assert_eq!(default_pack_target("/srv/vol"), 32 << 20);
        assert_eq!(default_pack_target("s3://bucket/prefix"), 16 << 20);
        assert_eq!(default_pack_target("tape-emu:/tmp/t"), 64 << 20);
        assert_eq!(default_pack_target("tape:/dev/nst0"), 64 << 20);
    }
}
