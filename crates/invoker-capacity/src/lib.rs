//! The capacity manager: a fleet of invokers per group that grows and shrinks with demand
//! (seed 002, Fn's capacity manager). `invoker_core::capacity` decides, purely, from the demand
//! the schedulers report and the group's invokers; `invoker_core::predictor` turns demand into
//! a target. This crate carries those decisions out: the manager (leadership, the tick), the
//! control planes that start and stop invokers, its small API and its metrics. It takes its
//! settings from the invoker's config, which checks them, and depends on nothing of the invoker.

#![forbid(unsafe_code)]

pub mod http;
pub mod manager;
pub mod metrics;
pub mod plane;
