//! The optimizer offload's weight stream: the model's own groups kept in the exec's host pool
//! are copied to the device one at a time, the next one of the pass's plan ahead (see
//! [`super::source`]).

use super::offload::Stored;
use super::ModelError;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::Tensor;
use cannon_runtime::CopyMark;
use std::sync::Mutex;

/// Copies the groups of [`super::Params`] in the host pool to the device, one at a time and the
/// next ahead (see the module docs).
#[derive(Debug)]
pub struct Streamer {
    /// The device (allocator, compute stream) and the host pool the groups are in.
    exec: DeviceCtx,
    state: Mutex<StreamState>,
}

#[derive(Debug, Default)]
struct StreamState {
    /// The groups the running pass fetches, in order.
    order: Vec<usize>,
    /// The next position of `order` to fetch.
    next: usize,
    /// A copy issued ahead: (group, device buffer, the point its copy ends at).
    ahead: Option<(usize, Tensor<f32>, CopyMark)>,
}

impl Streamer {
    /// A streamer copying groups to `exec`'s device from its host pool.
    pub fn new(exec: DeviceCtx) -> Self {
        Streamer {
            exec,
            state: Mutex::new(StreamState::default()),
        }
    }

    /// A streamer on the same exec with no pass under way (for a copy of the parameters).
    pub(crate) fn fresh(&self) -> Self {
        Streamer::new(self.exec.clone())
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, StreamState>, ModelError> {
        self.state
            .lock()
            .map_err(|_| ModelError::Input("the parameter streamer was poisoned by a panic".into()))
    }

    /// A new pass: its fetch order; a copy still ahead from an unfinished pass is dropped.
    pub(crate) fn begin(&self, order: &[usize]) -> Result<(), ModelError> {
        let mut s = self.state()?;
        s.order = order.to_vec();
        s.next = 0;
        s.ahead = None;
        Ok(())
    }

    /// Group `g` of `data` on the device: the copy issued ahead, or one made now; then the
    /// copy of the group after `g` in the pass's order is issued. A group out of the order
    /// (a pass that told none) is copied on its own, nothing issued ahead.
    pub(crate) fn fetch(&self, data: &[Stored], g: usize) -> Result<Tensor<f32>, ModelError> {
        let pool = self.exec.host_pool().ok_or_else(|| {
            ModelError::Input("offloaded parameters need an exec with a host pool".into())
        })?;
        let (st, alloc) = (self.exec.stream(), self.exec.allocator());
        let host = |g: usize| match data.get(g) {
            Some(Stored::Host(h)) => Some(h),
            _ => None,
        };
        let mut s = self.state()?;
        let buf = match s.ahead.take() {
            Some((a, buf, mark)) if a == g => {
                pool.wait(st, &mark)?;
                buf
            }
            other => {
                drop(other);
                let h = host(g).ok_or_else(|| ModelError::no_group(g, data.len()))?;
                let buf = Tensor::from_buffer(pool.reload(alloc, st, h)?, h.shape())?;
                pool.wait(st, &pool.mark()?)?;
                buf
            }
        };
        let at = (s.next..s.order.len()).find(|&i| s.order[i] == g);
        if let Some(i) = at {
            s.next = i + 1;
            if let Some(h) = s.order.get(i + 1).and_then(|&n| host(n).map(|h| (n, h))) {
                let (n, h) = h;
                let ahead = Tensor::from_buffer(pool.reload(alloc, st, h)?, h.shape())?;
                s.ahead = Some((n, ahead, pool.mark()?));
            }
        }
        Ok(buf)
    }
}
