//! [`MetaRead`] and [`MetaTx`] of a transaction (or a one-query read) on
//! a pooled connection, with the reference-count statements.

use super::*;

/// Reference-count changes, dating a count that reaches 0.
pub(super) const APPLY_REFS_SQL: &str = concat!(
    "UPDATE chunks c SET refs = c.refs + d.d, zero_since = CASE WHEN c.refs + d.d = 0 THEN ",
    // The statement's time, not the transaction's start: as close to the
    // commit as the store can date it (the collector compares it with
    // the start of flush rounds under way, `oldest_flush`).
    "floor(extract(epoch FROM clock_timestamp()))::bigint",
    " END FROM unnest($1::bigint[], $2::bigint[]) AS d(id, d) WHERE c.id = d.id"
);

/// A new chunk row, its hash claimed atomically; dated if it starts at 0.
pub(super) const INSERT_CHUNK_SQL: &str = concat!(
    "INSERT INTO chunks(id, hash, pack, \"offset\", stored_len, raw_len, flags, refs, zero_since) ",
    "VALUES($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $8::bigint = 0 THEN ",
    db_secs!(),
    " END) ON CONFLICT (hash) DO NOTHING"
);

impl Prefetched {
    /// From the BEGIN batch's rows: `i` rows are locked inodes
    /// (`INODE_COLS` after the tag), `e` rows entries (parent, name as
    /// hex, ino, kind); `asked` entries without a row are absent.
    pub(super) fn from_rows(msgs: &[pg::SimpleQueryMessage], asked: &[(Ino, &[u8])]) -> Result<Prefetched> {
        let mut p = Prefetched::default();
        for &(parent, name) in asked {
            p.entries.insert((parent, name.to_vec()), None);
        }
        for m in msgs {
            let pg::SimpleQueryMessage::Row(r) = m else { continue };
            match r.get(0) {
                Some("i") => {
                    let row = row_to_inode_at(r, 1)?;
                    p.inodes.insert(row.attr.ino, row);
                }
                Some("e") => {
                    let name = unhex(r.get(2).unwrap_or_default()).ok_or_else(|| Error::corrupt("PostgreSQL metadata: an entry's name is not hex"))?;
                    let (parent, ino, kind) = (r.int(1)? as Ino, r.int(3)? as Ino, FileKind::from_code(r.int(4)?)?);
                    p.entries.insert((parent, name), Some((ino, kind)));
                }
                _ => {}
            }
        }
        Ok(p)
    }
}

pub(super) fn col<'r, T: pg::types::FromSql<'r>>(r: &'r Row, i: usize) -> Result<T> {
    r.try_get(i).map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {e}")))
}

impl<'a> PgTx<'a> {
    pub(super) fn new(c: &'a mut Conn, store: &'a PgMeta, write: bool) -> Self {
        PgTx { c: RefCell::new(c), store, write, deltas: RefCell::new(HashMap::new()), changed: Default::default(), failed: RefCell::new(None), single: None, pre: RefCell::new(None) }
    }

    /// Notes a change for the log (once per transaction).
    pub(super) fn changed(&self, c: Changed) {
        self.changed.borrow_mut().insert(c);
    }

    pub(super) fn inode_changed(&self, ino: Ino) {
        self.changed(Changed::Inode(ino));
    }

    /// An entry of `parent` appeared or went: the entry and the directory.
    pub(super) fn entry_changed(&self, parent: Ino, name: &[u8]) {
        self.changed(Changed::Entry { parent, name: name.to_vec() });
        self.changed(Changed::Inode(parent));
    }

