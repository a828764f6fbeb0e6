//! Each typed operation as its SQL on the connection, and the reference
//! counts that page operations change (applied at the end of a write).

use super::*;

pub(super) const INODE_COLS: &str = "ino, kind, perm, nlink, uid, gid, rdev, size, data_bytes, atime, mtime, ctime, btime, parent, target, jseq, flags";

pub(super) fn row_to_inode(r: &rusqlite::Row) -> rusqlite::Result<(InodeRow, i64)> {
    let kind: i64 = r.get(1)?;
    let data_bytes: i64 = r.get(8)?;
    let attr = Attr {
        ino: r.get::<_, i64>(0)? as u64,
        kind: FileKind::File, // fixed below
        perm: r.get::<_, i64>(2)? as u32,
        nlink: r.get::<_, i64>(3)? as u32,
        uid: r.get::<_, i64>(4)? as u32,
        gid: r.get::<_, i64>(5)? as u32,
        rdev: r.get::<_, i64>(6)? as u32,
        size: r.get::<_, i64>(7)? as u64,
        blocks: (data_bytes as u64).div_ceil(512),
        atime: Timestamp(r.get(9)?),
        mtime: Timestamp(r.get(10)?),
        ctime: Timestamp(r.get(11)?),
        btime: Timestamp(r.get(12)?),
    };
    Ok((
        InodeRow {
            attr,
            data_bytes: data_bytes as u64,
            parent: r.get::<_, Option<i64>>(13)?.map(|p| p as u64),
            target: r.get(14)?,
            jseq: r.get::<_, i64>(15)? as u64,
            flags: r.get(16)?,
            cver: 0,
        },
        kind,
    ))
}

/// Reads one inode.
pub(super) fn get_inode(c: &Connection, ino: Ino) -> Result<Option<InodeRow>> {
    let mut st = c.prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino=?1"))?;
    let r = st.query_row([ino as i64], row_to_inode).optional()?;
    match r {
        None => Ok(None),
        Some((mut row, kind)) => {
            row.attr.kind = FileKind::from_code(kind)?;
            if row.attr.kind == FileKind::Dir {
                row.attr.size = 4096;
                row.attr.blocks = 8;
            }
            Ok(Some(row))
        }
    }
}

/// A new inode with its allocation and flags given (clones, snapshots).
pub(super) fn insert_inode_full(c: &Connection, a: &Attr, data_bytes: u64, parent: Option<Ino>, target: Option<&[u8]>, jseq: u64, flags: i64) -> Result<()> {
    let mut st = c.prepare_cached(
        "INSERT INTO inodes(ino, kind, perm, uid, gid, rdev, nlink, size, data_bytes, atime, mtime, ctime, btime, parent, target, jseq, flags)
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )?;
    st.execute(params![
        a.ino as i64, a.kind.code(), a.perm, a.uid, a.gid, a.rdev, a.nlink, a.size as i64, data_bytes as i64,
        a.atime.0, a.mtime.0, a.ctime.0, a.btime.0, parent.map(|p| p as i64), target, jseq as i64, flags
    ])?;
    Ok(())
}

/// `info` key of the inode-number high-water mark: every number ever handed
/// out is below it (numbers are never reused, even for deleted inodes).
pub const INO_HIGH_KEY: &str = "ino_high";

/// The first inode number never handed out: above every inode row and the
/// persisted high-water mark.
pub(super) fn next_free_ino(c: &Connection) -> Result<u64> {
    let max = c.query_row("SELECT COALESCE(MAX(ino), 1) FROM inodes", [], |r| r.get::<_, i64>(0))? as u64;
    let high = get_info(c, INO_HIGH_KEY)?.unwrap_or(0).max(0) as u64;
    Ok((max + 1).max(high))
}

/// Writes back the mutable attributes of an inode.
pub(super) fn update_attr(c: &Connection, a: &Attr) -> Result<()> {
    let mut st = c.prepare_cached(
        "UPDATE inodes SET perm=?2, uid=?3, gid=?4, nlink=?5, atime=?6, mtime=?7, ctime=?8 WHERE ino=?1",
    )?;
    st.execute(params![a.ino as i64, a.perm, a.uid, a.gid, a.nlink, a.atime.0, a.mtime.0, a.ctime.0])?;
    Ok(())
}

/// Records a flushed file's size, allocation and journal position.
pub(super) fn update_content(c: &Connection, ino: Ino, size: u64, data_bytes: u64, mtime: Timestamp, ctime: Timestamp, jseq: u64) -> Result<()> {
    let mut st = c.prepare_cached("UPDATE inodes SET size=?2, data_bytes=?3, mtime=?4, ctime=?5, jseq=MAX(jseq, ?6) WHERE ino=?1")?;
    st.execute(params![ino as i64, size as i64, data_bytes as i64, mtime.0, ctime.0, jseq as i64])?;
    Ok(())
}

