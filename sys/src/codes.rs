//! Names of the status codes CANN functions return, for error messages in the layers above.
//!
//! Always compiled (no `npu` feature) so a status can be printed anywhere. The tables restate
//! docs/cann-api.md §1.4 (aclError), §2.2 (aclnnStatus) and §5 (HcclResult), plus a few
//! aclError codes taken straight from the wheel's `acl/error_codes/rt_error_codes.h` (107020,
//! 507901); with `--features npu` the tests check every entry against the constants generated
//! from the real headers.

/// Name of an `aclError` (`int`) code, `"unknown aclError"` if it is not in the table.
pub fn acl_error_name(code: i32) -> &'static str {
    match code {
        0 => "ACL_SUCCESS",
        100000 => "ACL_ERROR_INVALID_PARAM",
        100001 => "ACL_ERROR_UNINITIALIZE",
        100002 => "ACL_ERROR_REPEAT_INITIALIZE",
        100037 => "ACL_ERROR_REPEAT_FINALIZE",
        107000 => "ACL_ERROR_RT_PARAM_INVALID",
        107001 => "ACL_ERROR_RT_INVALID_DEVICEID",
        107002 => "ACL_ERROR_RT_CONTEXT_NULL",
        107003 => "ACL_ERROR_RT_STREAM_CONTEXT",
        // A task on a stream ran past its time limit (rt_error_codes.h: "task timeout").
        107020 => "ACL_ERROR_RT_TASK_TIMEOUT",
        200000 => "ACL_ERROR_BAD_ALLOC",
        200001 => "ACL_ERROR_API_NOT_SUPPORT",
        200002 => "ACL_ERROR_INVALID_DEVICE",
        200003 => "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
        200006 => "ACL_ERROR_FEATURE_UNSUPPORTED",
        207000 => "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
        207001 => "ACL_ERROR_RT_MEMORY_ALLOCATION",
        207004 => "ACL_ERROR_RT_NO_DEVICE",
        207018 => "ACL_ERROR_RT_DEVICE_OOM",
        500000 => "ACL_ERROR_INTERNAL_ERROR",
        500001 => "ACL_ERROR_FAILURE",
        500002 => "ACL_ERROR_GE_FAILURE",
        500003 => "ACL_ERROR_RT_FAILURE",
        500004 => "ACL_ERROR_DRV_FAILURE",
        507000 => "ACL_ERROR_RT_INTERNAL_ERROR",
        507014 => "ACL_ERROR_RT_AICORE_TIMEOUT",
        507015 => "ACL_ERROR_RT_AICORE_EXCEPTION",
        507035 => "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION",
        507046 => "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
        507047 => "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
        507053 => "ACL_ERROR_RT_DEVICE_MEM_ERROR",
        507054 => "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR",
        507057 => "ACL_ERROR_RT_SUSPECT_REMOTE_ERROR",
        507899 => "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
        // The host-device channel closed (rt_error_codes.h: "hdc disconnect").
        507901 => "ACL_ERROR_RT_SOCKET_CLOSE",
        507904 => "ACL_ERROR_RT_COMM_OP_RETRY_FAIL",
        _ => "unknown aclError",
    }
}

/// Whether an `aclError` means the device ran out of memory (the caching allocator frees its
/// cache and retries on these).
pub fn acl_error_is_oom(code: i32) -> bool {
    matches!(code, 200000 | 207001 | 207018)
}

/// Name of an `aclnnStatus` (`int32_t`) code, `"unknown aclnnStatus"` if not in the table.
pub fn aclnn_status_name(code: i32) -> &'static str {
    match code {
        0 => "ACLNN_SUCCESS",
        161001 => "ACLNN_ERR_PARAM_NULLPTR",
        161002 => "ACLNN_ERR_PARAM_INVALID",
        361001 => "ACLNN_ERR_RUNTIME_ERROR",
        561000 => "ACLNN_ERR_INNER",
        561001 => "ACLNN_ERR_INNER_INFERSHAPE_ERROR",
        561002 => "ACLNN_ERR_INNER_TILING_ERROR",
        561003 => "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
        561101 => "ACLNN_ERR_INNER_CREATE_EXECUTOR",
        561103 => "ACLNN_ERR_INNER_NULLPTR",
        561107 => "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
        _ => "unknown aclnnStatus",
    }
}

