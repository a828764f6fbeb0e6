//! A PostgreSQL cluster that fails over, for tests: one etcd and two
//! PostgreSQL 15 nodes managed by Patroni (Debian's `patroni` and
//! `etcd-server`), on loopback ports, in a scratch directory. One node is
//! the primary, the other its synchronous standby (`synchronous_mode`);
//! `primary_start_timeout: 0` makes Patroni fail over as soon as the
//! primary's postmaster is found dead, rather than restart it in place.
//! Clients reach whichever node is the primary with the multi-host URL
//! ([`PatroniCluster::url`], `target_session_attrs=read-write`).
//!
//! As root, Patroni runs as the `postgres` user (PostgreSQL refuses root)
//! through `setpriv`, which execs in place, so the PID the test holds is
//! Patroni's own. Everything is stopped by PID when the cluster is dropped:
//! each Patroni (SIGTERM: it stops its PostgreSQL), then whatever
//! postmaster is still running, then etcd.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// What a missing Patroni or etcd says, for the test to fail with.
fn missing(tool: &str, package: &str) -> String {
    format!("this test needs {tool}, which is missing: apt-get install -y {package} (scripts/test.sh installs it)")
}

fn am_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("binding a loopback port")
}

/// One Patroni-managed node.
struct Node {
    name: String,
    dir: PathBuf,
    pg_port: u16,
    api_port: u16,
    patroni: Option<Child>,
}

/// A running etcd and two Patroni nodes.
pub struct PatroniCluster {
    root: PathBuf,
    etcd: Option<Child>,
    nodes: Vec<Node>,
}

/// The status code of `GET path` on a loopback port (None: no answer).
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1)?.parse().ok()
}

