//! Namespace operations: lookup, create, link, unlink, rename, attributes,
//! extended attributes. Each change is one metadata transaction.

use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::meta::{self, InodeRow};
use crate::types::*;
use crate::meta::MetaRead;

/// Largest extended attribute value (as Linux: 64 KiB).
const XATTR_MAX: usize = 64 << 10;

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::invalid(format!("invalid file name {:?}", String::from_utf8_lossy(name))));
    }
    if name.len() > NAME_MAX {
        return Err(Error::new(ErrorKind::NameTooLong, "file name longer than 255 bytes"));
    }
    Ok(())
}

fn inode(c: &dyn MetaRead, ino: Ino) -> Result<InodeRow> {
    c.get_inode(ino)?.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))
}

fn dir(c: &dyn MetaRead, ino: Ino) -> Result<InodeRow> {
    check_dir(ino, c.get_inode(ino)?)
}

/// `row` (inode `ino`'s, if it exists) as a directory that still exists.
fn check_dir(ino: Ino, row: Option<InodeRow>) -> Result<InodeRow> {
    let r = row.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))?;
    if r.attr.kind != FileKind::Dir {
        return Err(Error::new(ErrorKind::NotDir, format!("inode {ino} is not a directory")));
    }
    if r.attr.nlink == 0 {
        return Err(Error::not_found("directory was removed"));
    }
    Ok(r)
}

/// Fails with EROFS for a snapshot's inode.
pub(crate) fn check_not_snapshot(r: &InodeRow) -> Result<()> {
    if r.read_only() {
        return Err(Error::new(ErrorKind::ReadOnly, "snapshots are read-only"));
    }
    Ok(())
}

/// `parent` as a directory whose entries may change, and its entry `name`
/// (ino, kind), in one query.
fn wdir_entry(c: &dyn MetaRead, parent: Ino, name: &[u8]) -> Result<(Ino, FileKind)> {
    let (p, child) = c.lookup_inode(parent, name)?;
    check_not_snapshot(&check_dir(parent, p)?)?;
    let child = child.ok_or_else(|| Error::not_found("no such entry"))?;
    Ok((child.attr.ino, child.attr.kind))
}

