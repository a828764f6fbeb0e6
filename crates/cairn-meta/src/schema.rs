//! The metadata schema, described once: every table and column of both
//! stores, with the type class of each column and where it exists (every
//! store, or only one that offers [`SharedVolume`](crate::SharedVolume)).
//!
//! Each store writes its DDL in its own dialect (`sqlite/schema.rs`,
//! `postgres/schema.rs`), once at creation and again in the steps that
//! upgrade an older schema; none of that may change without a schema
//! version (docs/format.md). This description is what they must agree
//! on: each store reads back the schema it created (or upgraded) from its
//! catalog (`SqliteMeta::catalog`, `PgMeta::catalog`), and its tests
//! assert that it equals [`expected`] for its dialect. A column added to
//! one store's DDL and not here, or a type that drifts, fails them.

use std::collections::BTreeMap;

/// A column's type class, written per dialect by [`Ty::sqlite`] and
/// [`Ty::postgres`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    /// A 64-bit integer.
    Int,
    /// An integer that SQLite declares without a type (`info.value`: any
    /// value, nullable there); a 64-bit integer elsewhere.
    AnyInt,
    /// A 16-bit integer (PostgreSQL's codes: change kinds, lock kinds).
    SmallInt,
    /// A double.
    Real,
    Text,
    /// Bytes.
    Blob,
    Bool,
    /// A point in time with its zone (the server's clock).
    Time,
}

impl Ty {
    /// The type SQLite's `PRAGMA table_info` reports.
    pub fn sqlite(self) -> &'static str {
        match self {
            Ty::Int | Ty::SmallInt => "INTEGER",
            Ty::AnyInt => "",
            Ty::Real => "REAL",
            Ty::Text => "TEXT",
            Ty::Blob => "BLOB",
            Ty::Bool => "INTEGER",
            Ty::Time => "INTEGER",
        }
    }

    /// The type PostgreSQL's `information_schema.columns.data_type` reports.
    pub fn postgres(self) -> &'static str {
        match self {
            Ty::Int | Ty::AnyInt => "bigint",
            Ty::SmallInt => "smallint",
            Ty::Real => "double precision",
            Ty::Text => "text",
            Ty::Blob => "bytea",
            Ty::Bool => "boolean",
            Ty::Time => "timestamp with time zone",
        }
    }
}

/// Where a table or column exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum In {
    /// In every store.
    All,
    /// Only in a store that offers `SharedVolume` (PostgreSQL).
    Shared,
    /// Only in the embedded store (none today; kept for symmetry).
    Embedded,
}

/// A column: name, type class, NOT NULL (a primary key's columns count
/// as NOT NULL whatever a dialect reports), where it exists.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub ty: Ty,
    pub not_null: bool,
    pub only: In,
}

/// A table: its columns in their order, its primary key, where it exists.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    pub key: &'static [&'static str],
    pub only: In,
}

const fn c(name: &'static str, ty: Ty, not_null: bool) -> Column {
    Column { name, ty, not_null, only: In::All }
}

const fn shared(name: &'static str, ty: Ty, not_null: bool) -> Column {
    Column { name, ty, not_null, only: In::Shared }
}

use Ty::*;

