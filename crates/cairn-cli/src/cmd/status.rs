//! `cairn status`: every Cairn mount on this machine and its health.

use crate::logging;
use anyhow::Result;

/// List every Cairn mount on this machine: volume, backend, mountpoint,
/// daemon pid, uptime, bytes not yet in the backend, and health.
///
/// Mounts come from the kernel's mount table (type fuse.cairn); each
/// mount's daemon registers its pid, local directory and backend in
/// /run/cairn/mounts/PID.json (other users: $XDG_RUNTIME_DIR/cairn/mounts)
/// while it runs, and answers the rest on its control socket. Dirty bytes
/// are the write-back journal plus packs waiting for upload: what this
/// machine holds that the backend has not got yet. Health: ok;
/// backend_unreachable (uploads, metadata shipping or lease renewals are
/// failing: writes pile up locally and are sent when the bucket answers);
/// lease_lost (another machine took the volume's lease, or its lease
/// object was deleted: the mount refuses writes, and `cairn umount` of
/// it exits non-zero); session_lost (a volume whose metadata is in
/// PostgreSQL: the mount's session expired, perhaps while the database
/// was unreachable, and it refuses writes until mounted again);
/// degraded (the flusher is failing); not_responding (the daemon does not
/// answer within 5 s); dead (the daemon is gone: `cairn umount` it);
/// unknown (it cannot be asked, e.g. another user's mount). The last
/// error of each failing part is shown. Exits 0 whatever the health.
/// It takes no --meta: a mount whose volume keeps its metadata in
/// PostgreSQL holds its own connection and answers for it.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print as JSON (one object per mount).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: StatusArgs, verbose: u8) -> Result<i32> {
    let StatusArgs { json } = a;
    logging::init(verbose, None)?;
    crate::status::run(json)
}
