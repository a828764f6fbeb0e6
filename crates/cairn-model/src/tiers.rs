//! Storage tiers and the placement rule (docs/tiers.md §1, §4, §5): a
//! price sheet per storage class ([`TierSheet`], AWS us-east-1 list
//! prices by default), and the pure rule that decides where a pack's or a
//! chunk's bytes should live ([`decide`]): the expected cost over a
//! horizon in each candidate class, the cost of the move, the latency
//! guard, and pins. The simulator (`cairn sim --tier-policies`) prices
//! with it; the engine's planner will reuse it for its live decisions.
//!
//! Every figure of [`TierSheet::aws`] is a list price of Amazon S3 in
//! us-east-1 (first 50 TB), as published on aws.amazon.com/s3/pricing and
//! restated (checked 2026-12-07) by costnimbus.com's "S3 storage classes
//! cost guide" (March 2026), usage.ai's "Glacier and Deep Archive pricing"
//! (May 2026) and AWS re:Post "s3-manage-data-retrieval" (restore request
//! fees); the API documentation of PutBucketIntelligentTieringConfiguration
//! for the 128 KB monitoring threshold. Glacier Instant Retrieval's row
//! (storage $0.004, 90 days, 128 KB minimum: cloudcostkit.com's "S3
//! Glacier pricing" guide, updated 2026-06-18 against the AWS page; PUT
//! $0.02 and GET $0.01 per 1,000, retrieval $0.03/GB: the AWS page's
//! Instant Retrieval rows). The tape sheet is an estimate, not
//! a list price (docs/tiers.md §1).

use serde::{Deserialize, Serialize};

/// A gigabyte as S3 bills it (2^30 bytes).
const GB: f64 = (1u64 << 30) as f64;
/// Days in a billing month (365 / 12).
pub const DAYS_PER_MONTH: f64 = 365.0 / 12.0;

/// A storage class a pack can live in, warmest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Class {
    #[serde(rename = "STANDARD")]
    Standard,
    #[serde(rename = "STANDARD_IA")]
    StandardIa,
    /// Glacier Instant Retrieval: archive storage read at once, billed
    /// per GB read.
    #[serde(rename = "GLACIER_IR")]
    GlacierIr,
    #[serde(rename = "GLACIER")]
    Glacier,
    #[serde(rename = "DEEP_ARCHIVE")]
    DeepArchive,
    #[serde(rename = "TAPE")]
    Tape,
}

impl Class {
    /// Every class, warmest first.
    pub const ALL: [Class; 6] = [Class::Standard, Class::StandardIa, Class::GlacierIr, Class::Glacier, Class::DeepArchive, Class::Tape];

    /// The S3 name (`STANDARD`, `STANDARD_IA`, `GLACIER_IR`, `GLACIER`,
    /// `DEEP_ARCHIVE`),
    /// or `TAPE`.
    pub fn name(self) -> &'static str {
        match self {
            Class::Standard => "STANDARD",
            Class::StandardIa => "STANDARD_IA",
            Class::GlacierIr => "GLACIER_IR",
            Class::Glacier => "GLACIER",
            Class::DeepArchive => "DEEP_ARCHIVE",
            Class::Tape => "TAPE",
        }
    }

    /// The class of a name from [`Class::name`] (any case), or of the
    /// docs' tier names (`warm`, `cool`, `cold`, `frozen`, `tape`).
    pub fn parse(s: &str) -> Option<Class> {
        let u = s.to_ascii_uppercase();
        Self::ALL.into_iter().find(|c| c.name() == u).or(match u.as_str() {
            "WARM" | "HOT" => Some(Class::Standard),
            "COOL" | "IA" => Some(Class::StandardIa),
            "ARCHIVE" | "IR" => Some(Class::GlacierIr),
            "COLD" => Some(Class::Glacier),
            "FROZEN" | "DEEP" => Some(Class::DeepArchive),
            _ => None,
        })
    }
}

