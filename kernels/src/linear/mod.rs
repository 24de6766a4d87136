//! linear (in progress: see the kernels issue).
