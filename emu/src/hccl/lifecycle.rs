//! The exported `Hccl*` functions of a communicator's life: the root info, the collective
//! init, destruction, its rank and size, its asynchronous error, and the error strings.
#![allow(non_snake_case)]

use super::args::{comm_of, current_device};
use super::boundary::{edge, host_ptr, non_null, perr, COMMS};
use super::comm::Comm;
use super::transport::{self, RootInfo, Timeouts, ROOT_INFO_BYTES};
use cannon_sys::hccl::*;
use std::ffi::{c_char, CStr};

/// The largest group the emulator forms (HCCL's own limit is far larger; a test never needs
/// more, and a garbage nRanks should fail fast rather than wait for thousands of ranks).
const MAX_RANKS: u32 = 4096;

/// # Safety
/// `rootInfo` points to a writable `HcclRootInfo`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(rootInfo: *mut HcclRootInfo) -> HcclResult {
    edge("HcclGetRootInfo", || {
        host_ptr(rootInfo.cast_const(), "rootInfo")?;
        current_device("HcclGetRootInfo")?;
        let info = transport::create_root()?.encode();
        // SAFETY: the caller's HcclRootInfo is ROOT_INFO_BYTES of writable host memory
        // (checked non-null and not device memory above).
        unsafe {
            std::ptr::copy_nonoverlapping(info.as_ptr(), rootInfo.cast::<u8>(), ROOT_INFO_BYTES)
        };
        Ok(())
    })
}

/// # Safety
/// `rootInfo` points to a readable `HcclRootInfo`, `comm` to a writable `HcclComm`.
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    nRanks: u32,
    rootInfo: *const HcclRootInfo,
    rank: u32,
    comm: *mut HcclComm,
) -> HcclResult {
    edge("HcclCommInitRootInfo", || {
        host_ptr(rootInfo, "rootInfo")?;
        host_ptr(comm.cast_const(), "comm")?;
        if nRanks == 0 || nRanks > MAX_RANKS {
            return Err(perr(
                HCCL_E_PARA,
                format!("nRanks {nRanks} must be in 1..={MAX_RANKS}"),
            ));
        }
        if rank >= nRanks {
            return Err(perr(
                HCCL_E_PARA,
                format!("rank {rank} is not below nRanks {nRanks}"),
            ));
        }
        let device = current_device("HcclCommInitRootInfo")?;
        // SAFETY: a readable HcclRootInfo of ROOT_INFO_BYTES (checked above).
        let bytes = unsafe { std::slice::from_raw_parts(rootInfo.cast::<u8>(), ROOT_INFO_BYTES) };
        let root = RootInfo::decode(bytes)?;
        let t = Timeouts::from_env()?;
        let mesh = super::bootstrap::connect(&root, nRanks, rank, t)?;
        let h = COMMS.insert(Comm::new(mesh, device, t));
        // SAFETY: writable HcclComm slot (checked above).
        unsafe { *comm = h as HcclComm };
        Ok(())
    })
}

/// # Safety
/// `comm` came from `HcclCommInitRootInfo`.
#[no_mangle]
pub unsafe extern "C" fn HcclCommDestroy(comm: HcclComm) -> HcclResult {
    edge("HcclCommDestroy", || {
        non_null(comm.cast_const(), "comm")?;
        // Jobs still queued hold their own reference; the connections close after them.
        COMMS.remove(comm as usize).map(drop)
    })
}

/// # Safety
/// `rankSize` points to a writable u32.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankSize(comm: HcclComm, rankSize: *mut u32) -> HcclResult {
    edge("HcclGetRankSize", || {
        let c = comm_of(comm)?;
        host_ptr(rankSize.cast_const(), "rankSize")?;
        // SAFETY: writable host u32 (checked above).
        unsafe { *rankSize = c.n_ranks };
        Ok(())
    })
}

/// # Safety
/// `rank` points to a writable u32.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult {
    edge("HcclGetRankId", || {
        let c = comm_of(comm)?;
        host_ptr(rank.cast_const(), "rank")?;
        // SAFETY: writable host u32 (checked above).
        unsafe { *rank = c.rank };
        Ok(())
    })
}

/// # Safety
/// `asyncError` points to a writable HcclResult.
#[no_mangle]
pub unsafe extern "C" fn HcclGetCommAsyncError(
    comm: HcclComm,
    asyncError: *mut HcclResult,
) -> HcclResult {
    edge("HcclGetCommAsyncError", || {
        let c = comm_of(comm)?;
        host_ptr(asyncError.cast_const(), "asyncError")?;
        // SAFETY: writable host HcclResult (checked above).
        unsafe { *asyncError = c.async_error() };
        Ok(())
    })
}

/// A static, NUL-terminated name for every code (unknown ones included).
#[no_mangle]
pub extern "C" fn HcclGetErrorString(code: HcclResult) -> *const c_char {
    let s: &'static CStr = match code {
        HCCL_SUCCESS => c"HCCL_SUCCESS: success",
        HCCL_E_PARA => c"HCCL_E_PARA: parameter error",
        HCCL_E_PTR => c"HCCL_E_PTR: empty pointer",
        HCCL_E_MEMORY => c"HCCL_E_MEMORY: memory error",
        HCCL_E_INTERNAL => c"HCCL_E_INTERNAL: internal error",
        HCCL_E_NOT_SUPPORT => c"HCCL_E_NOT_SUPPORT: not supported",
        HCCL_E_NOT_FOUND => c"HCCL_E_NOT_FOUND: not found",
        HCCL_E_UNAVAIL => c"HCCL_E_UNAVAIL: resource unavailable",
        HCCL_E_SYSCALL => c"HCCL_E_SYSCALL: system call error",
        HCCL_E_TIMEOUT => c"HCCL_E_TIMEOUT: timeout",
        HCCL_E_OPEN_FILE_FAILURE => c"HCCL_E_OPEN_FILE_FAILURE: open file fail",
        HCCL_E_TCP_CONNECT => c"HCCL_E_TCP_CONNECT: tcp connect fail",
        HCCL_E_ROCE_CONNECT => c"HCCL_E_ROCE_CONNECT: roce connect fail",
        HCCL_E_TCP_TRANSFER => c"HCCL_E_TCP_TRANSFER: tcp transfer fail",
        HCCL_E_ROCE_TRANSFER => c"HCCL_E_ROCE_TRANSFER: roce transfer fail",
        HCCL_E_RUNTIME => c"HCCL_E_RUNTIME: call runtime api fail",
        HCCL_E_DRV => c"HCCL_E_DRV: call driver api fail",
        HCCL_E_PROFILING => c"HCCL_E_PROFILING: call profiling api fail",
        HCCL_E_CCE => c"HCCL_E_CCE: call cce api fail",
        HCCL_E_NETWORK => c"HCCL_E_NETWORK: call network api fail",
        HCCL_E_AGAIN => c"HCCL_E_AGAIN: try again",
        HCCL_E_REMOTE => c"HCCL_E_REMOTE: error cqe",
        HCCL_E_SUSPENDING => c"HCCL_E_SUSPENDING: error communicator suspending",
        HCCL_E_OPRETRY_FAIL => c"HCCL_E_OPRETRY_FAIL: retry constraint",
        HCCL_E_OOM => c"HCCL_E_OOM: out of memory",
        _ => c"unknown HcclResult",
    };
    s.as_ptr()
}
