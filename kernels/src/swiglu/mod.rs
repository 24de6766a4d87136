//! swiglu (in progress: see the kernels issue).
