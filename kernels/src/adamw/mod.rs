//! adamw (in progress: see the kernels issue).
