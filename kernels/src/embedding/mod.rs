//! embedding (in progress: see the kernels issue).
