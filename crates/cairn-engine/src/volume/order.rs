//! The order of writes, in one place.
//!
//! Nothing that holds the only durable copy of acknowledged data or
//! metadata may be deleted or overwritten before what replaces it is
//! durable. `docs/format.md` ("Order of writes") states the rules; the
//! code that deletes things goes through the two functions here, which wait
//! on the metadata barrier ([`crate::meta::Meta::sync`]) first:
//!
//! - rule 1: journal segments ([`Volume::retire_journal`]);
//! - rule 3: backend objects: packs emptied or repacked by gc, orphans
//!   ([`Volume::delete_objects`]).
//!
//! Rule 2 (a pack is durable before metadata refers to it) is the backend
//! contract (`put` is durable when it returns) plus the flush waiting for
//! every upload before it commits; rule 4 (fsync) is [`Volume::fsync`].

use super::Volume;
use crate::error::Result;

impl Volume {
    /// Rule 1: deletes the journal segments whose records are all below
    /// `min_live_seq` (all folded into committed metadata), after making
    /// those commits durable: one WAL fsync for the whole round, none when
    /// no segment goes. Returns the number of segments deleted.
    pub(crate) fn retire_journal(&self, min_live_seq: u64) -> Result<usize> {
        self.journal.retire(min_live_seq, || self.meta.sync())
    }

    /// Rule 3: deletes backend objects that no committed metadata refers
    /// to any more, after making those commits durable (a repack's moved
    /// chunks, an emptied pack's deleted rows). Returns how many went.
    /// `who` pays for the deletes (in a bucket they go to the trash, which
    /// is metadata's).
    pub(crate) fn delete_objects<'a>(&self, who: cairn_backend::Subsystem, names: impl IntoIterator<Item = &'a str>) -> Result<u64> {
        let names: Vec<&str> = names.into_iter().collect();
        if names.is_empty() {
            return Ok(0);
        }
        self.meta.sync()?;
        // Deleted, or in a bucket put in the trash (older metadata
        // versions may still name them): the medium's (medium.rs).
        self.medium.drop_packs(self, who, names)
    }
}
