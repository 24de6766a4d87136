//! Streams and events.
//!
//! A stream is a [`Stream`] worker. An event records a point of one stream: recording queues a
//! job that stamps the time when the worker reaches it and remembers the job's sequence
//! number; waiting (`aclrtStreamWaitEvent`) queues a job on the waiting stream that blocks
//! until the recorded stream has run past that number, so work after the wait really runs
//! after the recorded work, on different threads.

use super::context::current_device;
use super::{guard_init, write_out};
use crate::error::{EmuError, EmuResult};
use crate::handle::Registry;
use crate::stream::{Shared, Stream, STREAMS};
use cannon_sys::acl::*;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn invalid(msg: impl Into<String>) -> EmuError {
    EmuError::new(ACL_ERROR_INVALID_PARAM, msg)
}

/// The stream an `aclrtStream` argument names: a created one, or for null the default stream
/// of the calling thread's current device.
pub fn resolve_stream(stream: aclrtStream) -> EmuResult<Arc<Stream>> {
    if stream.is_null() {
        return crate::device::default_stream(current_device()?);
    }
    STREAMS.get(stream as usize)
}

/// # Safety
/// `stream` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError {
    guard_init("aclrtCreateStream", || {
        // SAFETY: forwarded out-pointer.
        unsafe { create_stream(stream) }
    })
}

unsafe fn create_stream(stream: *mut aclrtStream) -> EmuResult<()> {
    if stream.is_null() {
        return Err(invalid("stream is a null pointer"));
    }
    let d = current_device()?;
    let h = STREAMS.insert(Stream::new(d)?);
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { write_out(stream, "stream", h as aclrtStream) }
}

