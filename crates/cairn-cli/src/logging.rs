//! Log output: the terminal, or a file for a mount in the background.

use anyhow::{Context, Result};
use std::path::Path;

/// Sets up `tracing` for this process: `verbose` (-v) raises the level, RUST_LOG
/// overrides it; a `file` gets plain text, a terminal colours.
pub fn init(verbose: u8, file: Option<&Path>) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn,cairn_engine=info,cairn_fuse=info",
        1 => "info,cairn_engine=debug,cairn_fuse=debug",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(p) => {
            // The log names files and volumes: private, like the volume directory.
            let f = std::os::unix::fs::OpenOptionsExt::mode(std::fs::OpenOptions::new().create(true).append(true), 0o600).open(p).with_context(|| format!("opening log file {}", p.display()))?;
            b.with_ansi(false).with_writer(std::sync::Mutex::new(f)).init();
        }
        // Colour codes only for a terminal: a log redirected to a file
        // stays plain text.
        None => {
            use std::io::IsTerminal;
            b.with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr).init()
        }
    }
    Ok(())
}
