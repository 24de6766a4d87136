//! gemm (in progress: see the kernels issue).
