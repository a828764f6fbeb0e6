//! Whole-tree copies that cost metadata only: `cairn clone` of a file or a
//! directory tree, and read-only snapshots of the volume under
//! `/.snapshots/NAME`.
//!
//! A copied inode gets a new number, the source's attributes, xattrs and
//! symlink target, and links to the source's extent pages (shared
//! copy-on-write, O(pages) per file, no chunk reference changes). Hard links
//! inside the tree stay hard links; link counts count only the names copied.
//! Snapshot inodes carry `FLAG_READ_ONLY`, which every change refuses with
//! EROFS; deleting a snapshot unlinks its pages, freeing what nothing else
//! shares.

use super::namespace::check_not_snapshot;
use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::meta::{self, FLAG_READ_ONLY};
use crate::types::{Attr, Caller, FileKind, Ino, Timestamp, ROOT_INO};
use crate::meta::MetaTx;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// The snapshot directory's name in the root.
pub const SNAPSHOT_DIR: &str = ".snapshots";
/// `info` key holding the snapshot directory's inode number.
const SNAPSHOT_DIR_KEY: &str = "snapshot_dir";

/// How `clone_tree` treats ownership.
#[derive(Clone, Copy, Debug)]
pub struct CloneOptions {
    /// Who asks: the copies belong to them unless they are root (as `cp -a`).
    pub caller: Caller,
}

/// One snapshot.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub name: String,
    /// Creation time, nanoseconds since the epoch.
    pub created_ns: i64,
    pub ino: Ino,
}

/// How copied inodes are stamped.
struct Stamp {
    flags: i64,
    owner: Option<Caller>,
    now: Timestamp,
    /// Keep ctime/btime as they were (snapshots) or set them to now (clones).
    keep_times: bool,
}

