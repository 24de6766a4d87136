//! The device bytes a collective's job reads and writes (always through
//! [`crate::mem::resolve`], inside the job), and the pieces it moves them in.

use super::dtype::{reduce, DType};
use crate::error::EmuResult;

pub(super) fn read_dev(addr: usize, len: usize) -> EmuResult<Vec<u8>> {
    // SAFETY: the copy is made before anything else touches the range.
    Ok(unsafe { dev_bytes(addr, len) }?.to_vec())
}

/// The device bytes `[addr, addr + len)` in place, for sending or reducing without a copy.
///
/// # Safety
/// Nothing writes the range while the slice lives: a collective's job is the only work on
/// its buffers (CANN's stream-ordering rule, which the emulator's streams keep), and the job
/// writes its receive buffer only where it does not overlap a slice still in use.
pub(super) unsafe fn dev_bytes<'a>(addr: usize, len: usize) -> EmuResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    let p = crate::mem::resolve(addr, len)?;
    // SAFETY: `resolve` checked [addr, addr+len) lies in one live allocation and `p` is its
    // host backing; the caller keeps writers away while the slice lives.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// [`dev_bytes`] for writing.
///
/// # Safety
/// As [`dev_bytes`], and no other slice of the range lives meanwhile.
unsafe fn dev_bytes_mut<'a>(addr: usize, len: usize) -> EmuResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    let p = crate::mem::resolve(addr, len)?;
    // SAFETY: as in `dev_bytes`; the caller rules out other slices of the range.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

pub(super) fn write_dev(addr: usize, data: &[u8]) -> EmuResult<()> {
    if data.is_empty() {
        return Ok(());
    }
    let p = crate::mem::resolve(addr, data.len())?;
    // SAFETY: as in `dev_bytes`; `data` is host memory of our own, never the backing itself.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    Ok(())
}

/// Bytes per piece: a collective's buffers travel in pieces of this size, each piece sent to
/// and taken from every peer before the next. A rank can then run at most one piece ahead of
/// its slowest peer, so the frames waiting in its inboxes stay a few pieces per peer instead
/// of a whole gathered group's chunks (the embedding group of a 0.86 B model: 3 x 67 MB).
/// A multiple of every element size, so reductions never split an element. The unit tests
/// use 16 bytes, so their small buffers travel in several pieces too.
pub(super) const PIECE: usize = if cfg!(test) { 16 } else { 4 << 20 };

/// The pieces `(index, byte range)` of a buffer of `len` bytes; one empty piece when `len`
/// is 0 (the ranks still exchange a frame, which checks that they made the same call).
pub(super) fn pieces(
    len: usize,
    piece: usize,
) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> {
    let count = len.div_ceil(piece).max(1);
    (0..count).map(move |k| (k as u64, k * piece..((k + 1) * piece).min(len)))
}

/// The piece size for a send and a receive range: [`PIECE`] when they are apart, else the
/// whole buffer in one piece (a piece written could be a later piece still to be sent).
/// Callers allow the in-place layouts each collective defines before asking.
pub(super) fn piece_len(send: usize, send_len: usize, recv: usize, recv_len: usize) -> usize {
    match overlap(send, send_len, recv, recv_len) {
        true => usize::MAX,
        false => PIECE,
    }
}

/// Whether the byte ranges `[a, a + a_len)` and `[b, b + b_len)` share a byte.
fn overlap(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// Reduces `parts` (in rank order) into the device range `[recv, recv + len)`: in place
/// when no part lies there (the parts are the peers' frames and, at `mine`, this rank's
/// send buffer), else through a host buffer written once every part has been read.
pub(super) fn reduce_into(
    dtype: DType,
    op: u32,
    parts: &[&[u8]],
    send: (usize, usize),
    recv: usize,
    len: usize,
) -> EmuResult<()> {
    if overlap(send.0, send.1, recv, len) {
        let mut out = vec![0u8; len];
        reduce(dtype, op, parts, &mut out)?;
        return write_dev(recv, &out);
    }
    // SAFETY: the receive range overlaps no part (the frames are host memory of our own,
    // the send range was checked above), and this job is the only work on it.
    let out = unsafe { dev_bytes_mut(recv, len) }?;
    reduce(dtype, op, parts, out)
}
