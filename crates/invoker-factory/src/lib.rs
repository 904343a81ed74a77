//! What every container factory is and shares. The [`contract`] (`ContainerFactory`, what a
//! container is made of and how the invoker reaches it) and its typed [`error`]s; what a
//! backend needs to keep a container to its limits and its tenant ([`logs`], each run's window
//! of its lines, and [`pipe_lines`], a pipe read into one; [`peer`], that only the container answers; [`own_disk`]; [`netns`]; Fn's
//! socket, [`fn_socket`]; [`uids`]; [`id_lock`]); the node stats of a one-host backend
//! ([`one_host`]); what each backend's section of the config says ([`settings`]); and the
//! capacity manager's other contract, a control plane ([`plane`]).
//!
//! The process factory lives in the invoker; Docker, Kubernetes and Mesos in crates of their
//! own, built only with their features. Each depends on this crate and nothing of the invoker,
//! so a backend cannot reach into the pool, the store or the API.

#![forbid(unsafe_code)]

pub mod contract;
pub mod error;
pub mod fn_socket;
pub mod id_lock;
pub mod kinds;
pub mod logs;
pub mod netns;
pub mod one_host;
pub mod own_disk;
pub mod peer;
pub mod pipe_lines;
pub mod plane;
pub mod settings;
pub mod uids;
