//! etcd as the cluster layer uses it: what it asks of etcd ([`kv::ClusterKv`], a trait the
//! registry, the schedulers and the capacity manager are written against), the real client
//! over etcd's v3 JSON gateway ([`client::Etcd`]), and a prefix kept in memory by a range and a
//! watch ([`mirror`]); and one key held by one live process ([`claim`]). Below the invoker, the scheduler and the capacity manager; it knows
//! nothing of what they keep in etcd (the keys are `invoker_wire::cluster`'s).

#![forbid(unsafe_code)]

pub mod claim;
pub mod client;
pub mod kv;
pub mod mirror;