/// # Safety
/// `stream` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStreamWithConfig(
    stream: *mut aclrtStream,
    priority: u32,
    flag: u32,
) -> aclError {
    guard_init("aclrtCreateStreamWithConfig", || {
        // CANN: priority 0 (highest) ..= 7; flags from ACL_STREAM_FAST_LAUNCH | FAST_SYNC.
        if priority > 7 {
            return Err(invalid(format!("priority {priority} is not in 0..=7")));
        }
        if flag & !(ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC) != 0 {
            return Err(invalid(format!(
                "flag {flag:#x} has bits outside ACL_STREAM_*"
            )));
        }
        // SAFETY: forwarded out-pointer.
        unsafe { create_stream(stream) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtDestroyStream(stream: aclrtStream) -> aclError {
    guard_init("aclrtDestroyStream", || {
        if stream.is_null() {
            return Err(invalid(
                "the default stream (null) is not destroyed by aclrtDestroyStream",
            ));
        }
        // CANN: the stream must belong to the current context, and unfinished tasks are
        // waited for (hicann/runtime docs/api_docs/aclrtDestroyStream.md). Dropping the last
        // Arc joins the worker after its queued jobs (Stream::drop).
        let d = current_device()?;
        let dev = STREAMS.get(stream as usize)?.device;
        if dev != d {
            return Err(EmuError::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                format!("the stream belongs to device {dev}, the current context to device {d}"),
            ));
        }
        let s = STREAMS.remove(stream as usize)?;
        let _ = s.synchronize(None);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError {
    guard_init("aclrtSynchronizeStream", || {
        resolve_stream(stream)?.synchronize(None).map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeStreamWithTimeout(stream: aclrtStream, timeout: i32) -> aclError {
    guard_init("aclrtSynchronizeStreamWithTimeout", || {
        // CANN: -1 waits forever, a positive value is milliseconds.
        let t = match timeout {
            -1 => None,
            t if t > 0 => Some(Duration::from_millis(t as u64)),
            t => return Err(invalid(format!("timeout {t} is neither -1 nor > 0 ms"))),
        };
        if resolve_stream(stream)?.synchronize(t)? {
            Ok(())
        } else {
            Err(EmuError::new(
                ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                format!("the stream did not finish within {timeout} ms"),
            ))
        }
    })
}

/// Where an event was last recorded: the stream's progress, the job number, and the time the
/// worker reached it.
#[derive(Clone)]
struct Mark {
    shared: Arc<Shared>,
    seq: u64,
    stamp: Arc<OnceLock<Instant>>,
}

/// An event: its creation flags and its last recording.
pub struct Event {
    device: u32,
    flag: u32,
    mark: Mutex<Option<Mark>>,
}

/// Events by handle.
pub static EVENTS: Registry<Event> = Registry::new("aclrtEvent", ACL_ERROR_INVALID_PARAM);

unsafe fn create_event(event: *mut aclrtEvent, flag: u32) -> EmuResult<()> {
    if event.is_null() {
        return Err(invalid("event is a null pointer"));
    }
    let known = ACL_EVENT_SYNC
        | ACL_EVENT_CAPTURE_STREAM_PROGRESS
        | ACL_EVENT_TIME_LINE
        | ACL_EVENT_DEVICE_USE_ONLY;
    if flag & !known != 0 {
        return Err(invalid(format!(
            "flag {flag:#x} has bits outside ACL_EVENT_*"
        )));
    }
    let device = current_device()?;
    let h = EVENTS.insert(Event {
        device,
        flag,
        mark: Mutex::new(None),
    });
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { write_out(event, "event", h as aclrtEvent) }
}

/// # Safety
/// `event` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEvent(event: *mut aclrtEvent) -> aclError {
    guard_init("aclrtCreateEvent", || {
        // SAFETY: forwarded out-pointer.
        unsafe { create_event(event, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE) }
    })
}

/// # Safety
/// `event` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEventWithFlag(event: *mut aclrtEvent, flag: u32) -> aclError {
    guard_init("aclrtCreateEventWithFlag", || {
        // SAFETY: forwarded out-pointer.
        unsafe { create_event(event, flag) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtDestroyEvent(event: aclrtEvent) -> aclError {
    guard_init("aclrtDestroyEvent", || {
        EVENTS.remove(event as usize).map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn aclrtRecordEvent(event: aclrtEvent, stream: aclrtStream) -> aclError {
    guard_init("aclrtRecordEvent", || {
        let e = EVENTS.get(event as usize)?;
        let s = resolve_stream(stream)?;
        if s.device != e.device {
            return Err(EmuError::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                format!(
                    "event of device {} recorded on a stream of device {}",
                    e.device, s.device
                ),
            ));
        }
        let stamp = Arc::new(OnceLock::new());
        let st = stamp.clone();
        // Hold the mark's lock across the enqueue so that a concurrent wait sees either the
        // previous recording or this one, never a half-made one.
        let mut mark = e.mark.lock();
        let seq = s.enqueue(Box::new(move || {
            let _ = st.set(Instant::now());
            Ok(())
        }))?;
        *mark = Some(Mark {
            shared: s.shared(),
            seq,
            stamp,
        });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtStreamWaitEvent(stream: aclrtStream, event: aclrtEvent) -> aclError {
    guard_init("aclrtStreamWaitEvent", || {
        let e = EVENTS.get(event as usize)?;
        let s = resolve_stream(stream)?;
        // Never recorded: nothing to wait for (the wait captures the event's state now).
        let Some(m) = e.mark.lock().clone() else {
            return Ok(());
        };
        s.enqueue(Box::new(move || {
            m.shared.wait_for(m.seq, None);
            Ok(())
        }))?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeEvent(event: aclrtEvent) -> aclError {
    guard_init("aclrtSynchronizeEvent", || {
        let e = EVENTS.get(event as usize)?;
        if let Some(m) = e.mark.lock().clone() {
            m.shared.wait_for(m.seq, None);
        }
        Ok(())
    })
}

/// # Safety
/// `status` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtQueryEventStatus(
    event: aclrtEvent,
    status: *mut aclrtEventRecordedStatus,
) -> aclError {
    guard_init("aclrtQueryEventStatus", || {
        let e = EVENTS.get(event as usize)?;
        let done = e
            .mark
            .lock()
            .as_ref()
            .is_none_or(|m| m.shared.done() >= m.seq);
        let v = if done {
            ACL_EVENT_RECORDED_STATUS_COMPLETE
        } else {
            ACL_EVENT_RECORDED_STATUS_NOT_READY
        };
        // SAFETY: the caller's out-pointer.
        unsafe { write_out(status, "status", v) }
    })
}

fn stamp_of(e: &Event, which: &str) -> EmuResult<Instant> {
    if e.flag & ACL_EVENT_TIME_LINE == 0 && e.flag != 0 {
        return Err(EmuError::new(
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            format!("{which} was created without ACL_EVENT_TIME_LINE, so it carries no time"),
        ));
    }
    let m = e.mark.lock().clone().ok_or_else(|| {
        EmuError::new(
            ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID,
            format!("{which} was never recorded"),
        )
    })?;
    m.stamp.get().copied().ok_or_else(|| {
        EmuError::new(
            ACL_ERROR_RT_EVENT_NOT_COMPLETE,
            format!("{which} has not completed yet: synchronise it first"),
        )
    })
}

/// # Safety
/// `ms` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn aclrtEventElapsedTime(
    ms: *mut f32,
    startEvent: aclrtEvent,
    endEvent: aclrtEvent,
) -> aclError {
    guard_init("aclrtEventElapsedTime", || {
        let a = stamp_of(&*EVENTS.get(startEvent as usize)?, "startEvent")?;
        let b = stamp_of(&*EVENTS.get(endEvent as usize)?, "endEvent")?;
        let t = if b >= a {
            b.duration_since(a).as_secs_f32() * 1e3
        } else {
            -(a.duration_since(b).as_secs_f32() * 1e3)
        };
        // SAFETY: the caller's out-pointer.
        unsafe { write_out(ms, "ms", t) }
    })
}

/// Test hook, not a CANN function: holds (`hold != 0`) or releases a stream's worker before
/// its next job, so a test can show deterministically that queued work has not run yet (the
/// missing-synchronise bug). Nothing in cannon's library code calls it.
#[no_mangle]
pub extern "C" fn cannon_emu_stream_hold(stream: aclrtStream, hold: i32) -> aclError {
    guard_init("cannon_emu_stream_hold", || {
        resolve_stream(stream)?.hold(hold != 0);
        Ok(())
    })
}
