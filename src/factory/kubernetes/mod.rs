//! The Kubernetes factory (issue 20), in parts. Landed so far: what each node offers, from the
//! API server's Nodes and Pods (`offers.rs`, pure), kept current by watches (`watch.rs`, tested
//! against the fake API server in `tests/support/kube_api.rs`). To come: pods created bound to
//! the node the pool chose, their logs, and the factory itself.

pub mod offers;
pub mod watch;
