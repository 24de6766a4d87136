//! Exactly what cannon binds: one spec per generated module. Adding a function here (and, for an
//! aclnn op, its declaration in sys/include/cannon_aclnn.h) and rerunning the generator is the
//! whole procedure; sys/README.md lists the same names for readers.

/// Which loader library a module's functions come from (a `cannon_sys::loader::Lib` variant).
#[derive(Clone, Copy, Debug)]
pub enum LibName {
    AscendCl,
    NnopBase,
    OpApi,
    Hccl,
}

impl LibName {
    pub fn variant(self) -> &'static str {
        match self {
            LibName::AscendCl => "AscendCl",
            LibName::NnopBase => "NnopBase",
            LibName::OpApi => "OpApi",
            LibName::Hccl => "Hccl",
        }
    }

    pub fn file(self) -> &'static str {
        match self {
            LibName::AscendCl => "libascendcl.so",
            LibName::NnopBase => "libnnopbase.so",
            LibName::OpApi => "the aclnn op libraries",
            LibName::Hccl => "libhccl.so",
        }
    }
}

/// One generated file.
pub struct ModuleSpec {
    /// Output file name in src/generated.
    pub file: &'static str,
    /// First line of the module docs.
    pub title: &'static str,
    /// Contents of the virtual header bindgen parses (`#include`s relative to the include dirs).
    pub wrapper: &'static str,
    /// Parse as C++14 (hccl.h only parses as C++).
    pub cplusplus: bool,
    /// Functions, grouped by the library they are resolved from.
    pub functions: Vec<(LibName, Vec<String>)>,
    /// Types to emit (plus what the functions need, recursively).
    pub types: &'static [&'static str],
    /// Constants to emit (regexes, anchored by bindgen).
    pub vars: &'static [&'static str],
    /// Types defined by the `acl` module and imported here instead of redefined.
    pub imported: &'static [&'static str],
}

impl ModuleSpec {
    pub fn all_functions(&self) -> impl Iterator<Item = &str> {
        self.functions
            .iter()
            .flat_map(|(_, f)| f.iter().map(String::as_str))
    }

    pub fn lib_of(&self, function: &str) -> Option<LibName> {
        self.functions
            .iter()
            .find(|(_, f)| f.iter().any(|n| n == function))
            .map(|(l, _)| *l)
    }
}

fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

pub const ACL_FUNCTIONS: &[&str] = &[
    "aclInit",
    "aclFinalize",
    "aclGetRecentErrMsg",
    "aclrtGetVersion",
    "aclrtSetDevice",
    "aclrtResetDevice",
    "aclrtGetDevice",
    "aclrtGetDeviceCount",
    "aclrtSynchronizeDevice",
    "aclrtCreateContext",
    "aclrtDestroyContext",
    "aclrtSetCurrentContext",
    "aclrtGetCurrentContext",
    "aclrtCreateStream",
    "aclrtCreateStreamWithConfig",
    "aclrtDestroyStream",
    "aclrtSynchronizeStream",
    "aclrtSynchronizeStreamWithTimeout",
    "aclrtStreamWaitEvent",
    "aclrtCreateEvent",
    "aclrtCreateEventWithFlag",
    "aclrtRecordEvent",
    "aclrtSynchronizeEvent",
    "aclrtQueryEventStatus",
    "aclrtEventElapsedTime",
    "aclrtDestroyEvent",
    "aclrtMalloc",
    "aclrtFree",
    "aclrtMallocHost",
    "aclrtFreeHost",
    "aclrtMemcpy",
    "aclrtMemcpyAsync",
    "aclrtMemset",
    "aclrtMemsetAsync",
    "aclrtGetMemInfo",
];

pub const ACL_TYPES: &[&str] = &[
    "aclError",
    "aclrtContext",
    "aclrtStream",
    "aclrtEvent",
    "aclrtMemMallocPolicy",
    "aclrtMemcpyKind",
    "aclrtMemAttr",
    "aclrtEventRecordedStatus",
    "aclDataType",
    "aclFormat",
];

pub const ACL_VARS: &[&str] = &[
    "ACL_MAJOR_VERSION",
    "ACL_MINOR_VERSION",
    "ACL_PATCH_VERSION",
    "ACL_SUCCESS",
    "ACL_ERROR_.*",
    "ACL_EVENT_SYNC",
    "ACL_EVENT_CAPTURE_STREAM_PROGRESS",
    "ACL_EVENT_TIME_LINE",
    "ACL_EVENT_DEVICE_USE_ONLY",
    "ACL_MEM_TYPE_LOW_BAND_WIDTH",
    "ACL_MEM_TYPE_HIGH_BAND_WIDTH",
    "ACL_MEM_ACCESS_USER_SPACE_READONLY",
    "ACL_STREAM_FAST_LAUNCH",
    "ACL_STREAM_FAST_SYNC",
];