impl Volume {
    /// Copies the file or tree `src` to the new name `name` in `dst_parent`.
    pub fn clone_tree(&self, src: Ino, dst_parent: Ino, name: &[u8], opts: CloneOptions) -> Result<Attr> {
        self.check_writable()?;
        super::namespace::check_name(name)?;
        self.prefetch_metadata();
        // The tree's content must be committed to be shared (committed is
        // enough: the clone's own transaction is no more durable).
        self.flush_round(true)?;
        let now = Timestamp::now();
        let owner = (opts.caller.uid != 0).then_some(opts.caller);
        let ino = self.meta.write(|tx| {
            let parent = tx.get_inode(dst_parent)?.ok_or_else(|| Error::not_found("destination directory does not exist"))?;
            if parent.attr.kind != FileKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, "destination parent is not a directory"));
            }
            check_not_snapshot(&parent)?;
            if tx.lookup(dst_parent, name)?.is_some() {
                return Err(Error::new(ErrorKind::Exists, format!("{} already exists", String::from_utf8_lossy(name))));
            }
            // A directory copied into itself would never end.
            let mut cur = dst_parent;
            for _ in 0..100_000 {
                if cur == src {
                    return Err(Error::invalid("cannot clone a directory into itself"));
                }
                if cur == ROOT_INO {
                    break;
                }
                cur = tx.get_inode(cur)?.and_then(|r| r.parent).unwrap_or(ROOT_INO);
            }
            let stamp = Stamp { flags: 0, owner, now, keep_times: false };
            self.copy_tree(tx, src, dst_parent, name, &stamp, None)
        })?;
        self.kernel_entry_changed(dst_parent, name);
        self.kernel_inode_changed(dst_parent);
        self.getattr(ino)
    }

    /// Creates the read-only snapshot `.snapshots/NAME` of the whole tree.
    pub fn snapshot_create(&self, name: &str) -> Result<SnapshotInfo> {
        self.check_writable()?;
        super::namespace::check_name(name.as_bytes())?;
        self.sync()?;
        let now = Timestamp::now();
        let (dir, ino, created) = self.meta.write(|tx| {
            let dir = self.snapshot_dir(tx, true)?.expect("created");
            if tx.lookup(dir, name.as_bytes())?.is_some() {
                return Err(Error::new(ErrorKind::Exists, format!("snapshot {name:?} already exists")));
            }
            let stamp = Stamp { flags: FLAG_READ_ONLY, owner: None, now, keep_times: true };
            let ino = self.copy_tree(tx, ROOT_INO, dir, name.as_bytes(), &stamp, Some(dir))?;
            // The snapshot root records when it was taken.
            tx.set_btime(ino, now)?;
            Ok((dir, ino, now))
        })?;
        self.kernel_entry_changed(ROOT_INO, SNAPSHOT_DIR.as_bytes());
        // The first snapshot adds the snapshot directory to the root's
        // listing, which the kernel may cache (FOPEN_CACHE_DIR).
        self.kernel_inode_changed(ROOT_INO);
        self.kernel_entry_changed(dir, name.as_bytes());
        self.kernel_inode_changed(dir);
        Ok(SnapshotInfo { name: name.to_string(), created_ns: created.0, ino })
    }

    /// Every snapshot, by name.
    pub fn snapshot_list(&self) -> Result<Vec<SnapshotInfo>> {
        self.meta.read(|c| {
            let Some(dir) = c.get_info(SNAPSHOT_DIR_KEY)?.map(|i| i as Ino) else { return Ok(Vec::new()) };
            let mut out = Vec::new();
            for (name, ino, _) in c.list_dir(dir)? {
                let row = c.get_inode(ino)?.ok_or_else(|| Error::corrupt(format!("snapshot inode {ino} is missing")))?;
                out.push(SnapshotInfo { name: String::from_utf8_lossy(&name).into_owned(), created_ns: row.attr.btime.0, ino });
            }
            Ok(out)
        })
    }

    /// Deletes a snapshot; chunks nothing else uses become garbage for `gc`.
    pub fn snapshot_delete(&self, name: &str) -> Result<()> {
        self.check_writable()?;
        let now = Timestamp::now();
        let (dir, open_files) = self.meta.write(|tx| {
            let dir = self.snapshot_dir(tx, false)?.ok_or_else(|| Error::not_found(format!("no snapshot {name:?}")))?;
            if tx.lookup(dir, name.as_bytes())?.is_none() {
                return Err(Error::not_found(format!("no snapshot {name:?}")));
            }
            Ok((dir, remove_tree(self, tx, dir, name.as_bytes(), now)?))
        })?;
        for ino in open_files {
            self.last_name_gone(ino)?;
        }
        self.kernel_entry_changed(dir, name.as_bytes());
        self.kernel_inode_changed(dir);
        Ok(())
    }

    /// The snapshot directory, created (read-only, in the root) if asked.
    fn snapshot_dir(&self, c: &dyn MetaTx, create: bool) -> Result<Option<Ino>> {
        if let Some(ino) = c.get_info(SNAPSHOT_DIR_KEY)? {
            return Ok(Some(ino as Ino));
        }
        if !create {
            return Ok(None);
        }
        if c.lookup(ROOT_INO, SNAPSHOT_DIR.as_bytes())?.is_some() {
            return Err(Error::new(ErrorKind::Exists, format!("/{SNAPSHOT_DIR} already exists and is not the snapshot directory; rename it first")));
        }
        let now = Timestamp::now();
        let a = Attr {
            ino: self.alloc_ino(c)?,
            kind: FileKind::Dir,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
        };
        c.insert_inode_full(&a, 0, Some(ROOT_INO), None, self.journal.last_seq(), FLAG_READ_ONLY)?;
        c.insert_dentry(ROOT_INO, SNAPSHOT_DIR.as_bytes(), a.ino, FileKind::Dir)?;
        c.touch_dir(ROOT_INO, now, 1)?;
        c.set_info(SNAPSHOT_DIR_KEY, a.ino as i64)?;
        Ok(Some(a.ino))
    }

    /// Copies the tree at `src` to `name` in `dst_parent` inside transaction
    /// `tx`; `skip` is a directory left out (the snapshot directory).
    /// Returns the copy's inode number.
    fn copy_tree(&self, tx: &dyn MetaTx, src: Ino, dst_parent: Ino, name: &[u8], stamp: &Stamp, skip: Option<Ino>) -> Result<Ino> {
        let jseq = self.journal.last_seq();
        let mut new_ino: HashMap<Ino, Ino> = HashMap::new();
        let mut names: HashMap<Ino, u32> = HashMap::new();
        let mut subdirs: HashMap<Ino, u32> = HashMap::new();
        let mut kinds: HashMap<Ino, FileKind> = HashMap::new();
        let alloc = || self.alloc_ino(tx);
        let root = alloc()?;
        new_ino.insert(src, root);
        names.insert(root, 1);
        // (source inode, its copy, the copy's parent)
        let mut queue: VecDeque<(Ino, Ino, Ino)> = VecDeque::from([(src, root, dst_parent)]);
        let mut root_kind = FileKind::File;
        while let Some((s, d, dparent)) = queue.pop_front() {
            let row = tx.get_inode(s)?.ok_or_else(|| Error::not_found(format!("inode {s} vanished during the copy")))?;
            let mut a = row.attr;
            if s == src {
                root_kind = a.kind;
            }
            a.ino = d;
            if let Some(o) = stamp.owner {
                a.uid = o.uid;
                a.gid = o.gid;
                a.perm &= !0o6000; // as cp: no set-id bits on files one did not own
            }
            if !stamp.keep_times {
                a.ctime = stamp.now;
                a.btime = stamp.now;
            }
            let (size, data_bytes) = if a.kind == FileKind::File { (a.size, row.data_bytes) } else { (a.size, 0) };
            a.size = if a.kind == FileKind::Dir { 0 } else { size };
            let parent = (a.kind == FileKind::Dir).then_some(dparent);
            tx.insert_inode_full(&a, data_bytes, parent, row.target.as_deref(), jseq, stamp.flags)?;
            kinds.insert(d, a.kind);
            tx.copy_xattrs(s, d)?;
            match a.kind {
                FileKind::File => tx.share_pages(s, d)?,
                FileKind::Dir => {
                    for (n, child, kind) in tx.list_dir(s)? {
                        if Some(child) == skip {
                            continue;
                        }
                        let (copy, fresh) = match new_ino.get(&child) {
                            Some(&c) => (c, false),
                            None => {
                                let c = alloc()?;
                                new_ino.insert(child, c);
                                (c, true)
                            }
                        };
                        tx.insert_dentry(d, &n, copy, kind)?;
                        *names.entry(copy).or_default() += 1;
                        if kind == FileKind::Dir {
                            *subdirs.entry(d).or_default() += 1;
                        }
                        if fresh {
                            queue.push_back((child, copy, d));
                        }
                    }
                }
                _ => {}
            }
        }
        // Link counts of the copies: names copied (files), 2 + subdirectories (dirs).
        for (&d, &kind) in &kinds {
            let want = if kind == FileKind::Dir { 2 + subdirs.get(&d).copied().unwrap_or(0) } else { names.get(&d).copied().unwrap_or(1) };
            tx.fix_nlink(d, want)?;
        }
        tx.insert_dentry(dst_parent, name, root, root_kind)?;
        tx.touch_dir(dst_parent, stamp.now, if root_kind == FileKind::Dir { 1 } else { 0 })?;
        Ok(root)
    }
}

