//! Emulated streams: each one a worker thread running its queued jobs in order.
//!
//! Queuing returns at once, as `aclnn*` and `aclrtMemcpyAsync` do on hardware, so a caller
//! that reads results without synchronising sees the bug. A job's error is sticky: later jobs
//! of the stream are skipped and the error is returned by the next synchronise (as an AI Core
//! error surfaces at `aclrtSynchronizeStream`).

use crate::error::{EmuError, EmuResult};
use crate::handle::Registry;
use parking_lot::{Condvar, Mutex};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Streams created by `aclrtCreateStream`, by handle.
pub static STREAMS: Registry<Stream> =
    Registry::new("aclrtStream", cannon_sys::acl::ACL_ERROR_RT_PARAM_INVALID);

/// A unit of queued work.
pub type Job = Box<dyn FnOnce() -> EmuResult<()> + Send>;

#[derive(Default)]
struct Progress {
    queued: u64,
    done: u64,
    error: Option<EmuError>,
    /// While set, the worker waits before its next job (the `cannon_emu_stream_hold` test hook).
    held: bool,
}

/// What a stream's owner and its worker share.
#[derive(Default)]
pub struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    /// How many jobs have run (or been skipped after an error).
    pub fn done(&self) -> u64 {
        self.progress.lock().done
    }

    /// Blocks until job number `seq` (1-based, from [`Stream::enqueue`]) has run, or `timeout`.
    pub fn wait_for(&self, seq: u64, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut p = self.progress.lock();
        while p.done < seq {
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut p, d).timed_out() {
                        return p.done >= seq;
                    }
                }
                None => self.changed.wait(&mut p),
            }
        }
        true
    }
}

/// One emulated stream of device `device`.
pub struct Stream {
    pub device: u32,
    tx: Mutex<Option<Sender<Job>>>,
    shared: Arc<Shared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Stream {
    pub fn new(device: u32) -> EmuResult<Self> {
        let (tx, rx) = channel::<Job>();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("emu-npu{device}-stream"))
            .spawn(move || {
                for job in rx {
                    let skip = {
                        let mut p = s.progress.lock();
                        while p.held {
                            s.changed.wait(&mut p);
                        }
                        p.error.is_some()
                    };
                    // A panicking job must not kill the worker (waiters would hang): it
                    // becomes the stream's error.
                    let r = if skip {
                        Ok(())
                    } else {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).unwrap_or_else(
                            |_| {
                                Err(EmuError::new(
                                    cannon_sys::acl::ACL_ERROR_INTERNAL_ERROR,
                                    "internal error: a queued task panicked in the emulator",
                                ))
                            },
                        )
                    };
                    let mut p = s.progress.lock();
                    if let Err(e) = r {
                        p.error.get_or_insert(e);
                    }
                    p.done += 1;
                    drop(p);
                    s.changed.notify_all();
                }
            })
            .map_err(|e| {
                EmuError::new(
                    cannon_sys::acl::ACL_ERROR_RT_PARAM_INVALID,
                    format!("cannot start a stream worker thread: {e}"),
                )
            })?;
        Ok(Self {
            device,
            tx: Mutex::new(Some(tx)),
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Queues `job`; returns its sequence number (for events).
    pub fn enqueue(&self, job: Job) -> EmuResult<u64> {
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else {
            return Err(EmuError::new(
                cannon_sys::acl::ACL_ERROR_RT_PARAM_INVALID,
                "the stream was destroyed",
            ));
        };
        let seq = {
            let mut p = self.shared.progress.lock();
            p.queued += 1;
            p.queued
        };
        tx.send(job).map_err(|_| {
            EmuError::new(
                cannon_sys::acl::ACL_ERROR_RT_PARAM_INVALID,
                "the stream's worker has stopped",
            )
        })?;
        Ok(seq)
    }

    /// Holds the worker before its next job (`true`) or lets it go on (`false`).
    pub fn hold(&self, held: bool) {
        self.shared.progress.lock().held = held;
        self.shared.changed.notify_all();
    }

    /// The sequence number of the last queued job (0: none yet).
    pub fn position(&self) -> u64 {
        self.shared.progress.lock().queued
    }

    /// What waiters on this stream's progress hold.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Waits for everything queued so far; returns (and clears) the first job error.
    /// `Ok(false)` when `timeout` passed first (the caller maps it to its timeout code).
    pub fn synchronize(&self, timeout: Option<Duration>) -> EmuResult<bool> {
        let seq = self.position();
        if !self.shared.wait_for(seq, timeout) {
            return Ok(false);
        }
        match self.shared.progress.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Closing the channel ends the worker after the queued jobs (aclrtDestroyStream waits
        // for them too); a held worker is released so that it can.
        self.hold(false);
        self.tx.lock().take();
        if let Some(w) = self.worker.lock().take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn jobs_run_in_order_off_the_calling_thread() {
        let s = Stream::new(0).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let caller = std::thread::current().id();
        for i in 0..5 {
            let seen = seen.clone();
            s.enqueue(Box::new(move || {
                assert_ne!(std::thread::current().id(), caller);
                seen.lock().push(i);
                Ok(())
            }))
            .unwrap();
        }
        assert!(s.synchronize(None).unwrap());
        assert_eq!(*seen.lock(), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn an_error_is_sticky_until_synchronise() {
        let s = Stream::new(0).unwrap();
        let ran = Arc::new(AtomicU32::new(0));
        s.enqueue(Box::new(|| Err(EmuError::new(7, "boom"))))
            .unwrap();
        let r = ran.clone();
        s.enqueue(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        assert_eq!(s.synchronize(None).unwrap_err().code, 7);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "jobs after a failure are skipped"
        );
        assert!(s.synchronize(None).unwrap());
    }
}
