//! Pack uploads on a few long-lived threads.
//!
//! A flush round seals a pack every `pack_target` bytes and hands it here
//! so chunking goes on meanwhile; a round waits for its own uploads before
//! it commits the metadata that names them (docs/format.md, rule 2). A new
//! OS thread per pack cost a `clone`, a fresh stack and its page faults
//! for every pack, and on a volume of small flush rounds (untar, PostMark)
//! one per round; these workers are started once, at the first upload.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// Workers: enough for two uploads in flight per round with a second round
/// (an fsync's, the cleaner's) beside the flusher's.
const WORKERS: usize = 4;

#[derive(Default)]
pub(crate) struct Uploader {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// An upload handed to the workers; [`Pending::wait`] gives its result.
pub(crate) struct Pending(mpsc::Receiver<Result<()>>);

impl Pending {
    pub(crate) fn wait(self) -> Result<()> {
        self.0.recv().unwrap_or_else(|_| Err(Error::io("a pack upload failed: its worker panicked")))
    }
}

impl Uploader {
    /// Runs `job` on a worker; starts the workers on first use.
    pub(crate) fn submit(&self, job: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Pending> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let wrapped: Job = Box::new(move || {
            // A panic drops `done_tx` unsent: the waiter gets an error, and
            // the worker lives on for the next upload.
            if let Ok(r) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
                let _ = done_tx.send(r);
            }
        });
        let mut q = self.queue.lock();
        if q.is_none() {
            *q = Some(self.start()?);
        }
        q.as_ref().expect("started").send(wrapped).map_err(|_| Error::io("the pack upload workers are gone"))?;
        Ok(Pending(done_rx))
    }

    fn start(&self) -> Result<mpsc::Sender<Job>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = self.workers.lock();
        for i in 0..WORKERS {
            let rx = rx.clone();
            let h = std::thread::Builder::new()
                .name(format!("cairn-upload-{i}"))
                .spawn(move || loop {
                    // The lock is held only while taking a job, not while running it.
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return, // the volume is closing
                    }
                })
                .map_err(|e| Error::io(format!("starting a pack upload thread: {e}")))?;
            workers.push(h);
        }
        Ok(tx)
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        // Closing the queue ends each worker once the jobs queued are done.
        self.queue.lock().take();
        for h in self.workers.lock().drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_run_on_the_same_few_threads_and_a_panic_is_an_error() {
        let up = Uploader::default();
        let seen = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let pending: Vec<Pending> = (0..40)
            .map(|_| {
                let seen = seen.clone();
                up.submit(move || {
                    seen.lock().insert(std::thread::current().id());
                    Ok(())
                })
                .unwrap()
            })
            .collect();
        pending.into_iter().for_each(|p| p.wait().unwrap());
        assert!(seen.lock().len() <= WORKERS, "{} threads ran 40 uploads", seen.lock().len());
        assert_eq!(up.workers.lock().len(), WORKERS);
        let err = up.submit(|| panic!("injected")).unwrap().wait().unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        up.submit(|| Err(Error::io("store down"))).unwrap().wait().unwrap_err();
        up.submit(|| Ok(())).unwrap().wait().unwrap();
    }
}
