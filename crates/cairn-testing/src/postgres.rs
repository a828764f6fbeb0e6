//! A real PostgreSQL server for tests: Debian's server binaries, a fresh
//! cluster in a scratch directory, listening on a loopback port only, and
//! stopped by PID when dropped. Tests that need the server to go away and
//! come back (an outage under load) stop and start it; nothing is mocked.
//!
//! `initdb` refuses to run as root, so as root every server command runs as
//! the `postgres` user (`runuser -u postgres --`), which owns the cluster.
//!
//! The postmaster is started by a helper shell of the server's own (the
//! *spawner*, made with the cluster), never by the test process itself. A
//! process the test starts while one of its threads has a file open on a
//! FUSE mount inherits that descriptor, and `execve` closes it
//! (close-on-exec), which sends the mount a FLUSH; on a shared Cairn volume
//! a FLUSH commits the file to PostgreSQL. Restarting the server from the
//! test process during an outage therefore waited, inside `execve`, for
//! the very server it was starting, until the mount's metadata deadline
//! gave up (minutes under load, which looked like a slow shutdown). The
//! spawner was forked before the test opened anything there, and so was
//! every process it starts.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// What the spawner runs: `start` starts the server command (its
/// arguments) in the background and answers its PID; `wait` answers the
/// server's exit status once it has exited (the shell reaps it); `probe`
/// answers psql's exit status for `SELECT 1`. It ends at the end of its
/// input.
const SPAWNER: &str = r#"pid=
while read -r cmd; do
  case "$cmd" in
    start) "$@" </dev/null >>server.log 2>&1 & pid=$!; echo "$pid" ;;
    wait) if [ -n "$pid" ]; then wait "$pid"; echo "$?"; pid=; else echo none; fi ;;
    probe) "$PSQL" -X -q -At -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -c 'SELECT 1' </dev/null >/dev/null 2>&1; echo "$?" ;;
    *) echo "unknown command" ;;
  esac
done
"#;

