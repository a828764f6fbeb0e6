//! The bill of an open volume: requests and stored byte-seconds saved into
//! the metadata (they ship with it), this mount's bill object in the
//! bucket, and the usage `cairn cost` prices (`crate::cost` has the bill's
//! rows, objects and prices).

use super::Volume;
use crate::cost::*;
use crate::error::{Error, Result};
use crate::meta::{self, BillRow};
use cairn_backend::meter::{RequestCounts, RequestKind, Subsystem};
use std::time::Instant;

impl Volume {
    /// Saves the requests counted since the last save, and the stored
    /// byte-seconds since then, into the `bill` table (under the caller's
    /// round of [`Volume::ship_metadata`], before the changes are taken),
    /// when the round ships other changes anyway or the last save is
    /// [`BILL_EVERY`] old.
    pub(crate) fn record_bill(&self) -> Result<()> {
        let Some(cloud) = self.cloud.as_ref() else { return Ok(()) };
        if self.opts.read_only {
            return Ok(());
        }
        let mut last = cloud.bill_saved.lock();
        if !self.meta.has_changes() && last.elapsed() < BILL_EVERY {
            return Ok(());
        }
        let counts = cloud.meter.as_ref().map(|m| m.take()).unwrap_or_default();
        let now = now_secs();
        let rows = rows_of(&counts, unix_day(now));
        let r = self.meta.write(|tx| {
            for r in &rows {
                tx.add_bill(r)?;
            }
            match tx.get_info(meta::BILL_STORAGE_AT_KEY)? {
                Some(at) if at < now => {
                    let (size, dead) = tx.pack_bytes()?;
                    for r in storage_rows(at, now, size.saturating_sub(dead), dead) {
                        tx.add_bill(&r)?;
                    }
                }
                Some(_) => return Ok(()), // the clock went back: wait for it
                None => {}
            }
            Ok(tx.set_info(meta::BILL_STORAGE_AT_KEY, now)?)
        });
        match r {
            Ok(()) => {
                *last = Instant::now();
                Ok(())
            }
            Err(e) => {
                if let Some(m) = &cloud.meter {
                    m.add(&counts);
                }
                Err(e)
            }
        }
    }

    /// At a read-write open: the pending bill of the local directory goes
    /// into the table (and ships with the next version), then the file is
    /// removed.
    pub(crate) fn fold_pending_bill(&self) -> Result<()> {
        if self.cloud.is_none() || self.opts.read_only {
            return Ok(());
        }
        let p = pending_path(&self.layout.dir);
        if !p.exists() {
            return Ok(());
        }
        let rows = read_pending(&self.layout.dir)?;
        self.meta.write(|tx| {
            for r in &rows {
                tx.add_bill(r)?;
            }
            Ok(())
        })?;
        // Durable before the file goes (a crash in between counts the
        // rows twice, never loses them).
        self.meta.sync()?;
        std::fs::remove_file(&p).map_err(|e| Error::os(format_args!("removing {}", p.display()), &e))?;
        crate::fsutil::fsync_dir(&self.layout.dir)
    }

    /// Rewrites this mount's bill object with what its meter counted that
    /// no metadata version holds, cumulatively, its own upload included.
    /// Nothing is written when nothing was counted since the last time.
    /// On failure the counts stay in the meter.
    pub(crate) fn publish_mount_bill(&self) -> Result<()> {
        self.write_mount_bill(false)
    }

