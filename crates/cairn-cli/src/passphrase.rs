//! Getting a passphrase: a file, the CAIRN_PASSPHRASE variable, or a prompt.
//! It is kept in zeroizing memory and never written anywhere.

use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::path::Path;
use zeroize::Zeroizing;

pub fn get(file: Option<&Path>, confirm: bool) -> Result<Zeroizing<Vec<u8>>> {
    if let Some(f) = file {
        let raw = Zeroizing::new(std::fs::read(f).with_context(|| format!("reading passphrase file {}", f.display()))?);
        let line = raw.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            bail!("passphrase file {} is empty", f.display());
        }
        return Ok(Zeroizing::new(line.to_vec()));
    }
    if let Ok(p) = std::env::var("CAIRN_PASSPHRASE") {
        if p.is_empty() {
            bail!("CAIRN_PASSPHRASE is set but empty");
        }
        return Ok(Zeroizing::new(p.into_bytes()));
    }
    if !std::io::stdin().is_terminal() {
        bail!("this needs a passphrase: give it with --passphrase-file FILE or CAIRN_PASSPHRASE, or run on a terminal");
    }
    let p = Zeroizing::new(rpassword::prompt_password("Passphrase: ").context("reading the passphrase")?);
    if p.is_empty() {
        bail!("empty passphrase");
    }
    if confirm {
        let again = Zeroizing::new(rpassword::prompt_password("Repeat passphrase: ").context("reading the passphrase")?);
        if *again != *p {
            bail!("the passphrases differ");
        }
    }
    Ok(Zeroizing::new(p.as_bytes().to_vec()))
}
