//! Long-lived threads for blocking I/O: pack uploads, and the prefetch
//! reads of a bucket or a local disk.
//!
//! A flush round seals a pack every `pack_target` bytes and hands it here
//! so chunking goes on meanwhile; a round waits for its own uploads before
//! it commits the metadata that names them (docs/format.md, rule 2). A new
//! OS thread per pack cost a `clone`, a fresh stack and its page faults
//! for every pack, and on a volume of small flush rounds (untar, PostMark)
//! one per round. Prefetch reads wait on the network or the disk: on
//! rayon's pool (one thread per core) two of them held every worker the
//! flush hashes with, and a local disk read without the page cache's
//! read-ahead needs several in flight. The threads start at the first job.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// A pool of `n` threads named `name-K`.
pub(crate) struct Workers {
    name: &'static str,
    n: usize,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// A job handed to the workers; [`Pending::wait`] gives its result.
pub(crate) struct Pending(mpsc::Receiver<Result<()>>);

impl Pending {
    pub(crate) fn wait(self) -> Result<()> {
        self.0.recv().unwrap_or_else(|_| Err(Error::io("a background I/O job failed: its worker panicked")))
    }
}

impl Workers {
    pub(crate) const fn new(name: &'static str, n: usize) -> Self {
        Workers { name, n, queue: Mutex::new(None), workers: Mutex::new(Vec::new()) }
    }

    /// Runs `job` on a worker; starts the workers on first use.
    pub(crate) fn submit(&self, job: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Pending> {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let wrapped: Job = Box::new(move || {
            // A panic drops `done_tx` unsent: the waiter gets an error, and
            // the worker lives on for the next job.
            if let Ok(r) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
                let _ = done_tx.send(r);
            }
        });
        let mut q = self.queue.lock();
        if q.is_none() {
            *q = Some(self.start()?);
        }
        q.as_ref().expect("started").send(wrapped).map_err(|_| Error::io(format!("the {} threads are gone", self.name)))?;
        Ok(Pending(done_rx))
    }

    fn start(&self) -> Result<mpsc::Sender<Job>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = self.workers.lock();
        for i in 0..self.n {
            let rx = rx.clone();
            let h = std::thread::Builder::new()
                .name(format!("{}-{i}", self.name))
                .spawn(move || loop {
                    // The lock is held only while taking a job, not while running it.
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return, // the volume is closing
                    }
                })
                .map_err(|e| Error::io(format!("starting a {} thread: {e}", self.name)))?;
            workers.push(h);
        }
        Ok(tx)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Closing the queue ends each worker once the jobs queued are done.
        self.queue.lock().take();
        for h in self.workers.lock().drain(..) {
            // A job may hold the last reference to what owns this pool (a
            // prefetch holds the volume): a worker does not wait for itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_on_the_same_few_threads_and_a_panic_is_an_error() {
        let up = Workers::new("cairn-test", 4);
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
        assert!(seen.lock().len() <= 4, "{} threads ran 40 jobs", seen.lock().len());
        assert_eq!(up.workers.lock().len(), 4);
        let err = up.submit(|| panic!("injected")).unwrap().wait().unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        up.submit(|| Err(Error::io("store down"))).unwrap().wait().unwrap_err();
        up.submit(|| Ok(())).unwrap().wait().unwrap();
    }

    #[test]
    fn a_pool_dropped_by_its_own_job_does_not_wait_for_itself() {
        let up = Arc::new(Workers::new("cairn-test", 2));
        let held = Arc::new(Mutex::new(Some(up.clone())));
        let h2 = held.clone();
        drop(up);
        let (tx, rx) = mpsc::channel();
        held.lock().as_ref().unwrap().submit(move || {
            // The job drops the last reference to the pool on its own thread.
            let last = h2.lock().take();
            drop(last);
            tx.send(()).unwrap();
            Ok(())
        })
        .unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the job finished");
    }
}
