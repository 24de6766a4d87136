//! Collective communication: in-process CPU ranks (threads) and HCCL on NPUs
//! (in progress: see the foundation issue).
