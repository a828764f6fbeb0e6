//! File locks shared by every machine that mounts a volume read-write
//! (`docs/shared-volume.md` §8): the store keeps them, keyed by this
//! mount's session and the kernel's lock owner. A volume nobody else
//! mounts leaves locks to the kernel (none of this is called).

use super::Volume;
use crate::error::{Error, Result};
use crate::types::Ino;
pub use cairn_meta::locks::conflict as lock_conflict;
pub use cairn_meta::{LockKind, LockOutcome, LockOwner, LockRequest, LockRow, LockStyle, LOCK_EOF};

impl Volume {
    /// The session this mount's locks are kept under: Some only on a
    /// shared volume mounted read-write (a read-only mount has no session,
    /// its locks stay the kernel's, on this machine).
    pub fn lock_session(&self) -> Option<u64> {
        self.session_id()
    }

    fn lock_owner(&self, owner: u64) -> Result<LockOwner> {
        match self.lock_session() {
            Some(session) => Ok(LockOwner { session, owner }),
            None => Err(Error::new(crate::ErrorKind::NotSupported, "file locks are kept in the metadata store only on a shared volume mounted read-write")),
        }
    }

    /// Takes, changes or drops a lock of kernel lock owner `owner` on
    /// `ino`; never waits (a conflict names its holder; the caller
    /// retries).
    #[allow(clippy::too_many_arguments)]
    pub fn set_lock(&self, ino: Ino, owner: u64, style: LockStyle, kind: LockKind, start: u64, end: u64, pid: u32) -> Result<LockOutcome> {
        let owner = self.lock_owner(owner)?;
        // Marked before the store holds it: a close racing this request
        // then asks the store, never skips a lock that exists.
        if kind != LockKind::Unlock {
            *self.locked.entry(ino).or_insert(0) += 1;
        }
        Ok(self.meta.need_shared()?.set_lock(&LockRequest { ino, owner, style, kind, start, end, pid })?)
    }

    /// Every lock on each of `inos` (any session), with its inode: one
    /// question for all of a mount's parked requests.
    pub fn locks_on(&self, inos: &[Ino]) -> Result<Vec<(Ino, LockRow)>> {
        Ok(self.meta.need_shared()?.locks_on_many(inos)?)
    }

    /// `F_GETLK`: another owner's lock that conflicts with the request.
    #[allow(clippy::too_many_arguments)]
    pub fn test_lock(&self, ino: Ino, owner: u64, style: LockStyle, kind: LockKind, start: u64, end: u64, pid: u32) -> Result<Option<LockRow>> {
        let owner = self.lock_owner(owner)?;
        Ok(self.meta.need_shared()?.test_lock(&LockRequest { ino, owner, style, kind, start, end, pid })?)
    }

    /// Drops every lock of `style` that `owner` holds on `ino` (a close).
    /// A file this mount never locked costs no round trip: every close
    /// calls this, and almost none has a lock to drop.
    pub fn release_locks(&self, ino: Ino, owner: u64, style: LockStyle) -> Result<u64> {
        let owner = self.lock_owner(owner)?;
        let Some(requests) = self.locked.get(&ino).map(|r| *r) else { return Ok(0) };
        let store = self.meta.need_shared()?;
        let n = store.release_locks(ino, owner, style)?;
        // Forgotten once this mount holds none on it (another owner here
        // may still), unless a lock was asked for meanwhile.
        if !store.locks_on(ino)?.iter().any(|l| l.owner.session == owner.session) {
            self.locked.remove_if(&ino, |_, r| *r == requests);
        }
        Ok(n)
    }
}
