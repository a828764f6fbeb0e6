//! What `cairn info PATH` and `cairn stats DIR-IN-A-MOUNT` show: where one
//! file's bytes are (its chunks, their packs, how many places share them,
//! and whether they are in the journal, the local directory, the local
//! cache or only at the home), and a summary of one tree (what it holds,
//! what it shares with the rest of the volume, what deleting it would
//! free). Both read the committed metadata; `info` also the file's
//! in-memory state (bytes written but not yet flushed into a pack are in
//! the journal). The caller must be able to reach and read what it asks
//! about, as the kernel would check.

use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::{decode_page, Extent, ExtentMap, Source};
use crate::meta;
use crate::types::{Attr, Caller, FileKind, Ino, ROOT_INO};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Where a chunk's bytes are right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// Written, not yet flushed into a pack (in the journal).
    Journal,
    /// In a pack in the volume's own directory (`DIR/store`).
    Local,
    /// The local pack cache holds it (a volume in a bucket or on tape);
    /// also packs written but not yet uploaded.
    Cache,
    /// Only in the bucket.
    Bucket,
    /// Only on the tape.
    Tape,
}

impl Place {
    pub fn name(self) -> &'static str {
        match self {
            Place::Journal => "journal",
            Place::Local => "local",
            Place::Cache => "cache",
            Place::Bucket => "bucket",
            Place::Tape => "tape",
        }
    }
}

/// One run of a file's bytes that is not a hole.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChunkInfo {
    /// Offset in the file and length of the run.
    pub offset: u64,
    pub len: u64,
    /// The chunk (None for bytes still in the journal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<u64>,
    /// Where in the chunk the run starts.
    #[serde(default)]
    pub chunk_offset: u64,
    /// The chunk's plaintext and stored (compressed, sealed) length.
    #[serde(default)]
    pub raw_len: u64,
    #[serde(default)]
    pub stored_len: u64,
    /// The pack holding the chunk, and the chunk's offset in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<String>,
    #[serde(default)]
    pub pack_offset: u64,
    /// References to the chunk: places in files' extent maps that point at
    /// it (a whole-file clone shares its source's maps; see `map_links`).
    #[serde(default)]
    pub refs: u64,
    pub place: Place,
}

/// `cairn info PATH`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileInfo {
    pub ino: Ino,
    /// "file", "dir", "symlink", ...
    pub kind: String,
    pub size: u64,
    /// A directory's entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// Files linking this file's extent maps (1, or more after a whole-file
    /// clone: the clones share every chunk).
    pub map_links: u64,
    /// Distinct chunks the file references.
    pub chunks: u64,
    /// Bytes in holes.
    pub hole_bytes: u64,
    /// File bytes in chunks no other place references.
    pub exclusive_bytes: u64,
    /// File bytes in chunks other places (or clones) reference too.
    pub shared_bytes: u64,
    /// File bytes by where they are.
    pub placed: BTreeMap<String, u64>,
    /// The runs of data, in file order.
    pub runs: Vec<ChunkInfo>,
}

/// `cairn stats DIR` for a tree inside a mount.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TreeStats {
    pub files: u64,
    /// Including the tree's root if it is a directory.
    pub directories: u64,
    pub symlinks: u64,
    /// Sum of regular file sizes.
    pub logical_bytes: u64,
    /// Of those, bytes in holes.
    pub hole_bytes: u64,
    /// Distinct chunks the tree's files reference.
    pub chunks: u64,
    /// Their plaintext bytes.
    pub unique_bytes: u64,
    /// Their stored (compressed, sealed) bytes.
    pub stored_bytes: u64,
    /// (logical - holes) / unique.
    pub dedup_ratio: f64,
    /// Chunks also referenced from outside the tree, and their bytes.
    pub shared_chunks: u64,
    pub shared_bytes: u64,
    pub shared_stored_bytes: u64,
    /// Chunks referenced only from inside the tree: what deleting the tree
    /// would free.
    pub exclusive_chunks: u64,
    pub exclusive_bytes: u64,
    pub exclusive_stored_bytes: u64,
}

