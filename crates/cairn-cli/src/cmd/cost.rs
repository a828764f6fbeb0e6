//! `cairn cost`: the bill of a volume in a bucket.

use crate::show::money;
use crate::volume::{VolumeArgs, VolumeDir, open_volume};
use crate::{logging, size};
use anyhow::{Context, Result};

/// The bill of a volume in a bucket: requests by kind, transfer up and
/// down, stored bytes (live and dead), priced, and what each subsystem
/// spent.
///
/// Every HTTP request this volume's mounts and commands sent to the bucket
/// is counted as it is sent (failed attempts and retries too; a listing
/// counts a request per page of 1,000 names, a multipart upload its
/// create, each part and its completion), with the bytes of object
/// bodies up and down, by who asked: write (pack uploads), read_miss,
/// prefetch, gc, metadata (metadata versions, the lease, trash) and
/// other (the config object, fsck, commands). Stored bytes accrue by the
/// second, mounted or not: live and dead bytes of the packs the metadata
/// names. The counts live in the volume's metadata, so they survive
/// remounts and ship to the bucket with it; what a mount counts after
/// its last metadata version (that version's own upload, the lease's
/// release) waits in the local directory and ships with the next mount
/// from it.
///
/// A mounted volume answers through its control socket and sends no
/// request for it; an unmounted one is opened read-only, and the
/// requests that takes are counted after this report (the next one shows
/// them). Not counted: the requests of a command that failed before the
/// volume's local directory existed, of a read-only query (`stats`,
/// `cost`, `meta list`, `gc --dry-run`) run on a machine without a local
/// directory of the volume (it works in a temporary one, removed
/// afterwards), metadata versions' storage, and
/// the storage of packs gc trashed that wait for deletion.
#[derive(clap::Args)]
#[command(mut_args(crate::volume::volume_help(Some("s3://BUCKET/PREFIX (or the volume's local directory, or the mountpoint of the volume)"))))]
pub struct CostArgs {
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Count from this day on (YYYY-MM-DD, UTC). Default: everything.
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub since: Option<String>,
    /// The price table. `aws`: AWS S3 Standard in us-east-1, list prices
    /// ($0.023 per GB-month; PUT, COPY, POST, LIST $0.005 per 1,000;
    /// GET, HEAD $0.0004 per 1,000; DELETE free; transfer in free, out
    /// $0.09 per GB). `coral`: seed 004's table 1, Amazon column ($0.095
    /// per GB-month, $0.12 per GB down, $5e-6 a PUT/POST/LIST, $4e-7 a
    /// GET/HEAD). Or a TOML file with the fields `name` (optional),
    /// `storage_per_gb_month`, `transfer_up_per_gb`,
    /// `transfer_down_per_gb` and a table `[per_1000_requests]` with
    /// GET, HEAD, PUT, POST, LIST, DELETE (dollars per 1,000). GB =
    /// 2^30 bytes; a month = 730 hours.
    #[arg(long, default_value = "aws", value_name = "aws|coral|FILE")]
    pub prices: String,
    /// Print as JSON (usage, prices, items, subsystems, total).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CostArgs, verbose: u8) -> Result<i32> {
    let CostArgs { vol: VolumeArgs { volume: dir, cloud, meta, pass }, since, prices, json } = a;
    logging::init(verbose, None)?;
    meta.check()?;
    use cairn_engine::cost;
    // A bad price table or date fails before anything is opened.
    let prices = cost::Prices::load(&prices)?;
    let since_day = since.as_deref().map(cost::parse_day).transpose()?;
    let vd = VolumeDir::query(&dir, &cloud)?;
    let dir = vd.path.clone();
    let sock = cairn_engine::control::socket_path(&dir);
    let rows: Vec<cairn_engine::meta::BillRow> = match cairn_engine::control::call(&sock, &cairn_engine::control::Request::Cost { since_day })? {
        Some(v) => serde_json::from_value(v).context("reading the bill from the mount")?,
        None => {
            let vol = open_volume(&dir, &pass, &meta, true, None)?;
            let rows = vol.bill_usage(since_day, false);
            vol.close()?;
            rows?
        }
    };
    let bill = cost::price(&rows, &prices, since_day);
    if json {
        println!("{}", serde_json::to_string_pretty(&bill)?);
    } else {
        print_bill(&bill);
    }
    Ok(0)
}

/// `cairn cost` for a terminal.
fn print_bill(b: &cairn_engine::cost::Bill) {
    let from = b.since.as_deref().map_or("since counting began".to_string(), |d| format!("from {d}"));
    println!("bill {from}, prices: {}", b.prices.name);
    println!();
    // Few significant digits, no float noise: 0.0004, 2.5e-7.
    let num = |x: f64| {
        if x == 0.0 {
            "0".to_string()
        } else if x.abs() >= 1e-4 {
            let s = format!("{x:.6}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            format!("{x:.3e}")
        }
    };
    println!("{:<18} {:>22} {:>24} {:>14}", "item", "quantity", "unit price", "cost");
    for i in &b.items {
        let (q, p) = match i.unit.as_str() {
            "requests" => (format!("{}", i.quantity as u64), format!("${} per 1,000", num(i.unit_price * 1000.0))),
            // Bytes in binary units, as everywhere else Cairn shows sizes.
            "GB" => (size::human((i.quantity * cairn_engine::cost::GB) as u64), format!("${} per GB", num(i.unit_price))),
            _ => (format!("{}-months", size::human((i.quantity * cairn_engine::cost::GB) as u64)), format!("${} per GB-month", num(i.unit_price))),
        };
        println!("{:<18} {:>22} {:>24} {:>14}", i.item, q, p, money(i.cost));
    }
    println!("{:<18} {:>22} {:>24} {:>14}", "total", "", "", money(b.total));
    println!();
    // RESTORE (an archived pack's RestoreObject) only when there were any.
    let restores = b.subsystems.iter().any(|s| s.requests.get("RESTORE").is_some_and(|n| *n > 0));
    let kinds: &[&str] = if restores { &["GET", "HEAD", "PUT", "POST", "LIST", "DELETE", "RESTORE"] } else { &["GET", "HEAD", "PUT", "POST", "LIST", "DELETE"] };
    print!("{:<10}", "subsystem");
    for k in kinds {
        print!(" {k:>8}");
    }
    println!(" {:>12} {:>12} {:>12}", "up", "down", "cost");
    for s in &b.subsystems {
        print!("{:<10}", s.subsystem);
        for k in kinds {
            print!(" {:>8}", s.requests.get(*k).copied().unwrap_or(0));
        }
        println!(" {:>12} {:>12} {:>12}", size::human(s.bytes_up), size::human(s.bytes_down), money(s.cost));
    }
    println!("{:<10} {:>w$}", "storage", money(b.storage_cost()), w = 92 + 9 * (kinds.len() - 6));
}