pub(super) fn set_nlink(c: &Connection, ino: Ino, nlink: u32, ctime: Timestamp) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET nlink=?2, ctime=?3 WHERE ino=?1")?.execute(params![ino as i64, nlink, ctime.0])?;
    Ok(())
}

pub(super) fn set_parent(c: &Connection, ino: Ino, parent: Ino) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET parent=?2 WHERE ino=?1")?.execute(params![ino as i64, parent as i64])?;
    Ok(())
}

/// Touches a directory's mtime and ctime.
pub(super) fn touch_dir(c: &Connection, ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET mtime=?2, ctime=?2, nlink=nlink+?3 WHERE ino=?1")?
        .execute(params![ino as i64, now.0, nlink_delta])?;
    Ok(())
}

/// The entry `name` in `parent`: (ino, kind).
pub(super) fn lookup(c: &Connection, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
    let mut st = c.prepare_cached("SELECT ino, kind FROM dentries WHERE parent=?1 AND name=?2")?;
    let r: Option<(i64, i64)> = st.query_row(params![parent as i64, name], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
    match r {
        None => Ok(None),
        Some((i, k)) => Ok(Some((i as u64, FileKind::from_code(k)?))),
    }
}

pub(super) fn insert_dentry(c: &Connection, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Result<()> {
    match c.prepare_cached("INSERT INTO dentries(parent, name, ino, kind) VALUES(?1, ?2, ?3, ?4)")?.execute(params![parent as i64, name, ino as i64, kind.code()]) {
        Ok(_) => Ok(()),
        Err(rusqlite::Error::SqliteFailure(f, _)) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
            Err(Error::new(ErrorKind::Exists, format!("{} already exists in directory {parent}", String::from_utf8_lossy(name))))
        }
        Err(e) => Err(e.into()),
    }
}

/// Entries of a directory, sorted by name.
pub(super) fn list_dir(c: &Connection, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, FileKind)>> {
    let mut st = c.prepare_cached("SELECT name, ino, kind FROM dentries WHERE parent=?1 ORDER BY name")?;
    let rows = st.query_map([dir as i64], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))?;
    let mut out = Vec::new();
    for r in rows {
        let (n, i, k) = r?;
        out.push((n, i as u64, FileKind::from_code(k)?));
    }
    Ok(out)
}

pub(super) fn dir_is_empty(c: &Connection, dir: Ino) -> Result<bool> {
    let n: Option<i64> = c.prepare_cached("SELECT 1 FROM dentries WHERE parent=?1 LIMIT 1")?
        .query_row([dir as i64], |r| r.get(0)).optional()?;
    Ok(n.is_none())
}

/// Removes an inode row with its xattrs and page links. The caller has
/// already released its pages (`release_pages`).
pub(super) fn delete_inode(c: &Connection, ino: Ino) -> Result<()> {
    c.prepare_cached("DELETE FROM inodes WHERE ino=?1")?.execute([ino as i64])?;
    c.prepare_cached("DELETE FROM xattrs WHERE ino=?1")?.execute([ino as i64])?;
    c.prepare_cached("DELETE FROM file_pages WHERE ino=?1")?.execute([ino as i64])?;
    Ok(())
}

pub(super) fn get_xattr(c: &Connection, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
    Ok(c.prepare_cached("SELECT value FROM xattrs WHERE ino=?1 AND name=?2")?
        .query_row(params![ino as i64, name], |r| r.get(0)).optional()?)
}

pub(super) fn set_xattr(c: &Connection, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
    c.prepare_cached("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES(?1, ?2, ?3)")?
        .execute(params![ino as i64, name, value])?;
    Ok(())
}

pub(super) fn remove_xattr(c: &Connection, ino: Ino, name: &[u8]) -> Result<bool> {
    Ok(c.prepare_cached("DELETE FROM xattrs WHERE ino=?1 AND name=?2")?.execute(params![ino as i64, name])? > 0)
}

