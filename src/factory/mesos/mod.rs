//! The Mesos factory: action containers as tasks of a Mesos framework, through the v1
//! scheduler HTTP API. Resource offers are the node stats: per agent, what is offered now.

pub mod offers;
pub mod proto;
pub mod recordio;
pub mod scheduler;
