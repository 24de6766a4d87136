//! cannon-sys: raw FFI to AscendCL, aclnn and HCCL, dlopened at run time.
//!
//! - [`loader`]: finds `libascendcl.so`, `libnnopbase.so`, the aclnn op libraries and
//!   `libhccl.so` (`$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64`, then the default
//!   dlopen path) and resolves symbols once each. Always compiled.
//! - `acl`, `aclnn`, `hccl` (feature `npu`; not links, so that a default doc build resolves):
//!   bindgen output over the CANN headers, with every C function turned into an `unsafe fn`
//!   that resolves itself through the loader and returns `Result<c_return_type, Error>`. See
//!   sys/README.md.
//! - [`codes`]: names of aclError / aclnnStatus / HcclResult codes.
//! - [`emulator`]: `CANNON_CANN_EMULATOR` (every library from the host emulation of CANN,
//!   only when asked) and the test harness that selects the built emulator.
//!
//! Layering, lowest first: `error`, `codes`; `emulator::choice` (which CANN this process
//! loads); [`loader`]; the generated bindings, `probe` and the rest of
//! [`emulator`] (test selection), which open libraries through the loader.
//!
//! Nothing here links against CANN: a missing library or symbol is an [`Error`], never a panic
//! or a link failure.

pub mod codes;
pub mod emulator;
mod error;
pub mod loader;
mod probe;

#[cfg(feature = "npu")]
#[path = "generated/acl.rs"]
pub mod acl;
#[cfg(feature = "npu")]
#[path = "generated/aclnn.rs"]
pub mod aclnn;
#[cfg(feature = "npu")]
#[path = "generated/hccl.rs"]
pub mod hccl;

pub use codes::{acl_error_is_oom, acl_error_name, aclnn_status_name, hccl_result_name};
pub use error::Error;
pub use loader::Lib;
pub use probe::{probe, LibraryProbe, Probe};

/// True when the AscendCL runtime library can be loaded in this process (searched once, with the
/// environment at first use).
pub fn is_available() -> bool {
    loader::library(Lib::AscendCl).is_ok()
}
