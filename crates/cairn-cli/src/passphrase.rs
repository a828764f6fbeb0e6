//! Getting a passphrase: a file, the CAIRN_PASSPHRASE variable, or a prompt.
//! It is kept in zeroizing memory and never written anywhere.

use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::path::Path;
use zeroize::Zeroizing;

/// Longest passphrase line read from a file. The read stops there, so a
/// mistaken `--passphrase-file /dev/zero` (or a huge file) fails at once.
pub const MAX_PASSPHRASE_FILE_LINE: usize = 4096;

/// The first line of a passphrase file (without `\n` or `\r\n`), reading at
/// most [`MAX_PASSPHRASE_FILE_LINE`] + 1 bytes.
fn first_line(r: impl std::io::Read, f: &Path) -> Result<Zeroizing<Vec<u8>>> {
    use std::io::Read;
    let mut raw = Zeroizing::new(Vec::with_capacity(MAX_PASSPHRASE_FILE_LINE + 2));
    r.take(MAX_PASSPHRASE_FILE_LINE as u64 + 2)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading passphrase file {}", f.display()))?;
    let line = match raw.iter().position(|&b| b == b'\n') {
        Some(n) => &raw[..n],
        None => &raw[..],
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > MAX_PASSPHRASE_FILE_LINE {
        bail!(
            "passphrase file {}: the first line is longer than {MAX_PASSPHRASE_FILE_LINE} bytes (is it the right file? the passphrase is its first line)",
            f.display()
        );
    }
    if line.is_empty() {
        bail!("passphrase file {} is empty", f.display());
    }
    Ok(Zeroizing::new(line.to_vec()))
}

pub fn get(file: Option<&Path>, confirm: bool) -> Result<Zeroizing<Vec<u8>>> {
    if let Some(f) = file {
        let file = std::fs::File::open(f).with_context(|| format!("reading passphrase file {}", f.display()))?;
        return first_line(file, f);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passphrase_file_read_is_bounded() {
        // /dev/zero never ends: the read must stop and say why.
        let e = get(Some(Path::new("/dev/zero")), false).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("longer than 4096 bytes"), "{msg}");
        assert!(msg.contains("/dev/zero"), "{msg}");
    }

    #[test]
    fn passphrase_file_first_line() {
        let p = Path::new("x");
        assert_eq!(&first_line(&b"secret\nrest"[..], p).unwrap()[..], b"secret");
        assert_eq!(&first_line(&b"secret\r\n"[..], p).unwrap()[..], b"secret");
        assert_eq!(&first_line(&b"secret"[..], p).unwrap()[..], b"secret");
        let max = vec![b'a'; MAX_PASSPHRASE_FILE_LINE];
        assert_eq!(first_line(&max[..], p).unwrap().len(), MAX_PASSPHRASE_FILE_LINE);
        let mut crlf = max.clone();
        crlf.extend_from_slice(b"\r\n");
        assert_eq!(first_line(&crlf[..], p).unwrap().len(), MAX_PASSPHRASE_FILE_LINE);
        let long = vec![b'a'; MAX_PASSPHRASE_FILE_LINE + 1];
        assert!(first_line(&long[..], p).is_err());
        // A long second line does not matter.
        let mut two = b"pw\n".to_vec();
        two.extend(std::iter::repeat_n(b'z', 1 << 20));
        assert_eq!(&first_line(&two[..], p).unwrap()[..], b"pw");
        assert!(first_line(&b""[..], p).is_err());
        assert!(first_line(&b"\nx"[..], p).is_err());
    }
}
