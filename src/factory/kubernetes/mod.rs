//! The Kubernetes factory (issue 20), in parts. Landed so far: what each node offers, from the
//! API server's Nodes and Pods (`offers.rs`, pure). To come: the watches that feed it, pods
//! created bound to the node the pool chose, their logs, and the fake API server its tests run
//! against.

pub mod offers;
