//! The capacity manager: a fleet of invokers per group that grows and shrinks with demand
//! (seed 002, Fn's capacity manager). [`core`] decides, purely, from the demand the schedulers
//! report and the group's invokers; [`predictor`] turns demand into a target.

pub use invoker_core::capacity as core;
pub mod http;
pub mod manager;
pub mod metrics;
pub mod plane;
pub use invoker_core::predictor;
