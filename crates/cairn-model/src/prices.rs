//! The cloud price list and the request model it prices (docs/cloud.md
//! §6): what a store bills ([`RequestKind`]), how many requests an upload
//! takes ([`put_requests`]), and a price table ([`Prices`]) with its
//! presets and its TOML form. The engine's bill (`cairn_engine::cost`) and
//! the simulator price with these; the backend counts requests by
//! [`RequestKind`] and sends uploads as [`put_requests`] says.

use serde::{Deserialize, Serialize};

/// A gigabyte as S3 bills it (2^30 bytes).
pub const GB: f64 = (1u64 << 30) as f64;
/// A billing month: 730 hours (365 days / 12).
pub const MONTH_SECS: f64 = 730.0 * 3600.0;

/// Objects at least this large go up in parts (a multipart upload). A
/// bucket's packs (16 MiB by default, a little more with the blob that
/// fills them) go in one PUT: as parts each would cost five requests
/// (POST, three PUTs, POST) where one does. S3 takes up to 5 GiB in one
/// PUT and advises parts from 100 MB.
pub const MULTIPART_MIN: u64 = 100 << 20;
/// The size of each part of a multipart upload.
pub const PART_SIZE: u64 = 16 << 20;

/// The requests a successful put of `len` bytes sends, as (PUT, POST): one
/// PUT below the multipart threshold, else a POST to create the upload, a
/// PUT per part and a POST to complete it (what a simulated bill counts).
pub fn put_requests(len: u64) -> (u64, u64) {
    if len < MULTIPART_MIN {
        (1, 0)
    } else {
        (len.div_ceil(PART_SIZE), 2)
    }
}

/// Why a price table cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    /// Not a price table (the message says where and why).
    #[error("{0}")]
    Invalid(String),
    /// The file could not be read.
    #[error("reading price table {path}: {error}")]
    Read { path: String, error: std::io::Error },
}

/// A request as a store bills it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKind {
    /// GET of an object or a range of it (bytes: downloaded).
    Get,
    /// HEAD (an object's size).
    Head,
    /// PUT of an object or of one part of a multipart upload (bytes: uploaded).
    Put,
    /// POST: starting and completing a multipart upload.
    Post,
    /// One page of a listing (up to 1,000 keys).
    List,
    /// DELETE of an object, or abort of a multipart upload.
    Delete,
    /// `POST ?restore` (S3 RestoreObject) of an archived object: priced on
    /// its own (docs/tiers.md §1: $0.05 per 1,000 for GLACIER's standard
    /// retrieval), not as a POST.
    Restore,
}

impl RequestKind {
    /// Every kind, in order.
    pub const ALL: [RequestKind; 7] = [RequestKind::Get, RequestKind::Head, RequestKind::Put, RequestKind::Post, RequestKind::List, RequestKind::Delete, RequestKind::Restore];

    /// The HTTP name (`GET`, `HEAD`, `PUT`, `POST`, `LIST`, `DELETE`;
    /// `RESTORE` for a RestoreObject).
    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Get => "GET",
            RequestKind::Head => "HEAD",
            RequestKind::Put => "PUT",
            RequestKind::Post => "POST",
            RequestKind::List => "LIST",
            RequestKind::Delete => "DELETE",
            RequestKind::Restore => "RESTORE",
        }
    }

    /// The kind of a name from [`RequestKind::name`].
    pub fn from_name(s: &str) -> Option<RequestKind> {
        Self::ALL.into_iter().find(|x| x.name() == s)
    }

    /// Whether its bytes go up (to the store) rather than down.
    pub fn uploads(self) -> bool {
        matches!(self, RequestKind::Put | RequestKind::Post)
    }
}

