//! cross_entropy (in progress: see the kernels issue).
