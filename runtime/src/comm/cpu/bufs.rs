//! The addresses a rank posts to its peers for one round ([`RawBufs`]): a leaf below the round
//! protocol (group.rs), which carries them, and the data movement (exec.rs), which reads and
//! writes through them. Nothing here dereferences them; exec.rs says why its accesses are
//! sound and, for that reason, holds their `Send`/`Sync` impls.

/// The buffers a rank exposes to its peers for one round.
#[derive(Clone, Copy)]
pub(super) struct RawBufs {
    send: *const u8,
    recv: *mut u8,
}

impl RawBufs {
    pub(super) fn new<T>(send: &[T], recv: &mut [T]) -> Self {
        RawBufs {
            send: send.as_ptr().cast(),
            recv: recv.as_mut_ptr().cast(),
        }
    }

    /// One buffer that is both read and written (in-place all_reduce, broadcast).
    pub(super) fn in_place<T>(buf: &mut [T]) -> Self {
        let p = buf.as_mut_ptr();
        RawBufs {
            send: p.cast_const().cast(),
            recv: p.cast(),
        }
    }

    pub(super) fn none() -> Self {
        RawBufs {
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
        }
    }

    pub(super) fn send<T>(&self) -> *const T {
        self.send.cast()
    }

    pub(super) fn recv<T>(&self) -> *mut T {
        self.recv.cast()
    }
}
