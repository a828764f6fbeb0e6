//! The in-memory tree: members laid out as tar extraction would.

use std::collections::BTreeMap;

use cairn_tar::{DataRun, Member, MemberKind};
use tracing::warn;

/// Inode number of the root directory.
pub const ROOT: u64 = 1;

/// One inode.
#[derive(Clone, Debug)]
pub struct Node {
    /// Parent directory (the root is its own parent).
    pub parent: u64,
    /// Never `HardLink`: a hard link is another name for its target's node.
    pub kind: MemberKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ctime_ns: i64,
    pub size: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub nlink: u32,
    /// Symlink target.
    pub link: Option<Vec<u8>>,
    /// Where the file's bytes are in the archive.
    pub runs: Vec<DataRun>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Directory entries, sorted by name.
    pub children: Vec<(Vec<u8>, u64)>,
}

impl Node {
    /// Bytes actually stored (for `st_blocks`).
    pub fn stored(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }
}

/// Attributes given to directories that only exist because a member's path
/// names them, and to the root when the archive has no "." member.
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
}

/// Every node; inode n is `nodes[n - 1]`.
#[derive(Debug)]
pub struct Tree {
    nodes: Vec<Node>,
    /// Members left out (unsafe paths, links to nothing, paths through files).
    pub skipped: usize,
}

fn clamp_id(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX - 1)
}

/// Path components: leading '/' stripped (as tar does), "." and empty
/// components dropped; None if a ".." component appears.
fn components(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            _ => out.push(c),
        }
    }
    Some(out)
}

struct Builder {
    nodes: Vec<Node>,
    dirs: Vec<BTreeMap<Vec<u8>, u64>>,
    defaults: Defaults,
}

impl Builder {
    fn push(&mut self, n: Node) -> u64 {
        self.nodes.push(n);
        self.dirs.push(BTreeMap::new());
        self.nodes.len() as u64
    }

    fn node(&mut self, ino: u64) -> &mut Node {
        &mut self.nodes[(ino - 1) as usize]
    }

    fn dir_node(&self, parent: u64) -> Node {
        Node {
            parent,
            kind: MemberKind::Dir,
            mode: 0o755,
            uid: self.defaults.uid,
            gid: self.defaults.gid,
            mtime_ns: self.defaults.mtime_ns,
            atime_ns: self.defaults.mtime_ns,
            ctime_ns: self.defaults.mtime_ns,
            size: 0,
            dev_major: 0,
            dev_minor: 0,
            nlink: 1,
            link: None,
            runs: Vec::new(),
            xattrs: Vec::new(),
            children: Vec::new(),
        }
    }

    fn lookup(&self, comps: &[&[u8]]) -> Option<u64> {
        let mut at = ROOT;
        for c in comps {
            at = *self.dirs[(at - 1) as usize].get(*c)?;
        }
        Some(at)
    }

    /// The directory at `comps`, creating missing ones; None if a
    /// non-directory is in the way (tar would fail to extract there).
    fn ensure_dir(&mut self, comps: &[&[u8]]) -> Option<u64> {
        let mut at = ROOT;
        for c in comps {
            at = match self.dirs[(at - 1) as usize].get(*c) {
                Some(&i) if self.nodes[(i - 1) as usize].kind == MemberKind::Dir => i,
                Some(_) => return None,
                None => {
                    let n = self.dir_node(at);
                    let i = self.push(n);
                    self.dirs[(at - 1) as usize].insert(c.to_vec(), i);
                    i
                }
            };
        }
        Some(at)
    }

    /// Points `parent/name` at `ino`, dropping a link to what was there.
    fn bind(&mut self, parent: u64, name: &[u8], ino: u64) {
        if let Some(old) = self.dirs[(parent - 1) as usize].insert(name.to_vec(), ino) {
            if old != ino {
                let o = self.node(old);
                o.nlink = o.nlink.saturating_sub(1);
            }
        }
    }

    fn attrs(&self, m: &Member, parent: u64) -> Node {
        Node {
            parent,
            kind: m.kind,
            mode: m.mode & 0o7777,
            uid: clamp_id(m.uid),
            gid: clamp_id(m.gid),
            mtime_ns: m.mtime_ns,
            atime_ns: m.atime_ns.unwrap_or(m.mtime_ns),
            ctime_ns: m.ctime_ns.unwrap_or(m.mtime_ns),
            size: if m.kind == MemberKind::File {
                m.size
            } else {
                0
            },
            dev_major: m.dev_major,
            dev_minor: m.dev_minor,
            nlink: 1,
            link: if m.kind == MemberKind::Symlink {
                m.link_target.clone()
            } else {
                None
            },
            runs: if m.kind == MemberKind::File {
                m.data.clone()
            } else {
                Vec::new()
            },
            xattrs: m.xattrs.clone(),
            children: Vec::new(),
        }
    }
}

