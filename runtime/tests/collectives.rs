//! The CPU communicator against sequential references (see the modules under collectives/).

#[path = "collectives/common.rs"]
mod common;
#[path = "collectives/failures.rs"]
mod failures;
#[path = "collectives/gather.rs"]
mod gather;
#[path = "collectives/groups.rs"]
mod groups;
#[cfg(feature = "npu")]
#[path = "collectives/hccl.rs"]
mod hccl;
#[path = "collectives/reduce.rs"]
mod reduce;
#[path = "collectives/rendezvous.rs"]
mod rendezvous;
#[path = "collectives/store_strangers.rs"]
mod store_strangers;
