//! The mount(8) and umount(8) helpers: this binary run as
//! `/sbin/mount.fuse.cairn` (or `mount.cairn`) and `/sbin/umount.fuse.cairn`.
//!
//! mount(8) runs `mount.TYPE VOLUME MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]`
//! for `mount -t fuse.cairn` and fstab lines. Every `-o` option is a `cairn
//! mount` flag spelled without its dashes (`cache_dir=/x` or `cache-dir=/x`
//! for `--cache-dir /x`, `ro` for `--read-only`); the options mount(8) and
//! systemd keep for themselves are passed over. The translation reads the
//! clap definition of `cairn mount`, so a new mount flag is an option at once.
//! A mount for the mounting user alone (`--private`) is `no_allow_other`:
//! mount(8) takes `private` for the propagation flag (MS_PRIVATE) and never
//! passes it on, so the mount would quietly be open to every user; the old
//! spelling is still taken, with a warning, when it does reach the helper.
//! The passphrase comes from `passphrase_file=FILE` or the systemd
//! credential `cairn-passphrase`, never from the option line, which anyone
//! can read in /etc/fstab, /proc/self/mountinfo or `ps`.
//!
//! umount(8) runs `umount.TYPE MOUNTPOINT [-flnrv]` when that helper exists:
//! it makes plain `umount` (and systemd stopping a mount unit) wait, as
//! `cairn umount` does, until the daemon has flushed everything and exited.

use anyhow::{Context, Result};
use clap::Parser;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Systemd credential (`LoadCredential=cairn-passphrase:FILE`) read when no
/// `passphrase_file` option is given.
pub const CREDENTIAL: &str = "cairn-passphrase";

/// Options mount(8), fstab and systemd use for themselves, and FUSE options
/// that name what Cairn does anyway.
const PASSED_OVER: &[&str] = &[
    "defaults", "rw", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner", "group",
    // kept in /run/mount/utab: uhelper names the umount helper
    "uhelper", "helper",
    // Every Cairn mount is nosuid,nodev with default_permissions; allow_other
    // is the default (`no_allow_other` turns it off).
    "nosuid", "nodev", "default_permissions", "allow_other",
];

/// Runs the helper that `argv0` names, if it names one: the exit code.
pub fn main_as(argv0: &Path) -> Option<i32> {
    let name = argv0.file_name()?.to_str()?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (who, r) = match name {
        "mount.fuse.cairn" | "mount.cairn" => (name, mount_main(&args)),
        "umount.fuse.cairn" | "umount.cairn" => (name, umount_main(&args).map(|()| 0)),
        _ => return None,
    };
    Some(r.unwrap_or_else(|e| {
        eprintln!("{who}: {e:#}");
        // mount(8)'s codes: 1 bad usage, 32 the mount itself failed.
        if e.is::<UsageError>() {
            1
        } else {
            32
        }
    }))
}

/// A helper invocation mount(8) or a user got wrong (exit code 1).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// What mount(8) passed.
#[derive(Debug, Default, PartialEq)]
pub struct Invocation {
    pub volume: OsString,
    pub mountpoint: OsString,
    /// The `-o` lists, in order.
    pub options: Vec<String>,
    /// `-s`: ignore options Cairn does not know instead of failing.
    pub sloppy: bool,
    /// `-f`: check everything, mount nothing.
    pub fake: bool,
}

