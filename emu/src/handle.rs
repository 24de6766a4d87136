//! Live-handle registries for the opaque objects CANN hands out (aclTensor, aclIntArray, ...,
//! aclOpExecutor, streams, events, HCCL communicators).
//!
//! A handle is the address of a boxed object; the registry remembers which addresses are live,
//! so a destroyed, foreign or null handle is a typed error instead of a use after free.

use crate::error::{EmuError, EmuResult};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Objects of one kind, by handle.
pub struct Registry<T> {
    kind: &'static str,
    /// The error code a bad handle of this kind gives (aclError or aclnnStatus or HcclResult).
    bad_code: i32,
    live: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub const fn new(kind: &'static str, bad_code: i32) -> Self {
        Self {
            kind,
            bad_code,
            live: Mutex::new(BTreeMap::new()),
        }
    }

    /// Registers `value` and returns its handle (never null, unique while live).
    pub fn insert(&self, value: T) -> usize {
        let v = Arc::new(value);
        let h = Arc::as_ptr(&v) as usize;
        self.live.lock().insert(h, v);
        h
    }

    /// The object behind `handle`.
    pub fn get(&self, handle: usize) -> EmuResult<Arc<T>> {
        if handle == 0 {
            return Err(EmuError::new(self.bad_code, format!("null {}", self.kind)));
        }
        self.live.lock().get(&handle).cloned().ok_or_else(|| {
            EmuError::new(
                self.bad_code,
                format!(
                    "{handle:#x} is not a live {} (destroyed already, or never created here)",
                    self.kind
                ),
            )
        })
    }

    /// Removes `handle`, returning its object (destroy, or a one-shot executor's launch).
    pub fn remove(&self, handle: usize) -> EmuResult<Arc<T>> {
        let got = self.get(handle)?;
        self.live.lock().remove(&handle);
        Ok(got)
    }

    /// Every live object (device-wide synchronise walks the streams).
    pub fn values(&self) -> Vec<Arc<T>> {
        self.live.lock().values().cloned().collect()
    }

    /// Live objects (leak checks in tests).
    pub fn len(&self) -> usize {
        self.live.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destroyed_and_foreign_handles_are_errors() {
        static R: Registry<u32> = Registry::new("aclTensor", 161002);
        let h = R.insert(5);
        assert_eq!(*R.get(h).unwrap(), 5);
        assert_eq!(*R.remove(h).unwrap(), 5);
        assert_eq!(R.get(h).unwrap_err().code, 161002);
        assert!(R.get(0).unwrap_err().message.contains("null aclTensor"));
        assert!(R.remove(12345).is_err());
    }
}
