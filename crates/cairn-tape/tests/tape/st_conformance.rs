//! The device suite on a real drive. Needs a drive and a scratch tape whose
//! contents may be destroyed:
//!
//! ```text
//! CAIRN_TAPE_DEVICE=/dev/nst0 CAIRN_TAPE_DESTROY=yes [CAIRN_TAPE_BLOCK_SIZE=262144] \
//!     cargo test -p cairn-tape --test tape -- --ignored st_conformance
//! ```

#[cfg(target_os = "linux")]
#[test]
#[ignore = "needs a tape drive: set CAIRN_TAPE_DEVICE and CAIRN_TAPE_DESTROY=yes"]
fn st_conformance() {
    use cairn_tape::conformance::{run_all, Options};
    use cairn_tape::{StDrive, TapeDevice};

    let Ok(path) = std::env::var("CAIRN_TAPE_DEVICE") else {
        panic!("set CAIRN_TAPE_DEVICE=/dev/nstN (a non-rewinding device)");
    };
    assert_eq!(
        std::env::var("CAIRN_TAPE_DESTROY").as_deref(),
        Ok("yes"),
        "the suite overwrites the tape: set CAIRN_TAPE_DESTROY=yes"
    );
    let bs: usize = std::env::var("CAIRN_TAPE_BLOCK_SIZE")
        .map(|v| v.parse().expect("block size"))
        .unwrap_or(256 * 1024);
    let path = std::path::PathBuf::from(path);
    let dev = StDrive::open(&path, bs).unwrap_or_else(|e| panic!("{e}"));
    if !dev.logical_positions() {
        eprintln!("st_conformance: could not set MT_ST_SCSI2LOGICAL (not root?); positions are whatever the driver is set to");
    }
    let mut reopen = || -> Box<dyn TapeDevice> {
        Box::new(StDrive::open(&path, bs).unwrap_or_else(|e| panic!("{e}")))
    };
    // Filling a real tape to its end takes hours: no end-of-medium check here.
    run_all(
        Box::new(dev),
        Options {
            reopen: Some(&mut reopen),
            end_of_medium: false,
        },
    );
}
