//! The cluster layer: many invokers tied together through etcd. An invoker registers itself
//! under a lease (its API address, tags, health and headroom, and the containers it holds, in
//! the key layout of OpenWhisk's scheduler), so a scheduler can place activations across
//! invokers. Nothing here is on an activation's path: registration runs beside the pool and
//! never slows or fails an activation, whatever etcd does. etcd itself (the client, the trait
//! the cluster layer is written against, a mirrored prefix) is `invoker_etcd`'s.

pub mod fetch;
pub mod provisioned;
pub mod registry;
