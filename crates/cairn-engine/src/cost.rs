//! The bill of a volume in a bucket (issue 14, docs/cloud.md §6): what the
//! bucket served, counted per request by the backend's
//! [`Meter`](cairn_backend::Meter) (by subsystem and request kind, with
//! payload bytes), stored byte-seconds of packs (live and dead), kept in the
//! `bill` table of the metadata (so it ships with it), and priced by a
//! [`Prices`] table.
//!
//! When counts are saved:
//! - in the metadata shipper's round, before the changes are taken, when
//!   the round has other changes to ship, or when the bill was last saved
//!   [`BILL_EVERY`] ago (so an idle mount does not publish a metadata
//!   version, itself a billed PUT, every interval just for its bill);
//! - what no metadata version holds (every request of a read-only mount,
//!   and what a read-write one made after its last version: that
//!   version's upload, the lease's release) goes into the mount's own bill
//!   object in the bucket, `bills/<mount id>.json`, rewritten with its
//!   cumulative rows at unmount and, by a read-only mount, every
//!   [`BILL_OBJECT_EVERY`] (issue 25: `cairn cost` on another machine
//!   missed what a reading machine spent). `cairn cost` adds every bill
//!   object to the table's rows. The last write, at unmount, marks the
//!   object `ended`; a read-write open folds the ended objects of other
//!   mounts into one, `bills/folded.json` ([`fold_bills`]), so they do not
//!   pile up;
//! - only if that upload fails, and for commands that do not open the
//!   volume (`init`, `meta list`, `meta restore`), the rows go to
//!   `DIR/bill-pending.jsonl` in the local directory, which `cairn cost`
//!   reads too and the next read-write open folds into the table.
//!
//! Stored bytes accrue from `info.bill_storage_at` to the time of each
//! save: the packs table's bytes (dead: `dead_bytes`) times the seconds,
//! split by day. Unmounted time counts too (the bucket bills it), since the
//! next save starts where the last ended.

use crate::error::{Error, Result};
use crate::meta::BillRow;
use cairn_backend::meter::{RequestCounts, RequestKind, Subsystem};
use cairn_backend::Backend;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The price list lives in `cairn-model`, shared with the simulator.
pub use cairn_model::prices::{PriceError, Prices, RequestPrices, GB, MONTH_SECS};

/// The subsystem name of stored bytes in the bill.
pub const STORAGE: &str = "storage";
/// An idle mount saves its bill (and so ships a metadata version) at most
/// this often.
pub const BILL_EVERY: Duration = Duration::from_secs(600);
/// Counts saved outside the metadata, one JSON array of rows a line.
pub const PENDING_FILE: &str = "bill-pending.jsonl";
/// Where each mount's bill object lives in the bucket (format.md "Bills").
pub const BILLS_PREFIX: &str = "bills/";
/// A read-only mount rewrites its bill object at most this often (when it
/// made requests since), and at unmount.
pub const BILL_OBJECT_EVERY: Duration = Duration::from_secs(300);
/// A bill object larger than this is not read (it is not one of ours).
const BILL_OBJECT_MAX: u64 = 4 << 20;
/// The object the ended mounts' bill objects are folded into (format.md
/// "Bills").
pub const FOLDED_BILL: &str = "bills/folded.json";
/// The folded object grows by a row per (day, subsystem, item): read up
/// to this size.
const FOLDED_MAX: u64 = 64 << 20;

/// A mount's bill object (JSON).
#[derive(Serialize, Deserialize)]
pub(crate) struct BillObject {
    pub(crate) format: String,
    pub(crate) host: String,
    pub(crate) dir: String,
    /// Seconds since the epoch.
    pub(crate) written: i64,
    /// Written by the mount's unmount: the object never changes again and
    /// may be folded. Absent in objects of older versions (never folded).
    #[serde(default)]
    pub(crate) ended: bool,
    /// Every request the mount counted that no metadata version holds,
    /// this object's own upload included.
    pub(crate) rows: Vec<BillRow>,
}

/// The folded bill object (JSON): the sum of the ended mounts' bill
/// objects it absorbed, and their names. A reader counts its rows and
/// skips every bill object it names, so a bill object left behind by a
/// fold that stopped between writing this and deleting it is not counted
/// twice.
#[derive(Serialize, Deserialize, Default)]
struct FoldedBill {
    format: String,
    /// Seconds since the epoch.
    written: i64,
    /// Names of bill objects whose rows are in `rows` and that may still
    /// exist (each is deleted after this object is written; a name is
    /// dropped once its object is gone).
    absorbed: Vec<String>,
    rows: Vec<BillRow>,
}

