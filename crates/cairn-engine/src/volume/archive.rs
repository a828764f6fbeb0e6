//! Zero-copy tar archives (after AvaTar, seed 000 §III).
//!
//! Inside a volume a tar file is an extent list like any other file, so:
//! - **create** writes only the headers: the archive's extents are each
//!   header (a new small chunk), then the member's own extents (its chunks,
//!   shared), then the padding to 512 bytes and the end marker as holes;
//! - **extract** parses the headers and makes every member a new file whose
//!   extents are slices of the archive's extents (no data read or written).
//!
//! Both are one metadata transaction: an error leaves nothing half-made.
//! With `remove`/`consume` the sources (AvaTar's merge) or the archive (its
//! split) go in the same transaction.

use super::tree::remove_tree;
use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::{Extent, ExtentMap, RangeCursor, Source};
use crate::meta;
use crate::types::{Attr, Caller, FileKind, Ino, Timestamp};
use cairn_tar::{HeaderSpec, Member, MemberKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What an archive operation did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArchiveReport {
    /// Members written or extracted.
    pub members: u64,
    /// Member data bytes shared (not copied).
    pub data_bytes: u64,
    /// Header bytes written (create) or parsed (extract).
    pub header_bytes: u64,
    /// The archive's size.
    pub archive_bytes: u64,
    /// The new archive's inode (create) or the extraction root (extract).
    pub ino: Ino,
}

/// One top-level member of a new archive: the name it gets in the archive
/// and the inode it comes from.
#[derive(Clone, Debug)]
pub struct ArchiveSource {
    pub name: Vec<u8>,
    pub ino: Ino,
    /// Where its name is, for `remove` (parent directory, name).
    pub parent: Ino,
    pub entry: Vec<u8>,
}

/// Options of `archive_create`.
#[derive(Clone, Copy, Debug)]
pub struct CreateOptions {
    /// Pad headers so every member's data starts on a multiple of this.
    pub align: Option<u64>,
    /// Remove the sources once the archive holds them (a move).
    pub remove: bool,
    pub caller: Caller,
}

/// A piece of the archive being built.
enum Part {
    /// Header bytes: `len` bytes at `off` in header block `block`.
    Header { block: usize, off: u32, len: u32 },
    Ext(Extent),
}

/// Reads a committed file (the archive being extracted) for the tar parser
/// straight from its extent map. The parser reads headers at increasing
/// offsets, so a cursor finds each read's extents without scanning a page
/// of up to `PAGE_MAX` extents, as a lookup by offset would.
struct MapReader<'a> {
    vol: &'a Volume,
    map: &'a ExtentMap,
    cur: std::cell::RefCell<RangeCursor>,
}

impl cairn_tar::ReadAt for MapReader<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let end = offset.saturating_add(buf.len() as u64).min(self.map.len());
        if offset >= end {
            return Ok(0);
        }
        let mut at = 0usize;
        for (_, e) in self.map.range_from(&mut self.cur.borrow_mut(), offset, end) {
            let n = e.len as usize;
            match e.src {
                Source::Hole => buf[at..at + n].fill(0),
                Source::Chunk(id) => {
                    let c = self.vol.chunk(id).map_err(|e| std::io::Error::other(e.to_string()))?;
                    let src = c
                        .get(e.off as usize..(e.off + e.len) as usize)
                        .ok_or_else(|| std::io::Error::other(format!("extent past the end of chunk #{id}")))?;
                    buf[at..at + n].copy_from_slice(src);
                }
                _ => return Err(std::io::Error::other("the archive has content not yet flushed")),
            }
            at += n;
        }
        Ok(at)
    }
}