pub fn parse_invocation(args: &[OsString]) -> Result<Invocation> {
    let mut inv = Invocation::default();
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" => inv.options.push(it.next().ok_or_else(|| usage("-o needs an option list"))?.to_str().ok_or_else(|| usage("options must be UTF-8"))?.to_string()),
            "-t" => {
                it.next();
            }
            "-N" => return Err(usage("-N (mount in another namespace) is not supported")),
            _ if s.starts_with("-o") && s.len() > 2 => inv.options.push(s[2..].to_string()),
            _ if s.starts_with('-') && s.len() > 1 => {
                for c in s[1..].chars() {
                    match c {
                        's' => inv.sloppy = true,
                        'f' => inv.fake = true,
                        // no mtab to skip; mount(8)'s own verbosity
                        'n' | 'v' => {}
                        _ => return Err(usage(format!("unknown flag -{c} (usage: mount.fuse.cairn VOLUME MOUNTPOINT [-sfnv] [-o OPTIONS])"))),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [volume, mountpoint]: [OsString; 2] =
        positional.try_into().map_err(|p: Vec<OsString>| usage(format!("expected VOLUME and MOUNTPOINT, got {} arguments (usage: mount.fuse.cairn VOLUME MOUNTPOINT [-sfnv] [-o OPTIONS])", p.len())))?;
    inv.volume = volume;
    inv.mountpoint = mountpoint;
    Ok(inv)
}

/// Splits an option list on commas outside double quotes (libmount quotes
/// values that contain commas) and drops the quotes.
fn split_options(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in list.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.retain(|o| !o.is_empty());
    out
}

/// The `cairn mount` flags for the `-o` lists, checked against `mount` (the
/// clap definition of `cairn mount`). `credentials` is
/// `$CREDENTIALS_DIRECTORY`.
pub fn translate(mount: &clap::Command, lists: &[String], sloppy: bool, credentials: Option<&Path>) -> Result<Vec<OsString>> {
    // One value per flag, the last one winning, as mount(8) does.
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for opt in lists.iter().flat_map(|l| split_options(l)) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (opt.as_str(), None),
        };
        if PASSED_OVER.contains(&key) || key.starts_with("x-") || key == "comment" {
            continue;
        }
        let long = match key.replace('_', "-").as_str() {
            "ro" => "read-only".to_string(),
            "passphrase" => return Err(usage("a passphrase never goes in the mount options (anyone can read them): use passphrase_file=FILE or the systemd credential cairn-passphrase")),
            "foreground" => return Err(usage("foreground: mount(8) waits for its helper, so a helper mount always goes to the background")),
            "no-allow-other" => "private".to_string(),
            "private" => {
                // Only a direct call of the helper gets here: mount(8)
                // consumes `private` as a propagation flag.
                eprintln!("mount.fuse.cairn: warning: write the mount option `private` as `no_allow_other`: mount(8) takes `private` for a propagation flag and drops it, so an fstab line with it is mounted for every user");
                "private".to_string()
            }
            k => k.to_string(),
        };
        let Some(arg) = mount.get_arguments().find(|a| a.get_long() == Some(long.as_str())) else {
            if sloppy {
                continue;
            }
            return Err(usage(format!("unknown mount option `{key}` (see `cairn mount --help`; every --flag is an option spelled without its dashes, with _ or -)")));
        };
        let takes_value = arg.get_action().takes_values();
        match (&value, takes_value) {
            (None, true) => return Err(usage(format!("mount option `{key}` needs a value: {key}=VALUE"))),
            (Some(_), false) => return Err(usage(format!("mount option `{key}` takes no value"))),
            _ => {}
        }
        flags.retain(|(l, _)| *l != long);
        flags.push((long, value));
    }
    if !flags.iter().any(|(l, _)| l == "passphrase-file") {
        if let Some(cred) = credentials.map(|d| d.join(CREDENTIAL)).filter(|p| p.exists()) {
            flags.push(("passphrase-file".into(), Some(cred.to_string_lossy().into_owned())));
        }
    }
    let mut out = Vec::new();
    for (long, value) in flags {
        out.push(OsString::from(format!("--{long}")));
        out.extend(value.map(OsString::from));
    }
    Ok(out)
}

fn mount_main(args: &[OsString]) -> Result<i32> {
    use clap::CommandFactory;
    let inv = parse_invocation(args)?;
    let cli = crate::Cli::command();
    let mount = cli.find_subcommand("mount").expect("cairn has a mount command");
    let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    let flags = translate(mount, &inv.options, inv.sloppy, creds.as_deref())?;
    let mut argv: Vec<OsString> = vec!["cairn".into(), "mount".into(), inv.volume, inv.mountpoint];
    argv.extend(flags);
    // Values are checked by clap as for `cairn mount` (--durability etc.).
    // Messages name the -o options the helper was given, not the flags
    // they became.
    let parsed = crate::Cli::try_parse_from(&argv).map_err(|e| usage(format!("bad mount option: {}", as_options(mount, e.render().to_string().trim_start_matches("error: ").trim()))))?;
    if inv.fake {
        return Ok(0);
    }
    crate::run(parsed).map_err(|e| anyhow::anyhow!("{}", as_options(mount, &format!("{e:#}"))))
}

/// `msg` with every `cairn mount` flag in it (`--cache-dir`, `--durability
/// <DURABILITY>`) spelled as the -o option it came from (`-o cache_dir`,
/// `-o durability=<DURABILITY>`).
fn as_options(mount: &clap::Command, msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let len = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(after.len());
        let name = &after[..len];
        let known = !name.is_empty() && mount.get_arguments().any(|a| a.get_long() == Some(name));
        if !known {
            out.push_str("--");
            rest = after;
            continue;
        }
        let option = if name == "read-only" { "ro".to_string() } else { name.replace('-', "_") };
        out.push_str("-o ");
        out.push_str(&option);
        rest = &after[len..];
        // clap's `--flag <VALUE>` becomes `-o flag=<VALUE>`.
        if let Some(v) = rest.strip_prefix(" <").and_then(|r| r.find('>').map(|e| &r[..=e])) {
            out.push_str("=<");
            out.push_str(v);
            rest = &rest[2 + v.len()..];
        }
    }
    out.push_str(rest);
    out
}

