//! rope (in progress: see the kernels issue).
