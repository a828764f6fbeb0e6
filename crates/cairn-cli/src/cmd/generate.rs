//! `cairn generate man|completions DIR`: man pages and shell completions
//! made from the clap definitions, so they never drift from `--help`.
//! The concepts page, cairn(7), is hand-written in dist/man/.

use anyhow::{Context, Result};
use clap_complete::Shell;
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum What {
    /// cairn.1 and one page per subcommand (cairn-mount.1, ...).
    Man { dir: PathBuf },
    /// bash (cairn), zsh (_cairn) and fish (cairn.fish) completions.
    Completions { dir: PathBuf },
}

pub fn run(mut cmd: clap::Command, what: What) -> Result<i32> {
    match what {
        What::Man { dir } => {
            mkdir(&dir)?;
            clap_mangen::generate_to(cmd, &dir).with_context(|| format!("writing man pages to {}", dir.display()))?;
        }
        What::Completions { dir } => {
            mkdir(&dir)?;
            for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                clap_complete::generate_to(shell, &mut cmd, "cairn", &dir).with_context(|| format!("writing {shell} completions to {}", dir.display()))?;
            }
        }
    }
    Ok(0)
}

fn mkdir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}