/// The helper shell that starts the postmaster (see the module comment).
struct Spawner {
    child: Child,
    /// `None` once closed (the shell then exits).
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Spawner {
    /// Sends one command and reads its one-line answer.
    fn ask(&mut self, cmd: &str) -> Result<String, String> {
        let input = self.input.as_mut().ok_or("the PostgreSQL spawner shell was closed")?;
        writeln!(input, "{cmd}").map_err(|e| format!("the PostgreSQL spawner shell is gone ({cmd}): {e}"))?;
        let mut line = String::new();
        match self.output.read_line(&mut line) {
            Ok(0) => Err(format!("the PostgreSQL spawner shell ended without answering {cmd}")),
            Ok(_) => Ok(line.trim_end().to_string()),
            Err(e) => Err(format!("reading the PostgreSQL spawner's answer to {cmd}: {e}")),
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // The end of its input ends the shell.
        drop(self.input.take());
        let _ = self.child.wait();
    }
}

/// A running (or stopped) throwaway cluster.
pub struct PgServer {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    /// Starts and reaps the postmaster (made by `start_again` when first
    /// needed).
    spawner: Option<Spawner>,
    /// The postmaster's PID while it runs: the spawner's child, reaped
    /// only when `end` asks, so the PID cannot be reused before.
    postmaster: Option<i32>,
    /// More server settings (`-c name=value` each), from `start_with`.
    settings: Vec<String>,
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
        PgServer::start_with(&[])
    }

    /// [`start`](Self::start) with more server settings (`name=value`,
    /// each passed as `-c name=value`), kept for every later start.
    pub fn start_with(settings: &[&str]) -> Result<PgServer, String> {
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
        let mut s = PgServer { root, bin, port: free_port(), spawner: None, postmaster: None, settings: settings.iter().map(|x| x.to_string()).collect() };
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

    /// The spawner shell (see the module comment), started on first use:
    /// with the cluster, before the test has a mount.
    fn spawner(&mut self) -> Result<&mut Spawner, String> {
        if self.spawner.is_none() {
            let exe = self.bin.join("postgres");
            let mut c = Command::new("sh");
            c.arg("-c").arg(SPAWNER).arg("cairn-pg-spawner");
            if am_root() {
                // setpriv execs in place (runuser would fork and stand
                // between), so the spawner's child is the postmaster.
                c.args(["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]);
            }
            c.arg(&exe).arg("-D").arg(self.data()).args(["-c", "listen_addresses=127.0.0.1", "-p", &self.port.to_string()]);
            c.arg("-c").arg(format!("unix_socket_directories={}", self.root.join("sock").display()));
            // A test cluster need not survive a power cut of the machine.
            c.args(["-c", "fsync=off", "-c", "max_connections=200"]);
            for set in &self.settings {
                c.arg("-c").arg(set);
            }
            let psql = if self.bin.join("psql").exists() { self.bin.join("psql") } else { PathBuf::from("psql") };
            c.env("PSQL", psql).env("PGPORT", self.port.to_string());
            // The scratch directory is the working directory (server.log).
            let mut child = c
                .current_dir(&self.root)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting the PostgreSQL spawner shell (sh): {e}"))?;
            let input = child.stdin.take();
            let output = BufReader::new(child.stdout.take().expect("piped stdout"));
            self.spawner = Some(Spawner { child, input, output });
        }
        Ok(self.spawner.as_mut().expect("just made"))
    }

    /// Starts the server again on the same port (after [`stop`](Self::stop)
    /// or [`kill`](Self::kill)), waiting until it accepts connections.
    ///
    /// The postmaster is the spawner's child (not forked off by pg_ctl),
    /// and the spawner reaps it when `stop` or `kill` asks: an unreaped
    /// postmaster would still hold its pid, and the next start would
    /// refuse the data directory.
    pub fn start_again(&mut self) -> Result<(), String> {
        let answer = self.spawner()?.ask("start")?;
        let pid: i32 = answer.parse().map_err(|_| format!("the PostgreSQL spawner answered {answer:?} to start"))?;
        self.postmaster = Some(pid);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if self.spawner()?.ask("probe")? == "0" {
                return Ok(());
            }
            let exited = PgServer::exited(pid);
            if exited || std::time::Instant::now() > deadline {
                if exited {
                    let _ = self.end(0);
                } else {
                    let _ = self.end(libc::SIGKILL);
                }
                let tail = std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(20).collect();
                let why = if exited { "exited" } else { "did not accept connections within 60 s" };
                return Err(format!("postgres {why}; server log:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n")));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The postmaster's PID, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.postmaster
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

    /// Stops the server as `pg_ctl stop -m immediate` does (SIGQUIT): every
    /// process exits at once, nothing is flushed or checkpointed, and the
    /// next start runs crash recovery. Commits whose WAL was not yet
    /// written out (`synchronous_commit = off`) are lost, as in a power
    /// cut or an OOM kill of the server.
    pub fn stop_immediate(&mut self) {
        let _ = self.end(libc::SIGQUIT);
    }

    /// Copies the stopped cluster aside (`data-standby`): the state a
    /// standby would have if it stopped replicating now.
    pub fn copy_for_standby(&self) -> Result<(), String> {
        if self.postmaster.is_some() {
            return Err("copy_for_standby: the server is running".into());
        }
        let to = self.root.join("data-standby");
        let _ = std::fs::remove_dir_all(&to);
        let st = Command::new("cp").arg("-a").arg(self.data()).arg(&to).status().map_err(|e| format!("cp: {e}"))?;
        if !st.success() {
            return Err(format!("cp -a {} {} failed", self.data().display(), to.display()));
        }
        Ok(())
    }

    /// A failover to that copy: the stopped cluster is set aside, the copy
    /// starts on the same port as a standby and is promoted (a new
    /// timeline, as when Patroni promotes a replica that had not received
    /// the primary's last WAL). Waits until it accepts writes.
    pub fn fail_over_to_copy(&mut self) -> Result<(), String> {
        if self.postmaster.is_some() {
            return Err("fail_over_to_copy: the server is running".into());
        }
        let old = self.root.join("data-old");
        let _ = std::fs::remove_dir_all(&old);
        std::fs::rename(self.data(), &old).map_err(|e| format!("moving the cluster aside: {e}"))?;
        std::fs::rename(self.root.join("data-standby"), self.data()).map_err(|e| format!("moving the copy in: {e}"))?;
        std::fs::write(self.data().join("standby.signal"), b"").map_err(|e| format!("standby.signal: {e}"))?;
        if am_root() {
            let _ = Command::new("chown").args(["postgres:postgres"]).arg(self.data().join("standby.signal")).status();
        }
        self.start_again()?;
        let r = self.psql("postgres", "SELECT pg_promote(true, 60)")?;
        if r != "t" {
            return Err(format!("pg_promote answered {r:?}"));
        }
        Ok(())
    }

    /// Sends `sig` (none if 0) to the postmaster and waits for its exit.
    fn end(&mut self, sig: i32) -> Result<(), String> {
        let Some(pid) = self.postmaster.take() else { return Ok(()) };
        if sig != 0 {
            // SAFETY: kill has no memory preconditions; the pid is the
            // spawner's child, not yet reaped, so it cannot have been reused.
            unsafe { libc::kill(pid, sig) };
        }
        let status = self.spawner()?.ask("wait")?;
        if sig == libc::SIGINT && status != "0" {
            return Err(format!("postgres ended with exit status {status} after a fast shutdown"));
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
        psql_at(&self.bin, self.port, db, sql)
    }

    /// Creates an empty database.
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "a plain database name");
        self.psql("postgres", &format!("CREATE DATABASE {name}")).map(|_| ())
    }
}

/// Runs SQL with the psql of `bin` (or the one on PATH) against the server
/// on 127.0.0.1:`port`, database `db`, as `postgres`; stops at the first
/// error and returns the unaligned output.
pub(crate) fn psql_at(bin: &Path, port: u16, db: &str, sql: &str) -> Result<String, String> {
    let psql = if bin.join("psql").exists() { bin.join("psql") } else { PathBuf::from("psql") };
    let out = Command::new(&psql)
        .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-d", db, "-c", sql])
        .output()
        .map_err(|e| format!("running {}: {e}", psql.display()))?;
    if !out.status.success() {
        return Err(format!("psql: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.stop();
        drop(self.spawner.take());
        if std::thread::panicking() {
            // A failed test's server log tells what the server saw.
            eprintln!("PostgreSQL test cluster kept for inspection: {} (server.log)", self.root.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The test process's shared server (see [`shared`]), taken and stopped at
/// exit: statics are never dropped.
static SHARED: std::sync::Mutex<Option<std::sync::Arc<PgServer>>> = std::sync::Mutex::new(None);

extern "C" fn stop_shared() {
    if let Ok(mut s) = SHARED.lock() {
        drop(s.take());
    }
}

/// One server for every test of the process that needs no server of its
/// own (one that it stops, kills, or whose every connection it counts),
/// started by the first to ask, with an empty database `cairn`, and
/// stopped when the process exits. Tests keep apart by schema (volume id).
/// Panics, saying what is missing, if no server can be started.
pub fn shared() -> std::sync::Arc<PgServer> {
    let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pg) = &*s {
        return pg.clone();
    }
    let pg = PgServer::start().unwrap_or_else(|e| panic!("starting a PostgreSQL server for the tests: {e}"));
    pg.create_database("cairn").unwrap_or_else(|e| panic!("creating database cairn on the test server: {e}"));
    let pg = std::sync::Arc::new(pg);
    *s = Some(pg.clone());
    // SAFETY: registers a plain function with no preconditions.
    unsafe { libc::atexit(stop_shared) };
    pg
}
