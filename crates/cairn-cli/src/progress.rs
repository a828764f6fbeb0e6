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