/// Removes `name` (still naming `ino`) from `parent` and touches `parent`.
fn unlink_entry(tx: &dyn meta::MetaTx, parent: Ino, name: &[u8], ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<()> {
    if tx.unlink_entry(parent, name, ino, now, nlink_delta)? {
        Ok(())
    } else {
        Err(Error::not_found(format!("{} no longer names inode {ino}", String::from_utf8_lossy(name))))
    }
}

/// A directory whose entries may change.
fn wdir(c: &dyn MetaRead, ino: Ino) -> Result<InodeRow> {
    let r = dir(c, ino)?;
    check_not_snapshot(&r)?;
    Ok(r)
}

/// An inode that may change.
fn winode(c: &dyn MetaRead, ino: Ino) -> Result<InodeRow> {
    let r = inode(c, ino)?;
    check_not_snapshot(&r)?;
    Ok(r)
}

impl Volume {
    /// The inode at `path` (components separated by `/`, from the root; no
    /// symbolic links followed).
    pub fn resolve(&self, path: &[u8]) -> Result<Ino> {
        let mut cur = ROOT_INO;
        for comp in path.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".") {
            if comp == b".." {
                cur = self.parent_of(cur)?;
                continue;
            }
            cur = self.lookup(cur, comp)?.ino;
        }
        Ok(cur)
    }

    /// The directory holding `path` and the last component's name.
    pub fn resolve_parent(&self, path: &[u8]) -> Result<(Ino, Vec<u8>)> {
        let trimmed: &[u8] = {
            let mut p = path;
            while p.len() > 1 && p.ends_with(b"/") {
                p = &p[..p.len() - 1];
            }
            p
        };
        let (dir, name) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => (&b""[..], trimmed),
        };
        check_name(name)?;
        Ok((self.resolve(dir)?, name.to_vec()))
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Error::new(ErrorKind::NameTooLong, "file name longer than 255 bytes"));
        }
        let mut a = self.meta.read_one(|c| {
            let (dir_row, child) = c.lookup_inode(parent, name)?;
            check_dir(parent, dir_row)?;
            Ok(child.ok_or_else(|| Error::not_found("no such entry"))?.attr)
        })?;
        self.overlay_attr(&mut a);
        Ok(a)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let mut a = self.meta.read_one(|c| Ok(inode(c, ino)?.attr))?;
        self.overlay_attr(&mut a);
        Ok(a)
    }

    /// Changes attributes; a size change truncates or extends.
    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.check_writable()?;
        let touches = set.perm.is_some() || set.uid.is_some() || set.gid.is_some() || set.atime.is_some() || set.mtime.is_some() || set.ctime.is_some();
        // A touch alone (tar's chown, chmod and utimes of every file it
        // writes) checks the inode inside its own transaction: one read
        // and one update, not two more reads around them.
        if set.size.is_some() || !touches {
            let kind = self.meta.read(|c| Ok(winode(c, ino)?.attr.kind))?;
            if let Some(size) = set.size {
                match kind {
                FileKind::File => self.truncate(ino, size)?,
                    FileKind::Dir => return Err(Error::new(ErrorKind::IsDir, "cannot set the size of a directory")),
                    _ => return Err(Error::invalid("cannot set the size of a special file")),
                }
            }
        }
        let now = Timestamp::now();
        let resolve = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        if touches {
            let a = self.meta.write(|tx| {
                let mut a = winode(tx, ino)?.attr;
                if let Some(p) = set.perm {
                    a.perm = p & 0o7777;
                }
                if let Some(u) = set.uid {
                    a.uid = u;
                }
                if let Some(g) = set.gid {
                    a.gid = g;
                }
                if let Some(t) = set.atime {
                    a.atime = resolve(t);
                }
                if let Some(t) = set.mtime {
                    a.mtime = resolve(t);
                }
                a.ctime = set.ctime.unwrap_or(now);
                tx.update_attr(&a)?;
                Ok(a)
            })?;
            // An open file's in-memory times win over the row; keep them in step.
            if a.kind == FileKind::File {
                if let Some(st) = self.files.get(&ino) {
                    st.take_set_times(set.mtime.map(|_| a.mtime), a.ctime);
                }
            }
            if set.size.is_none() {
                let mut a = a;
                self.overlay_attr(&mut a);
                return Ok(a);
            }
        }
        self.getattr(ino)
    }

    fn new_inode(&self, parent: Ino, name: &[u8], kind: FileKind, perm: u32, rdev: u32, target: Option<&[u8]>, caller: Caller) -> Result<Attr> {
        self.check_writable()?;
        check_name(name)?;
        let now = Timestamp::now();
        // The name up front: the BEGIN round trip answers the lookup too.
        self.meta.write_locking(&[parent], &[(parent, name)], false, |tx| {
            // The directory and the name in one query.
            let (p, existing) = tx.lookup_inode(parent, name)?;
            let p = check_dir(parent, p)?;
            check_not_snapshot(&p)?;
            if existing.is_some() {
                return Err(Error::new(ErrorKind::Exists, "name exists"));
            }
            let mut perm = perm & 0o7777;
            let mut gid = caller.gid;
            // BSD group semantics under a setgid directory, as ext4 does.
            if p.attr.perm & 0o2000 != 0 {
                gid = p.attr.gid;
                if kind == FileKind::Dir {
                    perm |= 0o2000;
                }
            }
            let mut a = Attr {
                ino: 0,
                kind,
                perm,
                nlink: if kind == FileKind::Dir { 2 } else { 1 },
                uid: caller.uid,
                gid,
                rdev,
                size: target.map_or(0, |t| t.len() as u64),
                blocks: 0,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
            };
            a.ino = self.alloc_ino(tx)?;
            // A new file is open on this mount (the create opens it).
            let open = if kind == FileKind::File { self.created_open() } else { None };
            tx.create_node(&meta::NewNode { attr: &a, parent, name, target, jseq: self.journal.last_seq(), now, open })?;
            if kind == FileKind::Dir {
                a.size = 4096;
                a.blocks = 8;
            }
            let row = open.map(|(_, gen)| (a.ino, gen));
            Ok((a, row))
        })
        .map(|(a, row)| {
            self.created_registered(row);
            a
        })
    }

    /// Creates a regular file or a special file (fifo, socket, device).
    pub fn create(&self, parent: Ino, name: &[u8], kind: FileKind, perm: u32, rdev: u32, caller: Caller) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(Error::invalid("use mkdir or symlink"));
        }
        let a = self.new_inode(parent, name, kind, perm, rdev, None, caller)?;
        if kind == FileKind::File {
            self.adopt_new_file(&a, parent, name);
        }
        Ok(a)
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u32, caller: Caller) -> Result<Attr> {
        self.new_inode(parent, name, FileKind::Dir, perm, 0, None, caller)
    }

    /// Creates a symbolic link.
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], caller: Caller) -> Result<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(Error::invalid("symlink target must be 1 to 4095 bytes"));
        }
        self.new_inode(parent, name, FileKind::Symlink, 0o777, 0, Some(target), caller)
    }

    /// The target of a symbolic link.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.meta.read(|c| {
            let r = inode(c, ino)?;
            if r.attr.kind != FileKind::Symlink {
                return Err(Error::invalid("not a symbolic link"));
            }
            r.target.ok_or_else(|| Error::corrupt(format!("symlink {ino} has no target")))
        })
    }

    /// Adds a hard link to `ino`.
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.check_writable()?;
        check_name(newname)?;
        let now = Timestamp::now();
        self.meta.write_locking(&[ino, newparent], &[(newparent, newname)], false, |tx| {
            let mut a = winode(tx, ino)?.attr;
            if a.kind == FileKind::Dir {
                return Err(Error::new(ErrorKind::Permission, "hard links to directories are not allowed"));
            }
            if a.nlink == 0 {
                return Err(Error::not_found("file was removed"));
            }
            wdir(tx, newparent)?;
            if tx.lookup(newparent, newname)?.is_some() {
                return Err(Error::new(ErrorKind::Exists, "name exists"));
            }
            if a.nlink >= 65_000 {
                return Err(Error::new(ErrorKind::Range, "too many links"));
            }
            tx.insert_dentry(newparent, newname, ino, a.kind)?;
            a.nlink += 1;
            a.ctime = now;
            tx.set_nlink(ino, a.nlink, now)?;
            tx.touch_dir(newparent, now, 0)?;
            Ok(())
        })?;
        self.getattr(ino)
    }

    /// Removes a non-directory name; frees the inode when no name and no
    /// open handle remain.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        let now = Timestamp::now();
        let (ino, nlink, freed) = self.meta.write_locking(&[parent], &[(parent, name)], false, |tx| {
            let (ino, kind) = wdir_entry(tx, parent, name)?;
            if kind == FileKind::Dir {
                return Err(Error::new(ErrorKind::IsDir, "is a directory (use rmdir)"));
            }
            // Locked before its nlink is read, and before anyone's open of
            // it is asked about (an open locks it FOR SHARE).
            let a = tx.lock_inode(ino)?.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))?.attr;
            unlink_entry(tx, parent, name, ino, now, 0)?;
            let n = a.nlink.saturating_sub(1);
            // The common case, a file nobody has open or dirty (here or,
            // on a shared volume, on another machine): free it in this
            // same transaction.
            if n == 0 && self.free_in_tx(tx, ino)? {
                tx.release_pages(ino)?;
                tx.delete_inode(ino)?;
                return Ok((ino, n, true));
            }
            tx.set_nlink(ino, n, now)?;
            Ok((ino, n, false))
        })?;
        if nlink == 0 && !freed {
            self.last_name_gone(ino)?;
        } else if let (true, Some(t)) = (freed, &self.trace) {
            t.record(crate::trace::Event::Remove { ino });
        }
        Ok(())
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        let now = Timestamp::now();
        self.meta.write_locking(&[parent], &[(parent, name)], false, |tx| {
            let (ino, kind) = wdir_entry(tx, parent, name)?;
            if kind != FileKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, "not a directory"));
            }
            // A create in it locks it: the emptiness below stays true.
            let r = tx.lock_inode(ino)?.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))?;
            check_not_snapshot(&r)?;
            if !tx.dir_is_empty(ino)? {
                return Err(Error::new(ErrorKind::NotEmpty, "directory not empty"));
            }
            unlink_entry(tx, parent, name, ino, now, -1)?;
            Ok(tx.delete_inode(ino)?)
        })
    }

    /// Renames, with RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(&self, parent: Ino, name: &[u8], newparent: Ino, newname: &[u8], flags: RenameFlags) -> Result<()> {
        self.check_writable()?;
        check_name(newname)?;
        if flags.exchange && flags.noreplace {
            return Err(Error::invalid("RENAME_EXCHANGE and RENAME_NOREPLACE exclude each other"));
        }
        let now = Timestamp::now();
        // Between directories, renames take the volume's rename lock
        // first: the ancestor check below then sees every other move of a
        // directory committed (two crossing moves cannot both pass).
        // Returns the inode freed, if any, and the inodes moved: the source,
        // and on an exchange the target too.
        let (freed, moved) = self.meta.write_locking(&[parent, newparent], &[(parent, name), (newparent, newname)], parent != newparent, |tx| {
            wdir(tx, parent)?;
            wdir(tx, newparent)?;
            let (sino, skind) = tx.lookup(parent, name)?.ok_or_else(|| Error::not_found("no such entry"))?;
            let dst = tx.lookup(newparent, newname)?;
            tx.lock_inodes(&[Some(sino), dst.map(|d| d.0)].into_iter().flatten().collect::<Vec<_>>())?;
            winode(tx, sino)?;
            if let Some((dino, _)) = dst {
                winode(tx, dino)?;
            }
            if flags.exchange {
                let (dino, dkind) = dst.ok_or_else(|| Error::not_found("exchange target does not exist"))?;
                if sino == dino {
                    return Ok((None, [None, None]));
                }
                if skind == FileKind::Dir {
                    check_not_ancestor(tx, sino, newparent)?;
                }
                if dkind == FileKind::Dir {
                    check_not_ancestor(tx, dino, parent)?;
                }
                meta::remove_entry(tx, parent, name, sino)?;
                meta::remove_entry(tx, newparent, newname, dino)?;
                tx.insert_dentry(parent, name, dino, dkind)?;
                tx.insert_dentry(newparent, newname, sino, skind)?;
                if parent != newparent {
                    let sd = (skind == FileKind::Dir) as i64;
                    let dd = (dkind == FileKind::Dir) as i64;
                    if skind == FileKind::Dir {
                        tx.set_parent(sino, newparent)?;
                    }
                    if dkind == FileKind::Dir {
                        tx.set_parent(dino, parent)?;
                    }
                    tx.touch_dir(parent, now, dd - sd)?;
                    tx.touch_dir(newparent, now, sd - dd)?;
                } else {
                    tx.touch_dir(parent, now, 0)?;
                }
                for i in [sino, dino] {
                    let mut a = inode(tx, i)?.attr;
                    a.ctime = now;
                    tx.update_attr(&a)?;
                }
                return Ok((None, [Some(sino), Some(dino)]));
            }
            let mut freed = None;
            if let Some((dino, dkind)) = dst {
                if dino == sino {
                    return Ok((None, [None, None])); // two names of one inode: POSIX says do nothing
                }
                if flags.noreplace {
                    return Err(Error::new(ErrorKind::Exists, "target exists"));
                }
                match (skind == FileKind::Dir, dkind == FileKind::Dir) {
                    (true, false) => return Err(Error::new(ErrorKind::NotDir, "cannot replace a non-directory with a directory")),
                    (false, true) => return Err(Error::new(ErrorKind::IsDir, "cannot replace a directory with a non-directory")),
                    _ => {}
                }
                if skind == FileKind::Dir {
                    check_not_ancestor(tx, sino, newparent)?;
                }
                meta::remove_entry(tx, newparent, newname, dino)?;
                if dkind == FileKind::Dir {
                    if !tx.dir_is_empty(dino)? {
                        return Err(Error::new(ErrorKind::NotEmpty, "target directory not empty"));
                    }
                    tx.delete_inode(dino)?;
                    tx.touch_dir(newparent, now, -1)?;
                } else {
                    let a = inode(tx, dino)?.attr;
                    let n = a.nlink.saturating_sub(1);
                    tx.set_nlink(dino, n, now)?;
                    if n == 0 {
                        freed = Some(dino);
                    }
                }
            } else if skind == FileKind::Dir {
                check_not_ancestor(tx, sino, newparent)?;
            }
            meta::remove_entry(tx, parent, name, sino)?;
            tx.insert_dentry(newparent, newname, sino, skind)?;
            let isdir = (skind == FileKind::Dir) as i64;
            if parent != newparent {
                if skind == FileKind::Dir {
                    tx.set_parent(sino, newparent)?;
                }
                tx.touch_dir(parent, now, -isdir)?;
                tx.touch_dir(newparent, now, isdir)?;
            } else {
                tx.touch_dir(parent, now, 0)?;
            }
            let mut a = inode(tx, sino)?.attr;
            a.ctime = now;
            tx.update_attr(&a)?;
            Ok((freed, [Some(sino), None]))
        })?;
        if let [Some(s), d] = moved {
            self.file_moved(s, newparent, newname);
            if let Some(d) = d {
                self.file_moved(d, parent, name);
            }
        }
        if let Some(ino) = freed {
            self.last_name_gone(ino)?;
        }
        Ok(())
    }

    /// The entries of a directory, sorted, without `.` and `..`.
    pub fn readdir(&self, d: Ino) -> Result<Vec<DirEntry>> {
        self.meta.read(|c| {
            dir(c, d)?;
            Ok(c.list_dir(d)?.into_iter().map(|(name, ino, kind)| DirEntry { name, ino, kind }).collect())
        })
    }

    /// The parent of a directory (the root is its own parent).
    pub fn parent_of(&self, d: Ino) -> Result<Ino> {
        self.meta.read(|c| Ok(dir(c, d)?.parent.unwrap_or(ROOT_INO)))
    }

    /// Sets an extended attribute.
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        self.check_writable()?;
        check_xattr_name(name)?;
        if value.len() > XATTR_MAX {
            return Err(Error::new(ErrorKind::TooBig, "extended attribute value larger than 64 KiB"));
        }
        let now = Timestamp::now();
        self.meta.write(|tx| {
            let mut a = winode(tx, ino)?.attr;
            let exists = tx.get_xattr(ino, name)?.is_some();
            if flags.create && exists {
                return Err(Error::new(ErrorKind::Exists, "attribute exists"));
            }
            if flags.replace && !exists {
                return Err(Error::new(ErrorKind::NoAttr, "no such attribute"));
            }
            tx.set_xattr(ino, name, value)?;
            a.ctime = now;
            Ok(tx.update_attr(&a)?)
        })
    }

    /// Reads an extended attribute.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        self.meta.read(|c| {
            inode(c, ino)?;
            c.get_xattr(ino, name)?.ok_or_else(|| Error::new(ErrorKind::NoAttr, "no such attribute"))
        })
    }

    /// Names of the extended attributes.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.meta.read(|c| {
            inode(c, ino)?;
            Ok(c.list_xattrs(ino)?)
        })
    }

    /// Removes an extended attribute.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        check_xattr_name(name)?;
        let now = Timestamp::now();
        self.meta.write(|tx| {
            let mut a = winode(tx, ino)?.attr;
            if !tx.remove_xattr(ino, name)? {
                return Err(Error::new(ErrorKind::NoAttr, "no such attribute"));
            }
            a.ctime = now;
            Ok(tx.update_attr(&a)?)
        })
    }

    /// Frees an inode with no names and no open handles: its extents'
    /// chunk references are released and its rows deleted.
    pub(crate) fn free_inode(&self, ino: Ino) -> Result<()> {
        self.files.drop_freed(ino);
        let freed = self.meta.write(|tx| {
            let Some(row) = tx.get_inode(ino)? else { return Ok(false) };
            if row.attr.nlink > 0 || self.open_elsewhere_on_free(tx, ino)? {
                return Ok(false);
            }
            tx.release_pages(ino)?;
            tx.delete_inode(ino)?;
            Ok(true)
        })?;
        self.forget_closing(ino);
        if let (Some(t), true) = (&self.trace, freed) {
            t.record(crate::trace::Event::Remove { ino });
        }
        Ok(())
    }

    /// Frees the inodes without names that nobody has open: left by a
    /// crash while they were open, or, on a shared volume, by a machine
    /// whose expired session the cleaner removed with its open files.
    pub(crate) fn remove_orphans(&self) -> Result<()> {
        for ino in self.meta.read(|tx| Ok(tx.orphan_inodes()?))? {
            self.free_inode(ino)?;
        }
        Ok(())
    }
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::new(ErrorKind::Range, "attribute name must be 1 to 255 bytes"));
    }
    // ACLs would have to be enforced to be honest; refuse them like a file
    // system mounted without ACL support.
    if name.starts_with(b"system.") {
        return Err(Error::new(ErrorKind::NotSupported, "system.* attributes (ACLs) are not supported"));
    }
    Ok(())
}

/// Fails if `dir` is `target` or one of its ancestors (moving a directory
/// into its own subtree).
fn check_not_ancestor(c: &dyn MetaRead, dir: Ino, target: Ino) -> Result<()> {
    let mut cur = target;
    for _ in 0..100_000 {
        if cur == dir {
            return Err(Error::invalid("cannot move a directory into itself"));
        }
        if cur == ROOT_INO {
            return Ok(());
        }
        cur = inode(c, cur)?.parent.unwrap_or(ROOT_INO);
    }
    Err(Error::corrupt("directory parent chain does not reach the root"))
}
