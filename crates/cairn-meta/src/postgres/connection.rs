//! Connections: the URL and password file, the pool, classifying failures,
//! the retry loop every statement runs in, and the store's open and create.

use super::*;

impl Conn {
    /// `sql` prepared on this connection once, then reused: a statement
    /// sent as text is parsed in a round trip of its own every time.
    pub(super) fn prepared(&mut self, sql: &str) -> std::result::Result<Statement, pg::Error> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

impl Cached<'_> {
    pub(super) fn query(&mut self, sql: &str, p: &[P]) -> std::result::Result<Vec<Row>, pg::Error> {
        let st = self.0.prepared(sql)?;
        self.0.client.query(&st, p)
    }
    pub(super) fn query_one(&mut self, sql: &str, p: &[P]) -> std::result::Result<Row, pg::Error> {
        let st = self.0.prepared(sql)?;
        self.0.client.query_one(&st, p)
    }
    pub(super) fn execute(&mut self, sql: &str, p: &[P]) -> std::result::Result<u64, pg::Error> {
        let st = self.0.prepared(sql)?;
        self.0.client.execute(&st, p)
    }
}

/// By SQLSTATE, and for the driver's own errors (no SQLSTATE) by kind:
/// a closed connection, or an I/O error underneath (the driver's connect
/// and communication failures all carry one). Never by message text.
pub(super) fn classify(e: &pg::Error) -> Class {
    if let Some(code) = e.code() {
        return classify_sqlstate(code.code());
    }
    if e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) {
        return Class::Reconnect;
    }
    Class::Fatal
}

/// 40001 serialization failure, 40P01 deadlock, 55P03 lock not available
/// (`lock_timeout`), 57014 statement cancelled (`statement_timeout`): run
/// again while the deadline allows. Class 08 (connection), 57P01-03
/// (administrator or crash shutdown, cannot connect now), 53300 (too many
/// connections), 25006 (read-only transaction: a standby, as after a
/// failover to this address): connect again.
pub(super) fn classify_sqlstate(c: &str) -> Class {
    match c {
        "40001" | "40P01" | "55P03" | "57014" => Class::Retry,
        "57P01" | "57P02" | "57P03" | "53300" | "25006" => Class::Reconnect,
        _ if c.starts_with("08") => Class::Reconnect,
        _ => Class::Fatal,
    }
}

/// A PostgreSQL error as people read it: the server's message and SQLSTATE.
pub(super) fn describe(e: &pg::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {} (SQLSTATE {})", d.severity(), d.message(), d.code().code()),
        None => match std::error::Error::source(e) {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        },
    }
}

/// A chunk a transaction references is gone: on a shared volume, only
/// another machine's collector deletes chunk rows (at zero references),
/// so the writer lost the race with it and stores the chunk again.
pub(super) fn gone_chunk(id: i64) -> Error {
    Error::new(ErrorKind::Raced, format!("chunk #{id} was collected by another machine before this transaction referenced it"))
}

pub(super) fn pg_err(what: &str, e: &pg::Error) -> Error {
    Error::io(format!("PostgreSQL metadata store: {what}: {}", describe(e)))
}

impl PgMeta {
    /// Creates the schema of volume `id` (`cairn_<id>`) with its tables,
    /// sequences and the root directory, in one transaction. Fails if the
    /// schema exists.
    pub fn create(url: &str, id: &str, root: Caller0) -> Result<()> {
        let schema = schema_name(id)?;
        let cfg = config(url)?;
        let mut c = connect(&cfg, DEFAULT_TIMEOUT).map_err(|e| pg_err("connecting", &e))?;
        let now = Timestamp::now().0;
        let sql = format!(
            "BEGIN; CREATE SCHEMA {schema}; SET LOCAL search_path TO {schema}; {}
             INSERT INTO inodes(ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, btime, parent)
             VALUES(1, {}, {}, {}, {}, 2, {now}, {now}, {now}, {now}, 1); COMMIT;",
            schema_ddl(&schema),
            FileKind::Dir.code(),
            root.perm,
            root.uid,
            root.gid
        );
        match c.batch_execute(&sql) {
            Ok(()) => Ok(()),
            Err(e) if e.code().is_some_and(|c| c.code() == "42P06") => Err(Error::new(
                ErrorKind::Exists,
                format!("PostgreSQL schema {schema} already exists in database {}: a volume with id {id} is there already", db_name(&cfg)),
            )),
            Err(e) => Err(pg_err(&format!("creating schema {schema}"), &e)),
        }
    }

