//! Progress bars for long maintenance work, shown only on a terminal.

use cairn_engine::maintenance::Progress;
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use std::io::IsTerminal;

pub struct Bars {
    enabled: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl Bars {
    pub fn new(enabled: bool) -> Self {
        Bars { enabled: enabled && std::io::stderr().is_terminal(), bar: Mutex::new(None) }
    }
    pub fn finish(&self) {
        if let Some(b) = self.bar.lock().take() {
            b.finish_and_clear();
        }
    }
}

impl Progress for Bars {
    fn phase(&self, name: &str, total: u64) {
        if !self.enabled {
            return;
        }
        let mut g = self.bar.lock();
        if let Some(b) = g.take() {
            b.finish_and_clear();
        }
        let b = ProgressBar::new(total);
        b.set_style(ProgressStyle::with_template("{prefix:>10} [{bar:40}] {pos}/{len} {eta}").expect("template").progress_chars("=> "));
        b.set_prefix(name.to_string());
        *g = Some(b);
    }
    fn inc(&self, n: u64) {
        if let Some(b) = &*self.bar.lock() {
            b.inc(n);
        }
    }
}

/// Copies `r` to the end of `w` (after `head`), with a byte progress bar
/// named `prefix` on a terminal when the total `len` is known. Returns the
/// bytes written, `head` included.
pub fn copy_with_bar(prefix: &str, head: &[u8], mut r: impl std::io::Read, w: &std::fs::File, len: Option<u64>) -> anyhow::Result<u64> {
    use anyhow::Context;
    use std::io::Write;
    let bar = len.filter(|_| std::io::stderr().is_terminal()).map(|l| {
        let b = ProgressBar::new(l);
        b.set_style(ProgressStyle::with_template("{prefix:>10} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}").expect("template").progress_chars("=> "));
        b.set_prefix(prefix.to_string());
        b
    });
    let mut out = std::io::BufWriter::with_capacity(1 << 20, w);
    out.write_all(head).context("writing into the volume")?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = head.len() as u64;
    loop {
        let n = r.read(&mut buf).context("reading the source")?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).context("writing into the volume")?;
        total += n as u64;
        if let Some(b) = &bar {
            b.set_position(total);
        }
    }
    out.flush().context("writing into the volume")?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(total)
}
