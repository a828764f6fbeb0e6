//! Small file-system helpers the durability rules need.

use crate::error::{Error, Result};
use std::fs::File;
use std::path::Path;

/// fsync of a directory: makes the names created, renamed or deleted in it
/// durable (an fsync of a file keeps its contents, not its name).
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::os(format_args!("fsync {}", dir.display()), &e))
}
