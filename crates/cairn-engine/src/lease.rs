//! The lease: who has a cloud volume mounted read-write (docs/cloud.md §4,
//! format.md "Lease").
//!
//! Taken with a conditional create, so of two machines mounting at once
//! one wins; renewed by its holder every [`RENEW`], and it expires
//! [`EXPIRY`] after the last renewal. A holder that finds someone else's
//! lease at renewal has been forced out and stops writing. Version objects
//! are conditional creates too, so even a holder that has not noticed yet
//! cannot publish over the new holder's metadata.
//!
//! On a store with conditional updates (S3's If-Match, a local
//! directory's compare-and-replace: `Backend::conditional_updates`) the
//! holder also remembers the lease object's tag: it renews with
//! `put_if_match`, which fails (`ErrorKind::Changed`) once the lease object
//! was deleted or replaced behind its back (another machine may then hold
//! the volume), and it stops writing. Before each version it publishes, it
//! trusts its lease without a request while its last renewal is less than
//! [`TRUSTED`] old, and renews first otherwise: a publish costs no lease
//! read. On a store without them a renewal reads the lease and rewrites it,
//! as before.

use crate::error::{Error, ErrorKind, Result};
use cairn_backend::Backend;
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The lease object's name.
pub const OBJECT: &str = "lease";
/// How often the holder renews.
pub const RENEW: Duration = Duration::from_secs(30);
/// How long a lease lasts without renewal.
pub const EXPIRY: Duration = Duration::from_secs(120);
/// The longest renewal interval a mount may choose (`--lease-renew`).
pub const MAX_RENEW: Duration = Duration::from_secs(60);
/// How long after its last successful renewal (timed from before the
/// renewal was sent) a holder publishes versions on the strength of its
/// lease without asking the bucket: half of [`EXPIRY`]. No other mount
/// takes an unexpired lease, and the lease expires EXPIRY after that
/// renewal, so a version sent within this margin is sent while the lease
/// is ours, with 60 s to spare for the upload and for clocks that differ.
/// Past it (renewals failing, a stalled shipper), the publish renews
/// first. A lease object deleted or replaced by hand is seen at the next
/// renewal (every [`RENEW`]); until then the versions' conditional creates
/// keep two writers from both publishing the same version (docs/cloud.md §4).
pub const TRUSTED: Duration = Duration::from_secs(EXPIRY.as_secs() / 2);

/// The lease object (JSON).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaseBody {
    pub format: String,
    pub host: String,
    pub pid: u32,
    /// The local directory of the mount (cache and metadata).
    pub dir: String,
    /// Random per mount: tells a holder its own lease from a new one.
    pub mount_id: String,
    /// Seconds since the epoch.
    pub since: u64,
    pub expires: u64,
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The machine's name, for messages.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..n]).into_owned()
    } else {
        "unknown-host".into()
    }
}

/// A time for messages: UTC, to the second.
pub fn show_time(secs: u64) -> String {
    crate::types::format_utc(secs)
}

fn parse(bytes: &[u8]) -> Result<LeaseBody> {
    serde_json::from_slice(bytes).map_err(|e| Error::corrupt(format!("the volume's lease object is not valid ({e}); delete it if no machine has the volume mounted")))
}

/// Whether `pid` runs on this machine (a zombie does not: a killed daemon
/// may wait long for a parent to reap it).
fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, None | Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

/// A lease this process holds.
pub struct Lease {
    body: parking_lot::Mutex<LeaseBody>,
    /// The lease object's tag as this holder last wrote it (None: the
    /// store has no conditional updates).
    tag: parking_lot::Mutex<Option<String>>,
    /// When the last successful renewal (or the taking) was sent.
    renewed: parking_lot::Mutex<std::time::Instant>,
    /// Why the lease was lost, once a renewal found it so: checks fail from
    /// then on without asking again.
    lost: parking_lot::Mutex<Option<String>>,
    /// How long the lease lasts after each renewal ([`EXPIRY`]; shorter in
    /// tests of its expiry).
    expiry: Duration,
}

/// The error of a holder that lost its lease (kind Busy: the shipper
/// treats it as final and the mount stops writing).
pub fn lost(why: &str) -> Error {
    Error::new(
        ErrorKind::Busy,
        format!(
            "this mount lost the volume's lease: {why}. It refuses writes from now on and publishes nothing more: data written since its last published metadata version (just before or after the loss) may not be published in the bucket. Unmount it"
        ),
    )
}

