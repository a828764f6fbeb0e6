//! Small file-system helpers the durability rules need.

use crate::error::{Error, Result};
use std::fs::File;
use std::path::Path;

/// fsync of a directory: makes the names created, renamed or deleted in it
/// durable (an fsync of a file keeps its contents, not its name).
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::os(format_args!("fsync {}", dir.display()), &e))
}

/// The modes of a volume's and cache's directories and files, and the
/// private `create_dir_all`, live below the engine with the disk cache,
/// which makes them too.
pub use cairn_cache::fsutil::{create_private_dir_all, PRIVATE_DIR, PRIVATE_FILE};

/// Checks at open that a volume's local directory is private to its
/// owner. One that other users may enter (from before Cairn made them
/// 0700, or changed by hand) is closed (chmod go-rwx) with a warning
/// saying so, when this process owns it; otherwise the warning says what
/// to run. Only the top directory matters: nothing below it is reachable
/// once it is 0700.
pub fn ensure_private_dir(dir: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(m) = std::fs::metadata(dir) else { return };
    let mode = m.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if m.uid() == euid {
        match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & !0o077)) {
            Ok(()) => tracing::warn!(
                "{} had mode {mode:04o}: other users could read the volume's files (content, names, journal) and lock it; made it {:04o}",
                dir.display(),
                mode & !0o077
            ),
            Err(e) => tracing::warn!("{} has mode {mode:04o}, so other users can read the volume's files and lock it; making it private failed: {e}", dir.display()),
        }
    } else {
        tracing::warn!(
            "{} has mode {mode:04o} and belongs to uid {}, so other users can read the volume's files and lock it; its owner should run `chmod go-rwx {}`",
            dir.display(),
            m.uid(),
            dir.display()
        );
    }
}

/// Opens (creating 0600) the lock file of a volume without following a
/// symlink planted in its place.
pub fn open_lock_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(PRIVATE_FILE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Creates (or truncates) a file private to its owner (0600).
pub fn create_private_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(PRIVATE_FILE).open(path)
}

/// Replaces `dir/name` with `bytes` so that a crash leaves the old file or
/// the new one, never a part: a private temporary file, fsync'd, renamed
/// over it, then the directory fsync'd.
pub(crate) fn replace_private_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let write = || -> std::io::Result<()> {
        let tmp = dir.join(format!("{name}.tmp"));
        let mut f = create_private_file(&tmp)?;
        std::io::Write::write_all(&mut f, bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| crate::error::Error::os(format_args!("writing {}", path.display()), &e))?;
    fsync_dir(dir)
}
