//! The change log and feed: reading it with a cursor and its holes,
//! trimming it, and LISTEN notices of other machines' commits.

use super::*;

/// `info` key: the highest change seq a trim removed.
pub(super) const TRIMMED_KEY: &str = "changes_trimmed";

/// Change rows one statement of `trim_changes` removes at most.
pub(super) const TRIM_BATCH: i64 = 20_000;

/// `changes.kind` of an inode change and of an entry change.
pub(super) const CHANGE_INODE: i16 = 0;
pub(super) const CHANGE_ENTRY: i16 = 1;

/// Whether a notice's payload (`SEQ SESSION`, format.md "Change
/// notices"; a bare `SEQ` from an older writer) names a session other
/// than `own` (0: none), which is the only kind that wakes a follower.
pub(super) fn foreign_notice(payload: &str, own: u64) -> bool {
    let session = payload.split_once(' ').and_then(|(_, s)| s.parse::<u64>().ok());
    own == 0 || session != Some(own)
}

impl PgFeed {
    pub(super) fn listen(&mut self) -> Result<()> {
        let mut c = connect_as(&self.cfg, self.timeout, "cairn-listen").map_err(|e| pg_err("connecting to listen for changes", &e))?;
        c.batch_execute(&format!("LISTEN {}", self.channel)).map_err(|e| pg_err("listening for changes", &e))?;
        self.client = Some(c);
        self.checked = Instant::now();
        Ok(())
    }
}

impl ChangeFeed for PgFeed {
    fn wait(&mut self, timeout: Duration) -> Result<bool> {
        if let Some(c) = &mut self.client {
            let start = Instant::now();
            let own = self.own.load(Ordering::SeqCst);
            let mut r = c.notifications().timeout_iter(timeout).next();
            // This mount's own notices: keep waiting out the timeout.
            while let Ok(Some(n)) = &r {
                if foreign_notice(n.payload(), own) {
                    break;
                }
                self.checked = Instant::now();
                r = c.notifications().timeout_iter(timeout.saturating_sub(start.elapsed())).next();
                if matches!(r, Ok(None)) && start.elapsed() < timeout {
                    // timeout_iter ended early only if the connection did.
                    break;
                }
            }
            let alive = match r {
                Ok(Some(_)) => {
                    // Take every notice already here: one wake-up for them.
                    while let Ok(Some(_)) = c.notifications().iter().next() {}
                    self.checked = Instant::now();
                    return Ok(true);
                }
                // None before the timeout: the connection ended. After a
                // quiet timeout, check now and then that it still lives
                // (a silent network would never end it).
                Ok(None) if start.elapsed() < timeout => false,
                Ok(None) if self.checked.elapsed() < Duration::from_secs(10) => true,
                Ok(None) => !c.is_closed() && c.is_valid(Duration::from_secs(5)).is_ok(),
                Err(_) => false,
            };
            if alive {
                self.checked = Instant::now();
                return Ok(false);
            }
            tracing::warn!("PostgreSQL metadata store: the change listener's connection was lost; reconnecting");
            self.client = None;
        }
        // Notices sent while away are lost: the caller reads the log.
        self.listen()?;
        Ok(true)
    }
}

/// How far below the newest change a new cursor looks for seqs still
/// committing ([`MetaRead::change_cursor`]).
pub(super) const CURSOR_WINDOW: u64 = 65_536;

/// At most this many holes per cursor (the lowest go first, with a
/// warning): a sequence moved by hand (`setval`) must not make every read
/// carry millions of seqs.
pub(super) const MAX_HOLES: usize = 65_536;

impl PgMeta {
    /// How long a reader asks for a missing seq: twice the operation
    /// deadline plus 10 s (70 s by default). A transaction takes its seqs
    /// in its last statement before COMMIT, so it is done (committed or
    /// rolled back) well within this unless the server stalls its commit
    /// that long.
    pub fn hole_bound(&self) -> Duration {
        self.opts.timeout.saturating_mul(2) + Duration::from_secs(10)
    }