/// Removes the entry `name` of `parent` and, for a directory, everything
/// below it, inside transaction `tx`: entries go, link counts drop, and
/// inodes left without names are freed, or, if open, returned so the caller
/// can hand them to `last_name_gone` after the commit.
pub(super) fn remove_tree(vol: &Volume, tx: &dyn MetaTx, parent: Ino, name: &[u8], now: Timestamp) -> Result<Vec<Ino>> {
    let (top, kind) = tx.lookup(parent, name)?.ok_or_else(|| Error::not_found(format!("{} does not exist", String::from_utf8_lossy(name))))?;
    meta::remove_entry(tx, parent, name, top)?;
    tx.touch_dir(parent, now, if kind == FileKind::Dir { -1 } else { 0 })?;
    let mut open = Vec::new();
    let mut stack = vec![top];
    while let Some(ino) = stack.pop() {
        let Some(row) = tx.get_inode(ino)? else { continue };
        if row.attr.kind == FileKind::Dir {
            for (n, child, _) in tx.list_dir(ino)? {
                meta::remove_entry(tx, ino, &n, child)?;
                stack.push(child);
            }
            tx.delete_inode(ino)?;
            continue;
        }
        let n = row.attr.nlink.saturating_sub(1);
        if n > 0 {
            tx.set_nlink(ino, n, now)?;
        } else if !vol.free_in_tx(tx, ino)? {
            tx.set_nlink(ino, 0, now)?;
            open.push(ino);
        } else {
            tx.release_pages(ino)?;
            tx.delete_inode(ino)?;
        }
    }
    Ok(open)
}

