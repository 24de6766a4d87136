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

use crate::device::Device;
use crate::error::{Error, Result};
use std::time::Instant;

/// An ordered queue of work on one device.
pub struct Stream {
    inner: StreamInner,
}

enum StreamInner {
    Cpu,
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
            #[cfg(feature = "npu")]
            Device::Npu(ordinal) => Ok(Stream {
                inner: StreamInner::Npu(crate::npu::NpuStream::new(ordinal)?),
            }),
            #[cfg(not(feature = "npu"))]
            Device::Npu(_) => Err(Error::NotCompiled {
                what: "Stream::new",
                device,
            }),
        }
    }

    /// The host stream.
    pub fn cpu() -> Stream {
        Stream {
            inner: StreamInner::Cpu,
        }
    }

    pub fn device(&self) -> Device {
        match &self.inner {
            StreamInner::Cpu => Device::Cpu,
            #[cfg(feature = "npu")]
            StreamInner::Npu(s) => Device::Npu(s.ordinal()),
        }
    }

    /// The `aclrtStream` owner of an NPU stream; `None` for the host stream.
    #[cfg(feature = "npu")]
    pub fn acl_stream(&self) -> Option<&crate::npu::NpuStream> {
        match &self.inner {
            StreamInner::Cpu => None,
            StreamInner::Npu(s) => Some(s),
        }
    }

    /// Blocks until all work queued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            StreamInner::Cpu => Ok(()),
            #[cfg(feature = "npu")]
            StreamInner::Npu(s) => s.synchronize(),
        }
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
        match (&self.inner, &event.inner) {
            // Host work is complete when issued.
            (StreamInner::Cpu, EventInner::Cpu) => Ok(()),
            #[cfg(feature = "npu")]
            (StreamInner::Npu(s), EventInner::Npu(e)) => s.wait(e),
            #[cfg(feature = "npu")]
            _ => Err(backend_mismatch(
                "Stream::wait",
                self.device(),
                event.device(),
            )),
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
#[cfg(feature = "npu")]
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
            #[cfg(feature = "npu")]
            EventInner::Npu(e) => Device::Npu(e.ordinal()),
        }
    }

    /// Marks the current end of `stream`.
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        check_same("Event::record", self.device(), stream.device())?;
        match (&self.inner, &stream.inner) {
            (EventInner::Cpu, StreamInner::Cpu) => {}
            #[cfg(feature = "npu")]
            (EventInner::Npu(e), StreamInner::Npu(s)) => e.record(s)?,
            #[cfg(feature = "npu")]
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
            EventInner::Cpu => Ok(()),
            #[cfg(feature = "npu")]
            EventInner::Npu(e) => e.synchronize(),
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
            (EventInner::Cpu, EventInner::Cpu) => {
                Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3)
            }
            #[cfg(feature = "npu")]
            (EventInner::Npu(x), EventInner::Npu(y)) => x.elapsed_ms(y),
            #[cfg(feature = "npu")]
            _ => Err(backend_mismatch(
                "Event::elapsed_ms",
                self.device(),
                end.device(),
            )),
        }
    }
}