fn umount_main(args: &[OsString]) -> Result<()> {
    let mut mountpoint = None;
    let (mut lazy, mut force) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-t" | "-N" => {
                it.next();
            }
            _ if s.starts_with('-') && s.len() > 1 => {
                for c in s[1..].chars() {
                    match c {
                        'l' => lazy = true,
                        'f' => force = true,
                        'n' | 'v' | 'r' => {}
                        _ => return Err(usage(format!("unknown flag -{c}"))),
                    }
                }
            }
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(a)),
            _ => return Err(usage("usage: umount.fuse.cairn MOUNTPOINT [-flnrv]")),
        }
    }
    let mp = mountpoint.ok_or_else(|| usage("usage: umount.fuse.cairn MOUNTPOINT [-flnrv]"))?;
    if lazy || force {
        // The caller asked not to wait: detach (or abort) as umount(8)
        // would; a lazily detached daemon still flushes at its last close.
        let flags = if lazy { libc::MNT_DETACH } else { 0 } | if force { libc::MNT_FORCE } else { 0 };
        let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()).context("mountpoint contains a NUL byte")?;
        // SAFETY: umount2 with a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("unmounting {}", mp.display()));
        }
        return Ok(());
    }
    crate::daemon::unmount_and_wait(&mp, std::time::Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn mount_cmd() -> clap::Command {
        crate::Cli::command().find_subcommand("mount").unwrap().clone()
    }

    fn tr(opts: &str) -> Result<Vec<String>> {
        translate(&mount_cmd(), &[opts.to_string()], false, None).map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn messages_name_the_options_given_not_the_flags() {
        let m = mount_cmd();
        assert_eq!(as_options(&m, "invalid value 'x' for '--durability <DURABILITY>'"), "invalid value 'x' for '-o durability=<DURABILITY>'");
        assert_eq!(as_options(&m, "--cache-block must be between 4K and 64M"), "-o cache_block must be between 4K and 64M");
        assert_eq!(as_options(&m, "--read-only and --mirror"), "-o ro and -o mirror");
        // Not a mount flag: left alone.
        assert_eq!(as_options(&m, "see --help, or -- --nothing"), "see --help, or -- --nothing");
    }

    #[test]
    fn every_cairn_mount_flag_is_an_option() {
        let cmd = mount_cmd();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "foreground" {
                continue;
            }
            let opt = long.replace('-', "_");
            let opt = if arg.get_action().takes_values() { format!("{opt}=1") } else { opt };
            let got = tr(&opt).unwrap_or_else(|e| panic!("{opt}: {e:#}"));
            assert_eq!(got[0], format!("--{long}"), "{opt}");
        }
    }

    #[test]
    fn both_spellings_and_values() {
        let got = tr("defaults,_netdev,cache_dir=/var/c,cache-dir-size=2G,ro,durability=remote,no_writeback_cache,threads=8").unwrap();
        assert_eq!(got, ["--cache-dir", "/var/c", "--cache-dir-size", "2G", "--read-only", "--durability", "remote", "--no-writeback-cache", "--threads", "8"]);
    }

    #[test]
    fn metrics_is_an_option_too() {
        assert_eq!(tr("metrics=127.0.0.1:9567,ro").unwrap(), ["--metrics", "127.0.0.1:9567", "--read-only"]);
    }

    #[test]
    fn the_metadata_database_is_an_option_too() {
        assert_eq!(tr("meta=postgres://cairn@db:5432/vol?sslmode=disable,ro").unwrap(), ["--meta", "postgres://cairn@db:5432/vol?sslmode=disable", "--read-only"]);
    }

    #[test]
    fn a_tapes_mirror_is_an_option_too() {
        assert_eq!(tr("mirror=/srv/mirror,tape_memory=2G").unwrap(), ["--mirror", "/srv/mirror", "--tape-memory", "2G"]);
        assert_eq!(tr("no_mirror").unwrap(), ["--no-mirror"]);
    }

    #[test]
    fn system_options_are_passed_over() {
        let got = tr("rw,nofail,noauto,auto,user,users,x-systemd.automount,x-systemd.requires=network-online.target,comment=systemd.x,nosuid,nodev").unwrap();
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn unknown_options_are_named() {
        let e = tr("ro,cache_dri=/x").unwrap_err().to_string();
        assert!(e.contains("unknown mount option `cache_dri`"), "{e}");
        assert!(translate(&mount_cmd(), &["bogus,ro".into()], true, None).is_ok(), "sloppy (-s) ignores unknown options");
        assert!(tr("threads").unwrap_err().to_string().contains("needs a value"));
        assert!(tr("private=1").unwrap_err().to_string().contains("takes no value"));
        assert!(tr("no_allow_other=1").unwrap_err().to_string().contains("takes no value"));
    }

    #[test]
    fn no_allow_other_is_private_and_the_old_spelling_still_works() {
        assert_eq!(tr("no_allow_other,ro").unwrap(), ["--private", "--read-only"]);
        assert_eq!(tr("no-allow-other").unwrap(), ["--private"]);
        assert_eq!(tr("private").unwrap(), ["--private"]);
    }

    #[test]
    fn passphrase_only_from_a_file_or_a_credential() {
        let e = tr("passphrase=hunter2").unwrap_err().to_string();
        assert!(e.contains("never goes in the mount options"), "{e}");
        assert!(!e.contains("hunter2"), "the error repeats the secret: {e}");
        let dir = tempfile::tempdir().unwrap();
        let none = translate(&mount_cmd(), &["ro".into()], false, Some(dir.path())).unwrap();
        assert_eq!(none, os(&["--read-only"]), "no credential file: no flag");
        std::fs::write(dir.path().join(CREDENTIAL), "secret\n").unwrap();
        let cred = dir.path().join(CREDENTIAL).into_os_string();
        let got = translate(&mount_cmd(), &["ro".into()], false, Some(dir.path())).unwrap();
        assert_eq!(got, [OsString::from("--read-only"), "--passphrase-file".into(), cred]);
        let got = translate(&mount_cmd(), &["passphrase_file=/etc/p".into()], false, Some(dir.path())).unwrap();
        assert_eq!(got, os(&["--passphrase-file", "/etc/p"]), "the option wins over the credential");
    }

    #[test]
    fn quoted_values_and_last_one_wins() {
        assert_eq!(tr("gc_prices=\"/a,b.toml\",threads=2,threads=3").unwrap(), ["--gc-prices", "/a,b.toml", "--threads", "3"]);
    }

    #[test]
    fn invocation_as_mount8_makes_it() {
        let inv = parse_invocation(&os(&["s3://b/p", "/mnt/x", "-n", "-o", "rw,ro", "-t", "fuse.cairn", "-oprivate"])).unwrap();
        assert_eq!(inv, Invocation { volume: "s3://b/p".into(), mountpoint: "/mnt/x".into(), options: vec!["rw,ro".into(), "private".into()], sloppy: false, fake: false });
        let inv = parse_invocation(&os(&["-sf", "v", "m"])).unwrap();
        assert!(inv.sloppy && inv.fake);
        assert!(parse_invocation(&os(&["v"])).unwrap_err().to_string().contains("expected VOLUME and MOUNTPOINT"));
        assert!(parse_invocation(&os(&["v", "m", "-o"])).is_err());
    }

    #[test]
    fn the_whole_line_parses_as_cairn_mount() {
        let mut argv = os(&["cairn", "mount", "/v", "/m"]);
        argv.extend(translate(&mount_cmd(), &["cache_size=512M,log_file=/var/log/c.log,gc_interval=0".into()], false, None).unwrap());
        assert!(crate::Cli::try_parse_from(&argv).is_ok());
        argv.extend(os(&["--durability", "sometimes"]));
        assert!(crate::Cli::try_parse_from(&argv).is_err());
    }
}
