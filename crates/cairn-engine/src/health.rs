//! What is going wrong in a mount right now, for `cairn status`.
//!
//! The parts of a mount that retry in the background (the flusher, the
//! pack uploaders of a volume in a bucket, metadata shipping, the lease)
//! never fail a caller for a transient error: they log it and try again.
//! Each records its last failure in a [`Slot`] and clears it at its next
//! success, so a [`MountStatus`] tells a mount that is working from one
//! that is stuck, and why.

use serde::{Deserialize, Serialize};

/// A background part's last failure and the slot holding it live below
/// the engine, with the disk cache whose uploaders keep one too.
pub use cairn_cache::health::{Problem, Slot};

/// The slots of a volume's own background parts (the uploaders' is the
/// cache's: [`cairn_cache::CachedBackend::upload_problem`]).
#[derive(Debug, Default)]
pub struct Problems {
    pub flush: Slot,
    pub metadata: Slot,
    pub lease: Slot,
}

/// How a mount is doing, as its control socket reports it (`status`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MountStatus {
    /// `ok`, `lease_lost` (another machine took the volume's lease, or its
    /// lease object was deleted: the mount refuses writes), `session_lost`
    /// (on a volume whose metadata is in PostgreSQL: the mount's session
    /// expired, and it refuses writes), `backend_unreachable` (uploads,
    /// metadata shipping, lease or session renewals are failing; writes
    /// pile up locally) or `degraded` (the flusher is failing).
    pub health: String,
    /// What is failing, oldest first.
    pub problems: Vec<Problem>,
    pub read_only: bool,
    /// Whether the volume lives in a bucket.
    pub in_bucket: bool,
    /// Bytes in the write-back journal: written (and durable locally once
    /// fsync'd) but not yet chunked into packs.
    pub journal_bytes: u64,
    /// Writers wait while the journal holds more than this.
    pub journal_limit: u64,
    /// Files with changes waiting for the flusher.
    pub dirty_files: u64,
    /// Packs written locally and not yet in the bucket: bytes and objects.
    pub upload_queue_bytes: u64,
    pub upload_queue_objects: u64,
    /// What this machine holds that the backend does not have yet
    /// (`journal_bytes + upload_queue_bytes`).
    pub dirty_bytes: u64,
    /// Where the metadata lives when not in the volume's own SQLite file:
    /// the PostgreSQL URL (never a password: one in a URL is refused) and
    /// this mount's session (absent from older daemons' answers).
    #[serde(default)]
    pub metadata: Option<String>,
}

impl MountStatus {
    /// The health word for a set of problems (and a lost lease).
    pub fn judge(problems: &[Problem], lease_lost: bool) -> &'static str {
        if lease_lost {
            "lease_lost"
        } else if problems.iter().any(|p| matches!(p.what.as_str(), "upload" | "metadata" | "lease" | "session")) {
            "backend_unreachable"
        } else if !problems.is_empty() {
            "degraded"
        } else {
            "ok"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_words() {
        let p = |what: &str| Problem { what: what.into(), error: "x".into(), since: 0, failures: 1 };
        assert_eq!(MountStatus::judge(&[], false), "ok");
        assert_eq!(MountStatus::judge(&[], true), "lease_lost");
        assert_eq!(MountStatus::judge(&[p("lease"), p("upload")], true), "lease_lost", "a lost lease is not an unreachable bucket");
        assert_eq!(MountStatus::judge(&[p("flush")], false), "degraded");
        assert_eq!(MountStatus::judge(&[p("flush"), p("upload")], false), "backend_unreachable");
        assert_eq!(MountStatus::judge(&[p("lease")], false), "backend_unreachable");
    }
}