impl Volume {
    /// Creates the tar file `name` in `dst_parent` holding `sources` (and
    /// everything below the directories among them), sharing their data.
    pub fn archive_create(&self, sources: &[ArchiveSource], dst_parent: Ino, name: &[u8], opts: CreateOptions) -> Result<ArchiveReport> {
        self.check_writable()?;
        super::namespace::check_name(name)?;
        if let Some(a) = opts.align {
            if !a.is_power_of_two() || a < 512 {
                return Err(Error::invalid(format!("alignment {a} must be a power of two of at least 512")));
            }
        }
        if sources.is_empty() {
            return Err(Error::invalid("nothing to archive"));
        }
        // Members' content must be committed to be shared (committed, not
        // yet durable: the archive's own transaction is no more durable).
        let t0 = std::time::Instant::now();
        self.prefetch_metadata();
        self.flush_round(true)?;
        let now = Timestamp::now();
        // The headers, concatenated, are cut into blocks of about the average
        // chunk size, each stored as one chunk as soon as it is full (so
        // memory stays flat however many header bytes a tree needs: a deep
        // tree's headers repeat its whole path); every header is a slice of
        // its block. The member data around them stays in the members'
        // chunks, shared. One chunk per header would cost a chunk row, an
        // encryption and (on extract) a fetch per member.
        let block_target = (self.cfg.chunker.avg as usize).max(64 << 10);
        let mut batch = super::flush::Batch::new(self);
        batch.set_owner(opts.caller.uid);
        let mut block: Vec<u8> = Vec::with_capacity(block_target);
        let mut ids: Vec<u64> = Vec::new();
        let mut parts: Vec<Part> = Vec::new();
        let mut report = ArchiveReport::default();
        let mut pos = 0u64;
        self.meta.read_many(|c| {
            let mut first_name: HashMap<Ino, Vec<u8>> = HashMap::new();
            for s in sources {
                // Depth first, entries in name order, as tar walks a tree.
                let mut stack: Vec<(Vec<u8>, Ino)> = vec![(s.name.clone(), s.ino)];
                while let Some((path, ino)) = stack.pop() {
                    let row = c.get_inode(ino)?.ok_or_else(|| Error::not_found(format!("{} vanished", String::from_utf8_lossy(&path))))?;
                    let a = &row.attr;
                    let mut xattrs = Vec::new();
                    for n in c.list_xattrs(ino)? {
                        if let Some(v) = c.get_xattr(ino, &n)? {
                            xattrs.push((n, v));
                        }
                    }
                    let hard = if a.kind != FileKind::Dir && a.nlink > 1 { first_name.get(&ino).cloned() } else { None };
                    let kind = match (&hard, a.kind) {
                        (Some(_), _) => MemberKind::HardLink,
                        (None, FileKind::File) => MemberKind::File,
                        (None, FileKind::Dir) => MemberKind::Dir,
                        (None, FileKind::Symlink) => MemberKind::Symlink,
                        (None, FileKind::Fifo) => MemberKind::Fifo,
                        (None, FileKind::CharDev) => MemberKind::CharDev,
                        (None, FileKind::BlockDev) => MemberKind::BlockDev,
                        (None, FileKind::Socket) => continue, // tar cannot hold sockets (GNU tar skips them too)
                    };
                    if hard.is_none() && a.kind != FileKind::Dir && a.nlink > 1 {
                        first_name.insert(ino, path.clone());
                    }
                    let link_target = match kind {
                        MemberKind::HardLink => hard.clone(),
                        MemberKind::Symlink => row.target.clone(),
                        _ => None,
                    };
                    let size = if kind == MemberKind::File { a.size } else { 0 };
                    let spec = HeaderSpec {
                        path: &path,
                        kind,
                        link_target: link_target.as_deref(),
                        mode: a.perm,
                        uid: a.uid as u64,
                        gid: a.gid as u64,
                        uname: None,
                        gname: None,
                        mtime_ns: a.mtime.0,
                        atime_ns: None,
                        size,
                        dev_major: libc::major(a.rdev as libc::dev_t),
                        dev_minor: libc::minor(a.rdev as libc::dev_t),
                        xattrs: &xattrs,
                    };
                    let h = cairn_tar::write_header(&spec, pos, opts.align);
                    if !block.is_empty() && block.len() + h.len() > block_target {
                        ids.extend(batch.store_in(c, &[&block])?);
                        block.clear();
                    }
                    let too_big = || Error::invalid(format!("{}: a tar header of {} bytes", String::from_utf8_lossy(&path), h.len()));
                    parts.push(Part::Header { block: ids.len(), off: u32::try_from(block.len()).map_err(|_| too_big())?, len: u32::try_from(h.len()).map_err(|_| too_big())? });
                    block.extend_from_slice(&h);
                    pos += h.len() as u64;
                    report.header_bytes += h.len() as u64;
                    report.members += 1;
                    if kind == MemberKind::File && size > 0 {
                        let map = meta::load_extents(c, ino)?;
                        if map.len() != size {
                            return Err(Error::corrupt(format!("inode {ino}: extents cover {} bytes, size {size}", map.len())));
                        }
                        for (_, e) in map.range(0, size) {
                            parts.push(Part::Ext(e));
                        }
                        pos += size;
                        report.data_bytes += size;
                        let pad = cairn_tar::data_padding(size);
                        if pad > 0 {
                            parts.push(Part::Ext(Extent::hole(pad)));
                            pos += pad;
                        }
                    }
                    if a.kind == FileKind::Dir {
                        let mut children = c.list_dir(ino)?;
                        children.reverse(); // popped in name order
                        for (n, child, _) in children {
                            let mut p = path.clone();
                            p.push(b'/');
                            p.extend_from_slice(&n);
                            stack.push((p, child));
                        }
                    }
                }
            }
            Ok(())
        })?;
        parts.push(Part::Ext(Extent::hole(cairn_tar::END_OF_ARCHIVE.len() as u64)));
        pos += cairn_tar::END_OF_ARCHIVE.len() as u64;
        report.archive_bytes = pos;
        if !block.is_empty() {
            ids.extend(batch.store(&[&block])?);
        }
        drop(block);
        let walked = t0.elapsed();
        batch.seal()?;
        batch.finish_uploads()?;
        let header_chunks = ids.len();
        let extents: Vec<Extent> = parts
            .into_iter()
            .map(|p| match p {
                Part::Header { block, off, len } => Extent::chunk(ids[block], off as u64, len as u64),
                Part::Ext(e) => e,
            })
            .collect();
        let stored = t0.elapsed();
        let mut map = ExtentMap::new();
        map.splice(0, 0, extents);
        let jseq = self.journal.last_seq();
        let mut freed_later = Vec::new();
        let ch = map.take_changes();
        let ino = self.meta.write(|tx| {
            freed_later.clear(); // the store may run this again
            let parent = tx.get_inode(dst_parent)?.ok_or_else(|| Error::not_found("destination directory does not exist"))?;
            if parent.attr.kind != FileKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, "destination is not a directory"));
            }
            super::namespace::check_not_snapshot(&parent)?;
            if tx.lookup(dst_parent, name)?.is_some() {
                return Err(Error::new(ErrorKind::Exists, format!("{} already exists", String::from_utf8_lossy(name))));
            }
            batch.insert_into(tx)?;
            let ino = self.alloc_ino(tx)?;
            let a = new_attr(ino, FileKind::File, 0o644, 1, opts.caller, now, map.len());
            tx.insert_inode_full(&a, map.data_bytes(), None, None, jseq, 0)?;
            tx.insert_dentry(dst_parent, name, ino, FileKind::File)?;
            tx.touch_dir(dst_parent, now, 0)?;
            meta::save_extents(tx, ino, &ch)?;
            if opts.remove {
                // The archive must not vanish with its sources.
                let mut cur = dst_parent;
                for _ in 0..100_000 {
                    if sources.iter().any(|s| s.ino == cur) {
                        return Err(Error::invalid("the archive would be inside a source it removes"));
                    }
                    match tx.get_inode(cur)?.and_then(|r| r.parent) {
                        Some(p) if p != cur => cur = p,
                        _ => break,
                    }
                }
                for s in sources {
                    let p = tx.get_inode(s.parent)?.ok_or_else(|| Error::not_found("a source's directory vanished"))?;
                    super::namespace::check_not_snapshot(&p)?;
                    freed_later.extend(remove_tree(self, tx, s.parent, &s.entry, now)?);
                }
            }
            Ok(ino)
        })?;
        batch.account();
        tracing::debug!(members = report.members, header_chunks, ?walked, ?stored, total = ?t0.elapsed(), "archive created");
        for i in freed_later {
            self.last_name_gone(i)?;
        }
        self.kernel_entry_changed(dst_parent, name);
        self.kernel_inode_changed(dst_parent);
        if opts.remove {
            for s in sources {
                self.kernel_entry_changed(s.parent, &s.entry);
                self.kernel_inode_changed(s.parent);
            }
        }
        report.ino = ino;
        Ok(report)
    }

    /// Extracts the tar file `archive` into directory `dest` (created if
    /// missing, as `name` in `dest_parent`): every member becomes a file whose
    /// extents are slices of the archive's. Refuses, changing nothing, if a
    /// member's name is taken in `dest`, escapes it, or passes through a link.
    pub fn archive_extract(&self, archive: Ino, dest_parent: Ino, dest_name: &[u8], consume: Option<(Ino, Vec<u8>)>, caller: Caller) -> Result<ArchiveReport> {
        self.check_writable()?;
        super::namespace::check_name(dest_name)?;
        self.prefetch_metadata();
        // The archive's content must be committed: members slice its extents.
        let (size, amap) = {
            let locked = self.lock_clean(&[archive])?;
            let g = locked.states[0].inner.lock();
            (g.size, g.base.clone())
        };
        let t0 = std::time::Instant::now();
        let reader = MapReader { vol: self, map: &amap, cur: Default::default() };
        // Members are laid out as they are parsed: only what the inodes need
        // is kept per member, not the members themselves.
        let plan = Plan::build(cairn_tar::Parser::new(&reader, size), amap.len())?;
        let parsed = t0.elapsed();
        let now = Timestamp::now();
        let owner = (caller.uid != 0).then_some(caller);
        let mut report = ArchiveReport { members: plan.members, archive_bytes: size, ..Default::default() };
        let jseq = self.journal.last_seq();
        let mut freed_later = Vec::new();
        let root = self.meta.write(|tx| {
            freed_later.clear(); // the store may run this again
            let parent = tx.get_inode(dest_parent)?.ok_or_else(|| Error::not_found("destination's directory does not exist"))?;
            super::namespace::check_not_snapshot(&parent)?;
            // DEST: an existing directory whose names must stay untouched, or new.
            let (root, fresh) = match tx.lookup(dest_parent, dest_name)? {
                Some((ino, FileKind::Dir)) => {
                    // A name whose inode row is missing is damage, not a reason to crash.
                    let r = tx.get_inode(ino)?.ok_or_else(|| {
                        Error::corrupt(format!("directory entry {:?} names inode {ino}, which does not exist (run cairn fsck)", String::from_utf8_lossy(dest_name)))
                    })?;
                    super::namespace::check_not_snapshot(&r)?;
                    (ino, false)
                }
                Some(_) => return Err(Error::new(ErrorKind::Exists, format!("{} exists and is not a directory", String::from_utf8_lossy(dest_name)))),
                None => (self.alloc_ino(tx)?, true),
            };
            if fresh {
                let a = new_attr(root, FileKind::Dir, 0o755, 2, caller, now, 0);
                tx.insert_inode_full(&a, 0, Some(dest_parent), None, jseq, 0)?;
                tx.insert_dentry(dest_parent, dest_name, root, FileKind::Dir)?;
                tx.touch_dir(dest_parent, now, 1)?;
            } else {
                for top in plan.children_of(0) {
                    let n = &plan.nodes[top].name;
                    if tx.lookup(root, n)?.is_some() {
                        return Err(Error::new(ErrorKind::Exists, format!("{} already holds {}", String::from_utf8_lossy(dest_name), String::from_utf8_lossy(n))));
                    }
                }
            }
            // Inode numbers: node 0 is DEST; hard links share their target's.
            let mut inos: Vec<Ino> = vec![root; plan.nodes.len()];
            for (ino, node) in inos.iter_mut().zip(&plan.nodes).skip(1) {
                if node.hard_of().is_none() {
                    *ino = self.alloc_ino(tx)?;
                }
            }
            for i in 1..plan.nodes.len() {
                if let Some(t) = plan.nodes[i].hard_of() {
                    inos[i] = inos[t];
                }
            }
            let mut subdirs: HashMap<usize, u32> = HashMap::new();
            for i in 1..plan.nodes.len() {
                let n = &plan.nodes[i];
                if n.kind == FileKind::Dir {
                    *subdirs.entry(n.parent as usize).or_default() += 1;
                }
            }
            let mut cur = RangeCursor::default();
            for i in 1..plan.nodes.len() {
                let n = &plan.nodes[i];
                let ino = inos[i];
                tx.insert_dentry(inos[n.parent as usize], &n.name, ino, n.kind)?;
                if n.hard_of().is_some() {
                    continue;
                }
                let m = n.attrs.as_ref();
                let nlink = if n.kind == FileKind::Dir { 2 + subdirs.get(&i).copied().unwrap_or(0) } else { n.links };
                let mut a = new_attr(ino, n.kind, m.map_or(0o755, |m| m.mode & 0o7777), nlink, caller, now, 0);
                if let Some(m) = m {
                    if owner.is_none() {
                        a.uid = m.uid;
                        a.gid = m.gid;
                    }
                    a.mtime = Timestamp(m.mtime_ns);
                    a.atime = Timestamp(m.atime_ns);
                    a.rdev = m.rdev;
                    if owner.is_some() {
                        a.perm &= !0o6000;
                    }
                }
                let extra = m.and_then(|m| m.extra.as_deref());
                let mut data_bytes = 0;
                let target = extra.and_then(|x| if n.kind == FileKind::Symlink { x.target.clone() } else { None });
                if n.kind == FileKind::File {
                    let m = m.expect("files come from members");
                    let mut map = ExtentMap::new();
                    let mut ex: Vec<Extent> = Vec::new();
                    let mut at = 0u64;
                    for r in extra.map_or(&[][..], |x| &x.data[..]) {
                        if r.file_offset > at {
                            ex.push(Extent::hole(r.file_offset - at));
                        }
                        ex.extend(amap.range_from(&mut cur, r.archive_offset, r.archive_offset + r.len).into_iter().map(|(_, e)| e));
                        at = r.file_offset + r.len;
                    }
                    if m.size > at {
                        ex.push(Extent::hole(m.size - at));
                    }
                    map.splice(0, 0, ex);
                    a.size = map.len();
                    data_bytes = map.data_bytes();
                    report.data_bytes += data_bytes;
                    let ch = map.take_changes();
                    meta::save_extents(tx, ino, &ch)?;
                } else if n.kind == FileKind::Symlink {
                    a.size = target.as_ref().map_or(0, |t| t.len() as u64);
                }
                let parent = (n.kind == FileKind::Dir).then_some(inos[n.parent as usize]);
                tx.insert_inode_full(&a, data_bytes, parent, target.as_deref(), jseq, 0)?;
                if let Some(x) = extra {
                    for (k, v) in &x.xattrs {
                        tx.set_xattr(ino, k, v)?;
                    }
                }
            }
            let top_dirs = plan.children_of(0).filter(|&c| plan.nodes[c].kind == FileKind::Dir).count() as i64;
            tx.touch_dir(root, now, top_dirs)?;
            if let Some((p, n)) = &consume {
                freed_later.extend(remove_tree(self, tx, *p, n, now)?);
            }
            Ok(root)
        })?;
        tracing::debug!(members = plan.members, ?parsed, total = ?t0.elapsed(), "archive extracted");
        for i in freed_later {
            self.last_name_gone(i)?;
        }
        self.kernel_entry_changed(dest_parent, dest_name);
        self.kernel_inode_changed(dest_parent);
        self.kernel_inode_changed(root);
        if let Some((p, n)) = &consume {
            self.kernel_entry_changed(*p, n);
            self.kernel_inode_changed(*p);
        }
        report.header_bytes = size.saturating_sub(report.data_bytes);
        report.ino = root;
        Ok(report)
    }
}