const R: u32 = 4;
const X: u32 = 1;

/// Whether `caller` has the `want` bits (r=4, w=2, x=1) on `a`, as the
/// kernel's default permission check decides (owner, then group, then
/// others; root may do anything but execute a file no one may execute).
/// Supplementary groups are not known here: only the primary group counts.
pub(crate) fn may(a: &Attr, caller: Caller, want: u32) -> bool {
    if caller.uid == 0 {
        return want & X == 0 || a.kind == FileKind::Dir || a.perm & 0o111 != 0;
    }
    let bits = if a.uid == caller.uid {
        a.perm >> 6
    } else if a.gid == caller.gid {
        a.perm >> 3
    } else {
        a.perm
    } & 7;
    bits & want == want
}

fn denied(path: &[u8], what: &str) -> Error {
    Error::new(ErrorKind::Permission, format!("{}: permission denied ({what})", show(path)))
}

fn show(path: &[u8]) -> String {
    let s = String::from_utf8_lossy(path);
    if s.is_empty() { "/".into() } else { s.into_owned() }
}

impl Volume {
    /// `path` (from the volume root) resolved as `caller` would: every
    /// directory on the way must be searchable, and the last component
    /// must allow `want` (4 read, 1 search).
    pub fn resolve_as(&self, path: &[u8], caller: Caller, want: u32) -> Result<Ino> {
        let mut cur = self.getattr(ROOT_INO)?;
        let mut walked: Vec<u8> = Vec::new();
        for comp in path.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".") {
            if cur.kind != FileKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, format!("{}: not a directory", show(&walked))));
            }
            if !may(&cur, caller, X) {
                return Err(denied(&walked, "a directory on the way may not be searched"));
            }
            walked.push(b'/');
            walked.extend_from_slice(comp);
            cur = if comp == b".." { self.getattr(self.parent_of(cur.ino)?)? } else { self.lookup(cur.ino, comp).map_err(|e| e.context(show(&walked)))? };
        }
        if want != 0 && !may(&cur, caller, want) {
            return Err(denied(path, if cur.kind == FileKind::Dir { "the directory may not be read" } else { "the file may not be read" }));
        }
        Ok(cur.ino)
    }

    /// Visits every inode of the tree at `root` once (directories before
    /// their entries), checking as `caller` (if given) that each directory
    /// may be read and searched and, with `read_files`, each file read.
    pub(crate) fn walk_tree(&self, root: Ino, root_path: &[u8], caller: Option<Caller>, read_files: bool, f: &mut dyn FnMut(&Attr, &[(Vec<u8>, Ino, FileKind)]) -> Result<()>) -> Result<()> {
        let mut seen = HashSet::new();
        let mut stack: Vec<(Ino, Vec<u8>)> = vec![(root, root_path.to_vec())];
        while let Some((ino, path)) = stack.pop() {
            if !seen.insert(ino) {
                continue;
            }
            let a = self.getattr(ino)?;
            if let Some(c) = caller {
                match a.kind {
                    FileKind::Dir if !may(&a, c, R | X) => return Err(denied(&path, "a directory in the tree may not be read")),
                    FileKind::File if read_files && !may(&a, c, R) => return Err(denied(&path, "a file in the tree may not be read")),
                    _ => {}
                }
            }
            let list = if a.kind == FileKind::Dir { self.meta.read(|c| Ok(c.list_dir(ino)?))? } else { Vec::new() };
            f(&a, &list)?;
            {
                for (name, child, _) in list {
                    let mut p = path.clone();
                    p.push(b'/');
                    p.extend_from_slice(&name);
                    stack.push((child, p));
                }
            }
        }
        Ok(())
    }

    /// Where a stored chunk's bytes are.
    fn chunk_place(&self, pack: &str, off: u64, len: u64) -> Place {
        match self.cloud() {
            None => Place::Local,
            Some(c) if c.cache.holds(pack, off, len) => Place::Cache,
            Some(_) if !self.chunks.backend.capabilities().cheap_ranged_reads => Place::Tape,
            Some(_) => Place::Bucket,
        }
    }

    /// The file's current content as extents: the committed map with the
    /// unflushed journal pieces on top (as a flush would build it).
    fn current_extents(&self, ino: Ino) -> Result<ExtentMap> {
        if let Some(st) = self.files.get(&ino).map(|s| s.clone()) {
            let g = st.inner.lock();
            if !g.evicted {
                let mut map = g.base.clone();
                if g.base_valid < map.len() {
                    map.set_len(g.base_valid);
                }
                map.set_len(g.size);
                for (&s, p) in &g.overlay {
                    let ext = match p.src {
                        super::file::PieceSrc::Zero => Extent::hole(p.len),
                        super::file::PieceSrc::Data(loc) => Extent { src: Source::Pending(loc), off: 0, len: p.len },
                    };
                    map.splice(s, s + p.len, vec![ext]);
                }
                return Ok(map);
            }
        }
        self.meta.read(|c| meta::load_extents(c, ino))
    }

    /// `cairn info`: where the bytes of `path` are (see [`FileInfo`]).
    pub fn info(&self, path: &[u8], caller: Caller) -> Result<FileInfo> {
        let ino = self.resolve_as(path, caller, R)?;
        let a = self.getattr(ino)?;
        let kind = match a.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            _ => "special",
        };
        let mut info = FileInfo { ino, kind: kind.into(), size: a.size, entries: None, map_links: 1, chunks: 0, hole_bytes: 0, exclusive_bytes: 0, shared_bytes: 0, placed: BTreeMap::new(), runs: Vec::new() };
        if a.kind == FileKind::Dir {
            info.entries = Some(self.meta.read(|c| Ok(c.list_dir(ino)?))?.len() as u64);
            return Ok(info);
        }
        if a.kind != FileKind::File {
            return Ok(info);
        }
        let map = self.current_extents(ino)?;
        info.map_links = self.meta.read(|c| Ok(c.page_links(ino)?.iter().map(|p| p.refs).max().unwrap_or(1).max(1) as u64))?;
        let mut rows: HashMap<u64, meta::ChunkRow> = HashMap::new();
        for (at, e) in map.iter() {
            let run = match e.src {
                Source::Hole => {
                    info.hole_bytes += e.len;
                    continue;
                }
                Source::Pending(_) | Source::Mem => ChunkInfo { offset: at, len: e.len, chunk: None, chunk_offset: 0, raw_len: 0, stored_len: 0, pack: None, pack_offset: 0, refs: 1, place: Place::Journal },
                Source::Chunk(id) => {
                    if !rows.contains_key(&id) {
                        let row = self.meta.read(|c| Ok(c.chunk_by_id(id)?))?.ok_or_else(|| Error::corrupt(format!("chunk #{id} is referenced but not in the chunk index")))?;
                        rows.insert(id, row);
                    }
                    let row = &rows[&id];
                    let pack = self.chunks.pack_name(&self.meta, row.pack)?;
                    ChunkInfo {
                        offset: at,
                        len: e.len,
                        chunk: Some(id),
                        chunk_offset: e.off,
                        raw_len: row.raw_len as u64,
                        stored_len: row.stored_len as u64,
                        pack: Some(pack.to_string()),
                        pack_offset: row.offset,
                        refs: row.refs.max(0) as u64,
                        place: self.chunk_place(&pack, row.offset, row.stored_len as u64),
                    }
                }
            };
            if run.place == Place::Journal || (run.refs <= 1 && info.map_links == 1) {
                info.exclusive_bytes += run.len;
            } else {
                info.shared_bytes += run.len;
            }
            *info.placed.entry(run.place.name().to_string()).or_default() += run.len;
            info.runs.push(run);
        }
        info.chunks = rows.len() as u64;
        Ok(info)
    }

    /// `cairn stats DIR` for the tree at `path` (see [`TreeStats`]), from
    /// the committed metadata after a flush. O(tree): per-chunk and
    /// per-page counts of the tree's references only.
    pub fn tree_stats(&self, path: &[u8], caller: Caller) -> Result<TreeStats> {
        let root = self.resolve_as(path, caller, 0)?;
        self.sync()?;
        let mut s = TreeStats::default();
        // Names of each file inside the tree: a file with more names
        // (hard links outside) stays after a delete of the tree.
        let mut names: HashMap<Ino, u32> = HashMap::new();
        names.insert(root, 1);
        let mut files: Vec<(Ino, u32)> = Vec::new();
        self.walk_tree(root, path, Some(caller), false, &mut |a, list| {
            match a.kind {
                FileKind::File => {
                    s.files += 1;
                    s.logical_bytes = s.logical_bytes.saturating_add(a.size);
                    files.push((a.ino, a.nlink));
                }
                FileKind::Dir => s.directories += 1,
                FileKind::Symlink => s.symlinks += 1,
                _ => {}
            }
            for (_, child, kind) in list {
                if *kind == FileKind::File {
                    *names.entry(*child).or_default() += 1;
                }
            }
            Ok(())
        })?;
        // Page links from inside the tree, and chunk references from each
        // page seen (once: a page shared by clones in the tree counts once).
        struct Seen {
            key: i64,
            refs: i64,
            links: i64,
            escapes: bool,
        }
        let mut pages: HashMap<u64, Seen> = HashMap::new();
        let mut in_tree: HashMap<u64, i64> = HashMap::new(); // chunk -> references from the tree's own pages
        let count = |in_tree: &mut HashMap<u64, i64>, key: i64, data: &[u8], sign: i64| -> Result<()> {
            for x in &decode_page(key, data)?.extents {
                if let Source::Chunk(cid) = x.src {
                    *in_tree.entry(cid).or_default() += sign;
                }
            }
            Ok(())
        };
        for (ino, nlink) in files {
            // Another name outside the tree keeps this file alive.
            let escapes = names.get(&ino).copied().unwrap_or(0) < nlink;
            self.meta.read(|c| {
                if let Some(row) = c.get_inode(ino)? {
                    s.hole_bytes = s.hole_bytes.saturating_add(row.attr.size - row.data_bytes.min(row.attr.size));
                }
                for meta::PageLink { key, id, refs, data } in c.page_links(ino)? {
                    let e = pages.entry(id).or_insert(Seen { key, refs, links: 0, escapes: false });
                    e.links += 1;
                    e.escapes |= escapes;
                    if e.links == 1 {
                        count(&mut in_tree, key, &data, 1).map_err(|e| e.context(format!("inode {ino}, page #{id}")))?;
                    }
                }
                Ok(())
            })?;
        }
        // A page also linked from outside the tree: its references are not
        // the tree's alone (its chunks stay in the tree's set, counted 0).
        for (&id, p) in &pages {
            if p.escapes || p.links < p.refs {
                let data = self.meta.read(|c| c.page_data(id)?.ok_or_else(|| Error::corrupt(format!("page #{id} is missing"))))?;
                count(&mut in_tree, p.key, &data, -1)?;
            }
        }
        for (&id, &n) in &in_tree {
            let row = self.meta.read(|c| Ok(c.chunk_by_id(id)?))?.ok_or_else(|| Error::corrupt(format!("chunk #{id} is referenced but not in the chunk index")))?;
            let (raw, stored) = (row.raw_len as u64, row.stored_len as u64);
            s.chunks += 1;
            s.unique_bytes += raw;
            s.stored_bytes += stored;
            if n >= row.refs && n > 0 {
                s.exclusive_chunks += 1;
                s.exclusive_bytes += raw;
                s.exclusive_stored_bytes += stored;
            } else {
                s.shared_chunks += 1;
                s.shared_bytes += raw;
                s.shared_stored_bytes += stored;
            }
        }
        let data = s.logical_bytes - s.hole_bytes;
        s.dedup_ratio = if s.unique_bytes == 0 { 0.0 } else { data as f64 / s.unique_bytes as f64 };
        Ok(s)
    }
}
