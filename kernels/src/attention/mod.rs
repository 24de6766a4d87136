//! attention (in progress: see the kernels issue).
