//! Outside tools a test needs (GNU tar, bsdtar, rsync, FUSE): a missing one
//! fails the test and names the tool and the package that brings it, rather
//! than passing without having run (scripts/test.sh installs them all).

use std::path::Path;
use std::process::Command;

/// The Debian package that brings `tool`, for the failure message.
fn package_of(tool: &str) -> &str {
    match tool {
        "bsdtar" => "libarchive-tools",
        "fusermount3" => "fuse3",
        "getfattr" | "setfattr" => "attr",
        t => t,
    }
}

/// Why `tool` cannot be run (`tool --version` does not start or fails), or
/// `None` if it runs.
pub fn missing_tool(tool: &str) -> Option<String> {
    match Command::new(tool).arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`{tool} --version` failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Some(format!("{tool} could not be run: {e}")),
    }
}

/// Panics, naming the tool and how to install it, unless `tool` runs.
pub fn require_tool(tool: &str) {
    if let Some(why) = missing_tool(tool) {
        panic!(
            "this test needs {tool}, which is missing: {why}. Install it (apt-get install -y {}), or run the tests through scripts/test.sh, which does",
            package_of(tool)
        );
    }
}

/// Panics unless this machine can mount FUSE file systems: /dev/fuse exists
/// and fusermount3 runs.
pub fn require_fuse() {
    if !Path::new("/dev/fuse").exists() {
        panic!("this test mounts a FUSE file system and /dev/fuse is missing: load the fuse module (modprobe fuse), or run in a container given /dev/fuse");
    }
    if let Some(why) = missing_tool_flag("fusermount3", "-V") {
        panic!("this test needs fusermount3, which is missing: {why}. Install it (apt-get install -y fuse3)");
    }
}

fn missing_tool_flag(tool: &str, flag: &str) -> Option<String> {
    match Command::new(tool).arg(flag).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`{tool} {flag}` failed ({})", o.status)),
        Err(e) => Some(format!("{tool} could not be run: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_fails_naming_it_and_its_package() {
        let e = std::panic::catch_unwind(|| require_tool("cairn-no-such-tool-xyz")).expect_err("a missing tool passed");
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("cairn-no-such-tool-xyz") && msg.contains("apt-get install"), "{msg}");
        assert!(missing_tool("cairn-no-such-tool-xyz").is_some());
    }

    #[test]
    fn a_tool_that_runs_is_not_missing() {
        // cargo itself runs wherever these tests do.
        assert_eq!(missing_tool("cargo"), None);
    }

    #[test]
    fn bsdtar_is_named_with_its_package() {
        assert_eq!(package_of("bsdtar"), "libarchive-tools");
        assert_eq!(package_of("tar"), "tar");
    }
}
