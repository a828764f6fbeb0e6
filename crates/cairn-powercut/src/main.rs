//! `cairn-powercut BACKING MOUNTPOINT`: see the library docs.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cairn-powercut BACKING MOUNTPOINT

Mounts a view of directory BACKING at MOUNTPOINT (a test tool; needs root)
that simulates power cuts:

  - names (create, mkdir, unlink, rmdir, rename, symlink, link, chmod,
    chown, utimes) go to BACKING at once;
  - file contents and sizes (write, truncate, O_TRUNC) stay in this
    process's memory until the file is fsync'd or fdatasync'd, which writes
    them to BACKING and syncs before replying; fsync of a directory syncs
    the backing directory; close persists nothing;
  - reads through MOUNTPOINT see the unsynced state.

SIGKILL is a power cut: everything not fsync'd is lost, and a new
cairn-powercut over the same BACKING shows only what was fsync'd (unmount
the dead mount first: fusermount3 -u -z MOUNTPOINT). SIGTERM, SIGINT and
SIGHUP unmount cleanly but persist nothing more either.

Prints 'cairn-powercut: serving MOUNTPOINT' to stderr once ready.
Logging: RUST_LOG (e.g. RUST_LOG=cairn_powercut=debug).
";

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.len() != 2 || args.iter().any(|a| a.to_string_lossy().starts_with('-')) {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let backing = PathBuf::from(&args[0]);
    let mountpoint = PathBuf::from(&args[1]);
    match cairn_powercut::run_foreground(&backing, &mountpoint) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn-powercut: {e}");
            ExitCode::FAILURE
        }
    }
}