pub(super) fn list_xattrs(c: &Connection, ino: Ino) -> Result<Vec<Vec<u8>>> {
    let mut st = c.prepare_cached("SELECT name FROM xattrs WHERE ino=?1 ORDER BY name")?;
    let rows = st.query_map([ino as i64], |r| r.get::<_, Vec<u8>>(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The pages a file links, by key.
pub(super) fn load_pages(c: &Connection, ino: Ino) -> Result<Vec<StoredPage>> {
    let mut st = c.prepare_cached("SELECT f.key, p.id, p.data FROM file_pages f JOIN pages p ON p.id=f.page WHERE f.ino=?1 ORDER BY f.key")?;
    let rows = st.query_map([ino as i64], |r| Ok(StoredPage { key: r.get(0)?, id: r.get::<_, i64>(1)? as u64, data: r.get(2)? }))?;
    let pages: Vec<StoredPage> = rows.collect::<rusqlite::Result<_>>()?;
    let n: i64 = c.prepare_cached("SELECT COUNT(*) FROM file_pages WHERE ino=?1")?.query_row([ino as i64], |r| r.get(0))?;
    if n as usize != pages.len() {
        return Err(Error::corrupt(format!("inode {ino} links {} pages that do not exist", n as usize - pages.len())));
    }
    Ok(pages)
}

/// Adds each chunk reference in `chunks` times `sign` to `deltas`.
pub(super) fn count_chunk_refs(chunks: &[u64], sign: i64, deltas: &mut HashMap<u64, i64>) {
    for &id in chunks {
        *deltas.entry(id).or_default() += sign;
    }
}

/// Persists the page edits of one file. New pages are stored (their chunk
/// references counted into `deltas`); pages that lose their last link are
/// freed (their chunk references released). Returns the ids of the new
/// pages by key.
pub(super) fn save_pages(c: &Connection, ino: Ino, ch: &PageEdits, deltas: &mut HashMap<u64, i64>) -> Result<Vec<(i64, u64)>> {
    let mut link = c.prepare_cached("UPDATE pages SET refs=refs+1 WHERE id=?1")?;
    for id in &ch.gained {
        if link.execute([*id as i64])? != 1 {
            return Err(Error::corrupt(format!("inode {ino}: shared page #{id} is missing")));
        }
    }
    let mut ins = c.prepare_cached("INSERT INTO pages(refs, data) VALUES(1, ?1)")?;
    let mut put = c.prepare_cached("INSERT OR REPLACE INTO file_pages(ino, key, page) VALUES(?1, ?2, ?3)")?;
    let mut ids = Vec::new();
    for p in &ch.upserts {
        let id = if p.id == 0 {
            ins.execute([&p.data])?;
            let id = c.last_insert_rowid() as u64;
            count_chunk_refs(&p.chunks, 1, deltas);
            ids.push((p.key, id));
            id
        } else {
            p.id
        };
        put.execute(params![ino as i64, p.key, id as i64])?;
    }
    let mut del = c.prepare_cached("DELETE FROM file_pages WHERE ino=?1 AND key=?2")?;
    for k in &ch.deletes {
        del.execute(params![ino as i64, k])?;
    }
    for (id, chunks) in &ch.dropped {
        unlink_page(c, *id, Some(chunks), None, deltas)?;
    }
    Ok(ids)
}

/// Drops one link of a stored page; frees it, releasing its chunk
/// references, when it was the last. `chunks`: the page's chunk references
/// if the caller has them, else `codec` reads them from the page.
pub(super) fn unlink_page(c: &Connection, id: u64, chunks: Option<&[u64]>, codec: Option<&dyn PageCodec>, deltas: &mut HashMap<u64, i64>) -> Result<()> {
    let refs: i64 = c
        .prepare_cached("UPDATE pages SET refs=refs-1 WHERE id=?1 RETURNING refs")?
        .query_row([id as i64], |r| r.get(0))
        .optional()?
        .ok_or_else(|| Error::corrupt(format!("page #{id} is missing")))?;
    if refs < 0 {
        return Err(Error::corrupt(format!("page #{id}: link count went negative")));
    }
    if refs == 0 {
        match (chunks, codec) {
            (Some(ch), _) => count_chunk_refs(ch, -1, deltas),
            (None, Some(codec)) => {
                let data: Vec<u8> = c.prepare_cached("SELECT data FROM pages WHERE id=?1")?.query_row([id as i64], |r| r.get(0))?;
                let mut ch = Vec::new();
                codec.chunk_ids(&data, &mut ch).map_err(|e| e.context(format!("page #{id}")))?;
                count_chunk_refs(&ch, -1, deltas);
            }
            (None, None) => return Err(Error::invalid("internal: freeing a page without its references")),
        }
        c.prepare_cached("DELETE FROM pages WHERE id=?1")?.execute([id as i64])?;
    }
    Ok(())
}

/// Unlinks every page of `ino` (freeing those no other file links),
/// counting the resulting chunk reference changes into `deltas`.
pub(super) fn release_pages(c: &Connection, codec: &dyn PageCodec, ino: Ino, deltas: &mut HashMap<u64, i64>) -> Result<()> {
    let ids: Vec<i64> = {
        let mut st = c.prepare_cached("SELECT page FROM file_pages WHERE ino=?1")?;
        let rows = st.query_map([ino as i64], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for id in ids {
        unlink_page(c, id as u64, None, Some(codec), deltas)?;
    }
    c.prepare_cached("DELETE FROM file_pages WHERE ino=?1")?.execute([ino as i64])?;
    Ok(())
}

/// Links every page of `src` into `dst` as well (which must have none):
/// the O(pages) heart of a whole-file clone. No chunk reference changes.
pub(super) fn share_pages(c: &Connection, src: Ino, dst: Ino) -> Result<()> {
    c.prepare_cached("UPDATE pages SET refs=refs+1 WHERE id IN (SELECT page FROM file_pages WHERE ino=?1)")?.execute([src as i64])?;
    c.prepare_cached("INSERT INTO file_pages(ino, key, page) SELECT ?2, key, page FROM file_pages WHERE ino=?1")?
        .execute(params![src as i64, dst as i64])?;
    Ok(())
}

/// Copies every xattr of `src` to `dst`.
pub(super) fn copy_xattrs(c: &Connection, src: Ino, dst: Ino) -> Result<()> {
    c.prepare_cached("INSERT INTO xattrs(ino, name, value) SELECT ?2, name, value FROM xattrs WHERE ino=?1")?
        .execute(params![src as i64, dst as i64])?;
    Ok(())
}

/// Sets an inode's flags.
pub(super) fn set_flags(c: &Connection, ino: Ino, flags: i64) -> Result<()> {
    c.prepare_cached("UPDATE inodes SET flags=?2 WHERE ino=?1")?.execute(params![ino as i64, flags])?;
    Ok(())
}

/// A value of the `info` table.
pub(super) fn get_info(c: &Connection, key: &str) -> Result<Option<i64>> {
    Ok(c.prepare_cached("SELECT value FROM info WHERE key=?1")?.query_row([key], |r| r.get(0)).optional()?)
}

pub(super) fn set_info(c: &Connection, key: &str, value: i64) -> Result<()> {
    c.prepare_cached("INSERT OR REPLACE INTO info(key, value) VALUES(?1, ?2)")?.execute(params![key, value])?;
    Ok(())
}

/// Creates the `bill` table if it is missing; true if it was.
pub(super) fn ensure_bill_table(c: &Connection) -> Result<bool> {
    let had = has_bill_table(c)?;
    if !had {
        c.execute_batch(BILL_SCHEMA)?;
    }
    Ok(!had)
}

pub(super) fn has_bill_table(c: &Connection) -> Result<bool> {
    Ok(c.prepare_cached("SELECT 1 FROM sqlite_master WHERE type='table' AND name='bill'")?.exists([])?)
}

/// Adds to a row of the bill.
pub(super) fn add_bill(c: &Connection, r: &BillRow) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO bill(day, subsystem, item, requests, bytes) VALUES(?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(day, subsystem, item) DO UPDATE SET requests=requests+excluded.requests, bytes=bytes+excluded.bytes",
    )?
    .execute(params![r.day, r.subsystem, r.item, r.requests as i64, r.bytes as i64])?;
    Ok(())
}

/// The bill's rows from day `since` on (all of them for None); none when
/// the table does not exist (a volume never mounted read-write by a build
/// that keeps one).
pub(super) fn bill_rows(c: &Connection, since: Option<i64>) -> Result<Vec<BillRow>> {
    if !has_bill_table(c)? {
        return Ok(Vec::new());
    }
    let mut st = c.prepare("SELECT day, subsystem, item, requests, bytes FROM bill WHERE day >= ?1 ORDER BY day, subsystem, item")?;
    let rows = st.query_map([since.unwrap_or(i64::MIN)], |r| {
        Ok(BillRow { day: r.get(0)?, subsystem: r.get(1)?, item: r.get(2)?, requests: r.get::<_, i64>(3)? as u64, bytes: r.get::<_, i64>(4)? as u64 })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Bytes of every pack, and the dead ones among them.
pub(super) fn pack_bytes(c: &Connection) -> Result<(u64, u64)> {
    let (size, dead): (i64, i64) = c.query_row("SELECT COALESCE(SUM(size),0), COALESCE(SUM(dead_bytes),0) FROM packs", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((size as u64, dead as u64))
}

pub(super) fn row_to_chunk(r: &rusqlite::Row) -> rusqlite::Result<ChunkRow> {
    let h: Vec<u8> = r.get(1)?;
    let mut hash = [0u8; 32];
    if h.len() == 32 {
        hash.copy_from_slice(&h);
    }
    Ok(ChunkRow {
        id: r.get::<_, i64>(0)? as u64,
        hash,
        pack: r.get::<_, i64>(2)? as u64,
        offset: r.get::<_, i64>(3)? as u64,
        stored_len: r.get::<_, i64>(4)? as u32,
        raw_len: r.get::<_, i64>(5)? as u32,
        flags: r.get::<_, i64>(6)? as u8,
        refs: r.get(7)?,
        zero_since: None,
    })
}

pub(super) const CHUNK_COLS: &str = "id, hash, pack, offset, stored_len, raw_len, flags, refs";

pub(super) fn chunk_by_id(c: &Connection, id: u64) -> Result<Option<ChunkRow>> {
    Ok(c.prepare_cached(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE id=?1"))?
        .query_row([id as i64], row_to_chunk).optional()?)
}

pub(super) fn chunk_by_hash(c: &Connection, hash: &[u8; 32]) -> Result<Option<ChunkRow>> {
    Ok(c.prepare_cached(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE hash=?1"))?
        .query_row([&hash[..]], row_to_chunk).optional()?)
}

pub(super) fn all_chunks(c: &Connection) -> Result<Vec<ChunkRow>> {
    let mut st = c.prepare(&format!("SELECT {CHUNK_COLS} FROM chunks ORDER BY pack, offset"))?;
    let rows = st.query_map([], row_to_chunk)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn chunks_in_pack(c: &Connection, pack: u64) -> Result<Vec<ChunkRow>> {
    let mut st = c.prepare_cached(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE pack=?1 ORDER BY offset"))?;
    let rows = st.query_map([pack as i64], row_to_chunk)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn insert_chunk(c: &Connection, ch: &ChunkRow) -> Result<()> {
    let n = c
        .prepare_cached("INSERT INTO chunks(id, hash, pack, offset, stored_len, raw_len, flags, refs) VALUES(?1,?2,?3,?4,?5,?6,?7,?8) ON CONFLICT(hash) DO NOTHING")?
        .execute(params![ch.id as i64, &ch.hash[..], ch.pack as i64, ch.offset as i64, ch.stored_len, ch.raw_len, ch.flags, ch.refs])?;
    if n == 0 {
        // Another writer of this machine (an edit beside a flush round)
        // stored the same new chunk since this one looked it up.
        return Err(Error::new(ErrorKind::Raced, format!("chunk #{} (a new chunk) was stored by another writer at the same time", ch.id)));
    }
    Ok(())
}

pub(super) fn max_chunk_id(c: &Connection) -> Result<u64> {
    Ok(c.query_row("SELECT COALESCE(MAX(id), 0) FROM chunks", [], |r| r.get::<_, i64>(0))? as u64)
}

pub(super) fn max_jseq(c: &Connection) -> Result<u64> {
    Ok(c.query_row("SELECT COALESCE(MAX(jseq), 0) FROM inodes", [], |r| r.get::<_, i64>(0))? as u64)
}

/// A new pack. `dead_bytes` counts its blobs that no extent references yet
/// (new chunks start unreferenced; their first reference revives them).
pub(super) fn insert_pack(c: &Connection, name: &str, size: u64, blobs: u64, dead_bytes: u64) -> Result<u64> {
    let now = Timestamp::now().0;
    c.prepare_cached(
        "INSERT INTO packs(name, size, blobs, dead_bytes, dead_since, created, dead_mark, tier, tier_since) VALUES(?1, ?2, ?3, ?4, CASE WHEN ?4 > 0 THEN ?5 END, ?5, ?5, 0, ?5)",
    )?
        .execute(params![name, size as i64, blobs as i64, dead_bytes as i64, now])?;
    Ok(c.last_insert_rowid() as u64)
}

pub(super) fn pack_tier(c: &Connection, id: u64) -> Result<Option<PackTier>> {
    Ok(c.prepare_cached("SELECT tier, tier_since FROM packs WHERE id=?1")?
        .query_row([id as i64], |r| Ok(PackTier { tier: r.get::<_, i64>(0)? as TierCode, since: r.get(1)? }))
        .optional()?)
}

pub(super) fn set_pack_tier(c: &Connection, id: u64, tier: TierCode, since: i64) -> Result<bool> {
    Ok(c.prepare_cached("UPDATE packs SET tier=?2, tier_since=?3 WHERE id=?1")?.execute(params![id as i64, tier as i64, since])? > 0)
}

pub(super) fn tier_pin(c: &Connection, ino: Ino) -> Result<Option<u8>> {
    Ok(c.prepare_cached("SELECT tier_pin FROM inodes WHERE ino=?1")?.query_row([ino as i64], |r| Ok(r.get::<_, i64>(0)? as u8)).optional()?)
}

pub(super) fn set_tier_pin(c: &Connection, ino: Ino, pin: u8) -> Result<bool> {
    Ok(c.prepare_cached("UPDATE inodes SET tier_pin=?2 WHERE ino=?1")?.execute(params![ino as i64, pin as i64])? > 0)
}

/// The pin a new inode under `parent` takes: the parent's, marked
/// inherited (0 if the parent has none).
pub(super) fn inherit_pin(c: &Connection, new: Ino, parent: Ino) -> Result<()> {
    c.prepare_cached(
        "UPDATE inodes SET tier_pin = (SELECT CASE WHEN p.tier_pin & 15 = 0 THEN 0 ELSE (p.tier_pin & 15) | 16 END FROM inodes p WHERE p.ino=?2)
         WHERE ino=?1 AND EXISTS (SELECT 1 FROM inodes p WHERE p.ino=?2 AND p.tier_pin & 15 <> 0)",
    )?
    .execute(params![new as i64, parent as i64])?;
    Ok(())
}

fn restore_of(r: &rusqlite::Row) -> rusqlite::Result<RestoreRow> {
    Ok(RestoreRow {
        pack: r.get::<_, i64>(0)? as u64,
        class: r.get::<_, i64>(1)? as TierCode,
        requested_ns: r.get(2)?,
        ready_estimate_ns: r.get(3)?,
        expires_ns: r.get(4)?,
    })
}

pub(super) fn get_restore(c: &Connection, pack: u64) -> Result<Option<RestoreRow>> {
    Ok(c.prepare_cached("SELECT pack, class, requested_ns, ready_estimate_ns, expires_ns FROM restores WHERE pack=?1")?.query_row([pack as i64], restore_of).optional()?)
}

pub(super) fn list_restores(c: &Connection) -> Result<Vec<RestoreRow>> {
    let mut st = c.prepare_cached("SELECT pack, class, requested_ns, ready_estimate_ns, expires_ns FROM restores ORDER BY pack")?;
    let rows = st.query_map([], restore_of)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn insert_restore(c: &Connection, r: &RestoreRow) -> Result<bool> {
    Ok(c.prepare_cached("INSERT INTO restores(pack, class, requested_ns, ready_estimate_ns, expires_ns) VALUES(?1, ?2, ?3, ?4, ?5) ON CONFLICT(pack) DO NOTHING")?
        .execute(params![r.pack as i64, r.class as i64, r.requested_ns, r.ready_estimate_ns, r.expires_ns])?
        > 0)
}

pub(super) fn delete_restore(c: &Connection, pack: u64) -> Result<bool> {
    Ok(c.prepare_cached("DELETE FROM restores WHERE pack=?1")?.execute([pack as i64])? > 0)
}

pub(super) fn all_packs(c: &Connection) -> Result<Vec<PackRow>> {
    let mut st = c.prepare("SELECT id, name, size, blobs, dead_bytes FROM packs ORDER BY id")?;
    let rows = st.query_map([], |r| {
        Ok(PackRow {
            id: r.get::<_, i64>(0)? as u64,
            name: r.get(1)?,
            size: r.get::<_, i64>(2)? as u64,
            blobs: r.get::<_, i64>(3)? as u64,
            dead_bytes: r.get::<_, i64>(4)? as u64,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn pack_name(c: &Connection, id: u64) -> Result<String> {
    c.prepare_cached("SELECT name FROM packs WHERE id=?1")?
        .query_row([id as i64], |r| r.get(0))
        .optional()?
        .ok_or_else(|| Error::corrupt(format!("pack #{id} is missing from the metadata")))
}

/// Applies reference-count changes, keeping each pack's dead-byte count
/// (bytes of chunks nobody references) in step.
pub(super) fn apply_ref_deltas(c: &Connection, deltas: &HashMap<u64, i64>) -> Result<()> {
    let mut rows: Vec<(u64, i64)> = deltas.iter().filter(|(_, &d)| d != 0).map(|(&id, &d)| (id, d)).collect();
    rows.sort_unstable();
    if rows.len() < BULK_DELTAS {
        return apply_ref_deltas_each(c, &rows);
    }
    // Archives, tree clones and deletes change thousands of counts at once:
    // the ids go to SQLite as one bound array (`rarray`) and one statement
    // reads every affected row, instead of one query a chunk (whose fixed
    // cost was most of an archive's time). The new counts are then written
    // by one cached statement a row, which measured faster (4,096 rows:
    // 3.4 ms) than `refs = refs + ?` over the array (4.7 ms), and much
    // faster than an earlier version that staged the deltas in a temporary
    // table (its inserts and correlated subquery were a third of a
    // 1,024-file extract).
    let ids: rusqlite::vtab::array::Array = std::rc::Rc::new(rows.iter().map(|&(id, _)| rusqlite::types::Value::Integer(id as i64)).collect());
    // Check every count and sum the bytes that die (count reaches 0) or come
    // back (count leaves 0) by pack, in one pass; rows come in id order, as
    // `rows` is sorted.
    let mut dead: HashMap<i64, i64> = HashMap::new();
    let mut new_refs: Vec<(i64, i64)> = Vec::with_capacity(rows.len());
    {
        let mut st = c.prepare_cached("SELECT id, refs, pack, stored_len FROM chunks WHERE id IN rarray(?1) ORDER BY id")?;
        let mut q = st.query([&ids])?;
        let mut want = rows.iter();
        while let Some(r) = q.next()? {
            let id: i64 = r.get(0)?;
            let &(wid, d) = want.next().ok_or_else(|| Error::corrupt(format!("chunk #{id} came back unasked")))?;
            if wid as i64 != id {
                return Err(Error::corrupt(format!("reference to unknown chunk #{wid}")));
            }
            let refs: i64 = r.get(1)?;
            let new = refs + d;
            if new < 0 {
                return Err(Error::corrupt(format!("chunk #{id} reference count would go negative ({refs}{d:+})")));
            }
            let (pack, stored): (i64, i64) = (r.get(2)?, r.get(3)?);
            if refs > 0 && new == 0 {
                *dead.entry(pack).or_default() += stored;
            } else if refs == 0 && new > 0 {
                *dead.entry(pack).or_default() -= stored;
            }
            new_refs.push((id, new));
        }
        if let Some(&(id, _)) = want.next() {
            return Err(Error::corrupt(format!("reference to unknown chunk #{id}")));
        }
    }
    let mut set = c.prepare_cached("UPDATE chunks SET refs=?2 WHERE id=?1")?;
    for (id, new) in new_refs {
        set.execute([id, new])?;
    }
    let now = Timestamp::now().0;
    let mut upd = c.prepare_cached(DEAD_BYTES_SQL)?;
    for (pack, bytes) in dead {
        if bytes != 0 {
            upd.execute(params![pack, bytes, now])?;
        }
    }
    Ok(())
}

/// From this many changed counts on, `apply_ref_deltas` works in bulk.
pub(super) const BULK_DELTAS: usize = 64;

/// Adds `?2` bytes to pack `?1`'s dead bytes at time `?3` (ns); `dead_since`
/// is set when it holds dead bytes and cleared when it holds none. The dead
/// bytes held until now are first accrued into `dead_acc` (byte-seconds), so
/// the cost of storing them is exact for any history of deaths
/// (docs/frugal.md §5; SET sees the row as it was).
pub(super) const DEAD_BYTES_SQL: &str = "UPDATE packs SET dead_bytes=dead_bytes+?2,
           dead_since=CASE WHEN ?2 > 0 AND dead_since IS NULL THEN ?3 WHEN dead_bytes+?2 = 0 THEN NULL ELSE dead_since END,
           dead_acc=dead_acc + dead_bytes * ((?3 - COALESCE(dead_mark, dead_since, ?3)) / 1e9), dead_mark=?3
         WHERE id=?1";

pub(super) fn apply_ref_deltas_each(c: &Connection, rows: &[(u64, i64)]) -> Result<()> {
    let mut get = c.prepare_cached("SELECT refs, pack, stored_len FROM chunks WHERE id=?1")?;
    let mut set = c.prepare_cached("UPDATE chunks SET refs=?2 WHERE id=?1")?;
    let mut dead = c.prepare_cached(DEAD_BYTES_SQL)?;
    let now = Timestamp::now().0;
    for &(id, d) in rows {
        let (refs, pack, stored): (i64, i64, i64) = get
            .query_row([id as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?
            .ok_or_else(|| Error::corrupt(format!("reference to unknown chunk #{id}")))?;
        let new = refs + d;
        if new < 0 {
            return Err(Error::corrupt(format!("chunk #{id} reference count would go negative ({refs}{d:+})")));
        }
        set.execute(params![id as i64, new])?;
        if refs > 0 && new == 0 {
            dead.execute(params![pack, stored, now])?;
        } else if refs == 0 && new > 0 {
            dead.execute(params![pack, -stored, now])?;
        }
    }
    Ok(())
}

/// Every inode number.
pub(super) fn all_inodes(c: &Connection) -> Result<Vec<InodeRow>> {
    let mut st = c.prepare(&format!("SELECT {INODE_COLS} FROM inodes ORDER BY ino"))?;
    let rows = st.query_map([], row_to_inode)?;
    let mut out = Vec::new();
    for r in rows {
        let (mut row, k) = r?;
        row.attr.kind = FileKind::from_code(k)?;
        out.push(row);
    }
    Ok(out)
}

/// Inodes with no names left (orphans of a crash while files were open).
pub(super) fn orphan_inodes(c: &Connection) -> Result<Vec<Ino>> {
    let mut st = c.prepare("SELECT ino FROM inodes WHERE nlink=0")?;
    let rows = st.query_map([], |r| r.get::<_, i64>(0))?;
    Ok(rows.map(|r| r.map(|i| i as u64)).collect::<rusqlite::Result<_>>()?)
}

/// Every dentry: (parent, name, ino, kind code).
pub(super) fn all_dentries(c: &Connection) -> Result<Vec<(Ino, Vec<u8>, Ino, i64)>> {
    let mut st = c.prepare("SELECT parent, name, ino, kind FROM dentries")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get::<_, i64>(2)? as u64, r.get(3)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every stored page: (id, refs, data).
pub(super) fn all_pages(c: &Connection) -> Result<Vec<(u64, i64, Vec<u8>)>> {
    let mut st = c.prepare("SELECT id, refs, data FROM pages ORDER BY id")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every page link: (ino, key, page id).
pub(super) fn all_page_links(c: &Connection) -> Result<Vec<(Ino, i64, u64)>> {
    let mut st = c.prepare("SELECT ino, key, page FROM file_pages ORDER BY ino, key")?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get::<_, i64>(2)? as u64)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn count_inodes(c: &Connection) -> Result<u64> {
    Ok(c.query_row("SELECT COUNT(*) FROM inodes", [], |r| r.get::<_, i64>(0))? as u64)
}

/// Moves a chunk from one pack to another (repacking); Raced if it is no
/// longer in `from`.
pub(super) fn relocate_chunk(c: &Connection, id: u64, from: u64, to: u64, offset: u64) -> Result<()> {
    let n = c.prepare_cached("UPDATE chunks SET pack=?3, offset=?4 WHERE id=?1 AND pack=?2")?.execute(params![id as i64, from as i64, to as i64, offset as i64])?;
    if n == 0 {
        return Err(Error::new(ErrorKind::Raced, format!("chunk #{id} is no longer in pack #{from} (moved or freed since it was read)")));
    }
    Ok(())
}

/// Deletes a pack row and the unreferenced chunks still pointing at it.
pub(super) fn delete_pack(c: &Connection, pack: u64) -> Result<u64> {
    let n = c.prepare_cached("DELETE FROM chunks WHERE pack=?1 AND refs=0")?.execute([pack as i64])?;
    let live: i64 = c.query_row("SELECT COUNT(*) FROM chunks WHERE pack=?1", [pack as i64], |r| r.get(0))?;
    if live > 0 {
        return Err(Error::corrupt(format!("pack #{pack} still holds {live} live chunks")));
    }
    c.prepare_cached("DELETE FROM packs WHERE id=?1")?.execute([pack as i64])?;
    Ok(n as u64)
}

/// Adds the dead-byte accrual columns to a database from before them (the
/// cost-optimal cleaner's clock, docs/frugal.md §5); true if they were
/// missing. Dead bytes already there count from `dead_since`.
pub(super) fn ensure_dead_accrual(c: &Connection) -> Result<bool> {
    if has_dead_accrual(c)? {
        return Ok(false);
    }
    c.execute_batch(
        "ALTER TABLE packs ADD COLUMN dead_acc REAL NOT NULL DEFAULT 0;
         ALTER TABLE packs ADD COLUMN dead_mark INTEGER;
         UPDATE packs SET dead_mark = COALESCE(dead_since, created);",
    )?;
    Ok(true)
}

/// Whether the packs table has the accrual columns (a read-only open of an
/// older database may lack them).
pub(super) fn has_dead_accrual(c: &Connection) -> Result<bool> {
    Ok(c.prepare_cached("SELECT 1 FROM pragma_table_info('packs') WHERE name='dead_acc'")?.exists([])?)
}

/// Every pack holding dead bytes.
pub(super) fn dead_packs(c: &Connection) -> Result<Vec<DeadPack>> {
    let sql = if has_dead_accrual(c)? {
        "SELECT id, name, size, dead_bytes, dead_acc, COALESCE(dead_mark, dead_since, created), blobs FROM packs WHERE dead_bytes > 0 ORDER BY id"
    } else {
        "SELECT id, name, size, dead_bytes, 0.0, COALESCE(dead_since, created), blobs FROM packs WHERE dead_bytes > 0 ORDER BY id"
    };
    let mut st = c.prepare(sql)?;
    let rows = st.query_map([], |r| {
        Ok(DeadPack {
            id: r.get::<_, i64>(0)? as u64,
            name: r.get(1)?,
            size: r.get::<_, i64>(2)? as u64,
            dead_bytes: r.get::<_, i64>(3)? as u64,
            dead_acc: r.get(4)?,
            mark: r.get(5)?,
            blobs: r.get::<_, i64>(6)? as u64,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