const FOLDED_FORMAT: &str = "cairn-bill-folded-1";

/// The folded object and its tag (None: there is none yet).
fn read_folded(remote: &dyn Backend, size: u64) -> Result<(FoldedBill, Option<String>)> {
    if size > FOLDED_MAX {
        return Err(Error::corrupt(format!("{FOLDED_BILL}: {size} bytes, more than a folded bill holds")));
    }
    let (bytes, tag) = if remote.conditional_updates() {
        let (b, t) = remote.get_tagged(FOLDED_BILL)?;
        (b, Some(t))
    } else {
        (remote.get(FOLDED_BILL)?, None)
    };
    let f: FoldedBill = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(format!("{FOLDED_BILL}: {e}")))?;
    if f.format != FOLDED_FORMAT {
        return Err(Error::corrupt(format!("{FOLDED_BILL}: unknown format {:?}", f.format)));
    }
    Ok((f, tag))
}

fn read_bill_object(remote: &dyn Backend, o: &cairn_backend::ObjectInfo) -> Result<BillObject> {
    if o.size > BILL_OBJECT_MAX {
        return Err(Error::corrupt(format!("{} bytes, not a bill object", o.size)));
    }
    let b: BillObject = serde_json::from_slice(&remote.get(&o.name)?).map_err(|e| Error::corrupt(format!("{e}")))?;
    if b.format != "cairn-bill-1" {
        return Err(Error::corrupt(format!("unknown format {:?}", b.format)));
    }
    Ok(b)
}

/// This mount's bill object, as it was last written.
#[derive(Debug, Default)]
pub struct MountBill {
    /// Random per mount: the object's name.
    pub id: String,
    /// The rows the object holds (cumulative).
    pub(crate) rows: Vec<BillRow>,
    /// The object's own last upload: in its rows already, and counted by
    /// the meter after; the next take leaves it out.
    pub(crate) own_put: RequestCounts,
}

impl MountBill {
    pub fn new() -> Self {
        MountBill { id: hex::encode(rand::random::<[u8; 8]>()), ..Default::default() }
    }

    pub(crate) fn object(&self) -> String {
        format!("{BILLS_PREFIX}{}.json", self.id)
    }
}

/// `a` less `b`, per (subsystem, kind), not below zero.
pub fn minus(a: &RequestCounts, b: &RequestCounts) -> RequestCounts {
    let mut out = RequestCounts::default();
    for (s, k, t) in a.iter() {
        let p = b.get(s, k);
        out.add(s, k, t.requests.saturating_sub(p.requests), t.bytes.saturating_sub(p.bytes));
    }
    out
}

/// Adds `more` into `rows`, one row per (day, subsystem, item).
pub(crate) fn merge(rows: &mut Vec<BillRow>, more: Vec<BillRow>) {
    for r in more {
        match rows.iter_mut().find(|x| x.day == r.day && x.subsystem == r.subsystem && x.item == r.item) {
            Some(x) => {
                x.requests += r.requests;
                x.bytes += r.bytes;
            }
            None => rows.push(r),
        }
    }
}

/// The rows of every mount's bill object in the bucket except `except`'s
/// (a mount's own are counted from memory). An object that cannot be read
/// or parsed is skipped with a warning: the bill is then short, not wrong.
pub fn bucket_bills(remote: &dyn Backend, except: Option<&str>) -> Result<Vec<BillRow>> {
    // The bill: reading and folding bills is metadata's work.
    let md = cairn_backend::meter::paying(remote, Subsystem::Metadata);
    let remote: &dyn Backend = &*md;
    let mut out = Vec::new();
    let listed = remote.list(BILLS_PREFIX)?;
    // The folded object first: the objects it absorbed are in its rows.
    let mut absorbed = std::collections::BTreeSet::new();
    if let Some(o) = listed.iter().find(|o| o.name == FOLDED_BILL) {
        match read_folded(remote, o.size) {
            Ok((f, _)) => {
                absorbed.extend(f.absorbed);
                out.extend(f.rows);
            }
            Err(e) => tracing::warn!("{e}; skipped"),
        }
    }
    for o in &listed {
        if o.name == FOLDED_BILL || absorbed.contains(&o.name) || except.is_some_and(|id| o.name == format!("{BILLS_PREFIX}{id}.json")) {
            continue;
        }
        match read_bill_object(remote, o) {
            Ok(b) => out.extend(b.rows),
            Err(e) => tracing::warn!("{}: {e}; skipped", o.name),
        }
    }
    Ok(out)
}

