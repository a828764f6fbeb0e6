//! A real PostgreSQL server for tests: Debian's server binaries, a fresh
//! cluster in a scratch directory, listening on a loopback port only, and
//! stopped by PID when dropped. Tests that need the server to go away and
//! come back (an outage under load) stop and start it; nothing is mocked.
//!
//! `initdb` refuses to run as root, so as root every server command runs as
//! the `postgres` user (`runuser -u postgres --`), which owns the cluster.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A running (or stopped) throwaway cluster.
pub struct PgServer {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    /// The postmaster, started by us.
    child: Option<std::process::Child>,
}

/// What a missing server installation says, for the test to fail with.
pub const NO_POSTGRES: &str = "PostgreSQL's server binaries were not found: apt-get install -y postgresql (or set CAIRN_TEST_PG_BIN to the directory holding initdb and pg_ctl)";

/// The directory with `initdb` and `pg_ctl`: `CAIRN_TEST_PG_BIN`, else the
/// newest `/usr/lib/postgresql/N/bin`.
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("CAIRN_TEST_PG_BIN") {
        let d = PathBuf::from(d);
        return if d.join("initdb").exists() { Ok(d) } else { Err(format!("CAIRN_TEST_PG_BIN={} has no initdb", d.display())) };
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| NO_POSTGRES.to_string())?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, b)| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).ok_or_else(|| NO_POSTGRES.to_string())
}

fn am_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A free loopback port (bound and released; a race with another process
/// taking it in between shows as a failed start).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("binding a loopback port")
}

impl PgServer {
    /// Makes a cluster and starts it. The error says what is missing.
    pub fn start() -> Result<PgServer, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let bin = bin_dir()?;
        let root = std::env::temp_dir().join(format!("cairn-pg-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("sock")).map_err(|e| format!("creating {}: {e}", root.display()))?;
        if am_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).status().map_err(|e| format!("chown: {e}"))?;
            if !st.success() {
                return Err(format!("chown postgres {} failed (is there a postgres user? apt-get install -y postgresql)", root.display()));
            }
        }
        let mut s = PgServer { root, bin, port: free_port(), child: None };
        // --no-sync: a test cluster need not survive a power cut of the
        // machine, and initdb's fsyncs cost seconds.
        s.run_server_cmd("initdb", &["-D", &s.data().to_string_lossy(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"])?;
        s.start_again()?;
        Ok(s)
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// Runs one of the server's programs, as `postgres` when root.
    fn run_server_cmd(&self, prog: &str, args: &[&str]) -> Result<String, String> {
        let exe = self.bin.join(prog);
        let mut c = if am_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        // The scratch directory is the working directory: runuser keeps the
        // caller's, which `postgres` may not be allowed to enter.
        let out = c.args(args).current_dir(&self.root).output().map_err(|e| format!("running {}: {e}", exe.display()))?;
        if !out.status.success() {
            return Err(format!("{prog} {} failed: {}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts the server again on the same port (after [`stop`](Self::stop)
    /// or [`kill`](Self::kill)), waiting until it accepts connections.
    ///
    /// The postmaster is this process's child (not forked off by pg_ctl),
    /// so its exit is reaped here: an unreaped postmaster would still hold
    /// its pid, and the next start would refuse the data directory.
    pub fn start_again(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("server.log"))
            .map_err(|e| format!("opening the server log: {e}"))?;
        let exe = self.bin.join("postgres");
        let mut c = if am_root() {
            // setpriv execs in place (runuser would fork and stand between).
            let mut c = Command::new("setpriv");
            c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        c.arg("-D").arg(self.data()).args(["-c", "listen_addresses=127.0.0.1", "-p", &self.port.to_string()]);
        c.arg("-c").arg(format!("unix_socket_directories={}", self.root.join("sock").display()));
        // A test cluster need not survive a power cut of the machine.
        c.args(["-c", "fsync=off", "-c", "max_connections=200"]);
        let log2 = log.try_clone().map_err(|e| format!("{e}"))?;
        let child = c.current_dir(&self.root).stdin(std::process::Stdio::null()).stdout(log).stderr(log2).spawn().map_err(|e| format!("starting {}: {e}", exe.display()))?;
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if self.psql("postgres", "SELECT 1").is_ok() {
                return Ok(());
            }
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || std::time::Instant::now() > deadline {
                self.child = None;
                let tail = std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(20).collect();
                let why = if exited.is_some() { "exited" } else { "did not accept connections within 60 s" };
                return Err(format!("postgres {why}; server log:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The postmaster's PID, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Stops the server cleanly (SIGINT: PostgreSQL's fast shutdown, which
    /// closes connections, as when an administrator restarts it).
    pub fn stop(&mut self) -> Result<(), String> {
        self.end(libc::SIGINT)
    }

    /// Kills the postmaster with SIGKILL, as a crash of the database
    /// machine would end it. Its backends notice and exit; the next start
    /// recovers from the WAL.
    pub fn kill(&mut self) {
        let _ = self.end(libc::SIGKILL);
    }

    fn end(&mut self, sig: i32) -> Result<(), String> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        // SAFETY: kill has no memory preconditions; the pid is our child's,
        // not yet reaped, so it cannot have been reused.
        unsafe { libc::kill(child.id() as i32, sig) };
        let st = child.wait().map_err(|e| format!("waiting for postgres: {e}"))?;
        if sig == libc::SIGINT && !st.success() {
            return Err(format!("postgres ended with {st} after a fast shutdown"));
        }
        Ok(())
    }

    /// Whether the postmaster `pid` has exited.
    pub fn exited(pid: i32) -> bool {
        // A zombie has exited too (a backend orphaned by a killed
        // postmaster is reaped by whoever adopts it, maybe late).
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
        matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), None | Some('Z') | Some('X'))
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for database `db` as the `postgres` superuser
    /// (trust authentication on loopback: no password).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs SQL with `psql` against `db` and returns its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let psql = if self.bin.join("psql").exists() { self.bin.join("psql") } else { PathBuf::from("psql") };
        let out = Command::new(&psql)
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", db, "-c", sql])
            .output()
            .map_err(|e| format!("running {}: {e}", psql.display()))?;
        if !out.status.success() {
            return Err(format!("psql: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    }

    /// Creates an empty database.
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "a plain database name");
        self.psql("postgres", &format!("CREATE DATABASE {name}")).map(|_| ())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
