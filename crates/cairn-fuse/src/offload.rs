//! Requests that may wait on a disk or a device flush (reads, fsyncs),
//! handed off the threads that read /dev/fuse: with one reading thread,
//! metadata requests are then served one after another without contending,
//! and a read waiting on the disk holds a worker, not the reader.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of worker threads running jobs in the order given.
pub struct Offload {
    tx: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Offload {
    /// Starts `n` workers (at least one).
    pub fn new(n: usize) -> std::io::Result<Offload> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new().name(format!("cairn-fuse-io-{i}")).spawn(move || loop {
                    // The lock is held only to take the next job.
                    let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    };
                    job();
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Offload { tx: Some(tx), threads })
    }

    /// Runs `job` on a worker (on this thread once the workers are stopped).
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        match &self.tx {
            Some(tx) => {
                if let Err(mpsc::SendError(job)) = tx.send(Box::new(job)) {
                    job();
                }
            }
            None => job(),
        }
    }

    /// Lets the workers finish what they were given, then ends them.
    pub fn stop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Offload {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_every_job_before_stop_returns_and_after_it_inline() {
        let mut o = Offload::new(3).unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        for _ in 0..100 {
            let n = n.clone();
            o.run(move || {
                std::thread::sleep(std::time::Duration::from_micros(50));
                n.fetch_add(1, Ordering::SeqCst);
            });
        }
        o.stop();
        assert_eq!(n.load(Ordering::SeqCst), 100);
        let n2 = n.clone();
        o.run(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 101, "a stopped pool runs jobs inline");
    }
}
