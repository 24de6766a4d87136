//! Compile-time proof that every export has the exact C signature the loader calls it with:
//! each line is the `type F` of the function's wrapper in `sys/src/generated/acl.rs` (copied by
//! script), and an export whose parameters or return type differ does not compile.

#![allow(dead_code)]

use super::context::*;
use super::memory::*;
use super::streams::*;
use super::*;
use cannon_sys::acl::{
    aclError, aclrtContext, aclrtEvent, aclrtEventRecordedStatus, aclrtMemAttr,
    aclrtMemMallocPolicy, aclrtMemcpyKind, aclrtStream,
};

const _: unsafe extern "C" fn(*const std::os::raw::c_char) -> aclError = aclInit;
const _: unsafe extern "C" fn() -> aclError = aclFinalize;
const _: unsafe extern "C" fn() -> *const std::os::raw::c_char = aclGetRecentErrMsg;
const _: unsafe extern "C" fn(*mut aclrtContext, i32) -> aclError = aclrtCreateContext;
const _: unsafe extern "C" fn(aclrtContext) -> aclError = aclrtDestroyContext;
const _: unsafe extern "C" fn(aclrtContext) -> aclError = aclrtSetCurrentContext;
const _: unsafe extern "C" fn(*mut aclrtContext) -> aclError = aclrtGetCurrentContext;
const _: unsafe extern "C" fn(i32) -> aclError = aclrtSetDevice;
const _: unsafe extern "C" fn(i32) -> aclError = aclrtResetDevice;
const _: unsafe extern "C" fn(*mut i32) -> aclError = aclrtGetDevice;
const _: unsafe extern "C" fn() -> aclError = aclrtSynchronizeDevice;
const _: unsafe extern "C" fn(*mut u32) -> aclError = aclrtGetDeviceCount;
const _: unsafe extern "C" fn(*mut aclrtEvent) -> aclError = aclrtCreateEvent;
const _: unsafe extern "C" fn(*mut aclrtEvent, u32) -> aclError = aclrtCreateEventWithFlag;
const _: unsafe extern "C" fn(aclrtEvent) -> aclError = aclrtDestroyEvent;
const _: unsafe extern "C" fn(aclrtEvent, aclrtStream) -> aclError = aclrtRecordEvent;
const _: unsafe extern "C" fn(aclrtEvent, *mut aclrtEventRecordedStatus) -> aclError =
    aclrtQueryEventStatus;
const _: unsafe extern "C" fn(aclrtEvent) -> aclError = aclrtSynchronizeEvent;
const _: unsafe extern "C" fn(*mut f32, aclrtEvent, aclrtEvent) -> aclError = aclrtEventElapsedTime;
const _: unsafe extern "C" fn(
    *mut *mut std::os::raw::c_void,
    usize,
    aclrtMemMallocPolicy,
) -> aclError = aclrtMalloc;
const _: unsafe extern "C" fn(*mut std::os::raw::c_void) -> aclError = aclrtFree;
const _: unsafe extern "C" fn(*mut *mut std::os::raw::c_void, usize) -> aclError = aclrtMallocHost;
const _: unsafe extern "C" fn(*mut std::os::raw::c_void) -> aclError = aclrtFreeHost;
const _: unsafe extern "C" fn(
    *mut std::os::raw::c_void,
    usize,
    *const std::os::raw::c_void,
    usize,
    aclrtMemcpyKind,
) -> aclError = aclrtMemcpy;
const _: unsafe extern "C" fn(*mut std::os::raw::c_void, usize, i32, usize) -> aclError =
    aclrtMemset;
const _: unsafe extern "C" fn(
    *mut std::os::raw::c_void,
    usize,
    *const std::os::raw::c_void,
    usize,
    aclrtMemcpyKind,
    aclrtStream,
) -> aclError = aclrtMemcpyAsync;
const _: unsafe extern "C" fn(
    *mut std::os::raw::c_void,
    usize,
    i32,
    usize,
    aclrtStream,
) -> aclError = aclrtMemsetAsync;
const _: unsafe extern "C" fn(*mut aclrtStream) -> aclError = aclrtCreateStream;
const _: unsafe extern "C" fn(*mut aclrtStream, u32, u32) -> aclError = aclrtCreateStreamWithConfig;
const _: unsafe extern "C" fn(aclrtStream) -> aclError = aclrtDestroyStream;
const _: unsafe extern "C" fn(aclrtStream) -> aclError = aclrtSynchronizeStream;
const _: unsafe extern "C" fn(aclrtStream, i32) -> aclError = aclrtSynchronizeStreamWithTimeout;
const _: unsafe extern "C" fn(aclrtStream, aclrtEvent) -> aclError = aclrtStreamWaitEvent;
const _: unsafe extern "C" fn(aclrtMemAttr, *mut usize, *mut usize) -> aclError = aclrtGetMemInfo;
const _: unsafe extern "C" fn(*mut i32, *mut i32, *mut i32) -> aclError = aclrtGetVersion;