/// Every table, as docs/format.md "Metadata" describes them. Columns a
/// later schema version added come last (`ALTER TABLE .. ADD COLUMN`
/// appends), in the order they came.
pub const TABLES: &[Table] = &[
    Table { name: "info", columns: &[c("key", Text, true), c("value", AnyInt, true)], key: &["key"], only: In::All },
    Table {
        name: "inodes",
        columns: &[
            c("ino", Int, true),
            c("kind", Int, true),
            c("perm", Int, true),
            c("uid", Int, true),
            c("gid", Int, true),
            c("rdev", Int, true),
            c("nlink", Int, true),
            c("size", Int, true),
            c("data_bytes", Int, true),
            c("atime", Int, true),
            c("mtime", Int, true),
            c("ctime", Int, true),
            c("btime", Int, true),
            c("parent", Int, false),
            c("target", Blob, false),
            c("jseq", Int, true),
            c("flags", Int, true),
            shared("cver", Int, true),
            c("tier_pin", SmallInt, true),
        ],
        key: &["ino"],
        only: In::All,
    },
    Table { name: "dentries", columns: &[c("parent", Int, true), c("name", Blob, true), c("ino", Int, true), c("kind", Int, true)], key: &["parent", "name"], only: In::All },
    Table { name: "xattrs", columns: &[c("ino", Int, true), c("name", Blob, true), c("value", Blob, true)], key: &["ino", "name"], only: In::All },
    Table { name: "pages", columns: &[c("id", Int, true), c("refs", Int, true), c("data", Blob, true)], key: &["id"], only: In::All },
    Table { name: "file_pages", columns: &[c("ino", Int, true), c("key", Int, true), c("page", Int, true)], key: &["ino", "key"], only: In::All },
    Table {
        name: "packs",
        columns: &[
            c("id", Int, true),
            c("name", Text, true),
            c("size", Int, true),
            c("blobs", Int, true),
            c("dead_bytes", Int, true),
            c("dead_since", Int, false),
            c("created", Int, true),
            c("dead_acc", Real, true),
            c("dead_mark", Int, false),
            c("tier", SmallInt, true),
            c("tier_since", Int, true),
        ],
        key: &["id"],
        only: In::All,
    },
    Table {
        name: "chunks",
        columns: &[
            c("id", Int, true),
            c("hash", Blob, true),
            c("pack", Int, true),
            c("offset", Int, true),
            c("stored_len", Int, true),
            c("raw_len", Int, true),
            c("flags", Int, true),
            c("refs", Int, true),
            shared("zero_since", Int, false),
        ],
        key: &["id"],
        only: In::All,
    },
    Table {
        name: "restores",
        columns: &[c("pack", Int, true), c("class", SmallInt, true), c("requested_ns", Int, true), c("ready_estimate_ns", Int, true), c("expires_ns", Int, false)],
        key: &["pack"],
        only: In::All,
    },
    Table {
        name: "bill",
        columns: &[c("day", Int, true), c("subsystem", Text, true), c("item", Text, true), c("requests", Int, true), c("bytes", Int, true)],
        key: &["day", "subsystem", "item"],
        only: In::All,
    },
    Table {
        name: "sessions",
        columns: &[
            c("id", Int, true),
            c("host", Text, true),
            c("pid", Int, true),
            c("mount", Text, true),
            c("version", Text, true),
            c("started", Time, true),
            c("heartbeat", Time, true),
            c("expires", Time, true),
            c("flush_since", Int, false),
        ],
        key: &["id"],
        only: In::Shared,
    },
    Table {
        name: "changes",
        columns: &[c("seq", Int, true), c("kind", SmallInt, true), c("ino", Int, false), c("parent", Int, false), c("name", Blob, false), c("session", Int, false), c("at", Time, true)],
        key: &["seq"],
        only: In::Shared,
    },
    Table { name: "journal_marks", columns: &[c("journal", Int, true), c("ino", Int, true), c("seq", Int, true)], key: &["journal", "ino"], only: In::Shared },
    Table { name: "open_files", columns: &[c("ino", Int, true), c("session", Int, true), c("gen", Int, true)], key: &["ino", "session"], only: In::Shared },
    Table {
        name: "locks",
        columns: &[
            c("ino", Int, true),
            c("session", Int, true),
            c("owner", Int, true),
            c("flock", Bool, true),
            c("kind", SmallInt, true),
            c("lo", Int, true),
            c("hi", Int, true),
            c("pid", Int, true),
        ],
        key: &[],
        only: In::Shared,
    },
    Table { name: "uploads", columns: &[c("name", Text, true), c("session", Int, true), c("since", Time, true)], key: &["name"], only: In::Shared },
];

/// The dialect a store writes its schema in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// The embedded store: every table and column of [`In::All`] and
    /// [`In::Embedded`].
    Sqlite,
    /// The shared store: those of [`In::All`] and [`In::Shared`].
    Postgres,
}

/// One column as a catalog reports it: name, declared type, NOT NULL.
pub type CatalogColumn = (String, String, bool);

/// One table as a catalog reports it: its columns in order, its primary
/// key's columns in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatalogTable {
    pub columns: Vec<CatalogColumn>,
    pub key: Vec<String>,
}

/// A store's schema as its catalog reports it, by table name.
pub type Catalog = BTreeMap<String, CatalogTable>;

/// The schema a store of `dialect` must have, as its catalog reports it.
pub fn expected(dialect: Dialect) -> Catalog {
    let here = |only: In| match dialect {
        Dialect::Sqlite => only != In::Shared,
        Dialect::Postgres => only != In::Embedded,
    };
    let mut out = Catalog::new();
    for t in TABLES.iter().filter(|t| here(t.only)) {
        let columns = t
            .columns
            .iter()
            .filter(|c| here(c.only))
            .map(|c| {
                let (ty, not_null) = match dialect {
                    // No type, so no NOT NULL either: any value goes.
                    Dialect::Sqlite if c.ty == Ty::AnyInt => (c.ty.sqlite(), t.key.contains(&c.name)),
                    Dialect::Sqlite => (c.ty.sqlite(), c.not_null),
                    Dialect::Postgres => (c.ty.postgres(), c.not_null),
                };
                (c.name.to_string(), ty.to_string(), not_null)
            })
            .collect();
        out.insert(t.name.to_string(), CatalogTable { columns, key: t.key.iter().map(|k| k.to_string()).collect() });
    }
    out
}

/// What differs between a store's catalog and [`expected`], one line per
/// difference (empty when they agree).
pub fn differences(found: &Catalog, dialect: Dialect) -> Vec<String> {
    let want = expected(dialect);
    let mut out = Vec::new();
    for (name, w) in &want {
        match found.get(name) {
            None => out.push(format!("table {name} is missing")),
            Some(f) if f != w => out.push(format!("table {name}: the store has {f:?}, the description {w:?}")),
            Some(_) => {}
        }
    }
    for name in found.keys().filter(|n| !want.contains_key(*n)) {
        out.push(format!("table {name} is not in the description (crates/cairn-meta/src/schema.rs)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_column_is_a_column_and_not_null() {
        for t in TABLES {
            for k in t.key {
                let c = t.columns.iter().find(|c| c.name == *k).unwrap_or_else(|| panic!("{}: key column {k} is no column", t.name));
                assert!(c.not_null, "{}.{k} is in the key but may be null", t.name);
                assert!(c.only == In::All || c.only == t.only, "{}.{k}: a key column exists wherever its table does", t.name);
            }
        }
    }
}
