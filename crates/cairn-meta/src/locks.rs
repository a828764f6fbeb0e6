//! File locks kept by the store (`flock` and POSIX byte-range locks) for a
//! volume many machines mount (`docs/metadata-store.md` "Locks"): the
//! types of [`crate::MetaStore::set_lock`] and friends, and the one place
//! their rules are computed ([`plan`]), so every store grants the same.

use crate::types::Ino;

/// The highest offset a lock range can name (`OFFSET_MAX` of the kernel):
/// a range ending here runs to the end of the file, however it grows.
pub const LOCK_EOF: u64 = i64::MAX as u64;

/// Who holds a lock: a mount's session and the kernel's lock owner on that
/// mount (for POSIX locks the process's file table; for `flock` the open
/// file description).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockOwner {
    pub session: u64,
    pub owner: u64,
}

/// What a request asks: a shared lock, an exclusive one, or to unlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

impl LockKind {
    pub fn code(self) -> i16 {
        match self {
            LockKind::Read => 1,
            LockKind::Write => 2,
            LockKind::Unlock => 0,
        }
    }
    pub fn from_code(c: i16) -> crate::Result<Self> {
        Ok(match c {
            1 => LockKind::Read,
            2 => LockKind::Write,
            0 => LockKind::Unlock,
            _ => return Err(crate::Error::corrupt(format!("unknown lock kind code {c}"))),
        })
    }
}

/// `flock` locks (whole file) and POSIX locks (`fcntl`, `lockf`: byte
/// ranges) never conflict with each other (as on Linux).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockStyle {
    Posix,
    Flock,
}

/// A lock held: `kind` is Read or Write; `start..=end` (inclusive, `end`
/// at most [`LOCK_EOF`]); `pid` of the process that took it (what
/// `F_GETLK` reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRow {
    pub owner: LockOwner,
    pub style: LockStyle,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// A lock request on inode `ino` (for `flock`, `start`/`end` are ignored:
/// the whole file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    pub ino: Ino,
    pub owner: LockOwner,
    pub style: LockStyle,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// The answer to [`crate::MetaStore::set_lock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOutcome {
    Granted,
    /// Another owner holds a conflicting lock (one of them, as `F_GETLK`
    /// reports it); nothing changed.
    Conflict(LockRow),
}

impl LockRequest {
    /// The request's range, clamped: a flock's is the whole file.
    fn range(&self) -> (u64, u64) {
        match self.style {
            LockStyle::Flock => (0, LOCK_EOF),
            LockStyle::Posix => (self.start.min(LOCK_EOF), self.end.min(LOCK_EOF)),
        }
    }
}

/// The first lock in `held` (every lock on the request's inode) of another
/// owner that conflicts with `req`: same style, overlapping range, and one
/// of the two a write. None for an unlock.
pub fn conflict(held: &[LockRow], req: &LockRequest) -> Option<LockRow> {
    if req.kind == LockKind::Unlock {
        return None;
    }
    let (s, e) = req.range();
    held.iter()
        .find(|h| {
            h.style == req.style && h.owner != req.owner && h.start <= e && s <= h.end && (req.kind == LockKind::Write || h.kind == LockKind::Write)
        })
        .copied()
}

/// What the owner of `req` holds in `req`'s style on the inode after it:
/// `Err(holder)` on a conflict, else the new set of its locks of that
/// style (replacing all it held before), sorted by start, with ranges of
/// one kind that touch merged and the requested range cut out of ranges of
/// the other kind (POSIX: a lock or unlock of part of a range splits it).
pub fn plan(held: &[LockRow], req: &LockRequest) -> std::result::Result<Vec<LockRow>, LockRow> {
    if let Some(c) = conflict(held, req) {
        return Err(c);
    }
    let (s, e) = req.range();
    let mut out: Vec<LockRow> = Vec::new();
    if req.style == LockStyle::Flock {
        if req.kind != LockKind::Unlock {
            out.push(LockRow { owner: req.owner, style: req.style, kind: req.kind, start: s, end: e, pid: req.pid });
        }
        return Ok(out);
    }
    for h in held.iter().filter(|h| h.owner == req.owner && h.style == req.style) {
        if h.end < s || h.start > e {
            out.push(*h);
            continue;
        }
        if h.start < s {
            out.push(LockRow { end: s - 1, ..*h });
        }
        if h.end > e {
            out.push(LockRow { start: e + 1, ..*h });
        }
    }
    if req.kind != LockKind::Unlock {
        out.push(LockRow { owner: req.owner, style: req.style, kind: req.kind, start: s, end: e, pid: req.pid });
    }
    out.sort_by_key(|r| r.start);
    let mut merged: Vec<LockRow> = Vec::with_capacity(out.len());
    for r in out {
        match merged.last_mut() {
            Some(m) if m.kind == r.kind && m.end.saturating_add(1) >= r.start => {
                m.end = m.end.max(r.end);
                if r.start == s && r.kind == req.kind {
                    m.pid = req.pid;
                }
            }
            _ => merged.push(r),
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: LockOwner = LockOwner { session: 1, owner: 7 };
    const B: LockOwner = LockOwner { session: 2, owner: 7 };

    fn req(owner: LockOwner, kind: LockKind, start: u64, end: u64) -> LockRequest {
        LockRequest { ino: 5, owner, style: LockStyle::Posix, kind, start, end, pid: 1 }
    }

    fn apply(held: &mut Vec<LockRow>, r: LockRequest) -> std::result::Result<(), LockRow> {
        let mine = plan(held, &r)?;
        held.retain(|h| !(h.owner == r.owner && h.style == r.style));
        held.extend(mine);
        Ok(())
    }

    fn ranges(held: &[LockRow], o: LockOwner) -> Vec<(LockKind, u64, u64)> {
        let mut v: Vec<_> = held.iter().filter(|h| h.owner == o).map(|h| (h.kind, h.start, h.end)).collect();
        v.sort_by_key(|x| x.1);
        v
    }

    #[test]
    fn ranges_split_merge_and_conflict() {
        use LockKind::*;
        let mut h = Vec::new();
        apply(&mut h, req(A, Write, 0, 99)).unwrap();
        apply(&mut h, req(A, Read, 40, 59)).unwrap();
        assert_eq!(ranges(&h, A), vec![(Write, 0, 39), (Read, 40, 59), (Write, 60, 99)]);
        apply(&mut h, req(A, Unlock, 50, 69)).unwrap();
        assert_eq!(ranges(&h, A), vec![(Write, 0, 39), (Read, 40, 49), (Write, 70, 99)]);
        apply(&mut h, req(A, Write, 40, 69)).unwrap();
        assert_eq!(ranges(&h, A), vec![(Write, 0, 99)], "touching write ranges merge");
        assert_eq!(apply(&mut h, req(B, Read, 99, 200)).unwrap_err().owner, A);
        apply(&mut h, req(B, Read, 100, LOCK_EOF)).unwrap();
        apply(&mut h, req(A, Unlock, 0, LOCK_EOF)).unwrap();
        assert!(ranges(&h, A).is_empty());
        apply(&mut h, req(A, Read, 0, LOCK_EOF)).unwrap();
        assert_eq!(apply(&mut h, req(B, Write, 0, 0)).unwrap_err().owner, A);
    }
}