impl PatroniCluster {
    /// Starts etcd and two nodes and waits (up to 120 s) until one is the
    /// primary and the other its synchronous standby.
    pub fn start() -> Result<PatroniCluster, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        if crate::missing_tool("etcd").is_some() {
            return Err(missing("etcd", "etcd-server"));
        }
        if crate::missing_tool("patroni").is_some() {
            return Err(missing("patroni", "patroni"));
        }
        let bin = crate::postgres::bin_dir()?;
        let root = std::env::temp_dir().join(format!("cairn-patroni-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        let mut c = PatroniCluster { root: root.clone(), etcd: None, nodes: Vec::new() };
        let (client, peer) = (free_port(), free_port());
        let log = std::fs::File::create(root.join("etcd.log")).map_err(|e| format!("etcd.log: {e}"))?;
        let etcd = Command::new("etcd")
            .args(["--name", "e0", "--data-dir"])
            .arg(root.join("etcd"))
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("e0=http://127.0.0.1:{peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting etcd: {e}"))?;
        c.etcd = Some(etcd);
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_status(client, "/health") != Some(200) {
            if Instant::now() > deadline {
                return Err(format!("etcd did not answer on port {client} within 30 s; its log: {}", c.tail("etcd.log")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let scope = format!("cairn{}x{}", std::process::id(), N.load(Ordering::SeqCst));
        for i in 0..2 {
            let name = format!("node{i}");
            let dir = root.join(&name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            let (pg_port, api_port) = (free_port(), free_port());
            let cfg = format!(
                r#"scope: {scope}
namespace: /cairn/
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
etcd3:
  hosts: 127.0.0.1:{client}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1073741824
    synchronous_mode: true
    primary_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      parameters:
        max_connections: 200
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
  initdb:
    - encoding: UTF8
    - locale: C
    - auth: trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {dir}/data
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
      password: cairn
    replication:
      username: postgres
      password: cairn
    rewind:
      username: postgres
      password: cairn
  parameters:
    unix_socket_directories: {dir}
    fsync: "off"
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
"#,
                dir = dir.display(),
                bin = bin.display()
            );
            std::fs::write(dir.join("patroni.yml"), cfg).map_err(|e| format!("writing the Patroni config: {e}"))?;
            c.nodes.push(Node { name, dir, pg_port, api_port, patroni: None });
        }
        if am_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&root).status().map_err(|e| format!("chown: {e}"))?;
            if !st.success() {
                return Err(format!("chown postgres {} failed (is there a postgres user? apt-get install -y postgresql)", root.display()));
            }
        }
        // The first bootstraps the cluster; the second clones it.
        for i in 0..2 {
            c.start_node(i)?;
            if i == 0 {
                c.wait_for(Duration::from_secs(90), "a primary", |c| c.primary().is_some())?;
            }
        }
        c.wait_healthy(Duration::from_secs(120))?;
        Ok(c)
    }

    fn start_node(&mut self, i: usize) -> Result<(), String> {
        let n = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(n.dir.join("patroni.log")).map_err(|e| format!("patroni.log: {e}"))?;
        let mut cmd = if am_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--", "patroni"]);
            c
        } else {
            Command::new("patroni")
        };
        let child = cmd
            .arg(n.dir.join("patroni.yml"))
            .current_dir(&n.dir)
            .env("HOME", &n.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting patroni: {e}"))?;
        n.patroni = Some(child);
        Ok(())
    }

    fn tail(&self, rel: &str) -> String {
        let text = std::fs::read_to_string(self.root.join(rel)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(25).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn wait_for(&self, within: Duration, what: &str, ok: impl Fn(&Self) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while !ok(self) {
            if Instant::now() > deadline {
                let logs: Vec<String> = self.nodes.iter().map(|n| format!("{} patroni.log:\n{}", n.name, self.tail(&format!("{}/patroni.log", n.name)))).collect();
                return Err(format!("the Patroni cluster had no {what} within {within:?}\n{}", logs.join("\n")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The index of the node that is the primary now, by Patroni's REST
    /// API (`GET /primary` answers 200 on the leader only).
    pub fn primary(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| http_status(self.nodes[i].api_port, "/primary") == Some(200))
    }

    /// Whether there is a primary and the other node is its synchronous
    /// standby.
    pub fn is_healthy(&self) -> bool {
        match self.primary() {
            Some(p) => (0..self.nodes.len()).filter(|&i| i != p).all(|i| http_status(self.nodes[i].api_port, "/sync") == Some(200)),
            None => false,
        }
    }

    /// Waits until [`is_healthy`](Self::is_healthy) (a failed-over old
    /// primary has rejoined as the synchronous standby).
    pub fn wait_healthy(&self, within: Duration) -> Result<(), String> {
        self.wait_for(within, "primary with a synchronous standby", |c| c.is_healthy())
    }

    /// The multi-host URL of database `db` as `postgres`: libpq's form,
    /// which tokio-postgres parses too; `target_session_attrs=read-write`
    /// makes a client skip the standby.
    pub fn url(&self, db: &str) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.pg_port)).collect();
        format!("postgres://postgres@{}/{db}?target_session_attrs=read-write", hosts.join(","))
    }

    /// Runs SQL with psql on the primary (database `db`).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let p = self.primary().ok_or("no primary")?;
        crate::postgres::psql_at(&crate::postgres::bin_dir()?, self.nodes[p].pg_port, db, sql)
    }

    /// Creates an empty database (on the primary; it replicates).
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "a plain database name");
        self.psql("postgres", &format!("CREATE DATABASE {name}")).map(|_| ())
    }

    /// The postmaster PID of node `i`, from its `postmaster.pid`.
    fn postmaster(dir: &Path) -> Option<i32> {
        let text = std::fs::read_to_string(dir.join("data/postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        // SAFETY: signal 0 only checks that the process exists.
        (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
    }

    /// Kills the primary's postmaster with SIGKILL (its backends notice
    /// and exit; Patroni then fails over to the standby). Returns the
    /// index of the node killed.
    pub fn kill_primary(&self) -> Result<usize, String> {
        let p = self.primary().ok_or("no primary to kill")?;
        let pid = Self::postmaster(&self.nodes[p].dir).ok_or_else(|| format!("no running postmaster on {}", self.nodes[p].name))?;
        // SAFETY: kill has no memory preconditions; the pid was just read
        // from the node's postmaster.pid and is alive.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        Ok(p)
    }

    /// Waits until a node other than `old` is the primary; returns it.
    pub fn wait_new_primary(&self, old: usize, within: Duration) -> Result<usize, String> {
        self.wait_for(within, "new primary", |c| c.primary().is_some_and(|p| p != old))?;
        self.primary().ok_or_else(|| "the new primary went away".to_string())
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut p) = n.patroni.take() {
                // SAFETY: the child's pid, not yet reaped.
                unsafe { libc::kill(p.id() as i32, libc::SIGTERM) };
                if !wait_exit(&mut p, Duration::from_secs(30)) {
                    let _ = p.kill();
                    let _ = p.wait();
                }
            }
        }
        for n in &self.nodes {
            if let Some(pid) = Self::postmaster(&n.dir) {
                // SAFETY: a postmaster left running by a Patroni that died.
                unsafe { libc::kill(pid, libc::SIGQUIT) };
            }
        }
        if let Some(mut e) = self.etcd.take() {
            let _ = e.kill();
            let _ = e.wait();
        }
        if std::thread::panicking() {
            eprintln!("Patroni test cluster kept for inspection: {} (etcd.log, nodeN/patroni.log)", self.root.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
