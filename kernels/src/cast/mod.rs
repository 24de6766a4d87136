//! cast (in progress: see the kernels issue).
