//! `mount_archive`: index, mount, serve until unmounted, on the scaffold
//! every Cairn file system shares (`cairn-mount`).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cairn_mount::SignalWatch;
use fuser::{MountOption, Session};
use tracing::info;

use crate::fs::TarFs;
use crate::index::{open_index, IndexInfo};
use crate::tree::{Defaults, Tree};
use crate::TarfsError;

/// How to mount an archive.
#[derive(Clone, Debug)]
pub struct TarMountOptions {
    /// Let users other than the mounting one in (`allow_other`).
    pub allow_other: bool,
    /// Threads serving kernel requests (at least 1).
    pub threads: usize,
    /// The "source" shown by `mount`/`df`; default: the archive path.
    pub fsname: Option<String>,
    /// Where index files live; default [`crate::default_index_dir`].
    pub index_dir: Option<PathBuf>,
    /// Turn SIGTERM, SIGINT and SIGHUP into an unmount (lazy if busy; a
    /// second signal aborts the connection). Process-wide: leave it off
    /// when several mounts share a process.
    pub handle_signals: bool,
}

impl Default for TarMountOptions {
    fn default() -> Self {
        TarMountOptions {
            allow_other: false,
            threads: 2,
            fsname: None,
            index_dir: None,
            handle_signals: true,
        }
    }
}

/// What `on_ready` is told.
#[derive(Clone, Debug)]
pub struct MountInfo {
    /// The mount point, canonicalised.
    pub mountpoint: PathBuf,
    /// How the index was obtained.
    pub index: IndexInfo,
    /// Inodes in the tree (including synthesised directories).
    pub nodes: usize,
    /// Members left out (".." paths, dangling hard links, paths through files).
    pub skipped: usize,
}

/// Mounts `archive` read-only at `mountpoint` and serves it in the
/// foreground until it is unmounted (`fusermount3 -u MOUNTPOINT`,
/// `umount`, or a signal when `opts.handle_signals`).
///
/// The index is loaded or built first (errors in the archive are reported
/// before anything is mounted). `on_ready` runs once the kernel mount
/// exists and the FUSE handshake is done: a daemonising caller can let its
/// parent exit then. Returns when the session ends.
pub fn mount_archive(
    archive: &Path,
    mountpoint: &Path,
    opts: &TarMountOptions,
    on_ready: impl FnOnce(&MountInfo),
) -> Result<(), TarfsError> {
    let mp = cairn_mount::validate_mountpoint(mountpoint).map_err(|e| TarfsError::Io { what: "cannot mount there".into(), source: e })?;
    let (members, index) = open_index(archive, opts.index_dir.as_deref())?;
    let file = File::open(&index.archive).map_err(|e| TarfsError::Io {
        what: format!("cannot open {}", index.archive.display()),
        source: e,
    })?;
    let meta = file.metadata().map_err(|e| TarfsError::Io {
        what: format!("cannot stat {}", index.archive.display()),
        source: e,
    })?;
    let tree = Tree::build(
        &members,
        Defaults {
            uid: meta.uid(),
            gid: meta.gid(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        },
    );
    drop(members);
    let info = MountInfo {
        mountpoint: mp.clone(),
        nodes: tree.len(),
        skipped: tree.skipped,
        index,
    };
    let fs = TarFs::new(tree, file).map_err(|e| TarfsError::Io {
        what: "cannot read the archive".into(),
        source: e,
    })?;

    let mut config = cairn_mount::session_config(opts.threads, opts.allow_other);
    let fsname = opts
        .fsname
        .clone()
        .unwrap_or_else(|| info.index.archive.display().to_string())
        .replace(',', "_");
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName(fsname),
        MountOption::Subtype("cairn-tar".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    // Handlers go in before the mount: no window in which a signal kills
    // the process with the archive mounted.
    let watch = if opts.handle_signals {
        SignalWatch::start(mp.clone(), |_| {}).map_err(|e| TarfsError::Io { what: "cannot install signal handlers".into(), source: e })?
    } else {
        None
    };
    let session = Session::new(fs, &mp, &config).map_err(|e| TarfsError::Io {
        what: format!("cannot mount {}", mp.display()),
        source: e,
    })?;
    if let (Some(w), Some(id)) = (&watch, cairn_mount::fuse_connection_of(&mp)) {
        w.set_connection(id);
    }
    info!(
        archive = %info.index.archive.display(),
        mountpoint = %mp.display(),
        members = info.index.members,
        "tar archive mounted"
    );
    if watch.as_ref().is_some_and(SignalWatch::signalled) {
        // A signal arrived while mounting: its unmount found nothing yet.
        info!("signal received during mount: unmounting");
        if let Err(e) = cairn_mount::unmount_once(&mp, true) {
            tracing::warn!("{e}");
        }
    } else {
        on_ready(&info);
    }
    let res = session.run();
    drop(watch);
    info!(mountpoint = %mp.display(), "tar mount ended");
    res.map_err(|e| TarfsError::Io {
        what: format!("FUSE session on {}", mp.display()),
        source: e,
    })
}
