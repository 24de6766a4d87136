//! How a step spreads over ranks: [`fsdp`] shards the parameters, gradients and optimizer
//! state over the data-parallel ranks; [`cp`] cuts a batch's tokens over the ranks of a
//! context-parallel group, attention still seeing the whole sequence.
pub mod cp;
pub mod fsdp;
