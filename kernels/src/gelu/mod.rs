//! gelu (in progress: see the kernels issue).
