//! The `cannon` binary's commands ([`cli`]) and what only they use: [`plan`] (`cannon plan`,
//! each rank's memory of a run's layout before it runs), [`bench`](mod@bench) (`cannon bench`,
//! timed steps and every memory and parallel feature against the run without it) and
//! [`verify`] (`cannon verify`, parity against an eager float64 reference fixture), and
//! [`chart`] (the SVG and PNG line charts of `cannon plot` and `cannon compare --plot`) and
//! [`timeline`] (`cannon plot --trace`: a step profiler's trace as a picture).
pub mod bench;
pub mod chart;
pub mod cli;
pub mod plan;
pub mod timeline;
pub mod verify;
