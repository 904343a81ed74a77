//! The runtime protocols: how a proxy initialises a container's runtime with an action's code,
//! runs one activation on it, and reads the answer as an outcome. One file per protocol,
//! chosen per kind (`[kinds."<kind>"] protocol`); the proxy's lifecycle does not change with it.
//! Every protocol speaks HTTP/1.1 over the container's transport through [`RuntimeClient`].

mod answer;
mod client;
mod fn_relay;
pub mod fn_stream;
mod openwhisk;
mod stream;

pub use answer::{discard_reason, Answer, Interpreted};

pub use client::{RuntimeClient, RuntimeError, RuntimeResponse};

use invoker_factory::contract::FunctionStart;
use invoker_factory::contract::Transport;
use invoker_factory::kinds::RuntimeProtocol;
use invoker_factory::peer::Peer;
use invoker_job::stream::StreamRequest;
use invoker_job::RunJob;
use invoker_wire::model::Action;
use std::sync::Arc;
use std::time::Duration;

/// What a container of `protocol` starts with for `action`, when the protocol gives no code
/// once it runs (Fn's); `None` for a protocol that initialises its containers.
pub fn function_start(protocol: RuntimeProtocol, action: &Action, memory_mb: u32) -> Option<FunctionStart> {
    match protocol {
        RuntimeProtocol::OpenWhisk => None,
        RuntimeProtocol::Fn => Some(FunctionStart {
            code: action.exec.code.clone(),
            main: action.exec.main.clone().unwrap_or_else(|| "handler".into()),
            env: fn_stream::environment(action, memory_mb),
            image: action.exec.image.clone(),
        }),
    }
}

/// One container's runtime, reached through the protocol of its kind.
pub struct Runtime {
    protocol: RuntimeProtocol,
    client: RuntimeClient,
}

impl Runtime {
    /// `max_result` is the payload limit: no more of an answer is read than it allows.
    /// Every connection to `transport` is checked against `peer`.
    pub fn new(protocol: RuntimeProtocol, transport: &Transport, peer: Arc<Peer>, max_result: usize) -> Self {
        Runtime { protocol, client: RuntimeClient::new(transport, peer, max_result) }
    }

    /// Gives the runtime the action's code; `Err` holds the answer of a failed initialisation.
    pub async fn init(&self, action: &Action, api_host: &str, timeout: Duration) -> Result<(), Answer> {
        match self.protocol {
            RuntimeProtocol::OpenWhisk => openwhisk::init(&self.client, action, api_host, timeout).await,
            // Its code is in the container from the start.
            RuntimeProtocol::Fn => Ok(()),
        }
    }

    /// `stream`: the caller takes the answer as a stream, should the action stream one (a
    /// generator on our runtime; an Fn function's response in chunks).
    pub async fn run(&self, run: &RunJob, stream: Option<StreamRequest>, timeout: Duration) -> Answer {
        match self.protocol {
            RuntimeProtocol::OpenWhisk => openwhisk::run(&self.client, run, stream, timeout).await,
            RuntimeProtocol::Fn => fn_stream::call(&self.client, run, stream, timeout).await,
        }
    }

    /// The answer of a run (or of a failed init) as an outcome. `oom` says the container's
    /// memory limit killed it; `max_result_bytes` is the payload limit.
    pub fn interpret(&self, answer: Answer, timeout_ms: u64, oom: bool, max_result_bytes: usize) -> Interpreted {
        match self.protocol {
            RuntimeProtocol::OpenWhisk => openwhisk::interpret(answer, timeout_ms, oom, max_result_bytes),
            RuntimeProtocol::Fn => fn_stream::interpret(answer, oom, max_result_bytes),
        }
    }

    /// Whether a run's answer is a success of the protocol (not of the action): when it is not,
    /// the container may have died, and its OOM state is worth reading.
    pub fn within_protocol(&self, answer: &Answer) -> bool {
        match self.protocol {
            RuntimeProtocol::OpenWhisk => matches!(answer, Ok(RuntimeResponse { status: 200, .. })),
            RuntimeProtocol::Fn => fn_stream::within_contract(answer),
        }
    }
}
