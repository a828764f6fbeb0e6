//! `cairn fsck`: check a volume.

use crate::volume::{VolumeArgs, VolumeDir, maintain, open_volume};
use crate::{logging, progress};
use anyhow::Result;
use cairn_engine::{maintenance, report};

/// Check a volume's consistency (it must not be mounted).
#[derive(clap::Args)]
pub struct FsckArgs {
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Also read, decrypt and verify every stored chunk.
    #[arg(long)]
    pub read_data: bool,
    /// Replay a damaged journal: every record that still verifies, the
    /// damaged ones skipped (lost); a copy of each damaged segment is
    /// kept in the volume's journal-damaged/ directory.
    #[arg(long)]
    pub salvage_journal: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: FsckArgs, verbose: u8) -> Result<i32> {
    let FsckArgs { vol: VolumeArgs { volume: dir, cloud, meta, pass }, read_data, salvage_journal, json } = a;
    logging::init(verbose, None)?;
    meta.check()?;
    let dir = VolumeDir::unmounted(&dir, &cloud, "fsck")?.path;
    // A damaged journal stops an open that replays it: report it, and
    // check what is committed through a read-only open (or salvage the
    // journal when asked to). Read before the open replays (and may then
    // delete) the segments.
    let journal = report::journal_findings(&dir)?;
    let mut rep = if !journal.is_damaged() || salvage_journal {
        maintain(&dir, &pass, &meta, json, |o| o.salvage_journal = salvage_journal, |vol, bars| maintenance::fsck(vol, read_data, bars))?
    } else {
        let vol = open_volume(&dir, &pass, &meta, true, None)?;
        let bars = progress::Bars::new(!json);
        let r = maintenance::fsck(&vol, read_data, &bars);
        bars.finish();
        vol.close()?;
        r?
    };
    journal.add_to(&mut rep, salvage_journal);
    if json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        for w in &rep.warnings {
            println!("warning: {w}");
        }
        for e in &rep.errors {
            println!("error: {e}");
        }
        if rep.packs_in_trash > 0 {
            println!("{} packs no metadata names wait in the trash for their grace period (gc put them there)", rep.packs_in_trash);
        }
        if rep.packs_uploading > 0 {
            println!("{} packs are being uploaded by a flush not yet committed (or by a gone session, reclaimed by gc after the grace)", rep.packs_uploading);
        }
        println!(
            "checked {} inodes, {} chunks, {} packs{}: {} errors, {} warnings",
            rep.inodes,
            rep.chunks,
            rep.packs,
            if read_data { format!(", read {} blobs", rep.blobs_read) } else { String::new() },
            rep.errors.len(),
            rep.warnings.len()
        );
    }
    Ok(if rep.errors.is_empty() { 0 } else { 1 })
}
