//! The kernel's references to inodes (FUSE lookup counts).
//!
//! Every reply that gives the kernel an inode (lookup, create, mknod,
//! mkdir, symlink, link, a readdirplus entry) adds one reference; FORGET
//! takes them back. A file whose last name goes while the kernel still
//! holds it stays, with no names, until the kernel forgets it (and its
//! last handle is released): the kernel may still write back its pages
//! and its times (the writeback cache does so when it evicts the inode),
//! and those must find the inode, not ENOENT.
//!
//! Only a FUSE mount counts (an in-process caller never takes a
//! reference, and then an unlinked file goes at once, as before). After
//! a crash such files are orphans (no names), which the next read-write
//! open frees (`remove_orphans`); a clean close frees them itself.

use super::*;

#[derive(Default)]
pub(crate) struct KernelRefs {
    /// Inode → (references, its last name is gone).
    held: DashMap<Ino, (u64, bool)>,
}

impl Volume {
    /// The kernel was handed `ino` once more (call before the reply goes).
    pub fn kernel_ref(&self, ino: Ino) {
        if ino != crate::types::ROOT_INO {
            self.kernel_refs.held.entry(ino).or_insert((0, false)).0 += 1;
        }
    }

    /// FORGET: the kernel dropped `n` references to `ino`. The last one of
    /// a file without names frees it, unless a handle is still open (then
    /// its release does).
    pub fn kernel_forget(&self, ino: Ino, n: u64) -> Result<()> {
        let mut unlinked = false;
        self.kernel_refs.held.remove_if_mut(&ino, |_, (refs, gone)| {
            *refs = refs.saturating_sub(n);
            unlinked = *refs == 0 && *gone;
            *refs == 0
        });
        if unlinked && self.opts.read_only {
            return Ok(());
        }
        if unlinked && !self.open_here(ino) {
            self.free_inode(ino)?;
        }
        Ok(())
    }

    /// Whether a handle of this mount has `ino` open (its release frees it).
    fn open_here(&self, ino: Ino) -> bool {
        self.files.get(&ino).is_some_and(|st| st.inner.lock().open > 0)
    }

    /// Whether the kernel holds `ino`; if it does, marks it to be freed at
    /// its last FORGET (its last name is gone).
    pub(crate) fn held_by_kernel(&self, ino: Ino) -> bool {
        match self.kernel_refs.held.get_mut(&ino) {
            Some(mut e) => {
                e.1 = true;
                true
            }
            None => false,
        }
    }

    /// Whether the kernel holds `ino` (inside a transaction, before
    /// deciding to free it there).
    pub(crate) fn kernel_holds(&self, ino: Ino) -> bool {
        self.kernel_refs.held.contains_key(&ino)
    }

    /// At close: the kernel holds nothing any more; files without names
    /// that were waiting for its FORGET are freed.
    pub(crate) fn free_forgotten_at_close(&self) -> Result<()> {
        let gone: Vec<Ino> = self.kernel_refs.held.iter().filter(|e| e.value().1).map(|e| *e.key()).collect();
        self.kernel_refs.held.clear();
        for ino in gone {
            if !self.open_here(ino) {
                self.free_inode(ino)?;
            }
        }
        Ok(())
    }
}