/// Name of an `HcclResult` (C enum, 4 bytes) code, `"unknown HcclResult"` if not in the table.
pub fn hccl_result_name(code: u32) -> &'static str {
    match code {
        0 => "HCCL_SUCCESS",
        1 => "HCCL_E_PARA",
        2 => "HCCL_E_PTR",
        3 => "HCCL_E_MEMORY",
        4 => "HCCL_E_INTERNAL",
        5 => "HCCL_E_NOT_SUPPORT",
        6 => "HCCL_E_NOT_FOUND",
        7 => "HCCL_E_UNAVAIL",
        8 => "HCCL_E_SYSCALL",
        9 => "HCCL_E_TIMEOUT",
        10 => "HCCL_E_OPEN_FILE_FAILURE",
        11 => "HCCL_E_TCP_CONNECT",
        12 => "HCCL_E_ROCE_CONNECT",
        13 => "HCCL_E_TCP_TRANSFER",
        14 => "HCCL_E_ROCE_TRANSFER",
        15 => "HCCL_E_RUNTIME",
        16 => "HCCL_E_DRV",
        17 => "HCCL_E_PROFILING",
        18 => "HCCL_E_CCE",
        19 => "HCCL_E_NETWORK",
        20 => "HCCL_E_AGAIN",
        21 => "HCCL_E_REMOTE",
        22 => "HCCL_E_SUSPENDING",
        23 => "HCCL_E_OPRETRY_FAIL",
        24 => "HCCL_E_OOM",
        _ => "unknown HcclResult",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes a run on hardware reported without a name before (values and spellings from
    /// rt_error_codes.h of the torch-npu 2.14.0 wheel; checked in every build, not only with
    /// the generated constants of `--features npu`).
    #[test]
    fn runtime_timeout_and_link_codes_are_named() {
        assert_eq!(acl_error_name(107020), "ACL_ERROR_RT_TASK_TIMEOUT");
        assert_eq!(acl_error_name(507901), "ACL_ERROR_RT_SOCKET_CLOSE");
        assert_eq!(acl_error_name(507904), "ACL_ERROR_RT_COMM_OP_RETRY_FAIL");
        // Neighbours not in the table stay unknown rather than borrowing a name.
        assert_eq!(acl_error_name(107021), "unknown aclError");
        assert_eq!(acl_error_name(507902), "unknown aclError");
    }

    #[test]
    fn unknown_codes_are_named_unknown() {
        assert_eq!(acl_error_name(-7), "unknown aclError");
        assert_eq!(aclnn_status_name(1), "unknown aclnnStatus");
        assert_eq!(hccl_result_name(25), "unknown HcclResult");
    }

    /// Each table entry against the constant bindgen generated from the wheel's headers.
    #[cfg(feature = "npu")]
    #[test]
    fn acl_names_match_header_constants() {
        use crate::acl::*;
        macro_rules! check {
            ($($name:ident),* $(,)?) => {$(
                // Typed: every header code must be an aclError (`int`).
                let code: aclError = $name;
                assert_eq!(acl_error_name(code), stringify!($name));
            )*};
        }
        check!(
            ACL_SUCCESS,
            ACL_ERROR_INVALID_PARAM,
            ACL_ERROR_UNINITIALIZE,
            ACL_ERROR_REPEAT_INITIALIZE,
            ACL_ERROR_REPEAT_FINALIZE,
            ACL_ERROR_RT_PARAM_INVALID,
            ACL_ERROR_RT_INVALID_DEVICEID,
            ACL_ERROR_RT_CONTEXT_NULL,
            ACL_ERROR_RT_STREAM_CONTEXT,
            ACL_ERROR_RT_TASK_TIMEOUT,
            ACL_ERROR_BAD_ALLOC,
            ACL_ERROR_API_NOT_SUPPORT,
            ACL_ERROR_INVALID_DEVICE,
            ACL_ERROR_MEMORY_ADDRESS_UNALIGNED,
            ACL_ERROR_FEATURE_UNSUPPORTED,
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            ACL_ERROR_RT_MEMORY_ALLOCATION,
            ACL_ERROR_RT_NO_DEVICE,
            ACL_ERROR_RT_DEVICE_OOM,
            ACL_ERROR_INTERNAL_ERROR,
            ACL_ERROR_FAILURE,
            ACL_ERROR_GE_FAILURE,
            ACL_ERROR_RT_FAILURE,
            ACL_ERROR_DRV_FAILURE,
            ACL_ERROR_RT_INTERNAL_ERROR,
            ACL_ERROR_RT_AICORE_TIMEOUT,
            ACL_ERROR_RT_AICORE_EXCEPTION,
            ACL_ERROR_RT_VECTOR_CORE_EXCEPTION,
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
            ACL_ERROR_RT_DEVICE_MEM_ERROR,
            ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR,
            ACL_ERROR_RT_SUSPECT_REMOTE_ERROR,
            ACL_ERROR_RT_DRV_INTERNAL_ERROR,
            ACL_ERROR_RT_SOCKET_CLOSE,
            ACL_ERROR_RT_COMM_OP_RETRY_FAIL,
        );
        assert!(acl_error_is_oom(ACL_ERROR_RT_MEMORY_ALLOCATION));
        assert!(acl_error_is_oom(ACL_ERROR_RT_DEVICE_OOM));
        assert!(!acl_error_is_oom(ACL_ERROR_RT_PARAM_INVALID));
    }

    /// Every HcclResult enumerator of the header up to HCCL_E_OOM, against the generated enum.
    #[cfg(feature = "npu")]
    #[test]
    fn hccl_names_match_header_enum() {
        use crate::hccl::*;
        macro_rules! check {
            ($($name:ident),* $(,)?) => {$(
                let code: HcclResult = $name;
                assert_eq!(hccl_result_name(code), stringify!($name));
            )*};
        }
        check!(
            HCCL_SUCCESS,
            HCCL_E_PARA,
            HCCL_E_PTR,
            HCCL_E_MEMORY,
            HCCL_E_INTERNAL,
            HCCL_E_NOT_SUPPORT,
            HCCL_E_NOT_FOUND,
            HCCL_E_UNAVAIL,
            HCCL_E_SYSCALL,
            HCCL_E_TIMEOUT,
            HCCL_E_OPEN_FILE_FAILURE,
            HCCL_E_TCP_CONNECT,
            HCCL_E_ROCE_CONNECT,
            HCCL_E_TCP_TRANSFER,
            HCCL_E_ROCE_TRANSFER,
            HCCL_E_RUNTIME,
            HCCL_E_DRV,
            HCCL_E_PROFILING,
            HCCL_E_CCE,
            HCCL_E_NETWORK,
            HCCL_E_AGAIN,
            HCCL_E_REMOTE,
            HCCL_E_SUSPENDING,
            HCCL_E_OPRETRY_FAIL,
            HCCL_E_OOM,
        );
        assert_eq!(
            HCCL_E_RESERVED, 25,
            "a new HcclResult code needs a name here"
        );
    }
}