    /// Opens the schema of volume `id`, refusing a missing schema or an
    /// unknown schema version.
    pub fn open(url: &str, id: &str, codec: Arc<dyn PageCodec>) -> Result<PgMeta> {
        Self::open_with(url, id, codec, PgOptions::default())
    }

    /// [`PgMeta::open`] with options.
    pub fn open_with(url: &str, id: &str, codec: Arc<dyn PageCodec>, opts: PgOptions) -> Result<PgMeta> {
        let schema = schema_name(id)?;
        let mut cfg = config(url)?;
        tune(&mut cfg, opts.timeout);
        let mut c = connect(&cfg, opts.timeout).map_err(|e| pg_err("connecting", &e))?;
        let db = db_name(&cfg);
        let exists = c
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
            .map_err(|e| pg_err("looking up the volume's schema", &e))?
            .is_some();
        if !exists {
            return Err(Error::config(format!("PostgreSQL database {db} has no schema {schema}: no volume with id {id} was created there (wrong --meta database?)")));
        }
        c.batch_execute(&format!("SET search_path TO {schema}; {SESSION_SETTINGS}")).map_err(|e| pg_err("setting the search path", &e))?;
        let v = c
            .query_opt("SELECT value FROM info WHERE key = 'schema'", &[])
            .map_err(|e| Error::config(format!("PostgreSQL schema {schema} in database {db} is not a Cairn metadata schema: {}", describe(&e))))?;
        match v.map(|r| r.get::<_, i64>(0)) {
            Some(PG_SCHEMA_VERSION) => {}
            // Adds sessions and the change log (from 1), journal marks
            // (from 1 or 2), the open-file registry and locks (from 1 to
            // 3), the chunks' zero dates (from 1 to 4), the content
            // versions (from 1 to 5), the flushes under way (from 1 to
            // 6), the chunks' tiers, pins and restores (from 1 to 7); the
            // table lock makes a second machine upgrading at once wait,
            // then find them.
            Some(1..=7) => c
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE info IN SHARE ROW EXCLUSIVE MODE; {V2_DDL}
                     {V3_DDL}
                     {V4_DDL}
                     {V5_DDL}
                     {V6_DDL}
                     {V7_DDL}
                     {V8_DDL}
                     {}
                     UPDATE info SET value = {PG_SCHEMA_VERSION} WHERE key = 'schema' AND value < {PG_SCHEMA_VERSION}; COMMIT;",
                    fence_ddl(&schema)
                ))
                .map_err(|e| pg_err(&format!("upgrading schema {schema} to version {PG_SCHEMA_VERSION}"), &e))?,
            Some(v) => {
                return Err(Error::config(format!("PostgreSQL schema {schema} has metadata schema version {v}; this build reads {PG_SCHEMA_VERSION}")))
            }
            None => return Err(Error::config(format!("PostgreSQL schema {schema} in database {db} has no metadata schema version"))),
        }
        let r = c
            .query_one("SELECT COALESCE((SELECT MAX(ino) FROM inodes), 1), COALESCE((SELECT MAX(id) FROM chunks), 0)", &[])
            .map_err(|e| pg_err("reading the highest numbers in use", &e))?;
        let (ino_floor, chunk_floor) = (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64);
        // Advisory lock keys of this volume (advisory locks are per
        // database, so they name the schema): 64 bits of an MD5.
        let r = c
            .query_one(
                "SELECT ('x' || substr(md5($1 || ':maintenance'), 1, 16))::bit(64)::bigint",
                &[&schema],
            )
            .map_err(|e| pg_err("computing the volume's lock keys", &e))?;
        let maintenance_key = r.get::<_, i64>(0);
        let rename_key = c
            .query_one("SELECT ('x' || substr(md5($1 || ':rename'), 1, 16))::bit(64)::bigint", &[&schema])
            .map_err(|e| pg_err("computing the volume's lock keys", &e))?
            .get::<_, i64>(0);
        let ident = setup(&mut c, &schema, opts.timeout).map_err(|e| pg_err("setting up the connection", &e))?;
        let slots = Arc::new(Slots { open: Mutex::new(1), free: Default::default() });
        let first = Conn { client: c, _slot: Slot(slots.clone()), stmts: HashMap::new(), ident: ident.clone(), idle_since: Instant::now() };
        Ok(PgMeta {
            cfg,
            schema,
            codec,
            opts,
            pool: Mutex::new(vec![first]),
            slots,
            inos: Mutex::new(Block::default()),
            chunk_ids: Mutex::new(Block::default()),
            ino_floor,
            chunk_floor,
            abandoned: AtomicBool::new(false),
            outage: Mutex::new(None),
            in_outage: AtomicBool::new(false),
            retries: Default::default(),
            lose_commit_reply: AtomicBool::new(false),
            before_commit: Mutex::new(None),
            lazy: Mutex::new(Vec::new()),
            syncing: Mutex::new(()),
            lost: Mutex::new(None),
            ident: Mutex::new(Some(ident)),
            history: AtomicU64::new(0),
            ino_high: AtomicU64::new(0),
            chunk_high: AtomicU64::new(0),
            session: Arc::new(AtomicU64::new(0)),
            journal: AtomicU64::new(0),
            maintenance_key,
            rename_key,
        })
    }

    /// How many tries of operations failed and were run again (serialization
    /// failures, deadlocks, lost connections).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The schema this store works in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    pub(super) fn check_alive(&self) -> Result<()> {
        if self.abandoned.load(Ordering::SeqCst) {
            return Err(Error::io("the PostgreSQL metadata store was abandoned (simulated crash)"));
        }
        Ok(())
    }

    /// Once lazy commits were found lost (`sync`), every later change is
    /// refused too: the mount's view has parted from the database's, and
    /// only a new mount (replaying its journal) joins them again.
    pub(super) fn check_not_lost(&self) -> Result<()> {
        match &*self.lost.lock() {
            Some(m) => Err(Error::io(m.clone())),
            None => Ok(()),
        }
    }

    /// An idle connection, or a new one (`setup`), once fewer than
    /// [`MAX_CONNECTIONS`] are open: else it waits for one until the
    /// deadline (`Busy`). Idle connections unused for [`IDLE_CLOSE`] are
    /// closed first.
    pub(super) fn take_conn(&self, deadline: Instant) -> std::result::Result<Conn, ConnError> {
        // Closed outside the count's lock (closing one takes it).
        let stale: Vec<Conn> = {
            let mut pool = self.pool.lock();
            let (old, keep): (Vec<Conn>, Vec<Conn>) = pool.drain(..).partition(|c| c.idle_since.elapsed() >= IDLE_CLOSE);
            *pool = keep;
            old
        };
        drop(stale);
        {
            // The pool is looked at with the count locked, and a connection
            // put back or closed takes that lock to wake a waiter: no
            // wake-up is missed between the look and the wait.
            let mut open = self.slots.open.lock();
            loop {
                if let Some(c) = self.pool.lock().pop() {
                    return Ok(c);
                }
                if *open < MAX_CONNECTIONS {
                    *open += 1;
                    break;
                }
                if self.slots.free.wait_until(&mut open, deadline).timed_out() {
                    return Err(ConnError::Busy);
                }
            }
        }
        // Counted from here: dropped on any failure below.
        let slot = Slot(self.slots.clone());
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let mut client = connect(&self.cfg, left)?;
        let ident = setup(&mut client, &self.schema, self.opts.timeout)?;
        self.reachable();
        if self.saw(&ident) {
            // Before anything else on the new history.
            let (i, c) = (self.ino_high.load(Ordering::SeqCst) as i64, self.chunk_high.load(Ordering::SeqCst) as i64);
            client.batch_execute(&format!(
                "SELECT setval('ino_seq', GREATEST(last_value, {i})) FROM ino_seq; SELECT setval('chunk_seq', GREATEST(last_value, {c})) FROM chunk_seq"
            ))?;
        }
        Ok(Conn { client, _slot: slot, stmts: HashMap::new(), ident, idle_since: Instant::now() })
    }

    /// A new connection reached server history `ident`: if it is not the
    /// one the store saw before, the server crashed (and recovered) or
    /// another one took its place (a failover), and what this store knew
    /// of the old history is suspect: its id blocks are dropped (the new
    /// server's sequences may hand them out again), its change cursors
    /// are reset (`history`: the followers invalidate everything), and
    /// lazy commits made on the old history cannot be proven: the store is
    /// lost at once (`is_lost`) until `resume_after_loss`.
    /// Returns whether it changed.
    pub(super) fn saw(&self, ident: &Ident) -> bool {
        let mut seen = self.ident.lock();
        let changed = match &*seen {
            Some(old) if old == ident => return false,
            Some(old) => {
                // Lazy commits of another history can no longer be proven:
                // the store is lost from here (before the change cursors
                // move, so no follower takes the new server's older rows
                // for another machine's newer ones and re-bases on them;
                // the engine replays its journal instead, resume.rs).
                let unproven: u64 = self.lazy.lock().iter().filter(|x| x.ident != *ident).map(|x| x.done + x.inflight).sum();
                if unproven > 0 {
                    let msg = format!(
                        "PostgreSQL metadata store: {unproven} metadata commits made without waiting for the WAL flush (on {old}) cannot be proven durable: \
                         the server's history changed before they were flushed (a crash or a failover; now {ident}), so they may be lost. \
                         This mount keeps its write-back journal, refuses changes and syncs until it has replayed it on the new history (as a new mount would), then resumes"
                    );
                    tracing::error!("{msg}");
                    self.lost.lock().get_or_insert(msg);
                }
                self.history.fetch_add(1, Ordering::SeqCst);
                tracing::warn!("PostgreSQL metadata store: the server's history changed (was {old}, now {ident}): a crash or a failover; id blocks dropped, sequences set past them, change cursors reset");
                true
            }
            None => false,
        };
        *seen = Some(ident.clone());
        changed
    }

    /// A try found the server unreachable at `at`: the outage starts then
    /// unless it had already. Returns since when it has been unreachable.
    pub(super) fn unreachable(&self, at: Instant) -> Instant {
        let mut o = self.outage.lock();
        let since = o.get_or_insert(Outage { since: at, reported: false }).since;
        self.in_outage.store(true, Ordering::SeqCst);
        since
    }

    /// The server answered: an outage is over.
    pub(super) fn reachable(&self) {
        if !self.in_outage.load(Ordering::Relaxed) {
            return;
        }
        let mut o = self.outage.lock();
        if let Some(out) = o.take() {
            if out.reported {
                tracing::warn!("PostgreSQL metadata store: the server answers again, after {:.1} s unreachable", out.since.elapsed().as_secs_f64());
            }
        }
        self.in_outage.store(false, Ordering::SeqCst);
    }

    pub(super) fn put_conn(&self, mut c: Conn) {
        if !c.client.is_closed() && !self.abandoned.load(Ordering::SeqCst) {
            c.idle_since = Instant::now();
            self.pool.lock().push(c);
            let _open = self.slots.open.lock();
            self.slots.free.notify_one();
        }
    }

    /// Runs `body` on a connection until it is done, retrying serialization
    /// failures, deadlocks and lost connections with exponential backoff
    /// (from 2 ms, full jitter, at most 200 ms) until the deadline.
    ///
    /// The deadline is `timeout` after the operation started or after the
    /// server was first found unreachable (`outage`), whichever is sooner:
    /// past it an operation fails after one try. So a system call that
    /// makes several operations during an outage (an fsync: the chunk
    /// lookups, the commit; a close after it) waits for about one deadline
    /// in all, not one per operation, and any operation resumes as soon as
    /// a connection succeeds again (docs/metadata-store.md, "Retries").
    pub(super) fn run<T>(&self, what: &str, mut body: impl FnMut(&mut Conn) -> Step<T>) -> Result<T> {
        self.check_alive()?;
        let start = Instant::now();
        let mut deadline = start + self.opts.timeout;
        if self.in_outage.load(Ordering::SeqCst) {
            if let Some(o) = &*self.outage.lock() {
                deadline = deadline.min(o.since + self.opts.timeout);
            }
        }
        let mut tries: u32 = 0;
        loop {
            let last = match self.take_conn(deadline) {
                Ok(mut c) => match body(&mut c) {
                    Step::Done(r) => {
                        if r.is_ok() {
                            self.reachable();
                        }
                        self.put_conn(c);
                        return r;
                    }
                    Step::Failed(e) => {
                        match classify(&e) {
                            Class::Retry => {
                                self.reachable();
                                self.put_conn(c)
                            }
                            Class::Reconnect => {
                                // The others were most likely cut too.
                                drop(c);
                                let old = std::mem::take(&mut *self.pool.lock());
                                drop(old);
                                let since = self.unreachable(Instant::now());
                                deadline = deadline.min(since + self.opts.timeout);
                            }
                            Class::Fatal => {
                                if e.as_db_error().is_some() {
                                    self.reachable();
                                }
                                self.put_conn(c);
                                return Err(pg_err(what, &e));
                            }
                        }
                        e
                    }
                },
                Err(ConnError::Busy) => {
                    return Err(Error::io(format!(
                        "PostgreSQL metadata store: {what}: all {MAX_CONNECTIONS} connections of this mount stayed busy for the deadline ({:?})",
                        self.opts.timeout
                    )))
                }
                Err(ConnError::Pg(e)) => {
                    if classify(&e) == Class::Fatal {
                        return Err(pg_err(&format!("{what}: connecting"), &e));
                    }
                    let since = self.unreachable(Instant::now());
                    deadline = deadline.min(since + self.opts.timeout);
                    e
                }
            };
            tries += 1;
            self.check_alive()?;
            self.retries.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            if now >= deadline {
                let mut o = self.outage.lock();
                let (down, first) = match o.as_mut() {
                    Some(out) => (Some(now - out.since), !std::mem::replace(&mut out.reported, true)),
                    None => (None, true),
                };
                drop(o);
                let down = match down {
                    Some(d) => format!("; the server has been unreachable for {:.1} s, so operations fail after one try until a connection succeeds again", d.as_secs_f64()),
                    None => String::new(),
                };
                let msg = format!(
                    "PostgreSQL metadata store: {what} failed after {tries} tries in {:.1} s (deadline {:?}){down}; last error: {}",
                    (now - start).as_secs_f64(),
                    self.opts.timeout,
                    describe(&last)
                );
                // Once per outage: every operation fails after it, and the
                // flusher tries twice a second.
                if first {
                    tracing::error!("{msg}");
                } else {
                    tracing::debug!("{msg}");
                }
                return Err(Error::io(msg));
            }
            tracing::debug!("PostgreSQL metadata store: {what}: try {tries} failed ({}); retrying", describe(&last));
            let cap = Duration::from_millis(2).saturating_mul(1u32 << tries.min(10)).min(Duration::from_millis(200));
            let pause = cap.mul_f64(rand::random::<f64>()).min(deadline - now);
            std::thread::sleep(pause);
        }
    }

    /// Reserves the next block of a sequence on `c`.
    pub(super) fn next_block(c: &mut Client, seq: &str) -> std::result::Result<Block, pg::Error> {
        let v: i64 = c.query_one(&format!("SELECT nextval('{seq}')"), &[])?.get(0);
        Ok(Block { next: v as u64, end: v as u64 + ID_BLOCK, history: 0 })
    }
}

