//! The only calls into the system dynamic loader (dlopen/dlsym/dlerror/dlinfo).

use std::ffi::{c_void, CStr, CString};
use std::ptr::NonNull;

/// A library handle from `dlopen`. It is never closed: bindings resolved from it are cached in
/// statics for the life of the process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handle(NonNull<c_void>);

// SAFETY: a dlopen handle is an opaque token; dlsym on it is thread-safe per POSIX, and the
// handle is never closed, so sharing it between threads cannot dangle.
unsafe impl Send for Handle {}
// SAFETY: see `Send`; the handle is only ever read.
unsafe impl Sync for Handle {}

/// Last `dlerror()` text, or a fallback when the loader gave none.
fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string valid until the next
    // dl* call on this thread; it is copied out immediately.
    unsafe {
        let msg = libc::dlerror();
        if msg.is_null() {
            "unknown dlopen error".to_owned()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

/// `dlopen(name, RTLD_LAZY | RTLD_LOCAL)`: lazy like torch_npu, local so two CANN releases'
/// symbols never interpose each other. `name` without a slash uses the default search path
/// (LD_LIBRARY_PATH, ld.so.cache, system dirs).
pub(crate) fn open(name: &str) -> Result<Handle, String> {
    let c_name = CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
    // SAFETY: c_name is a valid NUL-terminated string; dlopen has no other preconditions.
    // Running the library's constructors is the documented cost of loading CANN.
    let raw = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    NonNull::new(raw).map(Handle).ok_or_else(last_error)
}

/// `dlsym(handle, symbol)`, `None` when the symbol is absent.
pub(crate) fn symbol(handle: Handle, symbol: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: the handle came from a successful dlopen and is never closed; symbol is a valid
    // NUL-terminated string.
    NonNull::new(unsafe { libc::dlsym(handle.0.as_ptr(), symbol.as_ptr()) })
}

/// The directory a handle was loaded from (glibc `RTLD_DI_ORIGIN`), to report where a library
/// found through the default search path actually lives.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn origin(handle: Handle) -> Option<String> {
    // glibc writes at most PATH_MAX bytes including the NUL.
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: RTLD_DI_ORIGIN writes a NUL-terminated path of at most PATH_MAX bytes into the
    // buffer, which is PATH_MAX + 1 bytes long and outlives the call.
    let rc = unsafe {
        libc::dlinfo(
            handle.0.as_ptr(),
            libc::RTLD_DI_ORIGIN,
            buf.as_mut_ptr().cast(),
        )
    };
    if rc != 0 {
        return None;
    }
    let s = CStr::from_bytes_until_nul(&buf).ok()?;
    Some(s.to_string_lossy().into_owned())
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn origin(_handle: Handle) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library found through the default search path reports the directory it came from
    /// (libc is loaded in every process, so dlopen returns its existing handle).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn origin_names_the_directory_of_a_default_path_library() {
        let handle = open("libc.so.6").unwrap();
        let dir = origin(handle).unwrap();
        assert!(
            std::path::Path::new(&dir).join("libc.so.6").exists(),
            "{dir}"
        );
        assert!(symbol(handle, c"strlen").is_some());
        assert!(symbol(handle, c"cannon_no_such_symbol").is_none());
    }

    #[test]
    fn open_failure_carries_the_loader_message() {
        let err = open("libcannon-does-not-exist.so").unwrap_err();
        assert!(
            err.starts_with("libcannon-does-not-exist.so: cannot open shared object file"),
            "{err}"
        );
    }
}
