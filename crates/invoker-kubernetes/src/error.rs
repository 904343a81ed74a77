//! What a call to a Kubernetes API server fails with, typed; shared by the factory and the
//! capacity manager's control plane.

use std::time::Duration;

/// A call to a Kubernetes API server that did not do what was asked; shared with the
/// capacity manager's control plane.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("api_server {url}: {source}")]
    ApiServer { url: String, source: hyper::http::uri::InvalidUri },
    #[error("{}: {source}", .path.display())]
    Kubeconfig { path: std::path::PathBuf, source: Box<kube::config::KubeconfigError> },
    #[error("no cluster configured: {0}")]
    NoCluster(Box<kube::config::InferConfigError>),
    /// `doing`: what was asked (creating the pod, scaling the StatefulSet a1 to 3).
    #[error("{doing}: {}", api_words(.source))]
    Call { doing: String, source: Box<kube::Error> },
    #[error("{doing}: no answer within {bound:?}")]
    Timeout { doing: String, bound: Duration },
    #[error("{0}: the watch ended before its first list")]
    WatchEnded(String),
    #[error("the StatefulSet of group {group}: {source}")]
    Template { group: String, source: serde_json::Error },
}

impl KubeError {
    pub fn call(doing: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
        let doing = doing.into();
        move |source| KubeError::Call { doing, source: Box::new(source) }
    }

    /// The API server's status code, when it answered one.
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Call { source, .. } => match source.as_ref() {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The API server's answer in its own words.
fn api_words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(r) if r.code == 409 => format!("the name is taken (409 {})", r.message),
        kube::Error::Api(r) if r.code == 422 => format!("the API server found it invalid: {}", r.message),
        kube::Error::Api(r) => format!("the API server answered {} {}: {}", r.code, r.reason, r.message),
        e => e.to_string(),
    }
}

impl From<KubeError> for invoker_factory::error::Cause {
    fn from(e: KubeError) -> Self {
        invoker_factory::error::Cause::backend(e)
    }
}

impl From<KubeError> for invoker_factory::plane::PlaneFailure {
    fn from(e: KubeError) -> Self {
        invoker_factory::plane::PlaneFailure::Backend(Box::new(e))
    }
}
