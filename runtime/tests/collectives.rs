//! The CPU communicator against sequential references (see the modules under collectives/).

#[path = "collectives/common.rs"]
mod common;
#[path = "collectives/reduce.rs"]
mod reduce;
