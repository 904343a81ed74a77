//! The invoker's decisions, as pure functions of events: what runs where and when a container
//! goes ([`pool`]), one container's life ([`proxy`]), which invoker a scheduler sends an
//! activation to ([`placement`]), and how many invokers a group needs ([`capacity`], with its
//! [`predictor`]s). Nothing here reads a clock or does I/O: time comes in with each event, and
//! the effects go out for the actors (the `invoker` crate) to carry out, so the actors, the
//! simulators ([`sim`]) and the property tests drive the same code. The crate depends on no async
//! runtime, actor, HTTP or storage crate (`tests/layout.rs` in the invoker checks it), so none
//! can creep in.

#![forbid(unsafe_code)]

pub mod capacity;
pub mod placement;
pub mod pool;
pub mod predictor;
pub mod proxy;
pub mod sim;