    /// [`Volume::publish_mount_bill`]; `ended` (the unmount's last write)
    /// marks the object ended, and writes it even with nothing new counted
    /// if it exists unmarked.
    fn write_mount_bill(&self, ended: bool) -> Result<()> {
        let Some(cloud) = self.cloud.as_ref() else { return Ok(()) };
        let Some(m) = cloud.meter.as_ref() else { return Ok(()) };
        if cloud.remote.capabilities().deferred_durability {
            // A tape keeps no bill objects: its counts go to the pending bill.
            return Ok(());
        }
        let mut b = cloud.bill.lock();
        let taken = minus(&m.take(), &b.own_put);
        b.own_put = RequestCounts::default();
        if taken.is_empty() && !(ended && !b.rows.is_empty()) {
            return Ok(());
        }
        let now = now_secs();
        let day = unix_day(now);
        let mut rows = b.rows.clone();
        merge(&mut rows, rows_of(&taken, day));
        // The object counts its own PUT, whose bytes are its length.
        let mut len = 0u64;
        let mut out = (Vec::new(), rows.clone());
        for _ in 0..8 {
            let mut r = rows.clone();
            merge(&mut r, vec![BillRow { day, subsystem: Subsystem::Metadata.name().into(), item: RequestKind::Put.name().into(), requests: 1, bytes: len }]);
            let obj = BillObject { format: "cairn-bill-1".into(), host: crate::lease::hostname(), dir: self.layout.dir.display().to_string(), written: now, ended, rows: r };
            let bytes = serde_json::to_vec(&obj).expect("bill serialises");
            let done = bytes.len() as u64 == len;
            len = bytes.len() as u64;
            out = (bytes, obj.rows);
            if done {
                break;
            }
        }
        let (bytes, rows) = out;
        match cloud.paid(Subsystem::Metadata).put(&b.object(), &bytes) {
            Ok(()) => {
                b.rows = rows;
                b.own_put.add(Subsystem::Metadata, RequestKind::Put, 1, bytes.len() as u64);
                Ok(())
            }
            Err(e) => {
                m.add(&taken);
                Err(Error::from(e).context(format_args!("uploading this mount's bill {}", b.object())))
            }
        }
    }

    /// At close: what the meter counted since the last save (the last
    /// metadata version's own upload, the lease's release; everything a
    /// read-only open did) goes into the mount's bill object in the
    /// bucket; only if that fails, to the pending bill.
    pub(crate) fn save_bill_residue(&self) {
        let Some(cloud) = self.cloud.as_ref() else { return };
        let Some(m) = cloud.meter.as_ref() else { return };
        if let Err(e) = self.write_mount_bill(true) {
            tracing::warn!("{e}; the requests are kept in {} until the next read-write mount", pending_path(&self.layout.dir).display());
        }
        // What the upload did not cover: a failed one's counts, a retried
        // one's extra attempts.
        let rest = minus(&m.take(), &std::mem::take(&mut cloud.bill.lock().own_put));
        if let Err(e) = append_pending(&self.layout.dir, &rows_of(&rest, unix_day(now_secs()))) {
            tracing::warn!("saving the last requests of the bill: {e}");
        }
    }

    /// The bill's rows from day `since` on: the table, the pending file,
    /// stored bytes up to now, and with `live` the requests counted but not
    /// saved yet (a mount answering `cairn cost`; a command that opened
    /// the volume only to ask leaves its own requests out, they are saved
    /// when it closes and shown next time).
    pub fn bill_usage(&self, since: Option<i64>, live: bool) -> Result<Vec<BillRow>> {
        let Some(cloud) = self.cloud.as_ref() else {
            return Err(Error::invalid(format!("{} is not a volume in a bucket: it sends no requests and has no bill", self.layout.dir.display())));
        };
        // No save runs meanwhile: a count is in the table or in the meter.
        let _saving = cloud.bill_saved.lock();
        let now = now_secs();
        let mut rows = self.meta.read(|c| {
            let mut rows = c.bill_rows(since)?;
            if let Some(at) = c.get_info(meta::BILL_STORAGE_AT_KEY)? {
                let (size, dead) = c.pack_bytes()?;
                rows.extend(storage_rows(at, now, size.saturating_sub(dead), dead));
            }
            Ok(rows)
        })?;
        rows.extend(read_pending(&self.layout.dir)?);
        // Every mount's bill object, this mount's from memory.
        let own = cloud.bill.lock();
        rows.extend(own.rows.iter().cloned());
        rows.extend(bucket_bills(cloud.remote.as_ref(), Some(&own.id))?);
        if live {
            if let Some(m) = &cloud.meter {
                rows.extend(rows_of(&minus(&m.snapshot(), &own.own_put), unix_day(now)));
            }
        }
        rows.retain(|r| since.is_none_or(|s| r.day >= s));
        Ok(rows)
    }
}
