//! Tier pins and `cairn tier status` (docs/tiers.md §5, §6): a pin on an
//! inode (`auto`, `hot`, `warm`, `cold`) that the tier planner will obey,
//! copied to new files and directories under a pinned directory by the
//! store at create (`MetaTx::create_node`, in the create's own statement),
//! and what a file or tree holds in each tier. The pin is recorded only:
//! packs move when the tier planner runs (not built yet).
//!
//! Who may pin: through the mount (the control socket), the owner of each
//! inode or root, as for chmod (the kernel's check for setattr); the
//! directories on the way must be searchable and, with `-r`, each
//! directory of the tree readable. The engine API without a caller
//! ([`Volume::set_tier_pin`]) is the volume owner's, as an unmounted
//! volume's metadata is.

use super::inspect::may;
use super::namespace::check_not_snapshot;
use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::Source;
use crate::meta;
use crate::types::{Caller, FileKind, Ino};
use cairn_meta::{PackTier, PIN_AUTO, PIN_COLD, PIN_HOT, PIN_INHERITED, PIN_MASK, PIN_WARM};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A pin (docs/tiers.md §5): where the planner must keep a file's chunks,
/// or `auto` (the bill decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierPin {
    Auto,
    Hot,
    Warm,
    Cold,
}

impl TierPin {
    /// The pin's bits in `inodes.tier_pin` (docs/format.md "Metadata").
    pub fn code(self) -> u8 {
        match self {
            TierPin::Auto => PIN_AUTO,
            TierPin::Hot => PIN_HOT,
            TierPin::Warm => PIN_WARM,
            TierPin::Cold => PIN_COLD,
        }
    }

    /// The pin of a `tier_pin` value (its inherited bit ignored); None
    /// for bits no build writes.
    pub fn from_code(c: u8) -> Option<TierPin> {
        match c & PIN_MASK {
            PIN_AUTO => Some(TierPin::Auto),
            PIN_HOT => Some(TierPin::Hot),
            PIN_WARM => Some(TierPin::Warm),
            PIN_COLD => Some(TierPin::Cold),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TierPin::Auto => "auto",
            TierPin::Hot => "hot",
            TierPin::Warm => "warm",
            TierPin::Cold => "cold",
        }
    }

    /// `hot`, `warm`, `cold` or `auto` (any case).
    pub fn parse(s: &str) -> Option<TierPin> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Some(TierPin::Auto),
            "hot" => Some(TierPin::Hot),
            "warm" => Some(TierPin::Warm),
            "cold" => Some(TierPin::Cold),
            _ => None,
        }
    }
}

/// The bytes of a file or tree in one tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TierBytes {
    /// The tier (`packs.tier`): `home`, or a class name (`STANDARD_IA`,
    /// `GLACIER`, ...).
    pub tier: String,
    /// The class its bytes are billed as: the home's (`local` for a
    /// volume in a directory, `STANDARD` for a bucket, `TAPE`), or the
    /// tier's own.
    pub class: String,
    /// File bytes whose chunks are in this tier (each file's references:
    /// a chunk two files share counts for both).
    pub bytes: u64,
    /// Stored bytes of the distinct chunks in this tier (what is billed).
    pub stored_bytes: u64,
    pub chunks: u64,
    pub packs: u64,
}

/// A restore of one of the file's or tree's packs in flight (or a
/// restored copy still readable), from the `restores` table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RestoreInfo {
    pub pack: String,
    pub class: String,
    pub requested_ns: i64,
    pub ready_estimate_ns: i64,
    #[serde(default)]
    pub expires_ns: Option<i64>,
}

/// `cairn tier status PATH`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TierStatus {
    pub ino: Ino,
    /// `file`, `dir`, `symlink` or `special`.
    pub kind: String,
    /// The inode's pin, and whether a create copied it from the parent
    /// directory (rather than `cairn tier set` on this path).
    pub pin: TierPin,
    pub inherited: bool,
    /// Inodes of the tree (the path itself included) pinned, by pin name
    /// (`auto` left out).
    pub pinned: BTreeMap<String, u64>,
    /// Regular files in the tree, and their bytes (holes excluded).
    pub files: u64,
    pub file_bytes: u64,
    /// The home's class (`local`, `STANDARD`, `TAPE`).
    pub home: String,
    /// Bytes by tier, warmest (home) first.
    pub tiers: Vec<TierBytes>,
    pub restores: Vec<RestoreInfo>,
}

