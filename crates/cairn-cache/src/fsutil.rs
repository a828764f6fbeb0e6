//! The modes of the private files and directories that a volume and its
//! cache keep (docs/threat-model.md); the engine's `fsutil` re-exports them.

use std::path::Path;

/// Mode of a volume's or cache's directories: its files hold every stored
/// file's content (unencrypted journal and packs) and every name (the
/// metadata), so only the owner may enter (as ssh, restic and PostgreSQL
/// keep their state).
pub const PRIVATE_DIR: u32 = 0o700;
/// Mode of the files in them.
pub const PRIVATE_FILE: u32 = 0o600;

/// `create_dir_all` whose new directories are private to their owner
/// (0700 whatever the umask), and `dir` itself made 0700 even if it
/// existed (a new volume may go into an empty directory made beforehand).
pub fn create_private_dir_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(PRIVATE_DIR).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR))
}