/// The lease object and its tag, if the store has conditional updates.
fn read_tagged(backend: &dyn Backend) -> std::result::Result<(LeaseBody, Option<String>), cairn_backend::Error> {
    if backend.conditional_updates() {
        let (b, t) = backend.get_tagged(OBJECT)?;
        Ok((parse(&b).map_err(|e| cairn_backend::Error::new(cairn_backend::ErrorKind::Corrupt, e.message().to_string()))?, Some(t)))
    } else {
        let b = backend.get(OBJECT)?;
        Ok((parse(&b).map_err(|e| cairn_backend::Error::new(cairn_backend::ErrorKind::Corrupt, e.message().to_string()))?, None))
    }
}

impl Lease {
    /// Takes the lease for a read-write mount of the volume whose local
    /// directory is `dir`, whose lock the caller holds. Refused while
    /// another live mount holds it; an expired lease is taken over only
    /// with `force`; a lease of this same directory on this machine (a
    /// crash) is taken over at once.
    pub fn acquire(backend: &dyn Backend, dir: &str, force: bool, volume: &str) -> Result<Lease> {
        Self::acquire_expiring(backend, dir, force, volume, EXPIRY)
    }

    /// [`Lease::acquire`] with a lease that lasts `expiry` after each
    /// renewal (whole seconds, at least one) instead of [`EXPIRY`].
    pub(crate) fn acquire_expiring(backend: &dyn Backend, dir: &str, force: bool, volume: &str, expiry: Duration) -> Result<Lease> {
        let expiry = Duration::from_secs(expiry.as_secs().max(1));
        // The bill: the lease's requests are metadata's, whoever asks.
        let md = cairn_backend::meter::paying(backend, cairn_backend::Subsystem::Metadata);
        let backend: &dyn Backend = &*md;
        let sent = std::time::Instant::now();
        let t = now();
        let body = LeaseBody {
            format: "cairn-lease-1".into(),
            host: hostname(),
            pid: std::process::id(),
            dir: dir.to_string(),
            mount_id: hex::encode(rand::random::<[u8; 8]>()),
            since: t,
            expires: t + expiry.as_secs(),
        };
        let bytes = serde_json::to_vec_pretty(&body).expect("lease serialises");
        let ours = |body: LeaseBody| -> Result<Lease> {
            // The tag of what we just wrote: the renewals and the checks
            // before each publish compare against it.
            let tag = if backend.conditional_updates() {
                let (b, t) = backend.get_tagged(OBJECT).map_err(|e| Error::from(e).context("reading the volume's lease"))?;
                if b != bytes {
                    return Err(lost("another mount replaced the lease object just after this one took it"));
                }
                Some(t)
            } else {
                None
            };
            Ok(Lease { body: parking_lot::Mutex::new(body), tag: parking_lot::Mutex::new(tag), renewed: parking_lot::Mutex::new(sent), lost: parking_lot::Mutex::new(None), expiry })
        };
        match backend.put_if_absent(OBJECT, &bytes) {
            Ok(()) => return ours(body),
            Err(e) if e.kind() == cairn_backend::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::from(e).context("taking the volume's lease")),
        }
        let held = parse(&backend.get(OBJECT).map_err(|e| Error::from(e).context("reading the volume's lease"))?)?;
        if held.mount_id == body.mount_id {
            // Our own create, retried after its reply was lost.
            return ours(body);
        }
        // A lease of this machine and this directory is a dead mount of it:
        // the caller holds the directory's lock, so no live process uses it.
        // A mount on this machine whose process is gone is dead for sure
        // too; of another directory, it is taken over with --force.
        let own_crash = held.host == body.host && held.dir == body.dir;
        let dead_here = held.host == body.host && !pid_alive(held.pid);
        let expired = held.expires <= t || dead_here;
        if !own_crash {
            if !expired {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "{volume} is mounted read-write by {} (pid {}, directory {}) since {}; its lease expires at {} unless renewed (every {} s while mounted). Mount read-only, or unmount it there",
                        held.host, held.pid, held.dir, show_time(held.since), show_time(held.expires), RENEW.as_secs()
                    ),
                ));
            }
            if !force && dead_here {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "{volume} was mounted read-write from {} by pid {}, which is no longer running (it crashed or was killed). Mount that directory again to recover its unshipped changes, or mount with --force to take the volume over from here; those changes are then lost",
                        held.dir, held.pid
                    ),
                ));
            }
            if !force {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "{volume} was mounted read-write by {} (pid {}) and its lease expired at {} without an unmount (that machine may have died). If it is really gone, mount with --force to take the volume over; its unshipped changes are lost",
                        held.host, held.pid, show_time(held.expires)
                    ),
                ));
            }
            tracing::warn!(host = %held.host, pid = held.pid, "taking over an expired lease (--force)");
        }
        backend.put(OBJECT, &bytes).map_err(|e| Error::from(e).context("taking the volume's lease"))?;
        ours(body)
    }

    /// Extends the lease; fails with Busy ([`lost`]) if another mount took
    /// it or the lease object was deleted or replaced.
    pub fn renew(&self, backend: &dyn Backend) -> Result<()> {
        // The bill: the lease's requests are metadata's, whoever asks.
        let md = cairn_backend::meter::paying(backend, cairn_backend::Subsystem::Metadata);
        let backend: &dyn Backend = &*md;
        let mut tag = self.tag.lock();
        let mut b = self.body.lock();
        let sent = std::time::Instant::now();
        if let Some(t) = tag.as_ref() {
            let mut next = b.clone();
            next.expires = now() + self.expiry.as_secs();
            let bytes = serde_json::to_vec_pretty(&next).expect("lease serialises");
            return match backend.put_if_match(OBJECT, &bytes, t) {
                Ok(new) => {
                    *tag = Some(new);
                    *b = next;
                    *self.renewed.lock() = sent;
                    Ok(())
                }
                Err(e) if e.kind() == cairn_backend::ErrorKind::Changed => {
                    drop((b, tag)); // why_lost takes the body's lock
                    let e = self.why_lost(backend);
                    *self.lost.lock() = Some(e.message().to_string());
                    Err(e)
                }
                Err(e) => Err(Error::from(e).context("renewing the volume's lease")),
            };
        }
        let held = parse(&backend.get(OBJECT).map_err(|e| Error::from(e).context("reading the volume's lease"))?)?;
        if held.mount_id != b.mount_id {
            return Err(Error::new(ErrorKind::Busy, format!("the volume's lease was taken over by {} (pid {}) at {}", held.host, held.pid, show_time(held.since))));
        }
        b.expires = now() + self.expiry.as_secs();
        backend.put(OBJECT, &serde_json::to_vec_pretty(&*b).expect("lease serialises")).map_err(|e| Error::from(e).context("renewing the volume's lease"))?;
        *self.renewed.lock() = sent;
        Ok(())
    }

    /// Before a version is published: the lease is ours. Without a request
    /// while the last renewal is less than [`TRUSTED`] old; otherwise it is
    /// renewed first (a conditional update that finds a lease deleted or
    /// replaced). Nothing on a store without conditional updates. Busy
    /// ([`lost`]) once the lease was found lost.
    pub fn check(&self, backend: &dyn Backend) -> Result<()> {
        if let Some(why) = self.lost.lock().as_ref() {
            return Err(Error::new(ErrorKind::Busy, why.clone()));
        }
        if self.tag.lock().is_none() || self.renewed.lock().elapsed() < TRUSTED {
            return Ok(());
        }
        self.renew(backend)
    }

    /// Why an update or check of the lease found it changed, for the error.
    fn why_lost(&self, backend: &dyn Backend) -> Error {
        match read_tagged(backend) {
            Ok((held, _)) if held.mount_id != self.body.lock().mount_id => {
                lost(&format!("{} (pid {}, directory {}) took it at {}", held.host, held.pid, held.dir, show_time(held.since)))
            }
            Ok(_) => lost("the lease object was rewritten behind this mount's back"),
            Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound => lost("the lease object was deleted from the bucket"),
            Err(_) => lost("the lease object was replaced or deleted"),
        }
    }

    /// Gives the lease up (at unmount), if it is still ours.
    pub fn release(&self, backend: &dyn Backend) -> Result<()> {
        // The bill: the lease's requests are metadata's, whoever asks.
        let md = cairn_backend::meter::paying(backend, cairn_backend::Subsystem::Metadata);
        let backend: &dyn Backend = &*md;
        if let Some(why) = self.lost.lock().as_ref() {
            return Err(Error::new(ErrorKind::Busy, why.clone()));
        }
        let held = match backend.get(OBJECT) {
            Ok(b) => parse(&b)?,
            // With conditional updates the object was ours until now: gone
            // means deleted behind this mount's back, and the last versions
            // were published without a lease.
            Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound && self.tag.lock().is_some() => {
                return Err(lost("the lease object was deleted from the bucket"));
            }
            Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::from(e).context("reading the volume's lease")),
        };
        if held.mount_id != self.body.lock().mount_id {
            return Err(lost(&format!("{} (pid {}) holds it since {}", held.host, held.pid, show_time(held.since))));
        }
        backend.delete(OBJECT)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_testing::MemoryBackend;
    use std::time::Instant;

    /// Waits (a few seconds at most, the lease being short) until the
    /// store's lease has expired by its own `expires`.
    fn wait_for_expiry(backend: &dyn Backend) -> LeaseBody {
        let held = parse(&backend.get(OBJECT).unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while now() < held.expires {
            assert!(Instant::now() < deadline, "a lease expiring at {} had not expired 30 s later", held.expires);
            std::thread::sleep(Duration::from_millis(100));
        }
        held
    }

    /// A lease its holder stops renewing runs out by itself: until then
    /// another mount is refused; after it, refused still without `force`
    /// (the holder may only be cut off), taken with it; the old holder's
    /// next renewal, check and release then fail as lost, naming the new
    /// holder.
    #[test]
    fn a_lease_not_renewed_expires_and_is_taken_over_only_with_force() {
        let mem = MemoryBackend::new();
        let a = Lease::acquire_expiring(&mem, "/cache/a", false, "s3://b/v", Duration::from_secs(2)).unwrap();
        let e = Lease::acquire(&mem, "/cache/b", false, "s3://b/v").err().expect("a live lease was taken");
        assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
        assert!(e.to_string().contains("is mounted read-write by") && e.to_string().contains("/cache/a"), "{e}");
        let held = wait_for_expiry(&mem);
        assert_eq!(held.dir, "/cache/a");
        let e = Lease::acquire(&mem, "/cache/b", false, "s3://b/v").err().expect("an expired lease was taken without --force");
        assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
        assert!(e.to_string().contains("expired") && e.to_string().contains("--force"), "{e}");
        let b = Lease::acquire(&mem, "/cache/b", true, "s3://b/v").unwrap_or_else(|e| panic!("--force on an expired lease: {e}"));
        let e = a.renew(&mem).expect_err("the old holder renewed a lease another mount took");
        assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
        assert!(e.to_string().contains("/cache/b"), "the loss names the new holder: {e}");
        assert_eq!(a.check(&mem).expect_err("a lost lease passed its check").kind(), ErrorKind::Busy);
        assert_eq!(a.release(&mem).expect_err("a lost lease was released").kind(), ErrorKind::Busy);
        b.renew(&mem).unwrap();
        b.release(&mem).unwrap();
        assert_eq!(mem.get(OBJECT).unwrap_err().kind(), cairn_backend::ErrorKind::NotFound, "the release deleted the lease object");
    }

    /// Renewals push the expiry back: a lease renewed more often than it
    /// lasts never expires, however long it is held.
    #[test]
    fn renewals_keep_a_short_lease_alive() {
        let mem = MemoryBackend::new();
        let a = Lease::acquire_expiring(&mem, "/cache/a", false, "s3://b/v", Duration::from_secs(2)).unwrap();
        let first = parse(&mem.get(OBJECT).unwrap()).unwrap().expires;
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            a.renew(&mem).unwrap();
            let e = Lease::acquire(&mem, "/cache/b", true, "s3://b/v").err().expect("a renewed lease was taken, even with force");
            assert!(e.to_string().contains("is mounted read-write by"), "{e}");
            std::thread::sleep(Duration::from_millis(300));
        }
        let last = parse(&mem.get(OBJECT).unwrap()).unwrap().expires;
        assert!(last > first + 1, "renewals did not move the expiry ({first} then {last})");
        a.release(&mem).unwrap();
    }

    /// A lease of this same directory on this machine is a crash of it (the
    /// caller holds the directory's lock): taken over at once, unexpired.
    #[test]
    fn a_lease_of_this_directory_is_taken_over_at_once() {
        let mem = MemoryBackend::new();
        let old = Lease::acquire(&mem, "/cache/a", false, "s3://b/v").unwrap();
        let again = Lease::acquire(&mem, "/cache/a", false, "s3://b/v").unwrap_or_else(|e| panic!("the same directory after a crash: {e}"));
        assert!(old.renew(&mem).is_err(), "the crashed mount's lease still renews");
        again.release(&mem).unwrap();
    }

    /// A lease object that is not one says so, and how to recover.
    #[test]
    fn a_damaged_lease_object_is_named() {
        let mem = MemoryBackend::new();
        mem.put(OBJECT, b"{not json").unwrap();
        let e = Lease::acquire(&mem, "/cache/a", false, "s3://b/v").err().expect("a damaged lease was taken");
        assert!(e.to_string().contains("lease object is not valid") && e.to_string().contains("delete it"), "{e}");
    }
}