/// The name of a `packs.tier` code.
pub fn tier_name(code: u8) -> String {
    match code {
        cairn_meta::TIER_HOME => "home",
        cairn_meta::TIER_STANDARD => "STANDARD",
        cairn_meta::TIER_STANDARD_IA => "STANDARD_IA",
        cairn_meta::TIER_GLACIER_IR => "GLACIER_IR",
        cairn_meta::TIER_GLACIER => "GLACIER",
        cairn_meta::TIER_DEEP_ARCHIVE => "DEEP_ARCHIVE",
        cairn_meta::TIER_TAPE => "TAPE",
        _ => return format!("tier{code}"),
    }
    .to_string()
}

/// Inodes pinned per write transaction of a `-r`.
const PIN_BATCH: usize = 512;

impl Volume {
    /// The class the home's packs are billed as: `local` (a directory),
    /// `TAPE`, or `STANDARD` (a bucket).
    pub fn home_class(&self) -> &'static str {
        match self.cloud() {
            None => "local",
            Some(_) if !self.chunks.backend.capabilities().cheap_ranged_reads => "TAPE",
            Some(_) => "STANDARD",
        }
    }

    /// The pin of `ino`, and whether it was inherited at create.
    pub fn tier_pin(&self, ino: Ino) -> Result<(TierPin, bool)> {
        let c = self.meta.read(|r| Ok(r.tier_pin(ino)?))?.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))?;
        let pin = TierPin::from_code(c).ok_or_else(|| Error::corrupt(format!("inode {ino} has tier pin {c}, which this build does not know")))?;
        Ok((pin, c & PIN_INHERITED != 0 && pin != TierPin::Auto))
    }

    /// Pins `ino` (and with `recursive`, every inode of its tree) to
    /// `pin`, recorded as set here (not inherited); returns the inodes
    /// pinned. Without a permission check: the volume owner's API (the
    /// mount's control path uses [`Volume::set_tier_pin_as`]). A snapshot
    /// refuses (EROFS); inside a tree, snapshots are left as they are.
    pub fn set_tier_pin(&self, ino: Ino, pin: TierPin, recursive: bool) -> Result<u64> {
        self.check_writable()?;
        let inos = self.pin_targets(ino, b"", None, recursive)?;
        self.write_pins(ino, &inos, pin)
    }

    /// [`Volume::set_tier_pin`] of `path` (from the volume root) as
    /// `caller` asks it through the mount: the path must be reachable,
    /// with `recursive` each directory of the tree readable, and `caller`
    /// must own every inode it pins or be root, as for chmod (EPERM
    /// otherwise, pinning nothing).
    pub fn set_tier_pin_as(&self, path: &[u8], pin: TierPin, recursive: bool, caller: Caller) -> Result<u64> {
        self.check_writable()?;
        let ino = self.resolve_as(path, caller, 0)?;
        let inos = self.pin_targets(ino, path, Some(caller), recursive)?;
        self.write_pins(ino, &inos, pin)
    }

    /// The inodes a pin of `root` changes, checked for `caller`.
    fn pin_targets(&self, root: Ino, path: &[u8], caller: Option<Caller>, recursive: bool) -> Result<Vec<Ino>> {
        let mut out = Vec::new();
        let check = |a: &crate::types::Attr, shown: &[u8]| -> Result<()> {
            if let Some(c) = caller {
                if c.uid != 0 && c.uid != a.uid {
                    let s = String::from_utf8_lossy(shown);
                    return Err(Error::new(
                        ErrorKind::Permission,
                        format!("{}: only its owner (uid {}) or root may pin it, as for chmod; nothing was pinned", if s.is_empty() { "/".into() } else { s }, a.uid),
                    ));
                }
            }
            Ok(())
        };
        if !recursive {
            check(&self.getattr(root)?, path)?;
            return Ok(vec![root]);
        }
        let mut names: HashMap<Ino, Vec<u8>> = HashMap::new();
        names.insert(root, path.to_vec());
        self.walk_tree(root, path, caller, false, &mut |a, list| {
            let shown = names.get(&a.ino).cloned().unwrap_or_default();
            check(a, &shown)?;
            out.push(a.ino);
            for (name, child, _) in list {
                let mut p = shown.clone();
                p.push(b'/');
                p.extend_from_slice(name);
                names.entry(*child).or_insert(p);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Writes the pin on `inos` in transactions of [`PIN_BATCH`]; `root`
    /// (the path asked) must not be in a snapshot, the others are skipped
    /// if they are.
    fn write_pins(&self, root: Ino, inos: &[Ino], pin: TierPin) -> Result<u64> {
        let mut n = 0u64;
        for batch in inos.chunks(PIN_BATCH) {
            n += self.meta.write(|tx| {
                let mut n = 0u64;
                for &ino in batch {
                    let Some(row) = tx.get_inode(ino)? else {
                        if ino == root {
                            return Err(Error::not_found(format!("inode {ino} does not exist")));
                        }
                        continue; // removed since the walk
                    };
                    if row.read_only() {
                        if ino == root {
                            check_not_snapshot(&row)?;
                        }
                        continue;
                    }
                    if tx.set_tier_pin(ino, pin.code())? {
                        n += 1;
                    }
                }
                Ok(n)
            })?;
        }
        Ok(n)
    }

    /// `cairn tier status` of `path` (from the volume root): its pin, and
    /// the bytes of its file or tree by the tier of their chunks' packs,
    /// from the committed metadata after a flush (as `tree_stats`).
    /// `caller`: the control path's; None for the volume owner's API.
    pub fn tier_status(&self, path: &[u8], caller: Option<Caller>) -> Result<TierStatus> {
        let root = match caller {
            Some(c) => self.resolve_as(path, c, 0)?,
            None => self.resolve(path)?,
        };
        if let Some(c) = caller {
            let a = self.getattr(root)?;
            if a.kind == FileKind::File && !may(&a, c, 4) {
                return Err(Error::new(ErrorKind::Permission, format!("{}: permission denied (the file may not be read)", String::from_utf8_lossy(path))));
            }
        }
        if !self.opts.read_only {
            self.sync()?;
        }
        let (pin, inherited) = self.tier_pin(root)?;
        let a = self.getattr(root)?;
        let kind = match a.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            _ => "special",
        };
        let mut st = TierStatus {
            ino: root,
            kind: kind.into(),
            pin,
            inherited,
            pinned: BTreeMap::new(),
            files: 0,
            file_bytes: 0,
            home: self.home_class().into(),
            tiers: Vec::new(),
            restores: Vec::new(),
        };
        let mut files = Vec::new();
        let mut all = Vec::new();
        self.walk_tree(root, path, caller, false, &mut |a, _| {
            all.push(a.ino);
            if a.kind == FileKind::File {
                files.push(a.ino);
            }
            Ok(())
        })?;
        for ino in all {
            let c = self.meta.read(|r| Ok(r.tier_pin(ino)?))?.unwrap_or(0);
            if let Some(p) = TierPin::from_code(c).filter(|p| *p != TierPin::Auto) {
                *st.pinned.entry(p.name().to_string()).or_default() += 1;
            }
        }
        let mut by_tier: BTreeMap<u8, TierBytes> = BTreeMap::new();
        let mut seen_chunks: HashSet<u64> = HashSet::new();
        let mut seen_packs: HashSet<u64> = HashSet::new();
        let mut chunk_rows: HashMap<u64, meta::ChunkRow> = HashMap::new();
        let mut pack_tiers: HashMap<u64, PackTier> = HashMap::new();
        for ino in files {
            st.files += 1;
            let map = self.meta.read(|c| meta::load_extents(c, ino))?;
            for (_, e) in map.iter() {
                let Source::Chunk(id) = e.src else { continue };
                if !chunk_rows.contains_key(&id) {
                    let row = self.meta.read(|c| Ok(c.chunk_by_id(id)?))?.ok_or_else(|| Error::corrupt(format!("chunk #{id} is referenced but not in the chunk index")))?;
                    chunk_rows.insert(id, row);
                }
                let row = &chunk_rows[&id];
                if !pack_tiers.contains_key(&row.pack) {
                    let t = self.meta.read(|c| Ok(c.pack_tier(row.pack)?))?.ok_or_else(|| Error::corrupt(format!("pack #{} of chunk #{id} is missing from the metadata", row.pack)))?;
                    pack_tiers.insert(row.pack, t);
                }
                let code = pack_tiers[&row.pack].tier;
                let t = by_tier.entry(code).or_insert_with(|| TierBytes {
                    tier: tier_name(code),
                    class: if code == cairn_meta::TIER_HOME { self.home_class().to_string() } else { tier_name(code) },
                    ..Default::default()
                });
                t.bytes += e.len;
                st.file_bytes += e.len;
                if seen_chunks.insert(id) {
                    t.chunks += 1;
                    t.stored_bytes += row.stored_len as u64;
                }
                if seen_packs.insert(row.pack) {
                    t.packs += 1;
                }
            }
        }
        st.tiers = by_tier.into_values().collect();
        for r in self.meta.read(|c| Ok(c.list_restores()?))? {
            if seen_packs.contains(&r.pack) {
                st.restores.push(RestoreInfo {
                    pack: self.chunks.pack_name(&self.meta, r.pack)?.to_string(),
                    class: tier_name(r.class),
                    requested_ns: r.requested_ns,
                    ready_estimate_ns: r.ready_estimate_ns,
                    expires_ns: r.expires_ns,
                });
            }
        }
        Ok(st)
    }
}
