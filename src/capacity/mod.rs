//! The capacity manager: a fleet of invokers per group that grows and shrinks with demand
//! (seed 002, Fn's capacity manager). `invoker_core::capacity` decides, purely, from the demand
//! the schedulers report and the group's invokers; `invoker_core::predictor` turns demand into
//! a target.

pub mod http;
pub mod manager;
pub mod metrics;
pub mod plane;
