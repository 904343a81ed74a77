//! Control planes: where a group's invokers run, and how one is started and stopped. A trait,
//! an enum over the real ones, and a fake for tests, as the container factories are. The
//! manager only asks; an invoker it started is known to be up once it registers in etcd.

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod local;

use invoker_factory::plane::{ControlPlane, InvokerSpec, PlaneError};
#[cfg(feature = "kubernetes")]
use invoker_kubernetes::plane as kubernetes;

pub enum AnyPlane {
    Local(local::LocalPlane),
    #[cfg(feature = "kubernetes")]
    Kubernetes(Box<kubernetes::KubernetesPlane>),
    #[cfg(any(test, feature = "test-util"))]
    Fake(fake::FakePlane),
}

/// `$body` with `$p` bound to the plane that runs: the one list of planes to delegate to.
macro_rules! each_plane {
    ($plane:expr, $p:ident => $body:expr) => {
        match $plane {
            AnyPlane::Local($p) => $body,
            #[cfg(feature = "kubernetes")]
            AnyPlane::Kubernetes($p) => $body,
            #[cfg(any(test, feature = "test-util"))]
            AnyPlane::Fake($p) => $body,
        }
    };
}

impl ControlPlane for AnyPlane {
    async fn provision(&self, spec: &InvokerSpec) -> Result<(), PlaneError> {
        each_plane!(self, p => p.provision(spec).await)
    }

    async fn remove(&self, id: &str) -> Result<(), PlaneError> {
        each_plane!(self, p => p.remove(id).await)
    }

    fn running(&self, id: &str) -> Option<bool> {
        each_plane!(self, p => p.running(id))
    }

    fn last_error(&self, id: &str) -> Option<String> {
        each_plane!(self, p => p.last_error(id))
    }

    fn found(&self) -> Vec<String> {
        each_plane!(self, p => p.found())
    }

    fn forget(&self, id: &str) {
        each_plane!(self, p => p.forget(id))
    }
}