/// Parses `url`, refusing a password in it, and sets the password from
/// `PGPASSWORD` or the password file as libpq does.
pub(super) fn config(url: &str) -> Result<pg::Config> {
    let mut cfg: pg::Config = url.parse().map_err(|e| Error::config(format!("PostgreSQL URL {url:?}: {e}")))?;
    if cfg.get_password().is_some() {
        return Err(Error::config(
            "the PostgreSQL URL carries a password, which would show in `ps` and shell history: remove it and use PGPASSWORD, ~/.pgpass or PGPASSFILE",
        ));
    }
    if let Some(p) = std::env::var_os("PGPASSWORD") {
        cfg.password(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()));
        return Ok(cfg);
    }
    let file = match std::env::var_os("PGPASSFILE") {
        Some(f) => Some(std::path::PathBuf::from(f)),
        None => std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".pgpass")),
    };
    if let Some(file) = file {
        if let Some(text) = read_pgpass(&file) {
            let host = match cfg.get_hosts().first() {
                Some(pg::config::Host::Tcp(h)) => h.clone(),
                _ => "localhost".to_string(),
            };
            let port = cfg.get_ports().first().copied().unwrap_or(5432).to_string();
            let user = cfg.get_user().map(str::to_string).or_else(|| std::env::var("USER").ok()).unwrap_or_default();
            let db = cfg.get_dbname().map(str::to_string).unwrap_or_else(|| user.clone());
            if let Some(pw) = pgpass_lookup(&text, &host, &port, &db, &user) {
                cfg.password(pw);
            }
        }
    }
    Ok(cfg)
}

