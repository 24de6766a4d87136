//! Streams order work on a device; events mark points in a stream for waiting and timing.
//!
//! On the CPU a stream runs work in order on the calling thread, so work is complete when a
//! call returns: `synchronize` and `wait` have nothing to do and an event records the
//! wall-clock time at which it was recorded. On the NPU they are `aclrtStream`/`aclrtEvent`.

use crate::device::Device;
use crate::error::{Error, Result};
use std::time::Instant;

/// An ordered queue of work on one device.
pub struct Stream {
    device: Device,
    #[cfg(feature = "npu")]
    npu: Option<crate::npu::NpuStream>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.device)
    }
}

impl Stream {
    /// A new stream on `device`.
    pub fn new(device: Device) -> Result<Stream> {
        match device {
            Device::Cpu => Ok(Stream::cpu()),
            #[cfg(feature = "npu")]
            Device::Npu(ordinal) => Ok(Stream {
                device,
                npu: Some(crate::npu::NpuStream::new(ordinal)?),
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
            device: Device::Cpu,
            #[cfg(feature = "npu")]
            npu: None,
        }
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The `aclrtStream` handle of an NPU stream.
    #[cfg(feature = "npu")]
    pub fn acl_stream(&self) -> Option<&crate::npu::NpuStream> {
        self.npu.as_ref()
    }

    /// Blocks until all work queued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        #[cfg(feature = "npu")]
        if let Some(s) = &self.npu {
            return s.synchronize();
        }
        Ok(())
    }

    /// Records an event at the current end of the stream.
    pub fn record(&self) -> Result<Event> {
        let mut e = Event::new(self.device)?;
        e.record(self)?;
        Ok(e)
    }

    /// Makes later work on this stream wait for `event` (possibly recorded on another stream).
    pub fn wait(&self, event: &Event) -> Result<()> {
        if event.device != self.device {
            return Err(Error::DeviceMismatch {
                what: "Stream::wait",
                expected: self.device,
                found: event.device,
            });
        }
        #[cfg(feature = "npu")]
        if let (Some(s), Some(e)) = (&self.npu, &event.npu) {
            return s.wait(e);
        }
        Ok(())
    }
}

/// A marker in a stream: wait for it, or time the work between two of them.
pub struct Event {
    device: Device,
    recorded_at: Option<Instant>,
    #[cfg(feature = "npu")]
    npu: Option<crate::npu::NpuEvent>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Event({}, recorded: {})",
            self.device,
            self.recorded_at.is_some()
        )
    }
}

impl Event {
    /// A timing-capable event on `device`, not yet recorded.
    pub fn new(device: Device) -> Result<Event> {
        match device {
            Device::Cpu => Ok(Event {
                device,
                recorded_at: None,
                #[cfg(feature = "npu")]
                npu: None,
            }),
            #[cfg(feature = "npu")]
            Device::Npu(ordinal) => Ok(Event {
                device,
                recorded_at: None,
                npu: Some(crate::npu::NpuEvent::new(ordinal)?),
            }),
            #[cfg(not(feature = "npu"))]
            Device::Npu(_) => Err(Error::NotCompiled {
                what: "Event::new",
                device,
            }),
        }
    }

    /// Marks the current end of `stream`.
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        if stream.device != self.device {
            return Err(Error::DeviceMismatch {
                what: "Event::record",
                expected: self.device,
                found: stream.device,
            });
        }
        self.recorded_at = Some(Instant::now());
        #[cfg(feature = "npu")]
        if let (Some(e), Some(s)) = (&self.npu, &stream.npu) {
            return e.record(s);
        }
        Ok(())
    }

    /// Blocks until the work before the event has finished.
    pub fn synchronize(&self) -> Result<()> {
        #[cfg(feature = "npu")]
        if let Some(e) = &self.npu {
            return e.synchronize();
        }
        Ok(())
    }

    /// Milliseconds between this event and a later one (both recorded and synchronized).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        #[cfg(feature = "npu")]
        if let (Some(a), Some(b)) = (&self.npu, &end.npu) {
            return a.elapsed_ms(b);
        }
        match (self.recorded_at, end.recorded_at) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(Error::NotRecorded {
                what: "Event::elapsed_ms",
            }),
        }
    }
}
