//! rmsnorm (in progress: see the kernels issue).