/// Prices per 1,000 requests of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestPrices {
    #[serde(rename = "GET")]
    pub get: f64,
    #[serde(rename = "HEAD")]
    pub head: f64,
    #[serde(rename = "PUT")]
    pub put: f64,
    #[serde(rename = "POST")]
    pub post: f64,
    #[serde(rename = "LIST")]
    pub list: f64,
    #[serde(rename = "DELETE")]
    pub delete: f64,
    /// A restore request (a price file without it: GLACIER's standard
    /// retrieval, [`RESTORE_PER_1000`]).
    #[serde(rename = "RESTORE", default = "default_restore")]
    pub restore: f64,
}

/// The price of 1,000 restore requests when a price file names none: AWS
/// GLACIER's standard retrieval (docs/tiers.md §1).
pub const RESTORE_PER_1000: f64 = 0.05;

fn default_restore() -> f64 {
    RESTORE_PER_1000
}

impl RequestPrices {
    /// The price of 1,000 requests of `k`.
    pub fn of(&self, k: RequestKind) -> f64 {
        match k {
            RequestKind::Get => self.get,
            RequestKind::Head => self.head,
            RequestKind::Put => self.put,
            RequestKind::Post => self.post,
            RequestKind::List => self.list,
            RequestKind::Delete => self.delete,
            RequestKind::Restore => self.restore,
        }
    }
}

/// A price table (US dollars). GB = 2^30 bytes; a month = 730 hours.
///
/// As TOML (`cairn cost --prices FILE`):
/// ```toml
/// name = "my store"            # optional
/// storage_per_gb_month = 0.023
/// transfer_up_per_gb = 0.0
/// transfer_down_per_gb = 0.09
/// [per_1000_requests]
/// GET = 0.0004
/// HEAD = 0.0004
/// PUT = 0.005
/// POST = 0.005
/// LIST = 0.005
/// DELETE = 0.0
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    #[serde(default)]
    pub name: String,
    pub storage_per_gb_month: f64,
    pub transfer_up_per_gb: f64,
    pub transfer_down_per_gb: f64,
    pub per_1000_requests: RequestPrices,
    /// Storage classes (docs/tiers.md §1): `[tiers.STANDARD_IA]` and so
    /// on; none in the file: the AWS sheet ([`Prices::tier_sheet`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<crate::tiers::TierSheet>,
}

impl Prices {
    /// AWS S3 Standard, us-east-1, list prices (first tiers): storage
    /// $0.023/GB-month; PUT, COPY, POST, LIST $0.005 per 1,000; GET, SELECT
    /// and the rest (HEAD) $0.0004 per 1,000; DELETE free; transfer in free,
    /// out to the internet $0.09/GB.
    pub fn aws() -> Prices {
        Prices {
            name: "aws (S3 Standard, us-east-1)".into(),
            storage_per_gb_month: 0.023,
            transfer_up_per_gb: 0.0,
            transfer_down_per_gb: 0.09,
            per_1000_requests: RequestPrices { get: 0.0004, head: 0.0004, put: 0.005, post: 0.005, list: 0.005, delete: 0.0, restore: RESTORE_PER_1000 },
            tiers: None,
        }
    }

    /// Seed 004 (Coral), table 1, the Amazon column: storage $0.095/GB-month,
    /// transfer up free and down $0.12/GB, "up" requests $5e-6 each (PUT,
    /// POST, LIST, as S3 priced them then), "down" requests $4e-7 (GET,
    /// HEAD), DELETE free.
    pub fn coral() -> Prices {
        Prices {
            name: "coral (seed 004, table 1, Amazon)".into(),
            storage_per_gb_month: 0.095,
            transfer_up_per_gb: 0.0,
            transfer_down_per_gb: 0.12,
            // $4e-7 and $5e-6 a request.
            per_1000_requests: RequestPrices { get: 0.0004, head: 0.0004, put: 0.005, post: 0.005, list: 0.005, delete: 0.0, restore: RESTORE_PER_1000 },
            tiers: None,
        }
    }