    /// The statement that appends the transaction's change rows and sends
    /// `pg_notify(<schema>, "<highest seq> <session>")`, delivered at
    /// commit; sent in the COMMIT's own round trip (`attempt`), so it is
    /// SQL text with the values written in: integers, and names as hex
    /// (`decode('…', 'hex')`), nothing to quote. None if nothing changed.
    /// No lock: writers of every machine commit side by side (group
    /// commit), so a smaller seq may commit after a larger one was read;
    /// readers track such holes (`read_changes`).
    pub(super) fn changes_sql(&self) -> Option<String> {
        use std::fmt::Write;
        let set = std::mem::take(&mut *self.changed.borrow_mut());
        if set.is_empty() {
            return None;
        }
        let session = match self.store.session.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i64),
        };
        let sess = session.map_or("NULL".to_string(), |s| s.to_string());
        let mut values = String::new();
        for c in set {
            if !values.is_empty() {
                values.push(',');
            }
            match c {
                Changed::Inode(ino) => {
                    let _ = write!(values, "({CHANGE_INODE},{},NULL,NULL,{sess})", ino as i64);
                }
                Changed::Entry { parent, name } => {
                    let _ = write!(values, "({CHANGE_ENTRY},NULL,{},decode('{}','hex'),{sess})", parent as i64, hex(&name));
                }
            }
        }
        if !self.store.opts.notify {
            return Some(format!("INSERT INTO changes(kind, ino, parent, name, session) VALUES {values}; "));
        }
        // The schema name is [a-z0-9_] (checked when the store opened).
        Some(format!(
            "WITH ins AS (INSERT INTO changes(kind, ino, parent, name, session) VALUES {values} RETURNING seq)
             SELECT pg_notify('{}', MAX(seq)::text || ' ' || '{}') FROM ins; ",
            self.store.schema,
            session.map_or(String::new(), |s| s.to_string())
        ))
    }

    pub(super) fn note(&self, e: pg::Error) -> Error {
        let err = pg_err("statement failed", &e);
        let mut f = self.failed.borrow_mut();
        if f.is_none() {
            *f = Some(e);
        }
        err
    }

    pub(super) fn with<T>(&self, sql: &str, run: impl FnOnce(&mut Client, &Statement) -> std::result::Result<T, pg::Error>) -> Result<T> {
        // A statement may change what the BEGIN round trip read.
        self.pre.borrow_mut().take();
        if let Some(n) = &self.single {
            if n.replace(n.get() + 1) > 0 {
                return Err(Error::invalid("internal: a second query in a read_one closure (it would see another snapshot)"));
            }
        }
        let mut g = self.c.borrow_mut();
        let conn = &mut **g;
        let st = conn.prepared(sql).map_err(|e| self.note(e))?;
        run(&mut conn.client, &st).map_err(|e| self.note(e))
    }

    pub(super) fn query(&self, sql: &str, p: &[P]) -> Result<Vec<Row>> {
        self.with(sql, |c, st| c.query(st, p))
    }
    pub(super) fn opt(&self, sql: &str, p: &[P]) -> Result<Option<Row>> {
        self.with(sql, |c, st| c.query_opt(st, p))
    }
    pub(super) fn one(&self, sql: &str, p: &[P]) -> Result<Row> {
        self.with(sql, |c, st| c.query_one(st, p))
    }
    pub(super) fn exec(&self, sql: &str, p: &[P]) -> Result<u64> {
        self.with(sql, |c, st| c.execute(st, p))
    }
    pub(super) fn int(&self, sql: &str, p: &[P]) -> Result<i64> {
        col(&self.one(sql, p)?, 0)
    }

    /// This store's journal id as a parameter (0: none set).
    pub(super) fn journal(&self) -> i64 {
        self.store.journal.load(Ordering::SeqCst) as i64
    }

    pub(super) fn need_write(&self) -> Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(Error::invalid("internal: a change outside a write transaction"))
        }
    }

    /// Applies the accumulated chunk reference changes: the rows are
    /// locked in ascending id order (so two transactions sharing chunks
    /// queue instead of deadlocking), checked, then incremented; each
    /// pack's dead bytes follow (as the SQLite store's `apply_ref_deltas`).
    /// The reference counts; returns the change rows' statement, for the
    /// COMMIT's round trip.
    pub(super) fn finish(&self) -> Result<Option<String>> {
        self.apply_refs()?;
        Ok(self.changes_sql())
    }

    pub(super) fn apply_refs(&self) -> Result<()> {
        let d = std::mem::take(&mut *self.deltas.borrow_mut());
        let mut rows: Vec<(i64, i64)> = d.into_iter().filter(|&(_, d)| d != 0).map(|(id, d)| (id as i64, d)).collect();
        if rows.is_empty() {
            return Ok(());
        }
        rows.sort_unstable();
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let got = self.query("SELECT id, refs, pack, stored_len FROM chunks WHERE id = ANY($1) ORDER BY id FOR UPDATE", &[&ids])?;
        let mut dead: HashMap<i64, i64> = HashMap::new();
        let mut want = rows.iter();
        for r in &got {
            let id: i64 = col(r, 0)?;
            let &(wid, d) = want.next().ok_or_else(|| Error::corrupt(format!("chunk #{id} came back unasked")))?;
            if wid != id {
                return Err(gone_chunk(wid));
            }
            let refs: i64 = col(r, 1)?;
            let new = refs + d;
            if new < 0 {
                return Err(Error::corrupt(format!("chunk #{id} reference count would go negative ({refs}{d:+})")));
            }
            let (pack, stored): (i64, i64) = (col(r, 2)?, col(r, 3)?);
            if refs > 0 && new == 0 {
                *dead.entry(pack).or_default() += stored;
            } else if refs == 0 && new > 0 {
                *dead.entry(pack).or_default() -= stored;
            }
        }
        if let Some(&(id, _)) = want.next() {
            return Err(gone_chunk(id));
        }
        let ds: Vec<i64> = rows.iter().map(|r| r.1).collect();
        // A count reaching 0 dates it (the collector's grace runs from
        // then); one leaving 0 clears the date.
        self.exec(APPLY_REFS_SQL, &[&ids, &ds])?;
        let now = Timestamp::now().0;
        let mut packs: Vec<(i64, i64)> = dead.into_iter().filter(|&(_, b)| b != 0).collect();
        packs.sort_unstable();
        for (pack, bytes) in packs {
            self.exec(DEAD_BYTES_SQL, &[&pack, &bytes, &now])?;
        }
        Ok(())
    }

    pub(super) fn unlink_page(&self, id: u64, chunks: Option<&[u64]>) -> Result<()> {
        let refs: i64 = match self.opt("UPDATE pages SET refs = refs - 1 WHERE id = $1 RETURNING refs", &[&(id as i64)])? {
            Some(r) => col(&r, 0)?,
            None => return Err(Error::corrupt(format!("page #{id} is missing"))),
        };
        if refs < 0 {
            return Err(Error::corrupt(format!("page #{id}: link count went negative")));
        }
        if refs == 0 {
            let mut d = Vec::new();
            match chunks {
                Some(ch) => d.extend_from_slice(ch),
                None => {
                    let row = self.one("SELECT data FROM pages WHERE id = $1", &[&(id as i64)])?;
                    let data: Vec<u8> = col(&row, 0)?;
                    self.store.codec.chunk_ids(&data, &mut d).map_err(|e| e.context(format!("page #{id}")))?;
                }
            }
            let mut deltas = self.deltas.borrow_mut();
            for c in d {
                *deltas.entry(c).or_default() -= 1;
            }
            self.exec("DELETE FROM pages WHERE id = $1", &[&(id as i64)])?;
        }
        Ok(())
    }
}

/// Adds `$2` bytes to pack `$1`'s dead bytes at time `$3` (ns), accruing
/// the dead bytes held until then into `dead_acc` (as the SQLite store).
pub(super) const DEAD_BYTES_SQL: &str = "UPDATE packs SET dead_bytes = dead_bytes + $2::bigint,
  dead_since = CASE WHEN $2::bigint > 0 AND dead_since IS NULL THEN $3::bigint WHEN dead_bytes + $2::bigint = 0 THEN NULL ELSE dead_since END,
  dead_acc = dead_acc + dead_bytes * (($3::bigint - COALESCE(dead_mark, dead_since, $3::bigint))::float8 / 1e9::float8), dead_mark = $3::bigint
  WHERE id = $1";

/// An inode row with this store's journal's mark as `jseq` (`$J` is
/// replaced by the parameter number of the journal id; no mark reads 0).
pub(super) const INODE_COLS: &str = "i.ino, i.kind, i.perm, i.nlink, i.uid, i.gid, i.rdev, i.size, i.data_bytes, i.atime, i.mtime, i.ctime, i.btime, i.parent, i.target, COALESCE(m.seq, 0), i.flags, i.cver";
/// How many columns `INODE_COLS` has.
pub(super) const INODE_NCOLS: usize = 18;
pub(super) const INODE_FROM: &str = "inodes i LEFT JOIN journal_marks m ON m.journal = $J AND m.ino = i.ino";
pub(super) const CHUNK_COLS: &str = "id, hash, pack, \"offset\", stored_len, raw_len, flags, refs, zero_since";

pub(super) fn row_to_inode(r: &Row) -> Result<InodeRow> {
    row_to_inode_at(r, 0)
}

/// A result row's columns, from a prepared statement (binary) or from a
/// simple query (text: a locking write's BEGIN round trip).
pub(super) trait Cols {
    fn opt_int(&self, i: usize) -> Result<Option<i64>>;
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>>;
    fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.ok_or_else(|| Error::corrupt(format!("PostgreSQL metadata: column {i} is NULL")))
    }
}

impl Cols for Row {
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        col(self, i)
    }
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        col(self, i)
    }
}

impl Cols for pg::SimpleQueryRow {
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        let v = self.try_get(i).map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {e}")))?;
        v.map(|t| t.parse::<i64>().map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {t:?}: {e}")))).transpose()
    }
    /// `bytea` in its text form, `\x` and hex.
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        let v = self.try_get(i).map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {e}")))?;
        let Some(t) = v else { return Ok(None) };
        t.strip_prefix("\\x").and_then(unhex).map(Some).ok_or_else(|| Error::corrupt(format!("PostgreSQL metadata: column {i} is not hex bytea")))
    }
}

