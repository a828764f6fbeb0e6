//! `cairn archive`: zero-copy tar archives inside a mount (create, extract,
//! import) and read-only mounts of any tar file.

use crate::edit::{ask, locate, Scratch};
use anyhow::{bail, Context, Result};
use cairn_engine::control::Request;
use cairn_engine::ArchiveReport;
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The name a PATH argument gets in the archive, as GNU tar names it: as
/// typed, without leading '/' or './' and trailing '/'.
fn member_name(p: &Path) -> Result<Vec<u8>> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => parts.push(n.as_bytes()),
            Component::ParentDir => bail!("{}: '..' in a member path; use -C DIR to start from another directory", p.display()),
            Component::Prefix(_) => bail!("{}: unsupported path", p.display()),
        }
    }
    if parts.is_empty() {
        bail!("{}: names no member (archive a directory by its name, or use -C DIR)", p.display());
    }
    Ok(parts.join(&b'/'))
}

fn summary(what: &str, r: &ArchiveReport) {
    if std::io::stderr().is_terminal() {
        eprintln!(
            "{what} {} members: {} of data shared, {} of headers, archive {}",
            r.members,
            crate::size::human(r.data_bytes),
            crate::size::human(r.header_bytes),
            crate::size::human(r.archive_bytes)
        );
    }
}

pub fn create(archive: &Path, paths: &[PathBuf], dir: Option<&Path>, align: Option<u64>, remove: bool) -> Result<()> {
    // The archive's path is taken before -C, as tar takes -f.
    let a = locate(archive)?;
    if let Some(d) = dir {
        std::env::set_current_dir(d).with_context(|| format!("-C {}", d.display()))?;
    }
    let mut members = Vec::new();
    for p in paths {
        let m = locate(p)?;
        if m.socket != a.socket {
            bail!("{} is not in the same Cairn volume as {}", p.display(), archive.display());
        }
        members.push((member_name(p)?, m.rel));
    }
    let v = ask(&a, &Request::ArchiveCreate { archive: a.rel.clone(), members, align, remove })?;
    summary("archived", &serde_json::from_value(v)?);
    Ok(())
}

pub fn extract(archive: &Path, dest: &Path, consume: bool) -> Result<()> {
    let a = locate(archive)?;
    let d = locate(dest)?;
    if a.socket != d.socket {
        bail!("{} and {} are not in the same Cairn volume (use `cairn archive import` for a tar from outside)", archive.display(), dest.display());
    }
    let v = ask(&a, &Request::ArchiveExtract { archive: a.rel.clone(), dest: d.rel, consume })?;
    summary("extracted", &serde_json::from_value(v)?);
    Ok(())
}

/// Copies a tar from outside into the volume (next to DEST, chunked and
/// deduplicated on the way), then extracts it zero-copy and drops the copy.
pub fn import(file: &Path, dest: &Path) -> Result<()> {
    let d = locate(dest)?;
    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut src = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let len = src.metadata()?.len();
    let scratch = Scratch::named(parent, "import")?;
    crate::progress::copy_with_bar("importing", &[], &mut src, &scratch.file, Some(len)).with_context(|| format!("copying {} into the volume", file.display()))?;
    let s = locate(&scratch.path)?;
    let v = ask(&d, &Request::ArchiveExtract { archive: s.rel, dest: d.rel.clone(), consume: true });
    // Consumed on success; the guard removes it on failure.
    let v = v?;
    summary("imported", &serde_json::from_value(v)?);
    Ok(())
}