/// What one class bills (US dollars; GB = 2^30 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierPrices {
    pub storage_per_gb_month: f64,
    /// Bytes deleted or moved out earlier are billed up to this age.
    pub min_days: f64,
    /// Smaller objects are billed as this large.
    pub min_object_bytes: u64,
    /// Bytes each object adds to the bill (Glacier's 40 KB of index).
    pub object_overhead_bytes: u64,
    pub put_per_1000: f64,
    pub get_per_1000: f64,
    /// Per GB read (IA) or restored (Glacier, Deep Archive).
    pub retrieval_per_gb: f64,
    /// Per 1,000 restore requests (or tape mounts).
    pub restore_per_1000: f64,
    /// Hours before a restored object can be read (0: read at once).
    pub restore_hours: f64,
}

impl TierPrices {
    /// Whether a read must first restore the object (and wait).
    pub fn needs_restore(&self) -> bool {
        self.restore_hours > 0.0
    }

    /// The bytes an object of `bytes` is billed as.
    pub fn billable(&self, bytes: u64) -> u64 {
        bytes.max(self.min_object_bytes) + self.object_overhead_bytes
    }

    /// Dollars a day for `bytes` billed bytes.
    pub fn per_day(&self, bytes: f64) -> f64 {
        bytes / GB * self.storage_per_gb_month / DAYS_PER_MONTH
    }

    /// The early-deletion fee of `bytes` leaving at `age_days`.
    pub fn early_deletion(&self, bytes: f64, age_days: f64) -> f64 {
        self.per_day(bytes) * (self.min_days - age_days).max(0.0)
    }

    fn check(&self, what: &str) -> Result<(), String> {
        let all = [self.storage_per_gb_month, self.min_days, self.put_per_1000, self.get_per_1000, self.retrieval_per_gb, self.restore_per_1000, self.restore_hours];
        if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(format!("tiers.{what}: prices, days and hours must be finite and not negative"));
        }
        Ok(())
    }
}

/// S3 Intelligent-Tiering's sheet and published rules (docs/tiers.md §8).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntelligentPrices {
    pub frequent_per_gb_month: f64,
    pub infrequent_per_gb_month: f64,
    pub archive_instant_per_gb_month: f64,
    /// Per 1,000 monitored objects a month.
    pub monitoring_per_1000_month: f64,
    /// Smaller objects are not monitored and stay in the frequent tier.
    pub min_monitored_bytes: u64,
    /// Days without access before the infrequent tier, and the archive
    /// instant access tier.
    pub infrequent_after_days: f64,
    pub archive_after_days: f64,
    pub put_per_1000: f64,
    pub get_per_1000: f64,
}

impl IntelligentPrices {
    /// The GB-month price of an object `idle_days` without access.
    pub fn storage_price(&self, bytes: u64, idle_days: f64) -> f64 {
        if bytes < self.min_monitored_bytes || idle_days < self.infrequent_after_days {
            self.frequent_per_gb_month
        } else if idle_days < self.archive_after_days {
            self.infrequent_per_gb_month
        } else {
            self.archive_instant_per_gb_month
        }
    }
}