    /// A local disk (docs/frugal.md §8): what the cleaner of a volume in a
    /// directory weighs, space against rewrite work. Storage at the price
    /// of a provisioned SSD (a cloud block volume, $0.08/GB-month; a disk
    /// bought outright costs less a month but the same order). Rewrite work
    /// priced as the disk time it takes: at about 300 MB/s a GB read or
    /// written takes 3.5 s, which at a machine's price (about $0.10 an
    /// hour, 2 cores with their disk) is about $0.0001; a file created,
    /// opened or deleted costs a few tens of microseconds of the same
    /// machine, priced as a millionth of a dollar per thousand. Only the
    /// ratio matters: a pack whose live and dead bytes are equal becomes
    /// due after about two hours, a pack with no live byte at
    /// once. The cleaner's hard bound on dead bytes (docs/frugal.md §8)
    /// acts long before that under a steady rewrite load.
    pub fn local_disk() -> Prices {
        Prices {
            name: "local disk".into(),
            storage_per_gb_month: 0.08,
            transfer_up_per_gb: 0.0001,
            transfer_down_per_gb: 0.0001,
            per_1000_requests: RequestPrices { get: 0.000001, head: 0.000001, put: 0.000001, post: 0.000001, list: 0.000001, delete: 0.0, restore: 0.0 },
            tiers: None,
        }
    }