fn new_attr(ino: Ino, kind: FileKind, perm: u32, nlink: u32, caller: Caller, now: Timestamp, size: u64) -> Attr {
    Attr { ino, kind, perm, nlink, uid: caller.uid, gid: caller.gid, rdev: 0, size, blocks: 0, atime: now, mtime: now, ctime: now, btime: now }
}


/// The tree an archive extracts to, checked before anything is written.
/// Built while the archive is parsed, keeping per member only what its
/// inode needs (about 100 bytes and its name for a header-only member):
/// the members themselves are dropped as they come.
struct Plan {
    /// Node 0 is DEST itself.
    nodes: Vec<Node>,
    /// Hash of (parent, name) → the first node of that hash; the others
    /// follow through `Node::next`.
    index: HashMap<u64, u32>,
    hasher: std::collections::hash_map::RandomState,
    /// Members parsed.
    members: u64,
}

const NONE: u32 = u32::MAX;

struct Node {
    name: Box<[u8]>,
    parent: u32,
    kind: FileKind,
    /// A hard link: the node whose inode it shares (NONE if not one).
    hard_of: u32,
    /// Names of the inode (files).
    links: u32,
    /// The next node whose (parent, name) hashes alike.
    next: u32,
    /// From the member describing it (None for directories implied by paths).
    attrs: Option<Attrs>,
}

