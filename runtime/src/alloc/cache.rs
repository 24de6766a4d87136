//! The cache of freed blocks and the rule that makes reusing them safe across streams.
//!
//! Work on a device stream runs after the host call that queued it, so a block freed on the
//! host may still be read or written by queued work. Each cached block therefore carries
//! *fences*: one event per stream that used it and was still alive at the free, recorded
//! at that stream's end at that moment. A request on stream `S` may take a cached block when
//!
//! - every fence on a stream other than `S` has completed (work on `S` itself is ordered
//!   before anything `S` runs later, so same-stream reuse needs no wait), and
//! - if `S` is not the block's owner (the stream it was allocated for), the fences cover
//!   every stream that used it: blocks of unknown owner (allocated without a stream) are
//!   reused only by requests without a stream, as before stream tracking existed.
//!
//! This is torch's `record_stream` rule, plus one step torch does not take: a block whose
//! fences have all completed is handed to any stream instead of waiting for its owner.

use crate::error::Result;
use crate::stream::Event;

/// An event recorded on stream `stream` when the block was freed.
pub(super) struct Fence {
    pub(super) stream: u64,
    pub(super) event: Event,
    /// Seen complete once (completion is final until the event is recorded again, and a
    /// fence's event is not recorded again while it is a fence).
    done: bool,
}

impl Fence {
    pub(super) fn new(stream: u64, event: Event) -> Self {
        Fence {
            stream,
            event,
            done: false,
        }
    }

    /// Whether the fenced work has finished; a failed query counts as not finished (the
    /// block then waits for [`Cached::wait`] at release, which reports the error).
    fn poll(&mut self) -> bool {
        if !self.done {
            self.done = self.event.query().unwrap_or(false);
        }
        self.done
    }
}

/// A freed block kept for reuse.
pub(super) struct Cached {
    pub(super) addr: usize,
    /// The stream id the block was last allocated for; `None`: allocated without a stream.
    pub(super) owner: Option<u64>,
    pub(super) fences: Vec<Fence>,
    /// Whether `fences` cover every stream the block was used on (false when the owner is
    /// unknown, or when a stream could neither be fenced nor synchronised).
    pub(super) covered: bool,
}

impl Cached {
    /// A block with no pending work anywhere (host memory, or a block of unknown owner).
    pub(super) fn plain(addr: usize) -> Self {
        Cached {
            addr,
            owner: None,
            fences: Vec::new(),
            covered: false,
        }
    }

    /// Whether a request on stream `req` (`None`: no stream named) may take this block now.
    pub(super) fn usable_by(&mut self, req: Option<u64>) -> bool {
        if req != self.owner && !self.covered {
            return false;
        }
        self.fences
            .iter_mut()
            .filter(|f| Some(f.stream) != req)
            .all(Fence::poll)
    }

    /// Blocks until every fence has completed (before the memory goes back to the device).
    pub(super) fn wait(&self) -> Result<()> {
        for f in &self.fences {
            if !f.done {
                f.event.synchronize()?;
            }
        }
        Ok(())
    }
}

/// Takes a block of the cached list `list` for a request on `req`: the most recently freed
/// block of the same owner if one is usable (the common single-stream case, no event
/// queries when it has no foreign fences), else the most recently freed usable one.
pub(super) fn take(list: &mut Vec<Cached>, req: Option<u64>) -> Option<Cached> {
    let same = (0..list.len())
        .rev()
        .find(|&i| list[i].owner == req && list[i].usable_by(req));
    let pick = same.or_else(|| (0..list.len()).rev().find(|&i| list[i].usable_by(req)))?;
    Some(list.remove(pick))
}
