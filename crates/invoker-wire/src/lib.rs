//! What the invoker, its runtimes and the cluster say to one another, apart from whoever says
//! it: actions and activation records in OpenWhisk's JSON and the `ActivationMessage` a
//! controller sends ([`model`]), the keys and records the members of a cluster keep in etcd
//! ([`cluster`]), and the fixed words and places of the runtime protocols ([`runtime`]). The
//! API, the store, the proxies, the factories, the runtime and the scheduler all read these
//! from here, so that none of them imports another for a shape they share.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod json_parts;
mod json_text;
pub mod model;
pub mod params;
pub mod record_head;
mod record_json;
pub mod result_json;
pub mod runtime;