pub const HCCL_FUNCTIONS: &[&str] = &[
    "HcclGetRootInfo",
    "HcclCommInitRootInfo",
    "HcclCommDestroy",
    "HcclGetRankSize",
    "HcclGetRankId",
    "HcclAllReduce",
    "HcclBroadcast",
    "HcclReduceScatter",
    "HcclAllGather",
    "HcclSend",
    "HcclRecv",
    "HcclAlltoAll",
    "HcclAlltoAllV",
    "HcclReduce",
    "HcclBarrier",
    "HcclGetCommAsyncError",
    "HcclGetErrorString",
];

pub const HCCL_TYPES: &[&str] = &[
    "HcclComm",
    "HcclRootInfo",
    "HcclResult",
    "HcclDataType",
    "HcclReduceOp",
];

pub const HCCL_VARS: &[&str] = &["HCCL_ROOT_INFO_BYTES"];

/// The aclnn descriptor API (libnnopbase.so).
pub const ACLNN_BASE_FUNCTIONS: &[&str] = &[
    "aclCreateTensor",
    "aclCreateScalar",
    "aclCreateIntArray",
    "aclCreateFloatArray",
    "aclCreateBoolArray",
    "aclCreateTensorList",
    "aclCreateScalarList",
    "aclDestroyTensor",
    "aclDestroyScalar",
    "aclDestroyIntArray",
    "aclDestroyFloatArray",
    "aclDestroyBoolArray",
    "aclDestroyTensorList",
    "aclDestroyScalarList",
    "aclSetAclOpExecutorRepeatable",
    "aclDestroyAclOpExecutor",
    "aclSetRawTensorAddr",
    "aclGetRawTensorAddr",
    "aclnnInit",
    "aclnnFinalize",
];

/// aclnn ops; each binds `aclnn<Op>GetWorkspaceSize` and `aclnn<Op>`.
pub const ACLNN_OPS: &[&str] = &[
    "FlashAttentionVarLenScore",
    "FlashAttentionUnpaddingScoreGrad",
    "RingAttentionUpdate",
    "Matmul",
    "Mm",
    "RmsNorm",
    "RmsNormGrad",
    "SwiGlu",
    "SwiGluGrad",
    "GeluV2",
    "GeluBackwardV2",
    "RotaryPositionEmbedding",
    "RotaryPositionEmbeddingGrad",
    "CrossEntropyLoss",
    "CrossEntropyLossGrad",
    "ApplyAdamWV2",
    "Cast",
    "Add",
    "Adds",
    "InplaceAdd",
    "Mul",
    "Muls",
    "InplaceMul",
    "InplaceMuls",
    "Embedding",
    "EmbeddingDenseBackward",
];

pub const ACLNN_TYPES: &[&str] = &[
    "aclnnStatus",
    "aclOpExecutor",
    "aclTensor",
    "aclScalar",
    "aclIntArray",
    "aclFloatArray",
    "aclBoolArray",
    "aclTensorList",
    "aclScalarList",
];

pub fn modules() -> Vec<ModuleSpec> {
    let ops = ACLNN_OPS
        .iter()
        .flat_map(|op| [format!("aclnn{op}GetWorkspaceSize"), format!("aclnn{op}")])
        .collect();
    vec![
        ModuleSpec {
            file: "acl.rs",
            title: "AscendCL runtime subset (libascendcl.so).",
            wrapper: "#include \"acl/acl_rt.h\"\n",
            cplusplus: false,
            functions: vec![(LibName::AscendCl, owned(ACL_FUNCTIONS))],
            types: ACL_TYPES,
            vars: ACL_VARS,
            imported: &[],
        },
        ModuleSpec {
            file: "hccl.rs",
            title: "HCCL collectives (libhccl.so).",
            wrapper: "#include \"third_party/hccl/inc/hccl/hccl.h\"\n",
            cplusplus: true,
            functions: vec![(LibName::Hccl, owned(HCCL_FUNCTIONS))],
            types: HCCL_TYPES,
            vars: HCCL_VARS,
            imported: &["aclrtStream"],
        },
        ModuleSpec {
            file: "aclnn.rs",
            title: "aclnn descriptors (libnnopbase.so) and ops (aclnn op libraries).",
            wrapper: "#include \"cannon_aclnn.h\"\n",
            cplusplus: false,
            functions: vec![
                (LibName::NnopBase, owned(ACLNN_BASE_FUNCTIONS)),
                (LibName::OpApi, ops),
            ],
            types: ACLNN_TYPES,
            vars: &[],
            imported: &["aclrtStream", "aclDataType", "aclFormat"],
        },
    ]
}
