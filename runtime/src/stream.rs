//! Streams order work on a device; events mark points in a stream for waiting and timing.
//!
//! On the CPU a stream runs work in order on the calling thread, so work is complete when a
//! call returns: `synchronize` and `wait` have nothing to do and an event records the
//! wall-clock time at which it was recorded. On the NPU they are `aclrtStream`/`aclrtEvent`.
//!
//! The backend is an enum inside each handle (`StreamInner`, `EventInner`): one variant per
//! backend this build contains, each owning what that backend needs (nothing on the CPU, the
//! ACL handle on an NPU). The device is read off the variant, so a stream cannot claim an NPU
//! while holding no ACL handle, and code that serves both backends is a `match` the compiler
//! checks for completeness in every feature combination, rather than optional fields that
//! exist only under `#[cfg(feature = "npu")]` and must be kept in step with a device field.
//!
//! Every stream has a process-unique [`Stream::id`], and the caching allocator keeps a weak
//! reference (`StreamRef`) to the streams a block was used on, to record an event on them
//! when the block is freed (see [`crate::alloc`]). A dropped NPU stream drains its queue
//! first, so a stream that is gone has no work left that could touch a block.

use crate::device::Device;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// An ordered queue of work on one device.
pub struct Stream {
    id: u64,
    /// Shared only with the allocator's weak references; dropping the `Stream` drops it.
    inner: Arc<StreamInner>,
}

/// Ids start at 1 and are never reused within a process.
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) enum StreamInner {
    Cpu,
    /// The meta device's: nothing runs, so nothing is ever pending.
    Meta,
    #[cfg(feature = "npu")]
    Npu(crate::npu::NpuStream),
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.device())
    }
}

impl Stream {
    /// A new stream on `device`.
    pub fn new(device: Device) -> Result<Stream> {
        match device {
            Device::Cpu => Ok(Stream::cpu()),
            Device::Meta => Ok(Stream::with_inner(StreamInner::Meta)),
            #[cfg(feature = "npu")]
            Device::Npu(ordinal) => Ok(Stream::with_inner(StreamInner::Npu(
                crate::npu::NpuStream::new(ordinal)?,
            ))),
            #[cfg(not(feature = "npu"))]
            Device::Npu(_) => Err(Error::NotCompiled {
                what: "Stream::new",
                device,
            }),
        }
    }

    /// The host stream.
    pub fn cpu() -> Stream {
        Stream::with_inner(StreamInner::Cpu)
    }

    fn with_inner(inner: StreamInner) -> Stream {
        Stream {
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            inner: Arc::new(inner),
        }
    }

