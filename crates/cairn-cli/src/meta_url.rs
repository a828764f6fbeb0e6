//! `--meta URL`: the PostgreSQL database of a volume whose metadata lives
//! there (issue 26, docs/shared-volume.md §1).
//!
//! The volume's config records only *that* its metadata is in PostgreSQL,
//! never where, so every command that opens such a volume itself (init,
//! mount, and the offline maintenance commands) is given the URL: by
//! `--meta` or, as its default, `CAIRN_META`. Commands that ask a running
//! mount need none: the mount holds its connection.
//!
//! A password never comes in the URL: it would sit in `ps`, shell history,
//! fstab and logs. Such a URL is refused here, before anything is opened,
//! with a message that does not repeat the URL.

use anyhow::{bail, Result};
use cairn_engine::config::MetaKind;
use cairn_engine::VolumeConfig;

/// The environment variable `--meta` defaults to.
pub const ENV: &str = "CAIRN_META";

/// Where a volume's metadata lives, for every command that opens a volume.
#[derive(clap::Args, Clone, Default)]
pub struct MetaArgs {
    /// The PostgreSQL database of a volume whose metadata lives there:
    /// postgres://USER@HOST[:PORT]/DB (default: $CAIRN_META).
    ///
    /// `cairn init VOLUME --meta URL` creates a volume whose metadata (the
    /// namespace and the chunk index) lives in that database, in a schema
    /// of its own (cairn_VOLUMEID); its packs stay where VOLUME says. The
    /// volume's config records only that its metadata is in PostgreSQL,
    /// never the host, user, database or password, so every command that
    /// opens the volume itself (mount, and fsck, gc, stats, cost on an
    /// unmounted volume) is given the URL again. A volume made without
    /// --meta keeps its metadata in SQLite in its directory and refuses
    /// --meta. Default: the environment variable CAIRN_META (which a volume
    /// whose metadata is in SQLite ignores). Commands that ask a running
    /// mount need no URL, the mount has its own: status, top, umount,
    /// snapshot, clone, insert/delete/replace, info, warmup, archive, and
    /// stats, cost and gc --dry-run of a mounted volume. As a mount(8)
    /// option: meta=URL.
    ///
    /// A password never goes in the URL (it would show in `ps`, shell
    /// history, fstab and logs): a URL with one is refused. As with psql,
    /// the password comes from PGPASSWORD, else from the password file
    /// named by PGPASSFILE, else ~/.pgpass (lines
    /// HOST:PORT:DB:USER:PASSWORD; the file must be mode 0600 or it is
    /// ignored).
    #[arg(long = "meta", value_name = "URL")]
    pub meta: Option<String>,
}

/// Where the URL came from, for messages.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Source {
    Flag,
    Env,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Flag => "--meta",
            Source::Env => ENV,
        }
    }
}

impl MetaArgs {
    /// The URL given (`--meta`, else a non-empty `CAIRN_META`), refused if
    /// it carries a password.
    fn given(&self) -> Result<Option<(String, Source)>> {
        let (url, source) = match &self.meta {
            Some(u) => (u.clone(), Source::Flag),
            None => match std::env::var(ENV) {
                Ok(u) if !u.trim().is_empty() => (u, Source::Env),
                _ => return Ok(None),
            },
        };
        if has_password(&url) {
            // The URL is not repeated: it would put the password on the
            // terminal, in scrollback and in logs.
            bail!(
                "the PostgreSQL URL in {} carries a password, which would show in `ps`, shell history and logs: remove it from the URL and give the password in PGPASSWORD, or in a password file (~/.pgpass, or the file PGPASSFILE names; lines HOST:PORT:DB:USER:PASSWORD, mode 0600)",
                source.name()
            );
        }
        Ok(Some((url, source)))
    }

    /// The URL for `cairn init`: `--meta`, else `CAIRN_META`.
    pub fn for_init(&self) -> Result<Option<String>> {
        Ok(self.given()?.map(|(u, _)| u))
    }

    /// Checks what was given without a volume to compare it with (a
    /// command that may be answered by a mount still refuses a password).
    pub fn check(&self) -> Result<()> {
        self.given().map(|_| ())
    }

    /// The URL to open the volume whose config is `cfg` with: for a
    /// volume whose metadata is in PostgreSQL, the URL given (none: the
    /// engine says to add --meta); for one in SQLite, none (`CAIRN_META`
    /// is ignored, an explicit `--meta` refused).
    pub fn for_volume(&self, cfg: &VolumeConfig) -> Result<Option<String>> {
        let given = self.given()?;
        match (cfg.meta, given) {
            (MetaKind::Sqlite, Some((_, Source::Flag))) => bail!(
                "--meta: this volume keeps its metadata in SQLite in its own directory, not in PostgreSQL (only a volume created with `cairn init --meta URL` has its metadata in PostgreSQL): leave out --meta"
            ),
            (MetaKind::Sqlite, _) => Ok(None),
            (_, given) => Ok(given.map(|(u, _)| u)),
        }
    }
}

/// Whether a PostgreSQL connection string carries a password: in the user
/// info of a URL (`postgres://USER:PASSWORD@HOST`), as a `password=` query
/// parameter, or as a `password=` key of libpq's key/value form. Errs on
/// the side of refusing: a `:` before the last `@` of the URL's part before
/// its query counts as a password.
pub fn has_password(url: &str) -> bool {
    let s = url.trim();
    let lower = s.to_ascii_lowercase();
    let uri = ["postgres://", "postgresql://"].iter().find_map(|p| lower.strip_prefix(p).map(|_| &s[p.len()..]));
    match uri {
        Some(rest) => {
            let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
            if let Some((userinfo, _)) = before_query.rsplit_once('@') {
                if userinfo.contains(':') {
                    return true;
                }
            }
            query.split('&').any(|kv| kv.split_once('=').map_or(kv, |(k, _)| k).trim().eq_ignore_ascii_case("password"))
        }
        None => {
            // key=value pairs separated by spaces: `password` as a key,
            // with optional spaces around `=`.
            let b = lower.as_bytes();
            let mut i = 0;
            while let Some(at) = lower[i..].find("password") {
                let start = i + at;
                let end = start + "password".len();
                let word_start = start == 0 || b[start - 1].is_ascii_whitespace();
                let rest = lower[end..].trim_start();
                if word_start && rest.starts_with('=') {
                    return true;
                }
                i = end;
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_in_every_spelling() {
        for url in [
            "postgres://cairn:secret@db/vol",
            "postgresql://cairn:secret@db:5432/vol",
            "POSTGRES://cairn:@db/vol",
            "postgres://cairn:p%40ss@db/vol",
            "postgres://cairn:pa/ss@db/vol",
            "postgres://cairn@db/vol?password=secret",
            "postgres://cairn@db/vol?sslmode=disable&Password=secret",
            "host=db user=cairn password=secret dbname=vol",
            "password = 'x y' host=db",
        ] {
            assert!(has_password(url), "{url}");
        }
        for url in [
            "postgres://cairn@db/vol",
            "postgres://cairn@db:5432/vol?sslmode=disable",
            "postgres://db/vol",
            "postgres://cairn@[::1]:5432/vol",
            "postgresql:///vol?host=/run/postgresql",
            "host=db user=cairn dbname=vol",
            "host=db user=cairn dbname=passwords",
        ] {
            assert!(!has_password(url), "{url}");
        }
    }
}
