//! patch_embed (in progress: see the kernels issue).