    /// This stream's process-unique id (what the allocator's per-block records name).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn device(&self) -> Device {
        self.inner.device()
    }

    /// A weak reference for the allocator's records of the streams a block was used on.
    pub(crate) fn weak(&self) -> StreamRef {
        StreamRef {
            id: self.id,
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The `aclrtStream` owner of an NPU stream; `None` for the host stream.
    #[cfg(feature = "npu")]
    pub fn acl_stream(&self) -> Option<&crate::npu::NpuStream> {
        match &*self.inner {
            StreamInner::Cpu | StreamInner::Meta => None,
            StreamInner::Npu(s) => Some(s),
        }
    }

    /// Blocks until all work queued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Records an event at the current end of the stream.
    pub fn record(&self) -> Result<Event> {
        let mut e = Event::new(self.device())?;
        e.record(self)?;
        Ok(e)
    }

    /// Makes later work on this stream wait for `event` (possibly recorded on another stream).
    pub fn wait(&self, event: &Event) -> Result<()> {
        check_same("Stream::wait", self.device(), event.device())?;
        match (&*self.inner, &event.inner) {
            // Host work is complete when issued; meta work is never issued.
            (StreamInner::Cpu, EventInner::Cpu) | (StreamInner::Meta, EventInner::Meta) => Ok(()),
            #[cfg(feature = "npu")]
            (StreamInner::Npu(s), EventInner::Npu(e)) => s.wait(e),
            _ => Err(backend_mismatch(
                "Stream::wait",
                self.device(),
                event.device(),
            )),
        }
    }
}

impl StreamInner {
    fn device(&self) -> Device {
        match self {
            StreamInner::Cpu => Device::Cpu,
            StreamInner::Meta => Device::Meta,
            #[cfg(feature = "npu")]
            StreamInner::Npu(s) => Device::Npu(s.ordinal()),
        }
    }

    fn synchronize(&self) -> Result<()> {
        match self {
            StreamInner::Cpu | StreamInner::Meta => Ok(()),
            #[cfg(feature = "npu")]
            StreamInner::Npu(s) => s.synchronize(),
        }
    }
}

/// A stream as the allocator remembers it: its id, and a weak handle that lets it record an
/// event there while the stream lives without keeping the stream alive.
#[derive(Clone)]
pub(crate) struct StreamRef {
    pub(crate) id: u64,
    inner: Weak<StreamInner>,
}

impl StreamRef {
    /// Records `event` at the current end of the stream: `Ok(true)` when recorded, `Ok(false)`
    /// when the stream is gone (its drop drained it, so no work of it is pending).
    pub(crate) fn record(&self, event: &mut Event) -> Result<bool> {
        match self.inner.upgrade() {
            Some(inner) => event.record_inner(&inner).map(|()| true),
            None => Ok(false),
        }
    }

    /// Waits for everything queued on the stream so far (the fallback when an event cannot
    /// be recorded); a stream that is gone has nothing queued.
    pub(crate) fn synchronize(&self) -> Result<()> {
        match self.inner.upgrade() {
            Some(inner) => inner.synchronize(),
            None => Ok(()),
        }
    }
}

fn check_same(what: &'static str, expected: Device, found: Device) -> Result<()> {
    if expected != found {
        return Err(Error::DeviceMismatch {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// Two handles of one device whose backends differ: impossible once their devices compared
/// equal (the device is read off the backend), but typed rather than assumed.
fn backend_mismatch(what: &'static str, expected: Device, found: Device) -> Error {
    Error::DeviceMismatch {
        what,
        expected,
        found,
    }
}

/// A marker in a stream: wait for it, or time the work between two of them.
pub struct Event {
    recorded_at: Option<Instant>,
    inner: EventInner,
}

enum EventInner {
    Cpu,
    Meta,
    #[cfg(feature = "npu")]
    Npu(crate::npu::NpuEvent),
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Event({}, recorded: {})",
            self.device(),
            self.recorded_at.is_some()
        )
    }
}

impl Event {
    /// A timing-capable event on `device`, not yet recorded.
    pub fn new(device: Device) -> Result<Event> {
        let inner = match device {
            Device::Cpu => EventInner::Cpu,
            Device::Meta => EventInner::Meta,
            #[cfg(feature = "npu")]
            Device::Npu(ordinal) => EventInner::Npu(crate::npu::NpuEvent::new(ordinal)?),
            #[cfg(not(feature = "npu"))]
            Device::Npu(_) => {
                return Err(Error::NotCompiled {
                    what: "Event::new",
                    device,
                })
            }
        };
        Ok(Event {
            recorded_at: None,
            inner,
        })
    }

    pub fn device(&self) -> Device {
        match &self.inner {
            EventInner::Cpu => Device::Cpu,
            EventInner::Meta => Device::Meta,
            #[cfg(feature = "npu")]
            EventInner::Npu(e) => Device::Npu(e.ordinal()),
        }
    }

    /// Marks the current end of `stream`.
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        self.record_inner(&stream.inner)
    }

    fn record_inner(&mut self, stream: &StreamInner) -> Result<()> {
        check_same("Event::record", self.device(), stream.device())?;
        match (&self.inner, stream) {
            (EventInner::Cpu, StreamInner::Cpu) | (EventInner::Meta, StreamInner::Meta) => {}
            #[cfg(feature = "npu")]
            (EventInner::Npu(e), StreamInner::Npu(s)) => e.record(s)?,
            _ => {
                return Err(backend_mismatch(
                    "Event::record",
                    self.device(),
                    stream.device(),
                ))
            }
        }
        self.recorded_at = Some(Instant::now());
        Ok(())
    }

    /// Blocks until the work before the event has finished.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            EventInner::Cpu | EventInner::Meta => Ok(()),
            #[cfg(feature = "npu")]
            EventInner::Npu(e) => e.synchronize(),
        }
    }

    /// Whether the work before the event has finished, without waiting (an event never
    /// recorded counts as finished, as `aclrtQueryEventStatus` reports it).
    pub fn query(&self) -> Result<bool> {
        match &self.inner {
            EventInner::Cpu | EventInner::Meta => Ok(true),
            #[cfg(feature = "npu")]
            EventInner::Npu(e) => e.query(),
        }
    }

    /// Milliseconds between this event and a later one (both recorded and synchronized).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let (Some(a), Some(b)) = (self.recorded_at, end.recorded_at) else {
            return Err(Error::NotRecorded {
                what: "Event::elapsed_ms",
            });
        };
        check_same("Event::elapsed_ms", self.device(), end.device())?;
        match (&self.inner, &end.inner) {
            (EventInner::Cpu, EventInner::Cpu) | (EventInner::Meta, EventInner::Meta) => {
                Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3)
            }
            #[cfg(feature = "npu")]
            (EventInner::Npu(x), EventInner::Npu(y)) => x.elapsed_ms(y),
            _ => Err(backend_mismatch(
                "Event::elapsed_ms",
                self.device(),
                end.device(),
            )),
        }
    }
}
