//! Preemption: a scheduler sends SIGTERM (a user SIGINT) before it kills a job. With
//! [`install`] (what `cannon train` does), the first such signal only sets a flag: the run
//! finishes its step, the ranks agree on it (any rank's flag stops every rank after the same
//! step), every rank writes its part of a checkpoint as the periodic ones, and the process
//! exits with [`EXIT_PREEMPTED`]; `checkpoint.resume = true` then continues bit for bit
//! (Megatron's `--exit-signal-handler`). A second signal stops the process at once.
//!
//! The same signal can arrive twice for one event: a scheduler signals every process of the
//! job, `cannon launch` included, which forwards it to its ranks. A second signal counts only
//! when it comes [`SECOND_SIGNAL_AFTER`] or more after the first.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

/// The exit code of a run stopped by a signal after writing its checkpoint: sysexits'
/// `EX_TEMPFAIL` ("try again later"), which a job script can tell from a failure (1, 2) and
/// from a kill (128 + the signal) and answer by requeueing the job.
pub const EXIT_PREEMPTED: u8 = 75;

/// How long after the first signal a second one stops the process at once.
pub const SECOND_SIGNAL_AFTER: Duration = Duration::from_secs(1);

/// The first signal received (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// When it came, in ms of CLOCK_MONOTONIC (+1, so that 0 means never).
static FIRST_AT_MS: AtomicU64 = AtomicU64::new(0);

/// Milliseconds of CLOCK_MONOTONIC, read in the handler (clock_gettime is
/// async-signal-safe).
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_MONOTONIC always exists on
    // Linux, and on failure the zeroed value is read.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomics, clock_gettime and _exit: all async-signal-safe.
    let now = monotonic_ms() + 1;
    match FIRST_AT_MS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => SIGNAL.store(sig, Ordering::SeqCst),
        Err(first) if now.saturating_sub(first) >= SECOND_SIGNAL_AFTER.as_millis() as u64 => {
            // SAFETY: _exit ends the process without running anything of this one's state
            // (no destructor, no flush of a half-written buffer): what a kill would do.
            unsafe { libc::_exit(128 + sig) }
        }
        Err(_) => {}
    }
}

/// Makes SIGTERM and SIGINT ask the run to stop after its step (see the module). Called by
/// `cannon train` before its ranks start; a library caller that wants the same calls it too.
pub fn install() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a sigaction with a handler that only touches atomics, reads the monotonic
        // clock and may _exit (all async-signal-safe); SA_RESTART keeps the run's blocking
        // reads and writes from failing with EINTR.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// The signal that asked the run to stop, if one did.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The name of a stop signal for messages.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}