/// The password file's text, or None if it is missing, not a regular file,
/// or readable by group or others (ignored with a warning, as libpq does).
pub(super) fn read_pgpass(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let md = std::fs::metadata(path).ok()?;
    if !md.is_file() {
        return None;
    }
    if md.permissions().mode() & 0o077 != 0 {
        tracing::warn!("password file {} has group or world access and is ignored; permissions should be u=rw (0600) or less", path.display());
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// The password of the first line of a libpq password file
/// (`host:port:database:user:password`, `*` matching anything in the first
/// four fields, `\:` and `\\` escapes) matching the connection.
pub fn pgpass_lookup(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields: Vec<String> = vec![String::new()];
        let mut chars = line.chars();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => {
                    if let Some(n) = chars.next() {
                        fields.last_mut().unwrap().push(n);
                    }
                }
                ':' if fields.len() < 5 => fields.push(String::new()),
                _ => fields.last_mut().unwrap().push(ch),
            }
        }
        if fields.len() != 5 {
            continue;
        }
        let want = [host, port, db, user];
        if fields[..4].iter().zip(want).all(|(f, w)| f == "*" || f == w) {
            return Some(fields.pop().unwrap());
        }
    }
    None
}

pub(super) fn db_name(cfg: &pg::Config) -> String {
    cfg.get_dbname().or(cfg.get_user()).unwrap_or("?").to_string()
}

