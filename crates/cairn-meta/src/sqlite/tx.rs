//! [`MetaRead`] and [`MetaTx`] of a transaction on the connection.

use super::*;

impl<'a> SqlTx<'a> {
    pub(super) fn new(c: &'a Connection, codec: &'a dyn PageCodec, ids: Option<&'a Ids>) -> Self {
        SqlTx { c, codec, ids, deltas: RefCell::new(HashMap::new()) }
    }

    /// Applies the accumulated chunk reference changes.
    pub(super) fn finish(&self) -> Result<()> {
        let d = std::mem::take(&mut *self.deltas.borrow_mut());
        if d.is_empty() {
            return Ok(());
        }
        apply_ref_deltas(self.c, &d)
    }
}

impl MetaRead for SqlTx<'_> {
    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        get_inode(self.c, ino)
    }
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
        lookup(self.c, parent, name)
    }
    fn list_dir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, FileKind)>> {
        list_dir(self.c, dir)
    }
    fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        dir_is_empty(self.c, dir)
    }
    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        get_xattr(self.c, ino, name)
    }
    fn list_xattrs(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        list_xattrs(self.c, ino)
    }
    fn load_pages(&self, ino: Ino) -> Result<Vec<StoredPage>> {
        load_pages(self.c, ino)
    }
    fn page_links(&self, ino: Ino) -> Result<Vec<PageLink>> {
        let mut st = self.c.prepare_cached("SELECT f.key, p.id, p.refs, p.data FROM file_pages f JOIN pages p ON p.id=f.page WHERE f.ino=?1")?;
        let rows = st.query_map([ino as i64], |r| Ok(PageLink { key: r.get(0)?, id: r.get::<_, i64>(1)? as u64, refs: r.get(2)?, data: r.get(3)? }))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
    fn page_data(&self, id: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.c.prepare_cached("SELECT data FROM pages WHERE id=?1")?.query_row([id as i64], |r| r.get(0)).optional()?)
    }
    fn get_info(&self, key: &str) -> Result<Option<i64>> {
        get_info(self.c, key)
    }
    fn chunk_by_id(&self, id: u64) -> Result<Option<ChunkRow>> {
        chunk_by_id(self.c, id)
    }
    fn chunk_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ChunkRow>> {
        chunk_by_hash(self.c, hash)
    }
    fn chunks_in_pack(&self, pack: u64) -> Result<Vec<ChunkRow>> {
        chunks_in_pack(self.c, pack)
    }
    fn all_chunks(&self) -> Result<Vec<ChunkRow>> {
        all_chunks(self.c)
    }
    fn max_chunk_id(&self) -> Result<u64> {
        max_chunk_id(self.c)
    }
    fn pack_name(&self, id: u64) -> Result<String> {
        pack_name(self.c, id)
    }
    fn pack_exists(&self, name: &str) -> Result<bool> {
        Ok(self.c.prepare_cached("SELECT 1 FROM packs WHERE name=?1")?.exists([name])?)
    }
    fn all_packs(&self) -> Result<Vec<PackRow>> {
        all_packs(self.c)
    }
    fn dead_packs(&self) -> Result<Vec<DeadPack>> {
        dead_packs(self.c)
    }
    fn pack_bytes(&self) -> Result<(u64, u64)> {
        pack_bytes(self.c)
    }
    fn pack_counts(&self, small: u64) -> Result<(u64, u64)> {
        let (n, s): (i64, i64) = self
            .c
            .prepare_cached("SELECT COUNT(*), COALESCE(SUM(size < ?1), 0) FROM packs")?
            .query_row([small as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok((n as u64, s as u64))
    }
    fn bill_rows(&self, since: Option<i64>) -> Result<Vec<BillRow>> {
        bill_rows(self.c, since)
    }
    fn all_inodes(&self) -> Result<Vec<InodeRow>> {
        all_inodes(self.c)
    }
    fn orphan_inodes(&self) -> Result<Vec<Ino>> {
        orphan_inodes(self.c)
    }
    /// No registry: the one process that opens this store knows its files.
    fn open_elsewhere(&self, _ino: Ino, _except: u64) -> Result<bool> {
        Ok(false)
    }
    fn all_dentries(&self) -> Result<Vec<(Ino, Vec<u8>, Ino, i64)>> {
        all_dentries(self.c)
    }
    fn all_pages(&self) -> Result<Vec<(u64, i64, Vec<u8>)>> {
        all_pages(self.c)
    }
    fn all_page_links(&self) -> Result<Vec<(Ino, i64, u64)>> {
        all_page_links(self.c)
    }
    fn count_inodes(&self) -> Result<u64> {
        count_inodes(self.c)
    }
    fn max_jseq(&self) -> Result<u64> {
        max_jseq(self.c)
    }
    fn inode_totals(&self) -> Result<InodeTotals> {
        // A file may be 2^63 - 1 bytes, so a SUM of sizes (64-bit in
        // SQLite, an error when it overflows) adds their high and low 32
        // bits apart (exact below 2^31 files) and the total saturates.
        let mut q = self.c.prepare(
            "SELECT kind, COUNT(*), COALESCE(SUM(size >> 32),0), COALESCE(SUM(size & 4294967295),0),
                    COALESCE(SUM(data_bytes >> 32),0), COALESCE(SUM(data_bytes & 4294967295),0) FROM inodes GROUP BY kind",
        )?;
        let rows = q.query_map([], |r| {
            let sum = |hi: i64, lo: i64| u64::try_from(((hi as u128) << 32) + lo as u128).unwrap_or(u64::MAX);
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, sum(r.get(2)?, r.get(3)?), sum(r.get(4)?, r.get(5)?)))
        })?;
        let mut t = InodeTotals::default();
        for r in rows {
            let (k, n, size, data) = r?;
            t.by_kind.push((FileKind::from_code(k)?, n as u64, size, data));
        }
        Ok(t)
    }
    fn chunk_totals(&self) -> Result<ChunkTotals> {
        let (live, dead, ub, lsb): (i64, i64, i64, i64) = self.c.query_row(
            "SELECT COALESCE(SUM(refs>0),0), COALESCE(SUM(refs=0),0), COALESCE(SUM(CASE WHEN refs>0 THEN raw_len END),0),
                    COALESCE(SUM(CASE WHEN refs>0 THEN stored_len END),0) FROM chunks",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?;
        let (np, sb, db): (i64, i64, i64) =
            self.c.query_row("SELECT COUNT(*), COALESCE(SUM(size),0), COALESCE(SUM(dead_bytes),0) FROM packs", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(ChunkTotals {
            live_chunks: live as u64,
            dead_chunks: dead as u64,
            unique_bytes: ub as u64,
            live_stored_bytes: lsb as u64,
            packs: np as u64,
            pack_bytes: sb as u64,
            dead_bytes: db as u64,
        })
    }
    fn pack_tier(&self, id: u64) -> Result<Option<PackTier>> {
        pack_tier(self.c, id)
    }
    fn tier_pin(&self, ino: Ino) -> Result<Option<u8>> {
        tier_pin(self.c, ino)
    }
    fn get_restore(&self, pack: u64) -> Result<Option<RestoreRow>> {
        get_restore(self.c, pack)
    }
    fn list_restores(&self) -> Result<Vec<RestoreRow>> {
        list_restores(self.c)
    }
}

impl SqlTx<'_> {
    pub(super) fn ids(&self) -> Result<&Ids> {
        self.ids.ok_or_else(|| Error::invalid("internal: a change outside a write transaction"))
    }
}

