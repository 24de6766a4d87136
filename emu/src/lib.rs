//! A host emulation of the CANN subset cannon calls: the AscendCL runtime, the aclnn descriptor
//! API and ops, and HCCL, exported as the C symbols the loader resolves.
//!
//! It exists so that CI, which has no NPU, runs the NPU code path for real: the loader opens this
//! library only when asked (`CANNON_CANN_EMULATOR=/path/to/libcannon_cann_emu.so`, or the test
//! harness), never in place of an installed CANN.
//!
//! What makes it worth running is that it is strict where CANN is: every argument is validated
//! as CANN documents it, and a violation is the documented error code with a message behind
//! `aclGetRecentErrMsg`, not a crash and not a silently wrong answer:
//! - [`mem`]: device memory lives in a reserved address range the host cannot read (a host
//!   read of a device pointer faults); only `aclrtMemcpy*` moves bytes across, and an op given
//!   a pointer outside a live allocation fails.
//! - [`stream`]: work queued on a stream runs on that stream's worker thread, so a missing
//!   synchronise reads stale or poisoned memory, as on hardware.
//! - [`device`]: the thread's current device (`aclrtSetDevice`), default streams, and the
//!   synchronisation of all of a device's streams.
//! - [`handle`]: descriptors and executors are live-handle registries: use after destroy and a
//!   second launch of a one-shot executor are errors.
//! - [`hccl`]: collectives between ranks in separate processes over loopback TCP, queued on
//!   streams, with dead or hung peers an error within `HCCL_EXEC_TIMEOUT`, never a hang.
//!
//! Layering, lowest first (a file imports only from files below it): [`error`], [`handle`],
//! [`mem`]; [`stream`] (the workers and the registry of created streams); [`device`] (the
//! current device, default streams, a device's synchronise); then the exports: [`acl`],
//! [`nnopbase`], [`hccl`]; then [`ops`], over the descriptors.

pub mod acl;
pub mod device;
pub mod error;
pub mod handle;
pub mod hccl;
pub mod mem;
pub mod nnopbase;
pub mod ops;
pub mod stream;

pub use error::{EmuError, EmuResult};