fn aws_standard() -> TierPrices {
    TierPrices { storage_per_gb_month: 0.023, min_days: 0.0, min_object_bytes: 0, object_overhead_bytes: 0, put_per_1000: 0.005, get_per_1000: 0.0004, retrieval_per_gb: 0.0, restore_per_1000: 0.0, restore_hours: 0.0 }
}
fn aws_standard_ia() -> TierPrices {
    TierPrices { storage_per_gb_month: 0.0125, min_days: 30.0, min_object_bytes: 128 << 10, object_overhead_bytes: 0, put_per_1000: 0.01, get_per_1000: 0.001, retrieval_per_gb: 0.01, restore_per_1000: 0.0, restore_hours: 0.0 }
}
fn aws_glacier_ir() -> TierPrices {
    // Read at once, like IA, at a quarter of its storage price: the class
    // for data read a few times a year (Intelligent-Tiering's archive
    // instant access tier bills the same $0.004).
    TierPrices { storage_per_gb_month: 0.004, min_days: 90.0, min_object_bytes: 128 << 10, object_overhead_bytes: 0, put_per_1000: 0.02, get_per_1000: 0.01, retrieval_per_gb: 0.03, restore_per_1000: 0.0, restore_hours: 0.0 }
}
fn aws_glacier() -> TierPrices {
    // Standard retrieval (3-5 hours: 4 h taken).
    TierPrices { storage_per_gb_month: 0.0036, min_days: 90.0, min_object_bytes: 0, object_overhead_bytes: 40 << 10, put_per_1000: 0.03, get_per_1000: 0.0004, retrieval_per_gb: 0.01, restore_per_1000: 0.05, restore_hours: 4.0 }
}
fn aws_deep_archive() -> TierPrices {
    // Standard retrieval (within 12 hours).
    TierPrices { storage_per_gb_month: 0.00099, min_days: 180.0, min_object_bytes: 0, object_overhead_bytes: 40 << 10, put_per_1000: 0.05, get_per_1000: 0.0004, retrieval_per_gb: 0.02, restore_per_1000: 0.10, restore_hours: 12.0 }
}
fn tape_estimate() -> TierPrices {
    // An estimate (docs/tiers.md §1): LTO-9 media at about $5/TB over a
    // five-year life plus the library's slots and drive time, $0.0005 per
    // GB-month; a recall is a mount and a locate (about 2 minutes), priced
    // as a request of $0.01 (a drive-minute); no retrieval fee.
    TierPrices { storage_per_gb_month: 0.0005, min_days: 0.0, min_object_bytes: 0, object_overhead_bytes: 0, put_per_1000: 0.0, get_per_1000: 0.0, retrieval_per_gb: 0.0, restore_per_1000: 10.0, restore_hours: 2.0 / 60.0 }
}
fn aws_intelligent() -> IntelligentPrices {
    IntelligentPrices {
        frequent_per_gb_month: 0.023,
        infrequent_per_gb_month: 0.0125,
        archive_instant_per_gb_month: 0.004,
        monitoring_per_1000_month: 0.0025,
        min_monitored_bytes: 128 << 10,
        infrequent_after_days: 30.0,
        archive_after_days: 90.0,
        put_per_1000: 0.005,
        get_per_1000: 0.0004,
    }
}

/// A price sheet per class (TOML: the `[tiers.CLASS]` tables of a price
/// file; a class left out keeps its AWS figures).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSheet {
    #[serde(rename = "STANDARD", default = "aws_standard")]
    pub standard: TierPrices,
    #[serde(rename = "STANDARD_IA", default = "aws_standard_ia")]
    pub standard_ia: TierPrices,
    #[serde(rename = "GLACIER_IR", default = "aws_glacier_ir")]
    pub glacier_ir: TierPrices,
    #[serde(rename = "GLACIER", default = "aws_glacier")]
    pub glacier: TierPrices,
    #[serde(rename = "DEEP_ARCHIVE", default = "aws_deep_archive")]
    pub deep_archive: TierPrices,
    #[serde(rename = "TAPE", default = "tape_estimate")]
    pub tape: TierPrices,
    #[serde(rename = "INTELLIGENT_TIERING", default = "aws_intelligent")]
    pub intelligent: IntelligentPrices,
}

impl Default for TierSheet {
    fn default() -> Self {
        TierSheet::aws()
    }
}

impl TierSheet {
    /// AWS S3 us-east-1 list prices (see the module docs), and the tape
    /// estimate.
    pub fn aws() -> TierSheet {
        TierSheet { standard: aws_standard(), standard_ia: aws_standard_ia(), glacier_ir: aws_glacier_ir(), glacier: aws_glacier(), deep_archive: aws_deep_archive(), tape: tape_estimate(), intelligent: aws_intelligent() }
    }

    /// The sheet of one class.
    pub fn of(&self, c: Class) -> &TierPrices {
        match c {
            Class::Standard => &self.standard,
            Class::StandardIa => &self.standard_ia,
            Class::GlacierIr => &self.glacier_ir,
            Class::Glacier => &self.glacier,
            Class::DeepArchive => &self.deep_archive,
            Class::Tape => &self.tape,
        }
    }

    /// Refuses negative or non-finite figures.
    pub fn check(&self) -> Result<(), String> {
        for c in Class::ALL {
            self.of(c).check(c.name())?;
        }
        let i = &self.intelligent;
        let all = [i.frequent_per_gb_month, i.infrequent_per_gb_month, i.archive_instant_per_gb_month, i.monitoring_per_1000_month, i.infrequent_after_days, i.archive_after_days, i.put_per_1000, i.get_per_1000];
        if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err("tiers.INTELLIGENT_TIERING: prices and days must be finite and not negative".into());
        }
        Ok(())
    }
}

