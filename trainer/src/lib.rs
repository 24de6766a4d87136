//! cannon-trainer: the Mistral3 trainer and the `cannon` binary.
pub mod cli;
pub mod data;
pub mod model;
pub mod train;
pub mod verify;
