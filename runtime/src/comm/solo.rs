//! A world of one rank on any device: what one process training alone uses, so that it runs
//! the same sharded step as N ranks do. Every collective over one rank is the identity: a
//! reduction, gather, scatter or exchange copies its send buffer into its receive buffer (on
//! the stream, like any device copy), an in-place one does nothing. The arguments are checked
//! as a group's would be (devices, lengths, counts, ranks), so code that passes here passes
//! the shape checks of a larger world.

use std::cell::Cell;
use std::time::Duration;

use super::error::{CommError, CommResult};
use super::types::ReduceOp;
use crate::buffer::{BufferView, BufferViewMut};
use crate::device::Device;
use crate::dtype::Element;
use crate::stream::Stream;

/// The one rank of a world of one on `device`.
#[derive(Debug)]
pub(crate) struct SoloCommunicator {
    device: Device,
    timeout: Cell<Duration>,
}

impl SoloCommunicator {
    pub(crate) fn new(device: Device, timeout: Duration) -> Self {
        SoloCommunicator {
            device,
            timeout: Cell::new(timeout),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        0
    }

    pub(crate) fn world_size(&self) -> usize {
        1
    }

    pub(crate) fn device(&self) -> Device {
        self.device
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    fn on_device(&self, op: &'static str, what: &'static str, found: Device) -> CommResult<()> {
        if found != self.device {
            return Err(CommError::DeviceMismatch {
                op,
                rank: 0,
                what,
                expected: self.device,
                found,
            });
        }
        Ok(())
    }

    /// Checks the stream and both buffers, and that `counts` (if any) is `[len]`; then copies.
    fn copy<T: Element>(
        &self,
        op: &'static str,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[&[usize]],
        stream: &Stream,
    ) -> CommResult<()> {
        self.on_device(op, "the stream", stream.device())?;
        self.on_device(op, "the send buffer", send.device())?;
        self.on_device(op, "the receive buffer", recv.device())?;
        if send.len() != recv.len() {
            return Err(CommError::InvalidArgument {
                op,
                detail: format!(
                    "a world of one sends {} elements and receives {}: they must be equal",
                    send.len(),
                    recv.len()
                ),
            });
        }
        for c in counts {
            if *c != [send.len()] {
                return Err(CommError::InvalidArgument {
                    op,
                    detail: format!(
                        "counts {c:?} for a world of one sending {} elements",
                        send.len()
                    ),
                });
            }
        }
        recv.memcpy_dtod(stream, send)
            .map_err(|e| CommError::Runtime {
                call: op,
                message: e.to_string(),
            })
    }

    fn peer(&self, op: &'static str, rank: usize) -> CommResult<()> {
        if rank != 0 {
            return Err(CommError::InvalidRank {
                op,
                rank,
                world_size: 1,
            });
        }
        Ok(())
    }

    pub(crate) fn all_reduce<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        _op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy("all_reduce", send, recv, &[], stream)
    }

    pub(crate) fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        _op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        self.on_device("all_reduce_in_place", "the stream", stream.device())?;
        self.on_device("all_reduce_in_place", "the buffer", buf.device())
    }

    pub(crate) fn all_gather<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy("all_gather", send, recv, &[], stream)
    }

    pub(crate) fn all_gather_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy("all_gather_v", send, recv, &[counts], stream)
    }

    pub(crate) fn reduce_scatter<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        _op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy("reduce_scatter", send, recv, &[], stream)
    }

    pub(crate) fn reduce_scatter_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        counts: &[usize],
        _op: ReduceOp,
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy("reduce_scatter_v", send, recv, &[counts], stream)
    }

    pub(crate) fn broadcast<T: Element>(
        &self,
        buf: &mut BufferViewMut<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        self.peer("broadcast", root)?;
        self.on_device("broadcast", "the stream", stream.device())?;
        self.on_device("broadcast", "the buffer", buf.device())
    }

    pub(crate) fn all_to_all<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        recv: &mut BufferViewMut<'_, T>,
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy("all_to_all", send, recv, &[], stream)
    }

    pub(crate) fn all_to_all_v<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        send_counts: &[usize],
        recv: &mut BufferViewMut<'_, T>,
        recv_counts: &[usize],
        stream: &Stream,
    ) -> CommResult<()> {
        self.copy(
            "all_to_all_v",
            send,
            recv,
            &[send_counts, recv_counts],
            stream,
        )
    }

    /// The stream drained, as an HCCL barrier does.
    pub(crate) fn barrier(&self, stream: &Stream) -> CommResult<()> {
        self.on_device("barrier", "the stream", stream.device())?;
        stream.synchronize().map_err(|e| CommError::Runtime {
            call: "barrier",
            message: e.to_string(),
        })
    }

    /// A message to oneself would need a queue no caller of a world of one uses: a ring of
    /// one exchanges with `send_recv`.
    pub(crate) fn send<T: Element>(
        &self,
        _buf: &BufferView<'_, T>,
        dst: usize,
        _stream: &Stream,
    ) -> CommResult<()> {
        self.peer("send", dst)?;
        Err(CommError::InvalidArgument {
            op: "send",
            detail: "a world of one has no peer to send to (use send_recv)".into(),
        })
    }

    pub(crate) fn recv<T: Element>(
        &self,
        _buf: &mut BufferViewMut<'_, T>,
        src: usize,
        _stream: &Stream,
    ) -> CommResult<()> {
        self.peer("recv", src)?;
        Err(CommError::InvalidArgument {
            op: "recv",
            detail: "a world of one has no peer to receive from (use send_recv)".into(),
        })
    }

    pub(crate) fn send_recv<T: Element>(
        &self,
        send: &BufferView<'_, T>,
        dst: usize,
        recv: &mut BufferViewMut<'_, T>,
        src: usize,
        stream: &Stream,
    ) -> CommResult<()> {
        self.peer("send_recv", dst)?;
        self.peer("send_recv", src)?;
        self.copy("send_recv", send, recv, &[], stream)
    }

    pub(crate) fn split(&self, _color: u32, _key: u32, stream: &Stream) -> CommResult<Self> {
        self.on_device("split", "the stream", stream.device())?;
        Ok(SoloCommunicator::new(self.device, self.timeout()))
    }
}

#[cfg(test)]
mod tests;
