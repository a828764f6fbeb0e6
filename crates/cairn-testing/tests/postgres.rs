//! The PostgreSQL fixture starts a real server, keeps data across a clean
//! stop and across a crash, and leaves neither process nor directory behind.

use cairn_testing::postgres::PgServer;

#[test]
fn a_throwaway_cluster_survives_stop_and_kill_and_is_gone_after_drop() {
    let mut pg = PgServer::start().unwrap_or_else(|e| panic!("{e}"));
    pg.create_database("fixture").unwrap();
    pg.psql("fixture", "CREATE TABLE t(x int); INSERT INTO t VALUES (41), (1)").unwrap();
    assert_eq!(pg.psql("fixture", "SELECT sum(x) FROM t").unwrap(), "42");
    // Only loopback: the server listens on 127.0.0.1 and nowhere else.
    let listen = pg.psql("postgres", "SHOW listen_addresses").unwrap();
    assert_eq!(listen, "127.0.0.1");

    pg.stop().unwrap();
    assert!(pg.psql("fixture", "SELECT 1").is_err(), "a stopped server still answers");
    pg.start_again().unwrap();
    assert_eq!(pg.psql("fixture", "SELECT sum(x) FROM t").unwrap(), "42");

    let pid = pg.pid().expect("a running server has a pid");
    pg.kill();
    assert!(PgServer::exited(pid), "the postmaster outlived SIGKILL");
    // Crash recovery on the next start keeps committed rows.
    pg.start_again().unwrap();
    assert_eq!(pg.psql("fixture", "SELECT count(*) FROM t").unwrap(), "2");

    let pid = pg.pid().unwrap();
    let root = std::env::temp_dir().join(format!("cairn-pg-{}-0", std::process::id()));
    drop(pg);
    assert!(PgServer::exited(pid), "the server outlived its fixture");
    assert!(!root.exists(), "the cluster directory was left behind");
}