/// Bounds on a connection's waits (docs/shared-volume.md, "Bounded
/// waits"), where the URL did not set them: TCP keepalives after a third
/// of the deadline (at most 60 s) of silence, probed 3 times a few
/// seconds apart, and `tcp_user_timeout` at the deadline, so a silent
/// network (a server machine gone, a partition) ends the connection
/// instead of the kernel's 2-hour default; and a primary: a standby
/// (read-only) at the address is skipped, so a failover that leaves one
/// there is met by connecting again.
pub(super) fn tune(cfg: &mut pg::Config, timeout: Duration) {
    let idle = (timeout / 3).clamp(Duration::from_secs(1), Duration::from_secs(60));
    cfg.keepalives(true);
    if cfg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        cfg.keepalives_idle(idle);
    }
    if cfg.get_keepalives_interval().is_none() {
        cfg.keepalives_interval((idle / 3).max(Duration::from_secs(1)));
    }
    if cfg.get_keepalives_retries().is_none() {
        cfg.keepalives_retries(3);
    }
    if cfg.get_tcp_user_timeout().is_none() {
        cfg.tcp_user_timeout(timeout.max(Duration::from_secs(1)));
    }
    if cfg.get_target_session_attrs() == pg::config::TargetSessionAttrs::Any {
        cfg.target_session_attrs(pg::config::TargetSessionAttrs::ReadWrite);
    }
}

