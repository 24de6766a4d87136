//! grad_clip (in progress: see the kernels issue).