/// A pin (docs/tiers.md §5): `Auto` lets the rule decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pin {
    #[default]
    Auto,
    To(Class),
}

/// What the rule knows of a pack or a chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Item {
    /// Live bytes.
    pub bytes: u64,
    /// Where they are, and for how many days.
    pub class: Class,
    pub age_days: f64,
    /// Reads a month (the EWMA of docs/tiers.md §2).
    pub reads_per_month: f64,
    /// Days since the last access (read or write; None: never).
    pub days_since_access: Option<f64>,
    /// Bytes one read fetches from an instant class.
    pub read_bytes: u64,
    /// Bytes of the object a restore brings back (the whole pack).
    pub object_bytes: u64,
    /// The share of an object's PUT, GET of a move, and per-object
    /// overhead this item bears (1 for a pack; a chunk's bytes over the
    /// pack target for a chunk).
    pub request_share: f64,
    pub pin: Pin,
}

/// The rule's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Days over which a move must pay for itself (`--tier-horizon`).
    pub horizon_days: f64,
    /// No class that needs a restore for data accessed this recently
    /// (`--cold-after`).
    pub cold_after_days: f64,
    /// No move to a colder class for data accessed (read or written) this
    /// recently: fresh data has no read history to judge by.
    pub settle_days: f64,
    /// The classes the volume may use.
    pub candidates: Vec<Class>,
}

impl Default for Rule {
    fn default() -> Self {
        Rule { horizon_days: 90.0, cold_after_days: 30.0, settle_days: 30.0, candidates: vec![Class::Standard, Class::StandardIa, Class::GlacierIr, Class::Glacier, Class::DeepArchive] }
    }
}

/// A decision to move, and the terms behind it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub to: Class,
    /// C(src) - C(to) over the horizon (dollars).
    pub saving: f64,
    pub move_cost: f64,
    /// Made because of a pin, whatever the bill says.
    pub pinned: bool,
}

/// What one read of `it` costs in `c`: a GET and the retrieval of what it
/// fetches; in a class that restores, a restore request and the whole
/// object's retrieval.
pub fn read_cost(sheet: &TierSheet, it: &Item, c: Class) -> f64 {
    let p = sheet.of(c);
    if p.needs_restore() {
        p.get_per_1000 / 1000.0 + p.restore_per_1000 / 1000.0 + p.retrieval_per_gb * it.object_bytes.max(it.bytes) as f64 / GB
    } else {
        p.get_per_1000 / 1000.0 + p.retrieval_per_gb * it.read_bytes as f64 / GB
    }
}

/// C(c) over `days`: the expected cost of keeping `it` in `c` (storage
/// of its billable bytes, and the reads at the item's rate). A class's
/// minimum object size applies to whole objects (`request_share` 1), not
/// to a chunk that will share a pack.
pub fn keep_cost_over(sheet: &TierSheet, it: &Item, c: Class, days: f64) -> f64 {
    let p = sheet.of(c);
    let bytes = if it.request_share >= 1.0 { it.bytes.max(p.min_object_bytes) } else { it.bytes };
    let billed = bytes as f64 + p.object_overhead_bytes as f64 * it.request_share.min(1.0);
    p.per_day(billed) * days + it.reads_per_month * days / DAYS_PER_MONTH * read_cost(sheet, it, c)
}

/// The window a move to `c` is judged over: the horizon, or longer when
/// the destination's minimum duration (or the source's, for a move up) is
/// longer, so that a class is never judged on less time than it bills.
pub fn window(sheet: &TierSheet, rule: &Rule, it: &Item, c: Class) -> f64 {
    rule.horizon_days.max(sheet.of(c).min_days).max(sheet.of(it.class).min_days)
}

/// C(c) over the window of a move to `c` ([`window`]).
pub fn keep_cost(sheet: &TierSheet, rule: &Rule, it: &Item, c: Class, to: Class) -> f64 {
    keep_cost_over(sheet, it, c, window(sheet, rule, it, to))
}