/// Folds the bill objects of ended mounts (marked `ended` by their
/// unmount; never `except`'s, the caller's own) into [`FOLDED_BILL`]:
/// first the folded object is written with their rows added and their
/// names in `absorbed`, then they are deleted. A crash in between leaves
/// objects the folded one names, which readers skip and the next fold
/// deletes. The folded object is replaced with a conditional update, so
/// two folds at once cannot lose each other's rows (the loser gives up);
/// on a store without conditional updates nothing is folded. Returns how
/// many objects were folded.
pub fn fold_bills(remote: &dyn Backend, except: Option<&str>) -> Result<usize> {
    // The bill: reading and folding bills is metadata's work.
    let md = cairn_backend::meter::paying(remote, Subsystem::Metadata);
    let remote: &dyn Backend = &*md;
    if !remote.conditional_updates() {
        return Ok(0);
    }
    let listed = remote.list(BILLS_PREFIX)?;
    let (folded, tag) = match listed.iter().find(|o| o.name == FOLDED_BILL) {
        Some(o) => read_folded(remote, o.size)?,
        None => (FoldedBill { format: FOLDED_FORMAT.into(), ..Default::default() }, None),
    };
    let names: std::collections::BTreeSet<&str> = listed.iter().map(|o| o.name.as_str()).collect();
    // Absorbed objects still there: a fold stopped before deleting them.
    let mut gone: Vec<String> = folded.absorbed.iter().filter(|n| names.contains(n.as_str())).cloned().collect();
    let mut rows = folded.rows;
    let mut new = Vec::new();
    for o in &listed {
        if o.name == FOLDED_BILL || folded.absorbed.contains(&o.name) || except.is_some_and(|id| o.name == format!("{BILLS_PREFIX}{id}.json")) {
            continue;
        }
        match read_bill_object(remote, o) {
            Ok(b) if b.ended => {
                merge(&mut rows, b.rows);
                new.push(o.name.clone());
            }
            Ok(_) => {} // a live mount's (or a crashed one's): it may still change
            Err(e) => tracing::warn!("{}: {e}; not folded", o.name),
        }
    }
    if !new.is_empty() {
        gone.extend(new.iter().cloned());
        let next = FoldedBill { format: FOLDED_FORMAT.into(), written: now_secs(), absorbed: gone.clone(), rows };
        let bytes = serde_json::to_vec(&next).expect("bill serialises");
        let put = match &tag {
            Some(t) => remote.put_if_match(FOLDED_BILL, &bytes, t).map(|_| ()),
            None => remote.put_if_absent(FOLDED_BILL, &bytes),
        };
        match put {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), cairn_backend::ErrorKind::Changed | cairn_backend::ErrorKind::AlreadyExists) => {
                tracing::info!("another fold of the bill objects ran meanwhile; this one gives up");
                return Ok(0);
            }
            Err(e) => return Err(Error::from(e).context(format_args!("writing {FOLDED_BILL}"))),
        }
    }
    for n in &gone {
        match remote.delete(n) {
            Ok(()) => {}
            Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::from(e).context(format_args!("deleting the folded bill object {n}"))),
        }
    }
    Ok(new.len())
}

const SECS_PER_DAY: i64 = 86_400;

/// Seconds since the epoch.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// The unix day (UTC) of a time in seconds since the epoch.
pub fn unix_day(secs: i64) -> i64 {
    secs.div_euclid(SECS_PER_DAY)
}