/// A new connection's settings, and the server history it reached
/// (`Ident`), in one round trip: the search path, the planner setting
/// (`SESSION_SETTINGS`), and the timeouts that bound what a statement
/// may wait for: `statement_timeout` and `lock_timeout` at the store's
/// deadline (a row lock held by a machine that froze makes the waiter
/// fail with 55P03 instead of hanging), and
/// `idle_in_transaction_session_timeout` at the deadline too (a machine
/// that froze inside a transaction loses it, and its locks, then).
pub(super) fn setup(c: &mut Client, schema: &str, timeout: Duration) -> std::result::Result<Ident, pg::Error> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
    let msgs = c.simple_query(&format!(
        "SET search_path TO {schema}; {SESSION_SETTINGS}; SET statement_timeout = {ms}; SET lock_timeout = {ms};
         SET idle_in_transaction_session_timeout = {ms}; {IDENT_SQL}"
    ))?;
    Ok(ident_of(&msgs))
}

/// The server history (`Ident`) as one row of text.
pub(super) const IDENT_SQL: &str = "SELECT (SELECT system_identifier FROM pg_control_system())::text, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8),
    COALESCE((SELECT stats_reset FROM pg_stat_wal)::text, '')";

/// The `IDENT_SQL` row among a simple query's answers.
pub(super) fn ident_of(msgs: &[pg::SimpleQueryMessage]) -> Ident {
    let row = msgs.iter().find_map(|m| match m {
        pg::SimpleQueryMessage::Row(r) => Some(r),
        _ => None,
    });
    let get = |i: usize| row.and_then(|r| r.get(i)).unwrap_or_default().to_string();
    Ident { system: get(0), timeline: get(1), stats_reset: get(2) }
}

pub(super) fn connect(cfg: &pg::Config, timeout: Duration) -> std::result::Result<Client, pg::Error> {
    connect_as(cfg, timeout, "cairn")
}

/// A connection whose `application_name` says what it is for
/// (`pg_stat_activity` shows it).
pub(super) fn connect_as(cfg: &pg::Config, timeout: Duration, app: &str) -> std::result::Result<Client, pg::Error> {
    let mut cfg = cfg.clone();
    cfg.connect_timeout(timeout.min(Duration::from_secs(10)));
    cfg.application_name(app);
    cfg.connect(NoTls)
}

/// A `Duration` as PostgreSQL microseconds (for `* interval '1 microsecond'`).
pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
