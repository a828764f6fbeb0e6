//! A backend in a local directory: one file per object.

use crate::{validate_name, Backend, Error, ErrorKind, ObjectInfo, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Objects as files below a root directory. Writes are staged in `tmp/`,
/// fsynced, renamed into place, and the directory is fsynced, so a crash
/// never leaves a partial object under its final name.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
}

impl LocalBackend {
    /// Opens an existing backend directory.
    pub fn open(root: &Path) -> Result<Self> {
        let md = fs::metadata(root).map_err(|e| Error::from_io(&format!("backend directory {}", root.display()), e))?;
        if !md.is_dir() {
            return Err(Error::new(ErrorKind::Io, format!("backend {} is not a directory", root.display())));
        }
        Ok(LocalBackend { root: root.to_path_buf() })
    }

    /// Creates the directory (and parents) if needed and opens it.
    pub fn create(root: &Path) -> Result<Self> {
        create_dir_durable(&root.join("tmp")).map_err(|e| Error::from_io(&format!("creating {}", root.display()), e))?;
        Self::open(root)
    }

    /// The directory that holds the objects.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        validate_name(name)?;
        Ok(self.root.join(name))
    }
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `create_dir_all` whose new directories survive a power cut: each one
/// created here is made durable in its parent (an fsync of the new
/// directory's contents alone would not keep its name).
fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_durable(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => fsync_dir(dir.parent().unwrap_or(Path::new("/"))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

impl Backend for LocalBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        let path = self.path(name)?;
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        let tmpdir = self.root.join("tmp");
        let ctx = |e| Error::from_io(&format!("writing object {name} in {}", self.root.display()), e);
        create_dir_durable(&parent).map_err(ctx)?;
        create_dir_durable(&tmpdir).map_err(ctx)?;
        let tmp = tmpdir.join(format!("{}.{:016x}", std::process::id(), rand::random::<u64>()));
        let result = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, &path)?;
            fsync_dir(&parent)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(ctx)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        let f = File::open(&path).map_err(|e| Error::from_io(&format!("object {name}"), e))?;
        let size = f.metadata().map_err(|e| Error::from_io(name, e))?.len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                format!("object {name}: range {offset}+{len} past its end ({size} bytes): truncated?"),
            ));
        }
        // Read into spare capacity: no zero-filling of a buffer about to be overwritten.
        let mut buf = Vec::with_capacity(len as usize);
        let mut f = f;
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| (&mut f).take(len).read_to_end(&mut buf))
            .map_err(|e| Error::from_io(&format!("reading object {name}"), e))?;
        if buf.len() as u64 != len {
            return Err(Error::new(ErrorKind::OutOfRange, format!("object {name}: short read ({} of {len} bytes)", buf.len())));
        }
        Ok(buf)
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        let mut f = File::open(&path).map_err(|e| Error::from_io(&format!("object {name}"), e))?;
        let mut buf = Vec::new();
        f.seek(SeekFrom::Start(0)).and_then(|_| f.read_to_end(&mut buf)).map_err(|e| Error::from_io(name, e))?;
        Ok(buf)
    }

    fn size(&self, name: &str) -> Result<u64> {
        let path = self.path(name)?;
        Ok(fs::metadata(&path).map_err(|e| Error::from_io(&format!("object {name}"), e))?.len())
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::from_io(&format!("deleting object {name}"), e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        let mut stack = vec![(self.root.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::from_io(&format!("listing {}", dir.display()), e)),
            };
            for ent in rd {
                let ent = ent.map_err(|e| Error::from_io("listing", e))?;
                let Some(fname) = ent.file_name().to_str().map(str::to_owned) else { continue };
                let name = if rel.is_empty() { fname.clone() } else { format!("{rel}/{fname}") };
                let ft = ent.file_type().map_err(|e| Error::from_io("listing", e))?;
                if ft.is_dir() {
                    if rel.is_empty() && fname == "tmp" {
                        continue; // staging area, not objects
                    }
                    // Descend only where the prefix can still match.
                    if prefix.starts_with(&name) || name.starts_with(prefix) {
                        stack.push((ent.path(), name));
                    }
                } else if ft.is_file() && name.starts_with(prefix) {
                    let size = ent.metadata().map_err(|e| Error::from_io("listing", e))?.len();
                    out.push(ObjectInfo { name, size });
                }
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("local:{}", self.root.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::create(dir.path()).unwrap();
        crate::conformance::run_all(&b);
    }

    #[test]
    fn no_staging_leftovers_after_put() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::create(dir.path()).unwrap();
        b.put("a/b", b"x").unwrap();
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }
}