impl Tree {
    /// Lays the members out in order: directories implied by paths are
    /// created, a later member of the same path replaces an earlier one (a
    /// directory over a directory only updates its attributes), and a hard
    /// link becomes another name of the node its target names at that
    /// point. Members whose path has a ".." component, whose parent is not
    /// a directory, or whose link target does not exist are skipped.
    pub fn build(members: &[Member], defaults: Defaults) -> Tree {
        let mut b = Builder {
            nodes: Vec::new(),
            dirs: Vec::new(),
            defaults,
        };
        let root = b.dir_node(ROOT);
        b.push(root);
        let mut skipped = 0usize;
        for m in members {
            let skip = |why: &str| {
                warn!(path = %String::from_utf8_lossy(&m.path), "tar member left out: {why}");
            };
            let Some(comps) = components(&m.path) else {
                skip("its path has a '..' component");
                skipped += 1;
                continue;
            };
            let Some((name, dirs)) = comps.split_last() else {
                // "." or "/": the root itself.
                if m.kind == MemberKind::Dir {
                    let mut n = b.attrs(m, ROOT);
                    n.parent = ROOT;
                    *b.node(ROOT) = n;
                }
                continue;
            };
            let Some(parent) = b.ensure_dir(dirs) else {
                skip("a parent is not a directory");
                skipped += 1;
                continue;
            };
            match m.kind {
                MemberKind::HardLink => {
                    let target = m
                        .link_target
                        .as_deref()
                        .and_then(components)
                        .and_then(|c| b.lookup(&c))
                        .filter(|&i| b.nodes[(i - 1) as usize].kind != MemberKind::Dir);
                    let Some(t) = target else {
                        skip("hard link to a member that is not in the archive before it");
                        skipped += 1;
                        continue;
                    };
                    if b.dirs[(parent - 1) as usize].get(*name) == Some(&t) {
                        continue;
                    }
                    b.bind(parent, name, t);
                    b.node(t).nlink += 1;
                }
                MemberKind::Dir => {
                    let existing = b.dirs[(parent - 1) as usize]
                        .get(*name)
                        .copied()
                        .filter(|&i| b.nodes[(i - 1) as usize].kind == MemberKind::Dir);
                    let n = b.attrs(m, parent);
                    match existing {
                        Some(i) => *b.node(i) = n,
                        None => {
                            let i = b.push(n);
                            b.bind(parent, name, i);
                        }
                    }
                }
                _ => {
                    let n = b.attrs(m, parent);
                    let i = b.push(n);
                    b.bind(parent, name, i);
                }
            }
        }
        // Sorted child lists, and directory link counts (2 + subdirectories).
        let dirs = std::mem::take(&mut b.dirs);
        let mut nodes = b.nodes;
        for (i, d) in dirs.into_iter().enumerate() {
            if nodes[i].kind != MemberKind::Dir {
                continue;
            }
            let subdirs = d
                .values()
                .filter(|&&c| nodes[(c - 1) as usize].kind == MemberKind::Dir)
                .count();
            nodes[i].nlink = 2 + subdirs as u32;
            nodes[i].children = d.into_iter().collect();
        }
        Tree { nodes, skipped }
    }

    /// The node of an inode number.
    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(usize::try_from(ino.checked_sub(1)?).ok()?)
    }

    /// A name in a directory.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let d = self.get(parent)?;
        d.children
            .binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .ok()
            .map(|i| d.children[i].1)
    }

    /// Inode of a path relative to the root.
    pub fn resolve(&self, path: &[u8]) -> Option<u64> {
        components(path)?
            .into_iter()
            .try_fold(ROOT, |at, c| self.lookup(at, c))
    }

    /// Number of inodes (reachable or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never true: the root always exists.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: &str, kind: MemberKind, size: u64) -> Member {
        Member {
            path: path.as_bytes().to_vec(),
            kind,
            link_target: None,
            mode: 0o644,
            uid: 1,
            gid: 2,
            uname: None,
            gname: None,
            mtime_ns: 5,
            atime_ns: None,
            ctime_ns: None,
            dev_major: 0,
            dev_minor: 0,
            size,
            xattrs: Vec::new(),
            data: if size > 0 {
                vec![DataRun {
                    file_offset: 0,
                    archive_offset: 512 * size,
                    len: size,
                }]
            } else {
                Vec::new()
            },
            header_offset: 0,
        }
    }

    const D: Defaults = Defaults {
        uid: 0,
        gid: 0,
        mtime_ns: 0,
    };

    #[test]
    fn implied_dirs_duplicates_and_links() {
        let mut hl = m("x/hard", MemberKind::HardLink, 0);
        hl.link_target = Some(b"./a/b/f".to_vec());
        let mut bad = m("y", MemberKind::HardLink, 0);
        bad.link_target = Some(b"missing".to_vec());
        let members = vec![
            m("./a/b/f", MemberKind::File, 3),
            m("a/b/f", MemberKind::File, 7), // replaces the first
            hl,
            bad,
            m("../evil", MemberKind::File, 1),
            m("a/b/f/under_a_file", MemberKind::File, 1),
            m("/abs/file", MemberKind::File, 2),
            m("a", MemberKind::Dir, 0), // attributes for an implied dir
        ];
        let t = Tree::build(&members, D);
        assert_eq!(t.skipped, 3);
        let f = t.resolve(b"a/b/f").unwrap();
        assert_eq!(t.get(f).unwrap().size, 7);
        assert_eq!(t.get(f).unwrap().nlink, 2);
        assert_eq!(t.resolve(b"x/hard"), Some(f));
        assert!(t.resolve(b"y").is_none());
        assert!(t.resolve(b"abs/file").is_some());
        let a = t.get(t.resolve(b"a").unwrap()).unwrap();
        assert_eq!((a.mode, a.uid, a.mtime_ns), (0o644, 1, 5));
        assert_eq!(a.children.len(), 1, "a keeps its children");
        assert_eq!(t.get(ROOT).unwrap().nlink, 2 + 3);
        let x = t.resolve(b"x").unwrap();
        assert_eq!(t.get(x).unwrap().parent, ROOT);
    }

    #[test]
    fn file_replaced_by_dir_and_back() {
        let members = vec![
            m("p", MemberKind::File, 1),
            m("p", MemberKind::Dir, 0),
            m("p/q", MemberKind::File, 1),
        ];
        let t = Tree::build(&members, D);
        let p = t.resolve(b"p").unwrap();
        assert_eq!(t.get(p).unwrap().kind, MemberKind::Dir);
        assert!(t.resolve(b"p/q").is_some());
    }
}
