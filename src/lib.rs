//! Invoker: the per-node agent of a serverless platform.
//!
//! The path of an activation: [`api`] validates and records it, the [`pool`] decides where it
//! runs (its pure core makes every decision), a [`proxy`] per container speaks the action
//! runtime protocol, a [`factory`] creates containers within what the cluster says is free,
//! and the [`store`] keeps actions and activation records.
#![forbid(unsafe_code)]

pub mod activation;
pub mod api;
pub mod app;
pub mod cluster;
pub mod config;
pub mod factory;
#[cfg(feature = "test-util")]
pub mod fuzz;
pub mod pool;
pub mod proxy;
pub mod sim;