    /// `changes_since` (`holes` false: rows after `cursor.after` only) or
    /// `read_changes`.
    pub(super) fn read_changes_from(&self, cur: &mut ChangeCursor, limit: usize, holes: bool) -> Result<Vec<Change>> {
        let history = self.history.load(Ordering::SeqCst);
        if holes && cur.history != history {
            // Another server history: its seqs say nothing about the old
            // one's. From its newest row on; the caller sees `history`
            // changed and drops what it cached.
            let top = self.last_change_seq()?;
            tracing::warn!(was = cur.after, now = top, "PostgreSQL metadata store: change cursor reset after the server's history changed");
            *cur = ChangeCursor { after: top, hole_bound: self.hole_bound(), history, ..Default::default() };
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let asked: Vec<i64> = if holes { cur.holes.keys().map(|&s| s as i64).collect() } else { Vec::new() };
        // The trim mark rides along (one row with a NULL seq when there
        // are no changes), in the rows' snapshot. The rows after the
        // cursor and the holes below it are two index ranges: as one
        // `seq > $1 OR seq = ANY(..)` the index was walked from its start,
        // every read costing the whole log (an open per create slowed from
        // 690 to 244/s as 6,000 files went by).
        let rows = self.stmt("reading the change log", |c| {
            c.query(
                "SELECT c.seq, c.kind, c.ino, c.parent, c.name, c.session, t.trimmed
                 FROM (SELECT COALESCE((SELECT value FROM info WHERE key = $4), 0) AS trimmed) t
                 LEFT JOIN LATERAL (SELECT * FROM (
                      (SELECT seq, kind, ino, parent, name, session FROM changes WHERE seq > $1 ORDER BY seq LIMIT $2)
                      UNION ALL
                      (SELECT seq, kind, ino, parent, name, session FROM changes WHERE seq = ANY($3::bigint[]) AND seq <= $1)
                  ) u ORDER BY seq LIMIT $2) c ON true
                 ORDER BY c.seq",
                &[&(cur.after.min(i64::MAX as u64) as i64), &(limit.min(i64::MAX as usize) as i64), &asked, &TRIMMED_KEY],
            )
        })?;
        let trimmed = match rows.first() {
            Some(r) => col::<i64>(r, 6)? as u64,
            None => 0,
        };
        let rows = rows
            .iter()
            .filter(|r| matches!(r.try_get::<_, Option<i64>>(0), Ok(Some(_))))
            .map(|r| {
                let kind: i16 = col(r, 1)?;
                let what = match kind {
                    CHANGE_INODE => Changed::Inode(col::<Option<i64>>(r, 2)?.unwrap_or(0) as u64),
                    CHANGE_ENTRY => Changed::Entry { parent: col::<Option<i64>>(r, 3)?.unwrap_or(0) as u64, name: col::<Option<Vec<u8>>>(r, 4)?.unwrap_or_default() },
                    k => return Err(Error::corrupt(format!("change log: unknown kind {k}"))),
                };
                Ok(Change { seq: col::<i64>(r, 0)? as u64, what, session: col::<Option<i64>>(r, 5)?.map(|s| s as u64) })
            })
            .collect::<Result<Vec<Change>>>()?;
        if !rows.is_empty() {
            cur.trimmed = trimmed;
        }
        if !holes {
            if let Some(last) = rows.last() {
                cur.after = last.seq;
            }
            return Ok(rows);
        }
        // A seq missing now was taken before the larger one read was
        // committed, so before now: its transaction ends within the bound
        // from now.
        let seen = Instant::now();
        let bound = self.hole_bound();
        cur.hole_bound = bound;
        for ch in &rows {
            if ch.seq > cur.after {
                for h in (cur.after + 1).max(ch.seq.saturating_sub(MAX_HOLES as u64))..ch.seq {
                    cur.holes.insert(h, seen);
                }
                cur.after = ch.seq;
            } else {
                cur.holes.remove(&ch.seq);
            }
        }
        // Forgotten only after a read that began past the bound.
        cur.holes.retain(|_, t| started.saturating_duration_since(*t) < bound);
        if cur.holes.len() > MAX_HOLES {
            let drop = cur.holes.len() - MAX_HOLES;
            tracing::warn!(dropped = drop, "PostgreSQL metadata store: more than {MAX_HOLES} change seqs missing below seq {}; no longer waiting for the lowest", cur.after);
            let keep = cur.holes.split_off(&cur.holes.keys().nth(drop).copied().unwrap_or(u64::MAX));
            cur.holes = keep;
        }
        Ok(rows)
    }

    /// One statement in its own (autocommit) transaction, with the store's
    /// retries.
    pub(super) fn stmt<T>(&self, what: &str, mut f: impl FnMut(&mut Cached) -> std::result::Result<T, pg::Error>) -> Result<T> {
        self.run(what, |c| match f(&mut Cached(c)) {
            Ok(v) => Step::Done(Ok(v)),
            Err(e) => Step::Failed(e),
        })
    }

    pub(super) fn session_rows(&self, expired_only: bool) -> Result<Vec<SessionRow>> {
        let rows = self.stmt("listing sessions", |c| {
            c.query(
                "SELECT id, host, pid, mount, version, (extract(epoch FROM started) * 1000000000)::bigint,
                        (extract(epoch FROM expires) * 1000000000)::bigint, expires <= clock_timestamp()
                 FROM sessions WHERE NOT $1 OR expires <= clock_timestamp() ORDER BY id",
                &[&expired_only],
            )
        })?;
        rows.iter()
            .map(|r| {
                Ok(SessionRow {
                    id: col::<i64>(r, 0)? as u64,
                    host: col(r, 1)?,
                    pid: col::<i64>(r, 2)? as u32,
                    mount: col(r, 3)?,
                    version: col(r, 4)?,
                    started: Timestamp(col(r, 5)?),
                    expires: Timestamp(col(r, 6)?),
                    expired: col(r, 7)?,
                })
            })
            .collect()
    }
}

impl ChangeLog for PgMeta {
    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>> {
        let mut c = ChangeCursor::at(after);
        self.read_changes_from(&mut c, limit, false)
    }
    /// Holes: the seqs missing in the `CURSOR_WINDOW` below the newest
    /// (above the highest trimmed), asked in the same statement.
    fn change_cursor(&self) -> Result<ChangeCursor> {
        let history = self.history.load(Ordering::SeqCst);
        let (top, holes) = self.stmt("reading the change log", |c| {
            c.query_one(
                "WITH m AS (SELECT COALESCE((SELECT MAX(seq) FROM changes), 0) AS top),
                      r AS (SELECT top, GREATEST(top - $1, COALESCE((SELECT value FROM info WHERE key = $2), 0), 0) AS lo FROM m)
                 SELECT top, ARRAY(SELECT s FROM r, generate_series(r.lo + 1, r.top - 1) AS s
                                   WHERE NOT EXISTS (SELECT 1 FROM changes WHERE seq = s) ORDER BY s)
                 FROM r",
                &[&(CURSOR_WINDOW as i64), &TRIMMED_KEY],
            )
            .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<i64>>(1)))
        })?;
        let now = Instant::now();
        Ok(ChangeCursor { after: top, holes: holes.into_iter().map(|s| (s as u64, now)).collect(), hole_bound: self.hole_bound(), trimmed: 0, history })
    }
    fn read_changes(&self, cursor: &mut ChangeCursor, limit: usize) -> Result<Vec<Change>> {
        self.read_changes_from(cursor, limit, true)
    }
    fn last_change_seq(&self) -> Result<u64> {
        self.stmt("reading the change log", |c| c.query_one("SELECT COALESCE(MAX(seq), 0) FROM changes", &[]).map(|r| r.get::<_, i64>(0) as u64))
    }
    /// Keeps the newest row whatever its age, so `last_change_seq` never
    /// goes back; records the highest seq removed in `info` in the same
    /// statement (`changes_trimmed_through`). In batches of
    /// [`TRIM_BATCH`] rows, oldest seq first (the primary key's order;
    /// seqs are taken in time order), each its own statement and
    /// transaction: a log of millions of rows is trimmed in steps that
    /// each end well within the statement timeout and hold few locks.
    fn trim_changes(&self, older_than: Duration) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let (n, looked) = self.stmt("trimming the change log", |c| {
                c.query_one(
                    "WITH b AS (SELECT seq, at FROM changes WHERE seq < (SELECT MAX(seq) FROM changes) ORDER BY seq LIMIT $3),
                          d AS (DELETE FROM changes WHERE seq IN (SELECT seq FROM b WHERE at < clock_timestamp() - $1::bigint * interval '1 microsecond')
                                RETURNING seq),
                          m AS (SELECT COUNT(*) AS n, MAX(seq) AS top FROM d),
                          u AS (INSERT INTO info(key, value) SELECT $2, top FROM m WHERE top IS NOT NULL
                                ON CONFLICT (key) DO UPDATE SET value = GREATEST(info.value, excluded.value))
                     SELECT n, (SELECT COUNT(*) FROM b) FROM m",
                    &[&micros(older_than), &TRIMMED_KEY, &TRIM_BATCH],
                )
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1)))
            })?;
            total += n;
            // A young row in the batch, or the log's end: done.
            if (n as i64) < looked || looked < TRIM_BATCH {
                return Ok(total);
            }
        }
    }
    fn changes_trimmed_through(&self) -> Result<u64> {
        self.stmt("reading the change log", |c| {
            c.query_one("SELECT COALESCE((SELECT value FROM info WHERE key = $1), 0)", &[&TRIMMED_KEY]).map(|r| r.get::<_, i64>(0) as u64)
        })
    }
    fn subscribe(&self) -> Result<Option<Box<dyn ChangeFeed>>> {
        self.check_alive()?;
        let mut f = PgFeed {
            cfg: self.cfg.clone(),
            channel: self.schema.clone(),
            timeout: self.opts.timeout,
            client: None,
            checked: Instant::now(),
            own: self.session.clone(),
        };
        f.listen()?;
        Ok(Some(Box::new(f)))
    }
}
