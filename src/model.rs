//! Actions and activation records: the shapes live in `invoker-wire`, which the cluster and the
//! runtimes read too.

pub use invoker_wire::model::*;