/// The inode in `INODE_COLS` order from column `b` on.
pub(super) fn row_to_inode_at(r: &impl Cols, b: usize) -> Result<InodeRow> {
    let data_bytes = r.int(b + 8)?;
    let attr = Attr {
        ino: r.int(b)? as u64,
        kind: FileKind::from_code(r.int(b + 1)?)?,
        perm: r.int(b + 2)? as u32,
        nlink: r.int(b + 3)? as u32,
        uid: r.int(b + 4)? as u32,
        gid: r.int(b + 5)? as u32,
        rdev: r.int(b + 6)? as u32,
        size: r.int(b + 7)? as u64,
        blocks: (data_bytes as u64).div_ceil(512),
        atime: Timestamp(r.int(b + 9)?),
        mtime: Timestamp(r.int(b + 10)?),
        ctime: Timestamp(r.int(b + 11)?),
        btime: Timestamp(r.int(b + 12)?),
    };
    let mut row = InodeRow {
        attr,
        data_bytes: data_bytes as u64,
        parent: r.opt_int(b + 13)?.map(|p| p as u64),
        target: r.opt_bytes(b + 14)?,
        jseq: r.int(b + 15)? as u64,
        flags: r.int(b + 16)?,
        cver: r.int(b + 17)? as u64,
    };
    if row.attr.kind == FileKind::Dir {
        row.attr.size = 4096;
        row.attr.blocks = 8;
    }
    Ok(row)
}

pub(super) fn row_to_chunk(r: &Row) -> Result<ChunkRow> {
    let h: Vec<u8> = col(r, 1)?;
    let mut hash = [0u8; 32];
    if h.len() == 32 {
        hash.copy_from_slice(&h);
    }
    Ok(ChunkRow {
        id: col::<i64>(r, 0)? as u64,
        hash,
        pack: col::<i64>(r, 2)? as u64,
        offset: col::<i64>(r, 3)? as u64,
        stored_len: col::<i64>(r, 4)? as u32,
        raw_len: col::<i64>(r, 5)? as u32,
        flags: col::<i64>(r, 6)? as u8,
        refs: col(r, 7)?,
        zero_since: col(r, 8)?,
    })
}

pub(super) fn chunks_of(rows: Vec<Row>) -> Result<Vec<ChunkRow>> {
    rows.iter().map(row_to_chunk).collect()
}

/// A sum PostgreSQL returns as numeric, read as text, saturating at u64::MAX.
pub(super) fn big(r: &Row, i: usize) -> Result<u64> {
    let s: String = col(r, i)?;
    Ok(s.parse::<u128>().map(|v| u64::try_from(v).unwrap_or(u64::MAX)).unwrap_or(u64::MAX))
}

fn restore_of(r: &Row) -> Result<RestoreRow> {
    Ok(RestoreRow {
        pack: col::<i64>(r, 0)? as u64,
        class: col::<i16>(r, 1)? as TierCode,
        requested_ns: col(r, 2)?,
        ready_estimate_ns: col(r, 3)?,
        expires_ns: col(r, 4)?,
    })
}