/// The cost of moving `it` to `c`: reading it at the source (a GET, its
/// retrieval, a restore request where one is needed), its PUT at the
/// destination, and the early-deletion fee at the source.
pub fn move_cost(sheet: &TierSheet, it: &Item, c: Class) -> f64 {
    let (s, d) = (sheet.of(it.class), sheet.of(c));
    let b = it.bytes as f64;
    (s.get_per_1000 + s.restore_per_1000 + d.put_per_1000) / 1000.0 * it.request_share + s.retrieval_per_gb * b / GB + s.early_deletion(b, it.age_days)
}

/// Whether `it` may move to `c` under the latency guard (no class that
/// restores for data accessed within `cold_after_days`) and the settling
/// time (nothing colder for data accessed within `settle_days`).
pub fn allowed(sheet: &TierSheet, rule: &Rule, it: &Item, c: Class) -> bool {
    let recent = |days: f64| it.days_since_access.is_some_and(|d| d < days);
    !(sheet.of(c).needs_restore() && recent(rule.cold_after_days)) && !(c > it.class && recent(rule.settle_days))
}

/// Where `it` should go, or None to stay (docs/tiers.md §4): a pin wins;
/// otherwise the allowed candidate with the largest net saving
/// C(src) - C(t) - C_move(t) over the move's [`window`], if that is
/// positive (ties: the warmer).
pub fn decide(sheet: &TierSheet, rule: &Rule, it: &Item) -> Option<Decision> {
    if let Pin::To(c) = it.pin {
        return (c != it.class).then(|| Decision { to: c, saving: keep_cost(sheet, rule, it, it.class, c) - keep_cost(sheet, rule, it, c, c), move_cost: move_cost(sheet, it, c), pinned: true });
    }
    let mut best: Option<(f64, Decision)> = None;
    for &c in &rule.candidates {
        if c == it.class || !allowed(sheet, rule, it, c) {
            continue;
        }
        let saving = keep_cost(sheet, rule, it, it.class, c) - keep_cost(sheet, rule, it, c, c);
        let cost = move_cost(sheet, it, c);
        let net = saving - cost;
        if net > 0.0 && saving > cost && best.as_ref().is_none_or(|(n, d)| net > *n || (net == *n && c < d.to)) {
            best = Some((net, Decision { to: c, saving, move_cost: cost, pinned: false }));
        }
    }
    best.map(|(_, d)| d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MB: u64 = 1 << 20;

    fn item(class: Class, reads: f64, since: Option<f64>) -> Item {
        Item { bytes: 16 * MB, class, age_days: 200.0, reads_per_month: reads, days_since_access: since, read_bytes: MB, object_bytes: 16 * MB, request_share: 1.0, pin: Pin::Auto }
    }

    #[test]
    fn the_aws_sheet_is_ordered_cold_is_cheap_to_keep_and_dear_to_read() {
        let s = TierSheet::aws();
        s.check().unwrap();
        let it = item(Class::Standard, 0.0, None);
        let classes = [Class::Standard, Class::StandardIa, Class::GlacierIr, Class::Glacier, Class::DeepArchive];
        for w in classes.windows(2) {
            assert!(s.of(w[0]).storage_per_gb_month > s.of(w[1]).storage_per_gb_month, "{w:?}");
            assert!(read_cost(&s, &it, w[0]) <= read_cost(&s, &it, w[1]), "{w:?}");
        }
        assert_eq!(s.of(Class::DeepArchive).min_days, 180.0);
        assert_eq!(s.intelligent.storage_price(64 << 10, 400.0), 0.023, "small objects stay frequent");
        assert_eq!(s.intelligent.storage_price(MB, 31.0), 0.0125);
        assert_eq!(s.intelligent.storage_price(MB, 90.0), 0.004);
    }

    #[test]
    fn data_never_read_goes_deep_data_read_daily_stays() {
        let (s, r) = (TierSheet::aws(), Rule::default());
        assert_eq!(decide(&s, &r, &item(Class::Standard, 0.0, Some(200.0))).map(|d| d.to), Some(Class::DeepArchive));
        assert_eq!(decide(&s, &r, &item(Class::Standard, 30.0, Some(0.5))), None);
        // Read last week: nothing colder, whatever the rate; read 40 days
        // ago with a --cold-after of 60: no class that restores, so the
        // coldest instant one (Glacier Instant Retrieval), or IA when the
        // volume may not use it.
        assert_eq!(decide(&s, &r, &item(Class::Standard, 0.0, Some(7.0))), None);
        let r60 = Rule { cold_after_days: 60.0, ..Rule::default() };
        assert_eq!(decide(&s, &r60, &item(Class::Standard, 0.0, Some(40.0))).map(|d| d.to), Some(Class::GlacierIr));
        let no_ir = Rule { candidates: vec![Class::Standard, Class::StandardIa, Class::Glacier, Class::DeepArchive], ..r60 };
        assert_eq!(decide(&s, &no_ir, &item(Class::Standard, 0.0, Some(40.0))).map(|d| d.to), Some(Class::StandardIa));
        // Read often from Deep Archive: up again.
        let d = decide(&s, &r, &item(Class::DeepArchive, 60.0, Some(1.0))).unwrap();
        assert_eq!(d.to, Class::Standard);
        assert!(d.saving > d.move_cost);
    }

    #[test]
    fn early_deletion_is_part_of_the_move() {
        let s = TierSheet::aws();
        let mut it = item(Class::DeepArchive, 0.0, None);
        it.age_days = 30.0;
        let fee = s.deep_archive.per_day(it.bytes as f64) * 150.0;
        let read = s.deep_archive.retrieval_per_gb * it.bytes as f64 / GB;
        let req = (s.deep_archive.get_per_1000 + s.deep_archive.restore_per_1000 + s.standard.put_per_1000) / 1000.0;
        assert!((move_cost(&s, &it, Class::Standard) - (fee + read + req)).abs() < 1e-12);
        it.age_days = 400.0;
        assert!((move_cost(&s, &it, Class::Standard) - (read + req)).abs() < 1e-12);
    }

    fn any_class() -> impl Strategy<Value = Class> {
        prop::sample::select(vec![Class::Standard, Class::StandardIa, Class::GlacierIr, Class::Glacier, Class::DeepArchive])
    }

    fn any_item() -> impl Strategy<Value = Item> {
        (any_class(), 1u64..(64 * MB), 0.0f64..400.0, 0.0f64..100.0, prop::option::of(0.0f64..400.0), 1u64..(4 * MB), 0.01f64..1.0).prop_map(|(class, bytes, age, reads, since, rb, share)| Item {
            bytes,
            class,
            age_days: age,
            reads_per_month: reads,
            days_since_access: since,
            read_bytes: rb.min(bytes),
            object_bytes: 16 * MB,
            request_share: share,
            pin: Pin::Auto,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Never a move whose cost exceeds its saving.
        #[test]
        fn no_move_at_a_loss(it in any_item(), horizon in 1.0f64..365.0, cold in 0.0f64..90.0) {
            let s = TierSheet::aws();
            let r = Rule { horizon_days: horizon, cold_after_days: cold, ..Rule::default() };
            if let Some(d) = decide(&s, &r, &it) {
                prop_assert!(!d.pinned);
                prop_assert!(d.saving > d.move_cost, "{d:?}");
                prop_assert!(allowed(&s, &r, &it, d.to));
                prop_assert!((d.saving - (keep_cost(&s, &r, &it, it.class, d.to) - keep_cost(&s, &r, &it, d.to, d.to))).abs() < 1e-12);
            }
        }

        /// A pin always wins.
        #[test]
        fn a_pin_always_wins(mut it in any_item(), to in any_class()) {
            it.pin = Pin::To(to);
            let d = decide(&TierSheet::aws(), &Rule::default(), &it);
            prop_assert_eq!(d.map(|d| d.to), (to != it.class).then_some(to));
            prop_assert!(d.is_none_or(|d| d.pinned));
        }

        /// More reads never move data colder.
        #[test]
        fn monotone_in_read_rate(it in any_item(), more in 0.0f64..100.0) {
            let (s, r) = (TierSheet::aws(), Rule::default());
            let at = |reads: f64| decide(&s, &r, &Item { reads_per_month: reads, ..it }).map_or(it.class, |d| d.to);
            let (low, high) = (at(it.reads_per_month), at(it.reads_per_month + more));
            prop_assert!(high <= low, "{} reads: {low:?}, {} reads: {high:?}", it.reads_per_month, it.reads_per_month + more);
        }
    }
}