/// A member's attributes, as its inode gets them.
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    mtime_ns: i64,
    atime_ns: i64,
    size: u64,
    /// Data runs, symlink target and xattrs, for members that have any.
    extra: Option<Box<Extra>>,
}

struct Extra {
    data: Vec<cairn_tar::DataRun>,
    target: Option<Vec<u8>>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Node {
    fn hard_of(&self) -> Option<usize> {
        (self.hard_of != NONE).then_some(self.hard_of as usize)
    }
}

impl Attrs {
    fn of(m: Member) -> Attrs {
        let target = if m.kind == MemberKind::Symlink { m.link_target } else { None };
        let xattrs: Vec<(Vec<u8>, Vec<u8>)> = m.xattrs.into_iter().filter(|(k, _)| !k.starts_with(b"system.") && !k.is_empty() && k.len() <= 255).collect();
        let data = if matches!(m.kind, MemberKind::File | MemberKind::HardLink) { m.data } else { Vec::new() };
        let extra = (!data.is_empty() || target.is_some() || !xattrs.is_empty()).then(|| Box::new(Extra { data, target, xattrs }));
        Attrs {
            mode: m.mode,
            uid: m.uid.min(u32::MAX as u64) as u32,
            gid: m.gid.min(u32::MAX as u64) as u32,
            rdev: libc::makedev(m.dev_major, m.dev_minor) as u32,
            mtime_ns: m.mtime_ns,
            atime_ns: m.atime_ns.unwrap_or(m.mtime_ns),
            size: m.size,
            extra,
        }
    }
}

impl Plan {
    fn children_of(&self, parent: usize) -> impl Iterator<Item = usize> + '_ {
        self.nodes.iter().enumerate().skip(1).filter(move |(_, n)| n.parent as usize == parent).map(|(i, _)| i)
    }

