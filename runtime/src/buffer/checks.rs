//! The range, length and device checks every copy and view makes.

use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use std::ops::Range;

pub(super) fn check_range(what: &'static str, range: &Range<usize>, len: usize) -> Result<()> {
    if range.start > range.end || range.end > len {
        return Err(Error::OutOfRange {
            what,
            start: range.start,
            end: range.end,
            len,
        });
    }
    Ok(())
}

pub(super) fn check_len(what: &'static str, len: usize, expected: usize) -> Result<()> {
    if len != expected {
        return Err(Error::Length {
            what,
            len,
            expected,
        });
    }
    Ok(())
}

pub(super) fn check_device(what: &'static str, expected: Device, found: Device) -> Result<()> {
    if expected != found {
        return Err(Error::DeviceMismatch {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// The element range `(start, len)` in units of `U` that covers the same bytes as elements
/// `start..start+len` of `T`, or an alignment error.
pub fn reinterpret_range<T: Element, U: Element>(
    start: usize,
    len: usize,
) -> Result<(usize, usize)> {
    let (ts, us) = (std::mem::size_of::<T>(), std::mem::size_of::<U>());
    let (off, bytes) = (start * ts, len * ts);
    let align = us.max(std::mem::align_of::<U>());
    if us == 0 || off % align != 0 || bytes % us != 0 {
        return Err(Error::Alignment {
            what: "reinterpret",
            offset: off,
            bytes,
            align,
        });
    }
    Ok((off / us, bytes / us))
}