/// The unix day of a date `YYYY-MM-DD` (UTC).
pub fn parse_day(s: &str) -> Result<i64> {
    let bad = || Error::invalid(format!("{s:?} is not a date YYYY-MM-DD"));
    let mut it = s.trim().splitn(3, '-');
    let (y, m, d) = (it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?);
    let (y, m, d): (i64, i64, i64) = (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?, d.parse().map_err(|_| bad())?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    // Days from civil (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let day = era * 146_097 + doe - 719_468;
    if show_day(day) != format!("{:04}-{:02}-{:02}", if m <= 2 { y + 1 } else { y }, m, d) {
        return Err(bad()); // e.g. 2026-02-30, or before 1970
    }
    Ok(day)
}

/// `YYYY-MM-DD` of a unix day (days before 1970 show as 1970-01-01).
pub fn show_day(day: i64) -> String {
    crate::types::format_utc(day.max(0) as u64 * SECS_PER_DAY as u64)[..10].to_string()
}

/// Rows of `counts`, all on `day`.
pub fn rows_of(counts: &RequestCounts, day: i64) -> Vec<BillRow> {
    counts
        .iter()
        .map(|(s, k, t)| BillRow { day, subsystem: s.name().to_string(), item: k.name().to_string(), requests: t.requests, bytes: t.bytes })
        .collect()
}

/// Stored byte-seconds of `live` and `dead` bytes from `from` to `to`
/// (seconds since the epoch), one row per day and kind.
pub fn storage_rows(from: i64, to: i64, live: u64, dead: u64) -> Vec<BillRow> {
    let mut out = Vec::new();
    let mut t = from;
    while t < to {
        let day = unix_day(t);
        let end = ((day + 1) * SECS_PER_DAY).min(to);
        let secs = (end - t) as u64;
        for (item, bytes) in [("live", live), ("dead", dead)] {
            if bytes > 0 {
                out.push(BillRow { day, subsystem: STORAGE.into(), item: item.into(), requests: 0, bytes: bytes.saturating_mul(secs) });
            }
        }
        t = end;
    }
    out
}

pub(crate) fn pending_path(dir: &Path) -> PathBuf {
    dir.join(PENDING_FILE)
}

/// Appends rows to the local directory's pending bill (fsync'd).
pub fn append_pending(dir: &Path, rows: &[BillRow]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let p = pending_path(dir);
    let mut line = serde_json::to_vec(rows).expect("rows serialise");
    line.push(b'\n');
    let w = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).mode(crate::fsutil::PRIVATE_FILE).open(&p)?;
        // One write: concurrent appenders (read-only commands) never interleave.
        f.write_all(&line)?;
        f.sync_data()
    };
    w().map_err(|e| Error::os(format_args!("writing {}", p.display()), &e))
}

/// The rows of the local directory's pending bill (a torn last line, from
/// a crash while appending, is skipped).
pub fn read_pending(dir: &Path) -> Result<Vec<BillRow>> {
    let p = pending_path(dir);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::os(format_args!("reading {}", p.display()), &e)),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<Vec<BillRow>>(line) {
            Ok(rows) => out.extend(rows),
            Err(e) => tracing::warn!("{} line {}: {e}; skipped", p.display(), i + 1),
        }
    }
    Ok(out)
}

/// Saves what `remote` counted that nobody saved yet (a command that made
/// requests without opening the volume: `meta list`, `meta restore`,
/// `init`) into the pending bill of the volume's local directory `dir`.
pub fn save_unsaved(dir: &Path, remote: &dyn Backend) -> Result<()> {
    let Some(m) = remote.meter() else { return Ok(()) };
    let counts = m.take();
    let r = append_pending(dir, &rows_of(&counts, unix_day(now_secs())));
    if r.is_err() {
        m.add(&counts);
    }
    r
}

/// One line of a bill.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BillItem {
    /// `GET requests`, ..., `transfer up`, `transfer down`, `storage live`, `storage dead`.
    pub item: String,
    /// Requests, GB, or GB-months.
    pub quantity: f64,
    /// `requests`, `GB`, `GB-months`.
    pub unit: String,
    /// Dollars per unit (per request: the price of 1,000 divided by 1,000).
    pub unit_price: f64,
    pub cost: f64,
}

/// What one subsystem spent (requests and transfer; storage is nobody's).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SubsystemBill {
    pub subsystem: String,
    /// Requests by kind.
    pub requests: BTreeMap<String, u64>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub cost: f64,
}

/// A priced bill.
#[derive(Clone, Debug, Serialize)]
pub struct Bill {
    pub prices: Prices,
    /// The first day counted (`YYYY-MM-DD`), or None: since the volume began counting.
    pub since: Option<String>,
    /// Requests by kind, over every subsystem.
    pub requests: BTreeMap<String, u64>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Stored byte-seconds.
    pub live_byte_seconds: u64,
    pub dead_byte_seconds: u64,
    pub items: Vec<BillItem>,
    pub subsystems: Vec<SubsystemBill>,
    pub total: f64,
}

