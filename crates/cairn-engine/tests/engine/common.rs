#![allow(dead_code)]
use cairn_engine::*;
use std::path::Path;
use std::sync::Arc;

/// Small chunks so tests exercise many chunk boundaries quickly.
pub fn small_chunks() -> ChunkerParams {
    ChunkerParams { min: 4 << 10, avg: 16 << 10, max: 64 << 10, ..Default::default() }
}

/// Where the suites that run on every metadata store keep their metadata:
/// SQLite in the volume's directory (the default), or with
/// `CAIRN_TEST_META=postgres` a PostgreSQL server of this test process's
/// own (`postgres::url`), so that the same tests hold for both
/// implementations of the store (issue 26). `scripts/test.sh` runs them
/// both ways.
pub fn meta_url() -> Option<String> {
    match std::env::var("CAIRN_TEST_META").as_deref() {
        Ok("postgres") => Some(pg_url().to_string()),
        Ok("sqlite") | Ok("") | Err(_) => None,
        Ok(other) => panic!("CAIRN_TEST_META={other}: say sqlite or postgres"),
    }
}

/// Open options on the suite's metadata store ([`meta_url`]). On
/// PostgreSQL gc takes a dead chunk at once, as on SQLite (the chunk grace
/// has a test of its own, `shared_writers::a_chunk_that_died_within_...`).
pub fn opts() -> OpenOptions {
    OpenOptions { meta_url: meta_url(), chunk_grace: Some(std::time::Duration::ZERO), ..Default::default() }
}

/// Runs one SQL statement on the metadata of the (closed) volume in `dir`,
/// wherever the suite keeps it ([`meta_url`]): to damage it on purpose.
pub fn meta_sql(dir: &Path, sql: &str) {
    if meta_url().is_some() {
        let (_, _, _, cfg) = read_config(dir).unwrap();
        pg_query(&format!("SET search_path TO cairn_{}; {sql}", cfg.volume_id));
    } else {
        let c = rusqlite::Connection::open(dir.join("meta.sqlite")).unwrap();
        c.execute_batch(sql).unwrap();
    }
}

pub fn init_small(dir: &Path) {
    init(dir, &InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), meta_url: meta_url(), ..Default::default() }).unwrap();
}

pub fn open(dir: &Path) -> Arc<Volume> {
    Volume::load(dir, opts()).unwrap()
}

pub fn root() -> Caller {
    Caller { uid: 0, gid: 0 }
}

pub fn mkfile(v: &Volume, parent: Ino, name: &str, data: &[u8]) -> Ino {
    let a = v.create(parent, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
    v.open(a.ino).unwrap();
    let mut off = 0;
    for piece in data.chunks(128 << 10) {
        v.write(a.ino, off, piece).unwrap();
        off += piece.len() as u64;
    }
    v.release(a.ino).unwrap();
    a.ino
}

pub fn read_all(v: &Volume, ino: Ino) -> Vec<u8> {
    let size = v.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = v.read(ino, out.len() as u64, 1 << 20).unwrap();
        assert!(!got.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&got);
    }
    out
}

/// Deterministic pseudo-random bytes (incompressible).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn stored_pack_bytes(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map(|rd| rd.flatten().map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() { walk(&e.path()) } else { m.len() }
        }).sum()).unwrap_or(0)
    }
    walk(&dir.join("store/packs"))
}

// --- the test process's PostgreSQL server (tests/engine/postgres.rs and
// the suites run with CAIRN_TEST_META=postgres) ---

/// The server, taken and stopped at exit (statics are never dropped).
static SERVER: std::sync::Mutex<Option<cairn_testing::postgres::PgServer>> = std::sync::Mutex::new(None);

extern "C" fn stop_server() {
    if let Ok(mut s) = SERVER.lock() {
        drop(s.take());
    }
}

/// The URL of database `cairn` on the process's server.
pub fn pg_url() -> &'static str {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        let pg = cairn_testing::postgres::PgServer::start().unwrap_or_else(|e| panic!("starting a PostgreSQL server for the tests: {e}"));
        pg.create_database("cairn").unwrap();
        let url = pg.url("cairn");
        *SERVER.lock().unwrap() = Some(pg);
        // SAFETY: registers a plain function with no preconditions.
        unsafe { libc::atexit(stop_server) };
        url
    })
}

/// One value a query answers on the test server (`psql`'s text).
pub fn pg_query(sql: &str) -> String {
    pg_url();
    let s = SERVER.lock().unwrap();
    s.as_ref().unwrap().psql("cairn", sql).unwrap()
}

pub fn pg_schema_exists(id: &str) -> bool {
    let s = SERVER.lock().unwrap();
    let out = s.as_ref().unwrap().psql("cairn", &format!("SELECT count(*) FROM pg_namespace WHERE nspname = 'cairn_{id}'")).unwrap();
    out == "1"
}


/// A volume at `dir` in an in-memory bucket (`s3://bucket/vol`), with
/// small chunks and 1 MiB packs, attached to this machine; the bucket.
pub fn memory_cloud_volume(dir: &Path) -> Arc<dyn cairn_backend::Backend> {
    memory_cloud_volume_packing(dir, 1 << 20)
}

/// [`memory_cloud_volume`] with packs of `pack_target` bytes.
pub fn memory_cloud_volume_packing(dir: &Path, pack_target: u64) -> Arc<dyn cairn_backend::Backend> {
    const URL: &str = "s3://bucket/vol";
    let bucket: Arc<dyn cairn_backend::Backend> = Arc::new(cairn_testing::MemoryBackend::new());
    init_cloud(dir, URL, None, None, &InitOptions { chunker: small_chunks(), pack_target: Some(pack_target), backend: Some(InjectedBackend(bucket.clone())), ..Default::default() }).unwrap();
    cloud::attach(dir, URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    bucket
}