    fn key(&self, parent: usize, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((parent, name))
    }

    fn child(&self, parent: usize, name: &[u8]) -> Option<usize> {
        let mut at = *self.index.get(&self.key(parent, name))?;
        while at != NONE {
            let n = &self.nodes[at as usize];
            if n.parent as usize == parent && &n.name[..] == name {
                return Some(at as usize);
            }
            at = n.next;
        }
        None
    }

    fn build(members: impl Iterator<Item = std::result::Result<Member, cairn_tar::TarError>>, archive_len: u64) -> Result<Plan> {
        let root = Node { name: Box::default(), parent: 0, kind: FileKind::Dir, hard_of: NONE, links: 1, next: NONE, attrs: None };
        let mut plan = Plan { nodes: vec![root], index: HashMap::new(), hasher: Default::default(), members: 0 };
        let err = |m: &Member, why: &str| Error::invalid(format!("member {:?}: {why}", String::from_utf8_lossy(&m.path)));
        for m in members {
            let m = m.map_err(|e| Error::invalid(format!("not a valid tar archive: {e}")))?;
            plan.members += 1;
            if plan.nodes.len() >= NONE as usize - 1 {
                return Err(Error::invalid("more than 4 billion members"));
            }
            let comps = cairn_tar::safe_path(&m.path).map_err(|e| Error::invalid(e.to_string()))?;
            if comps.is_empty() {
                continue; // "./" itself: DEST
            }
            // Walk (or imply) the directories above it; never through a
            // symlink or a file.
            let mut cur = 0usize;
            for c in &comps[..comps.len() - 1] {
                cur = match plan.child(cur, c) {
                    Some(n) if plan.nodes[n].kind == FileKind::Dir => n,
                    Some(_) => return Err(err(&m, &format!("its path passes through {:?}, which is not a directory in the archive", String::from_utf8_lossy(c)))),
                    None => plan.add(cur, c, FileKind::Dir, None),
                };
            }
            let last = comps[comps.len() - 1];
            let kind = match m.kind {
                MemberKind::File | MemberKind::HardLink => FileKind::File,
                MemberKind::Dir => FileKind::Dir,
                MemberKind::Symlink => FileKind::Symlink,
                MemberKind::Fifo => FileKind::Fifo,
                MemberKind::CharDev => FileKind::CharDev,
                MemberKind::BlockDev => FileKind::BlockDev,
            };
            if m.kind == MemberKind::Symlink && m.link_target.as_ref().is_none_or(|t| t.is_empty() || t.len() > 4095) {
                return Err(err(&m, "symlink target must be 1 to 4095 bytes"));
            }
            if m.data.iter().any(|r| r.archive_offset.checked_add(r.len).is_none_or(|e| e > archive_len)) {
                return Err(err(&m, "its data run past the end of the archive"));
            }
            let hard_of = if m.kind == MemberKind::HardLink {
                let t = m.link_target.as_deref().ok_or_else(|| err(&m, "hard link without a target"))?;
                let tc = cairn_tar::safe_path(t).map_err(|e| Error::invalid(e.to_string()))?;
                let target = plan.find(&tc).filter(|&n| plan.nodes[n].kind == FileKind::File && plan.nodes[n].hard_of == NONE);
                Some(target.ok_or_else(|| err(&m, "hard link to a file not earlier in the archive"))?)
            } else {
                None
            };
            let existing = plan.child(cur, last);
            match existing {
                // A directory named twice: the later header's attributes win.
                Some(n) if kind == FileKind::Dir && plan.nodes[n].kind == FileKind::Dir => plan.nodes[n].attrs = Some(Attrs::of(m)),
                Some(_) => return Err(err(&m, "the archive holds this name twice")),
                None => {
                    let n = plan.add(cur, last, kind, None);
                    match hard_of {
                        Some(t) => {
                            plan.nodes[n].hard_of = t as u32;
                            plan.nodes[t].links += 1;
                        }
                        None => plan.nodes[n].attrs = Some(Attrs::of(m)),
                    }
                }
            }
        }
        Ok(plan)
    }

    fn add(&mut self, parent: usize, name: &[u8], kind: FileKind, attrs: Option<Attrs>) -> usize {
        let n = self.nodes.len();
        let key = self.key(parent, name);
        let next = self.index.insert(key, n as u32).unwrap_or(NONE);
        self.nodes.push(Node { name: name.into(), parent: parent as u32, kind, hard_of: NONE, links: 1, next, attrs });
        n
    }

    fn find(&self, comps: &[&[u8]]) -> Option<usize> {
        let mut cur = 0;
        for c in comps {
            cur = self.child(cur, c)?;
        }
        Some(cur)
    }
}