impl MetaRead for PgTx<'_> {
    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        if let Some(r) = self.pre.borrow().as_ref().and_then(|p| p.inodes.get(&ino)) {
            return Ok(Some(r.clone()));
        }
        let from = INODE_FROM.replace("$J", "$2");
        let Some(r) = self.opt(&format!("SELECT {INODE_COLS} FROM {from} WHERE i.ino = $1"), &[&(ino as i64), &self.journal()])? else { return Ok(None) };
        Ok(Some(row_to_inode(&r)?))
    }
    /// One statement: the directory's row joined to the entry and its
    /// inode's row (all NULL when the name is not there).
    fn lookup_inode(&self, parent: Ino, name: &[u8]) -> Result<(Option<InodeRow>, Option<InodeRow>)> {
        if let Some(p) = self.pre.borrow().as_ref() {
            if let (Some(prow), Some(entry)) = (p.inodes.get(&parent), p.entries.get(&(parent, name.to_vec()))) {
                match entry {
                    None => return Ok((Some(prow.clone()), None)),
                    Some((ino, _)) => {
                        if let Some(c) = p.inodes.get(ino) {
                            return Ok((Some(prow.clone()), Some(c.clone())));
                        }
                    }
                }
            }
        }
        let parent_cols = INODE_COLS.replace("i.", "p.").replace("m.seq", "pm.seq");
        let sql = format!(
            "SELECT {parent_cols}, {INODE_COLS}
             FROM inodes p LEFT JOIN journal_marks pm ON pm.journal = $2 AND pm.ino = p.ino
             LEFT JOIN dentries d ON d.parent = p.ino AND d.name = $3
             LEFT JOIN inodes i ON i.ino = d.ino
             LEFT JOIN journal_marks m ON m.journal = $2 AND m.ino = i.ino
             WHERE p.ino = $1"
        );
        let Some(r) = self.opt(&sql, &[&(parent as i64), &self.journal(), &name])? else { return Ok((None, None)) };
        let child = match col::<Option<i64>>(&r, INODE_NCOLS)? {
            Some(_) => Some(row_to_inode_at(&r, INODE_NCOLS)?),
            None => None,
        };
        Ok((Some(row_to_inode(&r)?), child))
    }
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
        if let Some(e) = self.pre.borrow().as_ref().and_then(|p| p.entries.get(&(parent, name.to_vec()))) {
            return Ok(*e);
        }
        match self.opt("SELECT ino, kind FROM dentries WHERE parent = $1 AND name = $2", &[&(parent as i64), &name])? {
            None => Ok(None),
            Some(r) => Ok(Some((col::<i64>(&r, 0)? as u64, FileKind::from_code(col(&r, 1)?)?))),
        }
    }
    fn list_dir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, FileKind)>> {
        self.query("SELECT name, ino, kind FROM dentries WHERE parent = $1 ORDER BY name", &[&(dir as i64)])?
            .iter()
            .map(|r| Ok((col(r, 0)?, col::<i64>(r, 1)? as u64, FileKind::from_code(col(r, 2)?)?)))
            .collect()
    }
    fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        Ok(self.opt("SELECT 1 FROM dentries WHERE parent = $1 LIMIT 1", &[&(dir as i64)])?.is_none())
    }
    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.opt("SELECT value FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])?.map(|r| col(&r, 0)).transpose()
    }
    fn list_xattrs(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.query("SELECT name FROM xattrs WHERE ino = $1 ORDER BY name", &[&(ino as i64)])?.iter().map(|r| col(r, 0)).collect()
    }
    fn load_pages(&self, ino: Ino) -> Result<Vec<StoredPage>> {
        let rows = self.query(
            "SELECT f.key, p.id, p.data FROM file_pages f JOIN pages p ON p.id = f.page WHERE f.ino = $1 ORDER BY f.key",
            &[&(ino as i64)],
        )?;
        let pages: Vec<StoredPage> =
            rows.iter().map(|r| Ok(StoredPage { key: col(r, 0)?, id: col::<i64>(r, 1)? as u64, data: col(r, 2)? })).collect::<Result<_>>()?;
        let n = self.int("SELECT COUNT(*) FROM file_pages WHERE ino = $1", &[&(ino as i64)])?;
        if n as usize != pages.len() {
            return Err(Error::corrupt(format!("inode {ino} links {} pages that do not exist", n as usize - pages.len())));
        }
        Ok(pages)
    }
    fn page_links(&self, ino: Ino) -> Result<Vec<PageLink>> {
        self.query("SELECT f.key, p.id, p.refs, p.data FROM file_pages f JOIN pages p ON p.id = f.page WHERE f.ino = $1", &[&(ino as i64)])?
            .iter()
            .map(|r| Ok(PageLink { key: col(r, 0)?, id: col::<i64>(r, 1)? as u64, refs: col(r, 2)?, data: col(r, 3)? }))
            .collect()
    }
    fn page_data(&self, id: u64) -> Result<Option<Vec<u8>>> {
        self.opt("SELECT data FROM pages WHERE id = $1", &[&(id as i64)])?.map(|r| col(&r, 0)).transpose()
    }
    fn get_info(&self, key: &str) -> Result<Option<i64>> {
        self.opt("SELECT value FROM info WHERE key = $1", &[&key])?.map(|r| col(&r, 0)).transpose()
    }
    fn chunk_by_id(&self, id: u64) -> Result<Option<ChunkRow>> {
        self.opt(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE id = $1"), &[&(id as i64)])?.map(|r| row_to_chunk(&r)).transpose()
    }
    fn chunk_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ChunkRow>> {
        self.opt(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE hash = $1"), &[&&hash[..]])?.map(|r| row_to_chunk(&r)).transpose()
    }
    fn chunks_in_pack(&self, pack: u64) -> Result<Vec<ChunkRow>> {
        chunks_of(self.query(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE pack = $1 ORDER BY \"offset\""), &[&(pack as i64)])?)
    }
    fn all_chunks(&self) -> Result<Vec<ChunkRow>> {
        chunks_of(self.query(&format!("SELECT {CHUNK_COLS} FROM chunks ORDER BY pack, \"offset\""), &[])?)
    }
    fn max_chunk_id(&self) -> Result<u64> {
        Ok(self.int("SELECT COALESCE(MAX(id), 0) FROM chunks", &[])? as u64)
    }
    fn pack_name(&self, id: u64) -> Result<String> {
        match self.opt("SELECT name FROM packs WHERE id = $1", &[&(id as i64)])? {
            Some(r) => col(&r, 0),
            None => Err(Error::corrupt(format!("pack #{id} is missing from the metadata"))),
        }
    }
    fn pack_exists(&self, name: &str) -> Result<bool> {
        Ok(self.opt("SELECT 1 FROM packs WHERE name = $1", &[&name])?.is_some())
    }
    fn pack_tier(&self, id: u64) -> Result<Option<PackTier>> {
        match self.opt("SELECT tier, tier_since FROM packs WHERE id = $1", &[&(id as i64)])? {
            Some(r) => Ok(Some(PackTier { tier: col::<i16>(&r, 0)? as TierCode, since: col(&r, 1)? })),
            None => Ok(None),
        }
    }
    fn tier_pin(&self, ino: Ino) -> Result<Option<u8>> {
        match self.opt("SELECT tier_pin FROM inodes WHERE ino = $1", &[&(ino as i64)])? {
            Some(r) => Ok(Some(col::<i16>(&r, 0)? as u8)),
            None => Ok(None),
        }
    }
    fn get_restore(&self, pack: u64) -> Result<Option<RestoreRow>> {
        match self.opt("SELECT pack, class, requested_ns, ready_estimate_ns, expires_ns FROM restores WHERE pack = $1", &[&(pack as i64)])? {
            Some(r) => Ok(Some(restore_of(&r)?)),
            None => Ok(None),
        }
    }
    fn list_restores(&self) -> Result<Vec<RestoreRow>> {
        self.query("SELECT pack, class, requested_ns, ready_estimate_ns, expires_ns FROM restores ORDER BY pack", &[])?.iter().map(restore_of).collect()
    }
    fn all_packs(&self) -> Result<Vec<PackRow>> {
        self.query("SELECT id, name, size, blobs, dead_bytes FROM packs ORDER BY id", &[])?
            .iter()
            .map(|r| {
                Ok(PackRow {
                    id: col::<i64>(r, 0)? as u64,
                    name: col(r, 1)?,
                    size: col::<i64>(r, 2)? as u64,
                    blobs: col::<i64>(r, 3)? as u64,
                    dead_bytes: col::<i64>(r, 4)? as u64,
                })
            })
            .collect()
    }
    fn dead_packs(&self) -> Result<Vec<DeadPack>> {
        self.query(
            "SELECT id, name, size, dead_bytes, dead_acc, COALESCE(dead_mark, dead_since, created), blobs FROM packs WHERE dead_bytes > 0 ORDER BY id",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok(DeadPack {
                id: col::<i64>(r, 0)? as u64,
                name: col(r, 1)?,
                size: col::<i64>(r, 2)? as u64,
                dead_bytes: col::<i64>(r, 3)? as u64,
                dead_acc: col(r, 4)?,
                mark: col(r, 5)?,
                blobs: col::<i64>(r, 6)? as u64,
            })
        })
        .collect()
    }
    fn pack_bytes(&self) -> Result<(u64, u64)> {
        let r = self.one("SELECT COALESCE(SUM(size), 0)::text, COALESCE(SUM(dead_bytes), 0)::text FROM packs", &[])?;
        Ok((big(&r, 0)?, big(&r, 1)?))
    }
    fn bill_rows(&self, since: Option<i64>) -> Result<Vec<BillRow>> {
        self.query(
            "SELECT day, subsystem, item, requests, bytes FROM bill WHERE day >= $1 ORDER BY day, subsystem, item",
            &[&since.unwrap_or(i64::MIN)],
        )?
        .iter()
        .map(|r| Ok(BillRow { day: col(r, 0)?, subsystem: col(r, 1)?, item: col(r, 2)?, requests: col::<i64>(r, 3)? as u64, bytes: col::<i64>(r, 4)? as u64 }))
        .collect()
    }
    fn all_inodes(&self) -> Result<Vec<InodeRow>> {
        let from = INODE_FROM.replace("$J", "$1");
        self.query(&format!("SELECT {INODE_COLS} FROM {from} ORDER BY i.ino"), &[&self.journal()])?.iter().map(row_to_inode).collect()
    }
    fn orphan_inodes(&self) -> Result<Vec<Ino>> {
        // A row of a session that is gone counts for nothing (rows go with
        // their session; this is the second guard).
        self.query(
            "SELECT ino FROM inodes i WHERE nlink = 0
             AND NOT EXISTS (SELECT 1 FROM open_files o JOIN sessions s ON s.id = o.session WHERE o.ino = i.ino) ORDER BY ino",
            &[],
        )?
            .iter()
            .map(|r| Ok(col::<i64>(r, 0)? as u64))
            .collect()
    }
    fn open_elsewhere(&self, ino: Ino, except: u64) -> Result<bool> {
        Ok(self
            .opt(
                "SELECT 1 FROM open_files o JOIN sessions s ON s.id = o.session WHERE o.ino = $1 AND o.session <> $2 LIMIT 1",
                &[&(ino as i64), &(except as i64)],
            )?
            .is_some())
    }
    fn all_dentries(&self) -> Result<Vec<(Ino, Vec<u8>, Ino, i64)>> {
        self.query("SELECT parent, name, ino, kind FROM dentries ORDER BY parent, name", &[])?
            .iter()
            .map(|r| Ok((col::<i64>(r, 0)? as u64, col(r, 1)?, col::<i64>(r, 2)? as u64, col(r, 3)?)))
            .collect()
    }
    fn all_pages(&self) -> Result<Vec<(u64, i64, Vec<u8>)>> {
        self.query("SELECT id, refs, data FROM pages ORDER BY id", &[])?.iter().map(|r| Ok((col::<i64>(r, 0)? as u64, col(r, 1)?, col(r, 2)?))).collect()
    }
    fn all_page_links(&self) -> Result<Vec<(Ino, i64, u64)>> {
        self.query("SELECT ino, key, page FROM file_pages ORDER BY ino, key", &[])?
            .iter()
            .map(|r| Ok((col::<i64>(r, 0)? as u64, col(r, 1)?, col::<i64>(r, 2)? as u64)))
            .collect()
    }
    fn count_inodes(&self) -> Result<u64> {
        Ok(self.int("SELECT COUNT(*) FROM inodes", &[])? as u64)
    }
    fn max_jseq(&self) -> Result<u64> {
        Ok(self.int("SELECT COALESCE(MAX(seq), 0) FROM journal_marks WHERE journal = $1", &[&self.journal()])? as u64)
    }
    fn inode_totals(&self) -> Result<InodeTotals> {
        let rows = self.query(
            "SELECT kind, COUNT(*), LEAST(COALESCE(SUM(size), 0), 18446744073709551615)::text,
                    LEAST(COALESCE(SUM(data_bytes), 0), 18446744073709551615)::text FROM inodes GROUP BY kind ORDER BY kind",
            &[],
        )?;
        let mut t = InodeTotals::default();
        for r in &rows {
            t.by_kind.push((FileKind::from_code(col(r, 0)?)?, col::<i64>(r, 1)? as u64, big(r, 2)?, big(r, 3)?));
        }
        Ok(t)
    }
    fn chunk_totals(&self) -> Result<ChunkTotals> {
        let r = self.one(
            "SELECT COUNT(*) FILTER (WHERE refs > 0), COUNT(*) FILTER (WHERE refs = 0),
                    COALESCE(SUM(raw_len) FILTER (WHERE refs > 0), 0)::text, COALESCE(SUM(stored_len) FILTER (WHERE refs > 0), 0)::text FROM chunks",
            &[],
        )?;
        let p = self.one("SELECT COUNT(*), COALESCE(SUM(size), 0)::text, COALESCE(SUM(dead_bytes), 0)::text FROM packs", &[])?;
        Ok(ChunkTotals {
            live_chunks: col::<i64>(&r, 0)? as u64,
            dead_chunks: col::<i64>(&r, 1)? as u64,
            unique_bytes: big(&r, 2)?,
            live_stored_bytes: big(&r, 3)?,
            packs: col::<i64>(&p, 0)? as u64,
            pack_bytes: big(&p, 1)?,
            dead_bytes: big(&p, 2)?,
        })
    }
}