impl MetaTx for SqlTx<'_> {
    /// Numbers are never reused, even after the newest inode is deleted
    /// and the volume reopened (a kernel, an NFS export or a backup tool
    /// may remember them): the transaction that hands out a number past the
    /// reserved range records a new high-water mark `info.ino_high`,
    /// [`INO_RESERVE`] numbers ahead. If a transaction that reserved rolls
    /// back, the next number reserves again.
    fn alloc_ino(&self) -> Result<Ino> {
        let ids = self.ids()?;
        if ids.next.get() == 0 {
            ids.next.set(next_free_ino(self.c)?);
        }
        let ino = ids.next.get();
        ids.next.set(ino + 1);
        if ino >= ids.reserved.get() {
            let high = ino.max(ids.reserved.get()) + INO_RESERVE;
            set_info(self.c, INO_HIGH_KEY, high as i64)?;
            ids.reserved.set(high);
        }
        Ok(ino)
    }
    fn insert_inode_full(&self, a: &Attr, data_bytes: u64, parent: Option<Ino>, target: Option<&[u8]>, jseq: u64, flags: i64) -> Result<()> {
        insert_inode_full(self.c, a, data_bytes, parent, target, jseq, flags)
    }
    /// The default steps, with the parent's pin copied by one in-process
    /// statement that changes a row only under a pinned directory.
    fn create_node(&self, n: &NewNode) -> Result<()> {
        let dir = n.attr.kind == FileKind::Dir;
        insert_inode_full(self.c, n.attr, 0, dir.then_some(n.parent), n.target, n.jseq, 0)?;
        inherit_pin(self.c, n.attr.ino, n.parent)?;
        self.insert_dentry(n.parent, n.name, n.attr.ino, n.attr.kind)?;
        self.touch_dir(n.parent, n.now, dir as i64)?;
        if let Some((session, gen)) = n.open {
            if !self.mark_open(session, n.attr.ino, gen)? {
                return Err(Error::corrupt(format!("inode {} vanished in the transaction that made it", n.attr.ino)));
            }
        }
        Ok(())
    }
    fn set_pack_tier(&self, pack: u64, tier: TierCode, since: i64) -> Result<bool> {
        set_pack_tier(self.c, pack, tier, since)
    }
    fn set_tier_pin(&self, ino: Ino, pin: u8) -> Result<bool> {
        set_tier_pin(self.c, ino, pin)
    }
    fn insert_restore(&self, r: &RestoreRow) -> Result<bool> {
        insert_restore(self.c, r)
    }
    fn delete_restore(&self, pack: u64) -> Result<bool> {
        delete_restore(self.c, pack)
    }
    fn update_attr(&self, a: &Attr) -> Result<()> {
        update_attr(self.c, a)
    }
    fn update_content(&self, ino: Ino, size: u64, data_bytes: u64, mtime: Timestamp, ctime: Timestamp, jseq: u64) -> Result<()> {
        update_content(self.c, ino, size, data_bytes, mtime, ctime, jseq)
    }
    fn set_nlink(&self, ino: Ino, nlink: u32, ctime: Timestamp) -> Result<()> {
        set_nlink(self.c, ino, nlink, ctime)
    }
    fn fix_nlink(&self, ino: Ino, nlink: u32) -> Result<()> {
        self.c.prepare_cached("UPDATE inodes SET nlink=?2 WHERE ino=?1")?.execute(params![ino as i64, nlink])?;
        Ok(())
    }
    fn set_parent(&self, ino: Ino, parent: Ino) -> Result<()> {
        set_parent(self.c, ino, parent)
    }
    fn set_btime(&self, ino: Ino, btime: Timestamp) -> Result<()> {
        self.c.prepare_cached("UPDATE inodes SET btime=?2 WHERE ino=?1")?.execute(params![ino as i64, btime.0])?;
        Ok(())
    }
    fn touch_dir(&self, ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<()> {
        touch_dir(self.c, ino, now, nlink_delta)
    }
    fn set_flags(&self, ino: Ino, flags: i64) -> Result<()> {
        set_flags(self.c, ino, flags)
    }
    fn insert_dentry(&self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Result<()> {
        insert_dentry(self.c, parent, name, ino, kind)
    }
    fn delete_dentry(&self, parent: Ino, name: &[u8], expect: Ino) -> Result<bool> {
        Ok(self.c.prepare_cached("DELETE FROM dentries WHERE parent=?1 AND name=?2 AND ino=?3")?.execute(params![parent as i64, name, expect as i64])? == 1)
    }
    fn delete_inode(&self, ino: Ino) -> Result<()> {
        delete_inode(self.c, ino)
    }
    fn mark_open(&self, _session: u64, ino: Ino, _gen: u64) -> Result<bool> {
        Ok(get_inode(self.c, ino)?.is_some())
    }
    fn mark_closed(&self, _session: u64, _rows: &[(Ino, u64)]) -> Result<()> {
        Ok(())
    }
    fn set_xattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        set_xattr(self.c, ino, name, value)
    }
    fn remove_xattr(&self, ino: Ino, name: &[u8]) -> Result<bool> {
        remove_xattr(self.c, ino, name)
    }
    fn copy_xattrs(&self, src: Ino, dst: Ino) -> Result<()> {
        copy_xattrs(self.c, src, dst)
    }
    fn save_pages(&self, ino: Ino, edits: &PageEdits) -> Result<Vec<(i64, u64)>> {
        save_pages(self.c, ino, edits, &mut self.deltas.borrow_mut())
    }
    fn release_pages(&self, ino: Ino) -> Result<()> {
        release_pages(self.c, self.codec, ino, &mut self.deltas.borrow_mut())
    }
    fn share_pages(&self, src: Ino, dst: Ino) -> Result<()> {
        share_pages(self.c, src, dst)
    }
    fn set_info(&self, key: &str, value: i64) -> Result<()> {
        set_info(self.c, key, value)
    }
    fn insert_chunk(&self, ch: &ChunkRow) -> Result<()> {
        insert_chunk(self.c, ch)
    }
    fn relocate_chunk(&self, id: u64, from: u64, to: u64, offset: u64) -> Result<()> {
        relocate_chunk(self.c, id, from, to, offset)
    }
    fn insert_pack(&self, name: &str, size: u64, blobs: u64, dead_bytes: u64) -> Result<u64> {
        insert_pack(self.c, name, size, blobs, dead_bytes)
    }
    fn delete_pack(&self, pack: u64) -> Result<u64> {
        delete_pack(self.c, pack)
    }
    fn add_bill(&self, r: &BillRow) -> Result<()> {
        add_bill(self.c, r)
    }
    fn ensure_bill_table(&self) -> Result<bool> {
        ensure_bill_table(self.c)
    }
    fn ensure_dead_accrual(&self) -> Result<bool> {
        ensure_dead_accrual(self.c)
    }
    fn add_chunk_refs(&self, deltas: &HashMap<u64, i64>) -> Result<()> {
        let mut d = self.deltas.borrow_mut();
        for (&id, &n) in deltas {
            *d.entry(id).or_default() += n;
        }
        Ok(())
    }
}