/// Prices usage rows.
pub fn price(rows: &[BillRow], prices: &Prices, since: Option<i64>) -> Bill {
    let mut counts = RequestCounts::default();
    let (mut live, mut dead) = (0u64, 0u64);
    for r in rows {
        if r.subsystem == STORAGE {
            match r.item.as_str() {
                "live" => live = live.saturating_add(r.bytes),
                "dead" => dead = dead.saturating_add(r.bytes),
                _ => {}
            }
        } else if let (Some(s), Some(k)) = (Subsystem::from_name(&r.subsystem), RequestKind::from_name(&r.item)) {
            counts.add(s, k, r.requests, r.bytes);
        }
    }
    let per = |k: RequestKind| prices.per_1000_requests.of(k) / 1000.0;
    let gb = |b: u64| b as f64 / GB;
    let mut items = Vec::new();
    let mut requests = BTreeMap::new();
    let (mut up, mut down) = (0u64, 0u64);
    for k in RequestKind::ALL {
        let t = counts.total(k);
        requests.insert(k.name().to_string(), t.requests);
        if k.uploads() {
            up += t.bytes;
        } else {
            down += t.bytes;
        }
        items.push(BillItem { item: format!("{} requests", k.name()), quantity: t.requests as f64, unit: "requests".into(), unit_price: per(k), cost: t.requests as f64 * per(k) });
    }
    for (item, bytes, p) in [("transfer up", up, prices.transfer_up_per_gb), ("transfer down", down, prices.transfer_down_per_gb)] {
        items.push(BillItem { item: item.into(), quantity: gb(bytes), unit: "GB".into(), unit_price: p, cost: gb(bytes) * p });
    }
    for (item, bs) in [("storage live", live), ("storage dead", dead)] {
        let months = bs as f64 / GB / MONTH_SECS;
        items.push(BillItem { item: item.into(), quantity: months, unit: "GB-months".into(), unit_price: prices.storage_per_gb_month, cost: months * prices.storage_per_gb_month });
    }
    let subsystems = Subsystem::ALL
        .into_iter()
        .map(|s| {
            let mut b = SubsystemBill { subsystem: s.name().into(), ..Default::default() };
            for k in RequestKind::ALL {
                let t = counts.get(s, k);
                b.requests.insert(k.name().into(), t.requests);
                if k.uploads() {
                    b.bytes_up += t.bytes;
                } else {
                    b.bytes_down += t.bytes;
                }
                b.cost += t.requests as f64 * per(k);
            }
            b.cost += gb(b.bytes_up) * prices.transfer_up_per_gb + gb(b.bytes_down) * prices.transfer_down_per_gb;
            b
        })
        .collect();
    let total = items.iter().map(|i| i.cost).sum();
    Bill { prices: prices.clone(), since: since.map(show_day), requests, bytes_up: up, bytes_down: down, live_byte_seconds: live, dead_byte_seconds: dead, items, subsystems, total }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(subsystem: &str, item: &str, requests: u64, bytes: u64) -> BillRow {
        BillRow { day: 20_000, subsystem: subsystem.into(), item: item.into(), requests, bytes }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    /// Requests at the per-1,000 prices, transfer and storage per GB(-month),
    /// each subsystem's share, the total: worked by hand.
    #[test]
    fn the_aws_bill_by_hand() {
        let rows = vec![
            row("write", "PUT", 2_000, 3 << 30), // 3 GB up
            row("write", "POST", 10, 0),
            row("read_miss", "GET", 10_000, 2 << 30), // 2 GB down
            row("read_miss", "HEAD", 1_000, 0),
            row("metadata", "LIST", 1_000, 0),
            row("gc", "DELETE", 500, 0),
            row("metadata", "PUT", 1_000, 1 << 20),
            // 1 GB for a whole month live, 0.5 GB for a month dead
            BillRow { day: 20_000, subsystem: STORAGE.into(), item: "live".into(), requests: 0, bytes: (GB * MONTH_SECS) as u64 },
            BillRow { day: 20_000, subsystem: STORAGE.into(), item: "dead".into(), requests: 0, bytes: (GB / 2.0 * MONTH_SECS) as u64 },
        ];
        let b = price(&rows, &Prices::aws(), None);
        assert_eq!(b.requests["PUT"], 3_000);
        assert_eq!((b.requests["GET"], b.requests["HEAD"], b.requests["POST"], b.requests["LIST"], b.requests["DELETE"]), (10_000, 1_000, 10, 1_000, 500));
        let item = |n: &str| b.items.iter().find(|i| i.item == n).unwrap().cost;
        assert!(close(item("PUT requests"), 3.0 * 0.005));
        assert!(close(item("POST requests"), 0.01 * 0.005));
        assert!(close(item("GET requests"), 10.0 * 0.0004));
        assert!(close(item("HEAD requests"), 0.0004));
        assert!(close(item("LIST requests"), 0.005));
        assert_eq!(item("DELETE requests"), 0.0);
        assert!(close(item("transfer up"), 0.0), "transfer in is free");
        assert!(close(item("transfer down"), 2.0 * 0.09));
        assert!(close(item("storage live"), 0.023));
        assert!(close(item("storage dead"), 0.5 * 0.023));
        let want = 0.015 + 0.00005 + 0.004 + 0.0004 + 0.005 + 0.18 + 0.023 + 0.0115;
        assert!(close(b.total, want), "{} != {want}", b.total);
        let sub = |n: &str| b.subsystems.iter().find(|s| s.subsystem == n).unwrap();
        assert!(close(sub("write").cost, 2.0 * 0.005 + 0.01 * 0.005));
        assert_eq!(sub("write").bytes_up, 3 << 30);
        assert!(close(sub("read_miss").cost, 0.004 + 0.0004 + 0.18));
        assert!(close(sub("metadata").cost, 0.005 + 0.005));
        assert_eq!(sub("gc").cost, 0.0);
        // Storage belongs to no subsystem: the subsystems add up to the rest.
        let subs: f64 = b.subsystems.iter().map(|s| s.cost).sum();
        assert!(close(subs + 0.023 + 0.0115, b.total));
    }

    /// Coral's table 1 (Amazon): $5e-6 an up request, $4e-7 a down one,
    /// $0.12/GB down, $0.095/GB-month.
    #[test]
    fn the_coral_table() {
        let rows = vec![row("write", "PUT", 1, 0), row("read_miss", "GET", 1, 1 << 30), BillRow { day: 1, subsystem: STORAGE.into(), item: "live".into(), requests: 0, bytes: (GB * MONTH_SECS) as u64 }];
        let b = price(&rows, &Prices::coral(), None);
        let item = |n: &str| b.items.iter().find(|i| i.item == n).unwrap().cost;
        assert!(close(item("PUT requests"), 5e-6));
        assert!(close(item("GET requests"), 4e-7));
        assert!(close(item("transfer down"), 0.12));
        assert!(close(item("storage live"), 0.095));
        assert!(close(b.total, 5e-6 + 4e-7 + 0.12 + 0.095));
    }

    #[test]
    fn a_price_table_of_its_own_prices_a_bill() {
        // Parsing, the presets and files: cairn_model::prices's tests.
        let mut p = Prices::aws();
        p.per_1000_requests.put = 0.0025;
        p.transfer_up_per_gb = 0.01;
        let b = price(&[row("write", "PUT", 1000, 1 << 30)], &p, None);
        assert!(close(b.total, 0.0025 + 0.01));
    }

    #[test]
    fn storage_splits_by_day_and_dates_round_trip() {
        let d = 20_000 * SECS_PER_DAY;
        let rows = storage_rows(d - 100, d + 50, 10, 1);
        assert_eq!(rows.len(), 4);
        assert_eq!((rows[0].day, rows[0].bytes, rows[1].bytes), (19_999, 1_000, 100));
        assert_eq!((rows[2].day, rows[2].bytes, rows[3].bytes), (20_000, 500, 50));
        assert!(storage_rows(d, d, 10, 1).is_empty());
        assert_eq!(storage_rows(d, d + 10, 0, 0), vec![]);
        assert_eq!(show_day(0), "1970-01-01");
        assert_eq!(parse_day("1970-01-01").unwrap(), 0);
        for day in [0, 59, 365 * 30, 11_016, 20_000, 20_454, 2_932_896] {
            assert_eq!(parse_day(&show_day(day)).unwrap(), day);
        }
        assert_eq!(show_day(unix_day(1_795_000_000)), "2026-11-18");
        assert_eq!(parse_day("2000-02-29").unwrap(), 11_016);
        for bad in ["2026-02-30", "2026-13-01", "2026-1", "yesterday", "2026-00-10", "1969-12-31"] {
            assert!(parse_day(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pending_rows_append_and_survive_a_torn_line() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_pending(d.path()).unwrap().is_empty());
        append_pending(d.path(), &[row("write", "PUT", 1, 2)]).unwrap();
        append_pending(d.path(), &[row("other", "GET", 3, 4), row("metadata", "DELETE", 1, 0)]).unwrap();
        std::fs::OpenOptions::new().append(true).open(d.path().join(PENDING_FILE)).unwrap().write_all(b"[{\"day\":1,\"subsys").unwrap();
        let rows = read_pending(d.path()).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(price(&rows, &Prices::aws(), None).requests["GET"], 3);
    }
}