impl MetaTx for PgTx<'_> {
    fn lock_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        // Locked in the BEGIN round trip already.
        if let Some(r) = self.pre.borrow().as_ref().and_then(|p| p.inodes.get(&ino)) {
            return Ok(Some(r.clone()));
        }
        let from = INODE_FROM.replace("$J", "$2");
        let Some(r) = self.opt(&format!("SELECT {INODE_COLS} FROM {from} WHERE i.ino = $1 FOR UPDATE OF i"), &[&(ino as i64), &self.journal()])? else {
            return Ok(None);
        };
        Ok(Some(row_to_inode(&r)?))
    }
    fn unlink_entry(&self, parent: Ino, name: &[u8], ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<bool> {
        let r = self.one(
            "WITH d AS (DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3 RETURNING 1),
                  t AS (UPDATE inodes SET mtime = $4, ctime = $4, nlink = nlink + $5 WHERE ino = $1 AND EXISTS (SELECT 1 FROM d) RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM d), (SELECT count(*) FROM t)",
            &[&(parent as i64), &name, &(ino as i64), &now.0, &nlink_delta],
        )?;
        let gone: bool = col(&r, 0)?;
        if gone {
            self.entry_changed(parent, name);
        }
        Ok(gone)
    }
    fn lock_inodes(&self, inos: &[Ino]) -> Result<()> {
        if self.pre.borrow().as_ref().is_some_and(|p| inos.iter().all(|i| p.inodes.contains_key(i))) {
            return Ok(());
        }
        let mut ids: Vec<i64> = inos.iter().map(|&i| i as i64).collect();
        ids.sort_unstable();
        ids.dedup();
        self.query("SELECT ino FROM inodes WHERE ino = ANY($1) ORDER BY ino FOR UPDATE", &[&ids])?;
        Ok(())
    }
    /// From this store's block of `ino_seq` (a new block is reserved by a
    /// `nextval` on this transaction's connection: sequences are not
    /// transactional, so a rolled-back transaction skips its numbers).
    fn alloc_ino(&self) -> Result<Ino> {
        self.need_write()?;
        let mut b = self.store.inos.lock();
        loop {
            let history = self.store.history.load(Ordering::SeqCst);
            if b.history != history {
                *b = Block::default();
            }
            if let Some(v) = b.take(self.store.ino_floor) {
                return Ok(v);
            }
            let mut g = self.c.borrow_mut();
            *b = PgMeta::next_block(&mut g.client, "ino_seq").map_err(|e| self.note(e))?;
            b.history = history;
            self.store.ino_high.fetch_max(b.next, Ordering::SeqCst);
        }
    }
    /// One statement: the entry (ON CONFLICT DO NOTHING decides), then,
    /// only if it went in, the inode, the parent's times and links, and
    /// the open-file row.
    fn create_node(&self, n: &NewNode) -> Result<()> {
        let a = n.attr;
        let dir = a.kind == FileKind::Dir;
        let (session, gen) = n.open.unwrap_or((0, 0));
        let r = self.one(
            "WITH d AS (INSERT INTO dentries(parent, name, ino, kind) VALUES($14, $15, $1, $2) ON CONFLICT (parent, name) DO NOTHING RETURNING 1),
                  i AS (INSERT INTO inodes(ino, kind, perm, uid, gid, rdev, nlink, size, data_bytes, atime, mtime, ctime, btime, parent, target, jseq, flags, tier_pin)
                        SELECT $1::bigint, $2::bigint, $3::bigint, $4::bigint, $5::bigint, $6::bigint, $7::bigint, $8::bigint, 0, $9::bigint, $10::bigint,
                               $11::bigint, $12::bigint, $13::bigint, $16::bytea, 0, 0,
                               COALESCE((SELECT CASE WHEN p.tier_pin & 15 = 0 THEN 0 ELSE (p.tier_pin & 15) | 16 END FROM inodes p WHERE p.ino = $14), 0)
                        WHERE EXISTS (SELECT 1 FROM d) RETURNING ino),
                  t AS (UPDATE inodes SET mtime = $17::bigint, ctime = $17::bigint, nlink = nlink + $18::bigint
                        WHERE ino = $14 AND EXISTS (SELECT 1 FROM d) RETURNING 1),
                  s AS (SELECT $19::bigint = 0 OR EXISTS (SELECT 1 FROM sessions WHERE id = $19::bigint) AS live),
                  o AS (INSERT INTO open_files(ino, session, gen) SELECT $1::bigint, $19::bigint, $20::bigint
                        WHERE $19::bigint <> 0 AND (SELECT live FROM s) AND EXISTS (SELECT 1 FROM i)
                        ON CONFLICT (ino, session) DO UPDATE SET gen = excluded.gen RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM d), (SELECT live FROM s), (SELECT count(*) FROM t) + (SELECT count(*) FROM o)",
            &[
                &(a.ino as i64),
                &a.kind.code(),
                &(a.perm as i64),
                &(a.uid as i64),
                &(a.gid as i64),
                &(a.rdev as i64),
                &(a.nlink as i64),
                &(a.size as i64),
                &a.atime.0,
                &a.mtime.0,
                &a.ctime.0,
                &a.btime.0,
                &(dir.then_some(n.parent as i64)),
                &(n.parent as i64),
                &n.name,
                &n.target,
                &n.now.0,
                &(dir as i64),
                &(session as i64),
                &(gen as i64),
            ],
        )?;
        if !col::<bool>(&r, 0)? {
            return Err(name_taken(n.parent, n.name));
        }
        if !col::<bool>(&r, 1)? {
            return Err(session_gone(session));
        }
        self.entry_changed(n.parent, n.name);
        Ok(())
    }
    fn insert_inode_full(&self, a: &Attr, data_bytes: u64, parent: Option<Ino>, target: Option<&[u8]>, _jseq: u64, flags: i64) -> Result<()> {
        self.exec(
            "INSERT INTO inodes(ino, kind, perm, uid, gid, rdev, nlink, size, data_bytes, atime, mtime, ctime, btime, parent, target, jseq, flags)
             VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
            &[
                &(a.ino as i64),
                &a.kind.code(),
                &(a.perm as i64),
                &(a.uid as i64),
                &(a.gid as i64),
                &(a.rdev as i64),
                &(a.nlink as i64),
                &(a.size as i64),
                &(data_bytes as i64),
                &a.atime.0,
                &a.mtime.0,
                &a.ctime.0,
                &a.btime.0,
                &parent.map(|p| p as i64),
                &target,
                // No mark: the number is new, so no journal holds an older
                // record of it (the column is the frozen legacy one).
                &0i64,
                &flags,
            ],
        )?;
        Ok(())
    }
    fn update_attr(&self, a: &Attr) -> Result<()> {
        self.exec(
            "UPDATE inodes SET perm = $2, uid = $3, gid = $4, nlink = $5, atime = $6, mtime = $7, ctime = $8 WHERE ino = $1",
            &[&(a.ino as i64), &(a.perm as i64), &(a.uid as i64), &(a.gid as i64), &(a.nlink as i64), &a.atime.0, &a.mtime.0, &a.ctime.0],
        )?;
        self.inode_changed(a.ino);
        Ok(())
    }
    fn update_content(&self, ino: Ino, size: u64, data_bytes: u64, mtime: Timestamp, ctime: Timestamp, jseq: u64) -> Result<()> {
        // One statement: the content, and this journal's mark for the
        // inode (raised, never lowered; none for a missing inode, position
        // 0 or no journal set). Other journals' marks stay.
        self.exec(
            "WITH u AS (UPDATE inodes SET size = $2, data_bytes = $3, mtime = $4, ctime = $5, cver = cver + 1 WHERE ino = $1 RETURNING ino)
             INSERT INTO journal_marks(journal, ino, seq) SELECT $7::bigint, ino, $6::bigint FROM u WHERE $6::bigint > 0 AND $7::bigint <> 0
             ON CONFLICT (journal, ino) DO UPDATE SET seq = GREATEST(journal_marks.seq, excluded.seq)",
            &[&(ino as i64), &(size as i64), &(data_bytes as i64), &mtime.0, &ctime.0, &(jseq.min(i64::MAX as u64) as i64), &self.journal()],
        )?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_nlink(&self, ino: Ino, nlink: u32, ctime: Timestamp) -> Result<()> {
        self.exec("UPDATE inodes SET nlink = $2, ctime = $3 WHERE ino = $1", &[&(ino as i64), &(nlink as i64), &ctime.0])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn fix_nlink(&self, ino: Ino, nlink: u32) -> Result<()> {
        self.exec("UPDATE inodes SET nlink = $2 WHERE ino = $1", &[&(ino as i64), &(nlink as i64)])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_parent(&self, ino: Ino, parent: Ino) -> Result<()> {
        self.exec("UPDATE inodes SET parent = $2 WHERE ino = $1", &[&(ino as i64), &(parent as i64)])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_btime(&self, ino: Ino, btime: Timestamp) -> Result<()> {
        self.exec("UPDATE inodes SET btime = $2 WHERE ino = $1", &[&(ino as i64), &btime.0])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn touch_dir(&self, ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<()> {
        self.exec("UPDATE inodes SET mtime = $2, ctime = $2, nlink = nlink + $3 WHERE ino = $1", &[&(ino as i64), &now.0, &nlink_delta])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_flags(&self, ino: Ino, flags: i64) -> Result<()> {
        self.exec("UPDATE inodes SET flags = $2 WHERE ino = $1", &[&(ino as i64), &flags])?;
        self.inode_changed(ino);
        Ok(())
    }
    /// `ON CONFLICT DO NOTHING`: a taken name does not abort the
    /// transaction (as a constraint error in SQLite does not). A name taken
    /// by a transaction this one cannot see fails it with a serialization
    /// error instead, and the re-run sees the winner.
    fn insert_dentry(&self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Result<()> {
        let n = self.exec(
            "INSERT INTO dentries(parent, name, ino, kind) VALUES($1, $2, $3, $4) ON CONFLICT (parent, name) DO NOTHING",
            &[&(parent as i64), &name, &(ino as i64), &kind.code()],
        )?;
        if n == 0 {
            return Err(name_taken(parent, name));
        }
        self.entry_changed(parent, name);
        Ok(())
    }
    fn delete_dentry(&self, parent: Ino, name: &[u8], expect: Ino) -> Result<bool> {
        let gone = self.exec("DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3", &[&(parent as i64), &name, &(expect as i64)])? == 1;
        if gone {
            self.entry_changed(parent, name);
        }
        Ok(gone)
    }
    fn delete_inode(&self, ino: Ino) -> Result<()> {
        let i = ino as i64;
        self.exec(
            "WITH m AS (DELETE FROM journal_marks WHERE ino = $1), o AS (DELETE FROM open_files WHERE ino = $1),
                  x AS (DELETE FROM xattrs WHERE ino = $1), f AS (DELETE FROM file_pages WHERE ino = $1)
             DELETE FROM inodes WHERE ino = $1",
            &[&i],
        )?;
        self.inode_changed(ino);
        Ok(())
    }
    /// Reads the inode and writes the row in one serializable
    /// transaction: an unlink elsewhere that read no row and freed the
    /// inode conflicts with it, and one of the two is retried.
    fn mark_open(&self, session: u64, ino: Ino, gen: u64) -> Result<bool> {
        // A row of a session that is gone would keep the file forever. One
        // statement (a create runs this inside its transaction: a round
        // trip saved per create). FOR SHARE: an unlink at READ COMMITTED
        // locks the inode FOR UPDATE before it asks whether anyone has it
        // open, so the two queue and the unlink sees this row (or this
        // finds the inode gone), never both missing each other.
        let r = self.one(
            "WITH s AS (SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $2) AS live),
                  ins AS (INSERT INTO open_files(ino, session, gen) SELECT $1, $2, $3
                          WHERE (SELECT live FROM s) AND EXISTS (SELECT 1 FROM inodes WHERE ino = $1 FOR SHARE)
                          ON CONFLICT (ino, session) DO UPDATE SET gen = excluded.gen RETURNING 1)
             SELECT (SELECT live FROM s), EXISTS (SELECT 1 FROM ins)",
            &[&(ino as i64), &(session as i64), &(gen as i64)],
        )?;
        if !col::<bool>(&r, 0)? {
            return Err(session_gone(session));
        }
        col(&r, 1)
    }
    fn mark_closed(&self, session: u64, rows: &[(Ino, u64)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let inos: Vec<i64> = rows.iter().map(|r| r.0 as i64).collect();
        let gens: Vec<i64> = rows.iter().map(|r| r.1 as i64).collect();
        self.exec(
            "DELETE FROM open_files o USING unnest($2::bigint[], $3::bigint[]) AS x(ino, gen)
             WHERE o.session = $1 AND o.ino = x.ino AND (x.gen = 0 OR o.gen = x.gen)",
            &[&(session as i64), &inos, &gens],
        )?;
        Ok(())
    }
    fn set_xattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.exec(
            "INSERT INTO xattrs(ino, name, value) VALUES($1, $2, $3) ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            &[&(ino as i64), &name, &value],
        )?;
        self.inode_changed(ino);
        Ok(())
    }
    fn remove_xattr(&self, ino: Ino, name: &[u8]) -> Result<bool> {
        let gone = self.exec("DELETE FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])? > 0;
        if gone {
            self.inode_changed(ino);
        }
        Ok(gone)
    }
    fn copy_xattrs(&self, src: Ino, dst: Ino) -> Result<()> {
        self.exec("INSERT INTO xattrs(ino, name, value) SELECT $2, name, value FROM xattrs WHERE ino = $1", &[&(src as i64), &(dst as i64)])?;
        Ok(())
    }
    fn save_pages(&self, ino: Ino, ch: &PageEdits) -> Result<Vec<(i64, u64)>> {
        let i = ino as i64;
        for id in &ch.gained {
            if self.exec("UPDATE pages SET refs = refs + 1 WHERE id = $1", &[&(*id as i64)])? != 1 {
                return Err(Error::corrupt(format!("inode {ino}: shared page #{id} is missing")));
            }
        }
        let mut ids = Vec::new();
        for p in &ch.upserts {
            let id = if p.id == 0 {
                let id = self.int("INSERT INTO pages(refs, data) VALUES(1, $1) RETURNING id", &[&p.data])? as u64;
                let mut d = self.deltas.borrow_mut();
                for &c in &p.chunks {
                    *d.entry(c).or_default() += 1;
                }
                ids.push((p.key, id));
                id
            } else {
                p.id
            };
            self.exec(
                "INSERT INTO file_pages(ino, key, page) VALUES($1, $2, $3) ON CONFLICT (ino, key) DO UPDATE SET page = excluded.page",
                &[&i, &p.key, &(id as i64)],
            )?;
        }
        for k in &ch.deletes {
            self.exec("DELETE FROM file_pages WHERE ino = $1 AND key = $2", &[&i, k])?;
        }
        for (id, chunks) in &ch.dropped {
            self.unlink_page(*id, Some(chunks))?;
        }
        self.inode_changed(ino);
        Ok(ids)
    }
    /// One statement drops the links and counts the pages down (answering
    /// the data of those left unreferenced); one more deletes those pages.
    fn release_pages(&self, ino: Ino) -> Result<()> {
        let rows = self.query(
            "WITH f AS (DELETE FROM file_pages WHERE ino = $1 RETURNING page),
                  c AS (SELECT page, count(*) AS n FROM f GROUP BY page),
                  u AS (UPDATE pages p SET refs = p.refs - c.n FROM c WHERE p.id = c.page RETURNING p.id, p.refs, p.data)
             SELECT id, refs, CASE WHEN refs = 0 THEN data END, (SELECT count(*) FROM c) FROM u",
            &[&(ino as i64)],
        )?;
        self.inode_changed(ino);
        let Some(first) = rows.first() else { return Ok(()) };
        let linked: i64 = col(first, 3)?;
        if linked as usize != rows.len() {
            return Err(Error::corrupt(format!("inode {ino} links {} pages that do not exist", linked as usize - rows.len())));
        }
        let mut gone = Vec::new();
        let mut ids = Vec::new();
        for r in &rows {
            let (id, refs): (i64, i64) = (col(r, 0)?, col(r, 1)?);
            if refs < 0 {
                return Err(Error::corrupt(format!("page #{id}: link count went negative")));
            }
            if refs == 0 {
                let data: Vec<u8> = col(r, 2)?;
                self.store.codec.chunk_ids(&data, &mut ids).map_err(|e| e.context(format!("page #{id}")))?;
                gone.push(id);
            }
        }
        let mut deltas = self.deltas.borrow_mut();
        for c in ids {
            *deltas.entry(c).or_default() -= 1;
        }
        drop(deltas);
        if !gone.is_empty() {
            self.exec("DELETE FROM pages WHERE id = ANY($1)", &[&gone])?;
        }
        Ok(())
    }
    fn share_pages(&self, src: Ino, dst: Ino) -> Result<()> {
        self.exec("UPDATE pages SET refs = refs + 1 WHERE id IN (SELECT page FROM file_pages WHERE ino = $1)", &[&(src as i64)])?;
        self.exec("INSERT INTO file_pages(ino, key, page) SELECT $2, key, page FROM file_pages WHERE ino = $1", &[&(src as i64), &(dst as i64)])?;
        self.inode_changed(dst);
        Ok(())
    }
    fn set_info(&self, key: &str, value: i64) -> Result<()> {
        self.exec("INSERT INTO info(key, value) VALUES($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value", &[&key, &value])?;
        Ok(())
    }
    fn insert_chunk(&self, ch: &ChunkRow) -> Result<()> {
        // The hash is claimed atomically: another machine that stored the
        // same new chunk first wins, and this transaction learns it lost.
        let n = self.exec(
            INSERT_CHUNK_SQL,
            &[
                &(ch.id as i64),
                &&ch.hash[..],
                &(ch.pack as i64),
                &(ch.offset as i64),
                &(ch.stored_len as i64),
                &(ch.raw_len as i64),
                &(ch.flags as i64),
                &ch.refs,
            ],
        )?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::Raced,
                format!("chunk #{} (a new chunk) was stored by another machine at the same time", ch.id),
            ));
        }
        Ok(())
    }
    fn relocate_chunk(&self, id: u64, from: u64, to: u64, offset: u64) -> Result<()> {
        // `AND pack = $2`: two cleaners (one stalled past its lease) that
        // both planned to move this chunk must not both succeed; the
        // second would point the row at its own copy while the first's
        // transaction deletes the source, leaking one copy or naming a
        // pack gc already took.
        let n = self.exec("UPDATE chunks SET pack = $3, \"offset\" = $4 WHERE id = $1 AND pack = $2", &[&(id as i64), &(from as i64), &(to as i64), &(offset as i64)])?;
        if n == 0 {
            return Err(Error::new(ErrorKind::Raced, format!("chunk #{id} is no longer in pack #{from} (moved or freed by another machine since it was read)")));
        }
        Ok(())
    }
    fn set_pack_tier(&self, pack: u64, tier: TierCode, since: i64) -> Result<bool> {
        Ok(self.exec("UPDATE packs SET tier = $2, tier_since = $3 WHERE id = $1", &[&(pack as i64), &(tier as i16), &since])? > 0)
    }
    fn set_tier_pin(&self, ino: Ino, pin: u8) -> Result<bool> {
        Ok(self.exec("UPDATE inodes SET tier_pin = $2 WHERE ino = $1", &[&(ino as i64), &(pin as i16)])? > 0)
    }
    fn insert_restore(&self, r: &RestoreRow) -> Result<bool> {
        Ok(self.exec(
            "INSERT INTO restores(pack, class, requested_ns, ready_estimate_ns, expires_ns) VALUES($1, $2, $3, $4, $5) ON CONFLICT (pack) DO NOTHING",
            &[&(r.pack as i64), &(r.class as i16), &r.requested_ns, &r.ready_estimate_ns, &r.expires_ns],
        )? > 0)
    }
    fn delete_restore(&self, pack: u64) -> Result<bool> {
        Ok(self.exec("DELETE FROM restores WHERE pack = $1", &[&(pack as i64)])? > 0)
    }
    fn insert_pack(&self, name: &str, size: u64, blobs: u64, dead_bytes: u64) -> Result<u64> {
        let now = Timestamp::now().0;
        Ok(self.int(
            "WITH u AS (DELETE FROM uploads WHERE name = $1)
             INSERT INTO packs(name, size, blobs, dead_bytes, dead_since, created, dead_mark, tier, tier_since)
             VALUES($1, $2, $3, $4::bigint, CASE WHEN $4::bigint > 0 THEN $5::bigint END, $5::bigint, $5::bigint, 0, $5::bigint) RETURNING id",
            &[&name, &(size as i64), &(blobs as i64), &(dead_bytes as i64), &now],
        )? as u64)
    }
    fn delete_pack(&self, pack: u64) -> Result<u64> {
        let p = pack as i64;
        let n = self.exec("DELETE FROM chunks WHERE pack = $1 AND refs = 0", &[&p])?;
        let live = self.int("SELECT COUNT(*) FROM chunks WHERE pack = $1", &[&p])?;
        if live > 0 {
            // Planned dead, but another machine referenced one of its
            // chunks since (found by hash): nothing is deleted, the
            // cleaner plans again.
            return Err(Error::new(ErrorKind::Raced, format!("pack #{pack} still holds {live} live chunks (referenced by another machine since it was planned)")));
        }
        self.exec("DELETE FROM packs WHERE id = $1", &[&p])?;
        Ok(n)
    }
    fn add_bill(&self, r: &BillRow) -> Result<()> {
        self.exec(
            "INSERT INTO bill(day, subsystem, item, requests, bytes) VALUES($1, $2, $3, $4, $5)
             ON CONFLICT (day, subsystem, item) DO UPDATE SET requests = bill.requests + excluded.requests, bytes = bill.bytes + excluded.bytes",
            &[&r.day, &r.subsystem, &r.item, &(r.requests as i64), &(r.bytes as i64)],
        )?;
        Ok(())
    }
    /// The bill table is made with the schema.
    fn ensure_bill_table(&self) -> Result<bool> {
        Ok(false)
    }
    /// The accrual columns are made with the schema.
    fn ensure_dead_accrual(&self) -> Result<bool> {
        Ok(false)
    }
    fn add_chunk_refs(&self, deltas: &HashMap<u64, i64>) -> Result<()> {
        let mut d = self.deltas.borrow_mut();
        for (&id, &n) in deltas {
            *d.entry(id).or_default() += n;
        }
        Ok(())
    }
}

/// A create found its name taken.
pub(super) fn name_taken(parent: Ino, name: &[u8]) -> Error {
    Error::new(ErrorKind::Exists, format!("{} already exists in directory {parent}", String::from_utf8_lossy(name)))
}

/// An open-file row asked for by a session that was cleaned up.
pub(super) fn session_gone(session: u64) -> Error {
    Error::new(ErrorKind::SessionLost, format!("metadata session {session} is gone (expired and cleaned up): this mount cannot register open files any more; remount"))
}