    /// A table from TOML (see the type's docs).
    pub fn from_toml(text: &str) -> Result<Prices, PriceError> {
        let p: Prices = toml::from_str(text).map_err(|e| PriceError::Invalid(format!("price table: {e}")))?;
        let r = &p.per_1000_requests;
        let all = [p.storage_per_gb_month, p.transfer_up_per_gb, p.transfer_down_per_gb, r.get, r.head, r.put, r.post, r.list, r.delete];
        if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(PriceError::Invalid("price table: prices must be finite and not negative".into()));
        }
        if let Some(t) = &p.tiers {
            t.check().map_err(|e| PriceError::Invalid(format!("price table: {e}")))?;
        }
        Ok(p)
    }

    /// The price sheet per storage class: the file's `[tiers]`, else AWS
    /// us-east-1's list prices.
    pub fn tier_sheet(&self) -> crate::tiers::TierSheet {
        self.tiers.clone().unwrap_or_default()
    }

    /// `aws`, `coral`, `local`, or a TOML file.
    pub fn load(what: &str) -> Result<Prices, PriceError> {
        match what {
            "aws" => Ok(Prices::aws()),
            "local" => Ok(Prices::local_disk()),
            "coral" => Ok(Prices::coral()),
            path => {
                let text = std::fs::read_to_string(path).map_err(|error| PriceError::Read { path: path.to_string(), error })?;
                let mut p = Prices::from_toml(&text).map_err(|e| PriceError::Invalid(format!("{path}: {e}")))?;
                if p.name.is_empty() {
                    p.name = path.to_string();
                }
                Ok(p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_sheets_in_price_files() {
        // A file without tiers has none (the AWS sheet is used); one with
        // a partial [tiers.X] keeps the other classes' AWS figures.
        let base = toml::to_string(&Prices::aws()).unwrap();
        assert_eq!(Prices::from_toml(&base).unwrap().tiers, None);
        let t = format!("{base}\n[tiers.GLACIER]\nstorage_per_gb_month = 0.004\nmin_days = 90\nmin_object_bytes = 0\nobject_overhead_bytes = 0\nput_per_1000 = 0.03\nget_per_1000 = 0.0004\nretrieval_per_gb = 0.01\nrestore_per_1000 = 0.05\nrestore_hours = 5\n");
        let p = Prices::from_toml(&t).unwrap();
        let sheet = p.tier_sheet();
        assert_eq!((sheet.glacier.storage_per_gb_month, sheet.glacier.restore_hours), (0.004, 5.0));
        assert_eq!(sheet.deep_archive, crate::tiers::TierSheet::aws().deep_archive);
        // Round trip, and bad figures refused with the class named.
        assert_eq!(Prices::from_toml(&toml::to_string(&p).unwrap()).unwrap(), p);
        let e = Prices::from_toml(&t.replace("restore_hours = 5", "restore_hours = -5")).unwrap_err();
        assert_eq!(e.to_string(), "price table: tiers.GLACIER: prices, days and hours must be finite and not negative");
        assert!(Prices::from_toml(&t.replace("[tiers.GLACIER]", "[tiers.GLACIAR]")).is_err());
    }

    #[test]
    fn puts_count_their_parts() {
        assert_eq!(put_requests(0), (1, 0));
        assert_eq!(put_requests(MULTIPART_MIN - 1), (1, 0));
        assert_eq!(put_requests(MULTIPART_MIN), (7, 2));
        assert_eq!(put_requests(112 << 20), (7, 2));
        assert_eq!(put_requests((112 << 20) + 1), (8, 2));
        // A bucket's pack, a little over its 16 MiB target: one PUT.
        assert_eq!(put_requests(20 << 20), (1, 0));
    }

    #[test]
    fn request_kinds_round_trip_their_names() {
        for k in RequestKind::ALL {
            assert_eq!(RequestKind::from_name(k.name()), Some(k));
        }
        assert_eq!(RequestKind::from_name("COPY"), None);
        assert!(RequestKind::Put.uploads() && RequestKind::Post.uploads() && !RequestKind::Get.uploads());
    }

    #[test]
    fn price_tables_from_toml() {
        let t = r#"
            name = "half"
            storage_per_gb_month = 0.0115
            transfer_up_per_gb = 0.01
            transfer_down_per_gb = 0.045
            [per_1000_requests]
            GET = 0.0002
            HEAD = 0.0002
            PUT = 0.0025
            POST = 0.0025
            LIST = 0.0025
            DELETE = 0
        "#;
        let p = Prices::from_toml(t).unwrap();
        assert_eq!(p.name, "half");
        assert_eq!(p.per_1000_requests.of(RequestKind::Put), 0.0025);
        assert_eq!((p.per_1000_requests.of(RequestKind::Get), p.per_1000_requests.of(RequestKind::Delete)), (0.0002, 0.0));
        assert_eq!((p.storage_per_gb_month, p.transfer_up_per_gb, p.transfer_down_per_gb), (0.0115, 0.01, 0.045));
        // The built-in tables round-trip through the same format.
        for builtin in [Prices::aws(), Prices::coral(), Prices::local_disk()] {
            assert_eq!(Prices::from_toml(&toml::to_string(&builtin).unwrap()).unwrap(), builtin);
        }
        // Typos and missing or negative prices are refused.
        assert!(Prices::from_toml(&t.replace("GET =", "GETS =")).is_err());
        assert!(Prices::from_toml(&t.replace("DELETE = 0", "")).is_err());
        let e = Prices::from_toml(&t.replace("PUT = 0.0025", "PUT = -1")).unwrap_err();
        assert_eq!(e.to_string(), "price table: prices must be finite and not negative");
        assert_eq!(Prices::load("coral").unwrap(), Prices::coral());
        assert_eq!(Prices::load("aws").unwrap(), Prices::aws());
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("p.toml");
        std::fs::write(&f, t.replace("name = \"half\"", "")).unwrap();
        let path = f.to_str().unwrap();
        assert_eq!(Prices::load(path).unwrap().name, path);
        std::fs::write(&f, t.replace("PUT = 0.0025", "PUT = -1")).unwrap();
        assert_eq!(Prices::load(path).unwrap_err().to_string(), format!("{path}: price table: prices must be finite and not negative"));
        let missing = d.path().join("none.toml");
        let e = Prices::load(missing.to_str().unwrap()).unwrap_err();
        assert!(matches!(&e, PriceError::Read { error, .. } if error.kind() == std::io::ErrorKind::NotFound), "{e}");
        assert!(e.to_string().starts_with(&format!("reading price table {}: ", missing.display())), "{e}");
    }
}
