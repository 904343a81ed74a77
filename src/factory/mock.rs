//! The mock factory: programmable nodes, start latency, failures, and a log of every call.
//!
//! Each mock container is a real HTTP server on 127.0.0.1 that speaks the runtime protocol, so
//! the proxies run unchanged. The action's parameters steer a run: `sleep_ms` delays it,
//! `error` makes it an application error, `crash` kills the container mid-run, and
//! `fail_times: n` with `fail_key: k` makes the first n runs that name `k` application errors.

use http_body_util::{BodyExt, Limited};
use hyper::{Request, StatusCode};
use invoker_factory::contract::{ContainerFactory, ContainerHandle, ContainerSpec, Epoch, StatsReceiver, Transport};
use invoker_factory::error::{CreateError, FactoryError};
use invoker_factory::logs::{LogBuffer, Stream, SENTINEL};
use invoker_http::{json_value, Response};
use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Node name and memory capacity (MB).
    pub nodes: Vec<(String, u64)>,
    pub start_latency: Duration,
    /// Run time of an activation that does not say `sleep_ms`.
    pub run_latency: Duration,
    /// Every create fails.
    pub fail_creates: bool,
    /// Published stats describe the cluster as it was this long ago (a cluster manager's
    /// view lags behind reality); zero publishes the present.
    pub stats_lag: Duration,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            nodes: vec![("mock0".into(), 2048)],
            start_latency: Duration::ZERO,
            run_latency: Duration::ZERO,
            fail_creates: false,
            stats_lag: Duration::ZERO,
        }
    }
}

/// One entry of the call log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MockCall {
    Create(ContainerId),
    Created(ContainerId),
    CreateFailed(ContainerId),
    Refused(ContainerId),
    Crashed(ContainerId),
    Paused(ContainerId),
    Resumed(ContainerId),
    Destroy(ContainerId),
    Destroyed(ContainerId),
}

#[derive(Clone)]
pub struct MockFactory {
    inner: Arc<Inner>,
}

struct Inner {
    config: Mutex<MockConfig>,
    epoch: Epoch,
    stats: watch::Sender<Vec<NodeStatsUpdate>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Alive from `create` called until `destroy` completed: what occupies the cluster.
    alive: HashMap<ContainerId, (NodeId, u32, Option<CancellationToken>)>,
    max_alive: usize,
    calls: Vec<MockCall>,
    /// Runs so far by their `fail_key` parameter.
    runs_by_key: HashMap<String, u64>,
    /// Past snapshots, for stats that lag: (time, the update published for it).
    history: std::collections::VecDeque<(invoker_ids::Time, Vec<NodeStatsUpdate>)>,
    /// A paused container's runtime answers no run (503), as a frozen process would not.
    paused: std::collections::HashSet<ContainerId>,
}

struct RuntimeState {
    id: ContainerId,
    factory: MockFactory,
    logs: Arc<LogBuffer>,
    /// Cancelled, the container's server stops at once: no more accepts, connections dropped.
    stop: CancellationToken,
    run_latency: Duration,
}

impl MockFactory {
    pub fn new(config: MockConfig, epoch: Epoch) -> Self {
        let (stats, _) = watch::channel(Vec::new());
        let factory = MockFactory {
            inner: Arc::new(Inner { config: Mutex::new(config), epoch, stats, state: Mutex::default() }),
        };
        factory.publish();
        factory.start_lag_ticker();
        factory
    }

    /// Every node offers what the memory limit in `file` leaves beyond `own_mb`, read at once
    /// and then as the process factory reads it (`unlimited_mb` where it sets none).
    pub fn follow_memory_limit(&self, file: &std::path::Path, own_mb: u64, unlimited_mb: u64) {
        let offer = |factory: &MockFactory, mb: u64| {
            let changed = factory.inner.config.lock().nodes.iter().any(|(_, capacity)| *capacity != mb);
            if changed {
                factory.configure(|c| c.nodes.iter_mut().for_each(|(_, capacity)| *capacity = mb));
            }
        };
        match invoker_process::memory_limit::read(file, own_mb) {
            Ok(mb) => offer(self, mb.unwrap_or(unlimited_mb)),
            Err(e) => tracing::warn!("the mock factory's memory limit: {e}"),
        }
        let weak = Arc::downgrade(&self.inner);
        invoker_process::memory_limit::follow(file, own_mb, unlimited_mb, move |mb| {
            let Some(inner) = weak.upgrade() else { return false };
            offer(&MockFactory { inner }, mb);
            true
        });
    }

    /// Changes the programmable behaviour for what comes next.
    pub fn configure(&self, f: impl FnOnce(&mut MockConfig)) {
        f(&mut self.inner.config.lock());
        self.publish();
    }

    pub fn calls(&self) -> Vec<MockCall> {
        self.inner.state.lock().calls.clone()
    }

    pub fn alive(&self) -> usize {
        self.inner.state.lock().alive.len()
    }

    /// The most containers alive at any one moment so far.
    pub fn max_alive(&self) -> usize {
        self.inner.state.lock().max_alive
    }

    pub fn count(&self, pred: impl Fn(&MockCall) -> bool) -> usize {
        self.inner.state.lock().calls.iter().filter(|c| pred(c)).count()
    }

    fn publish(&self) {
        let (nodes, lag) = {
            let config = self.inner.config.lock();
            (config.nodes.clone(), config.stats_lag)
        };
        let now = self.inner.epoch.now();
        let mut state = self.inner.state.lock();
        let snapshot: Vec<NodeStatsUpdate> = nodes
            .iter()
            .map(|(name, capacity_mb)| {
                let used: u64 =
                    state.alive.values().filter(|(n, ..)| &*n.0 == name).map(|(_, m, _)| u64::from(*m)).sum();
                NodeStatsUpdate {
                    node: NodeId::new(name),
                    capacity_mb: *capacity_mb,
                    free_mb: capacity_mb.saturating_sub(used),
                    observed_at: now,
                }
            })
            .collect();
        state.history.push_back((now, snapshot));
        // Keep the newest snapshot that is at least `lag` old, and everything after it.
        while state.history.len() > 1 && state.history[1].0 + lag <= now {
            state.history.pop_front();
        }
        let due = state.history.front().filter(|(t, _)| *t + lag <= now).map(|(_, s)| s.clone());
        drop(state);
        if let Some(snapshot) = due {
            self.inner.stats.send_replace(snapshot);
        }
    }

    /// With lagging stats, publishes on a timer too, so that the past catches up with the pool.
    fn start_lag_ticker(&self) {
        let lag = self.inner.config.lock().stats_lag;
        if lag.is_zero() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let every = (lag / 4).max(Duration::from_millis(5));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                MockFactory { inner }.publish();
            }
        });
    }

    fn log(&self, call: MockCall) {
        self.inner.state.lock().calls.push(call);
    }

    fn start_runtime(
        &self,
        id: ContainerId,
        run_latency: Duration,
    ) -> Result<(std::net::SocketAddr, Arc<LogBuffer>, CancellationToken), FactoryError> {
        let create = |e: std::io::Error| CreateError::step("the mock runtime's listener", e);
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(create)?;
        listener.set_nonblocking(true).map_err(create)?;
        let addr = listener.local_addr().map_err(create)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(create)?;
        let logs = Arc::new(LogBuffer::default());
        let stop = CancellationToken::new();
        let state =
            Arc::new(RuntimeState { id, factory: self.clone(), logs: logs.clone(), stop: stop.clone(), run_latency });
        tokio::spawn(serve(listener, state));
        Ok((addr, logs, stop))
    }

    fn is_paused(&self, id: ContainerId) -> bool {
        self.inner.state.lock().paused.contains(&id)
    }

    /// Counts a run that names `key`; how many did before it.
    fn count_run(&self, key: &str) -> u64 {
        let mut state = self.inner.state.lock();
        let count = state.runs_by_key.entry(key.to_string()).or_default();
        *count += 1;
        *count - 1
    }
}

impl ContainerFactory for MockFactory {
    fn describe(&self) -> String {
        "mock factory (in-process runtimes, nothing enforced)".into()
    }

    fn stats(&self) -> StatsReceiver {
        self.inner.stats.subscribe()
    }

    fn observe(&self) {
        self.publish();
    }

    async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        let config = self.inner.config.lock().clone();
        let capacity = config.nodes.iter().find(|(n, _)| *n == *node.0).map(|(_, c)| *c).unwrap_or(0);
        {
            let mut state = self.inner.state.lock();
            state.calls.push(MockCall::Create(spec.id));
            let used: u64 = state.alive.values().filter(|(n, ..)| n == node).map(|(_, m, _)| u64::from(*m)).sum();
            if used + u64::from(spec.memory_mb) > capacity {
                state.calls.push(MockCall::Refused(spec.id));
                return Err(FactoryError::Refused(format!("{} MB do not fit on {node}", spec.memory_mb)));
            }
            state.alive.insert(spec.id, (node.clone(), spec.memory_mb, None));
            state.max_alive = state.max_alive.max(state.alive.len());
        }
        self.publish();
        tokio::time::sleep(config.start_latency).await;
        let started = if config.fail_creates {
            Err(CreateError::MockFails.into())
        } else {
            self.start_runtime(spec.id, config.run_latency)
        };
        match started {
            Ok((addr, logs, server)) => {
                let mut state = self.inner.state.lock();
                if let Some(entry) = state.alive.get_mut(&spec.id) {
                    entry.2 = Some(server);
                }
                state.calls.push(MockCall::Created(spec.id));
                drop(state);
                let ready_at = self.inner.epoch.now();
                self.publish();
                let (transport, peer) = (Transport::Tcp(addr), Arc::default());
                Ok(ContainerHandle { id: spec.id, node: node.clone(), transport, peer, logs, ready_at })
            }
            Err(e) => {
                {
                    let mut state = self.inner.state.lock();
                    state.alive.remove(&spec.id);
                    state.calls.push(MockCall::CreateFailed(spec.id));
                }
                self.publish();
                Err(e)
            }
        }
    }

    async fn pause(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        let mut state = self.inner.state.lock();
        if !state.alive.contains_key(&c.id) {
            return Err(FactoryError::NoSuchContainer { op: "pause" });
        }
        state.paused.insert(c.id);
        state.calls.push(MockCall::Paused(c.id));
        Ok(())
    }

    async fn resume(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        let mut state = self.inner.state.lock();
        if !state.paused.remove(&c.id) {
            return Err(FactoryError::NotInState { op: "resume", state: "paused" });
        }
        state.calls.push(MockCall::Resumed(c.id));
        Ok(())
    }

    async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.log(MockCall::Destroy(c.id));
        self.inner.state.lock().paused.remove(&c.id);
        let server = self.inner.state.lock().alive.get_mut(&c.id).and_then(|e| e.2.take());
        if let Some(server) = server {
            server.cancel();
        }
        c.logs.close();
        {
            let mut state = self.inner.state.lock();
            state.alive.remove(&c.id);
            state.calls.push(MockCall::Destroyed(c.id));
        }
        self.publish();
        Ok(())
    }

    async fn destroy_all(&self) {
        let servers: Vec<(ContainerId, Option<CancellationToken>)> =
            self.inner.state.lock().alive.iter_mut().map(|(id, e)| (*id, e.2.take())).collect();
        for (id, server) in servers {
            if let Some(server) = server {
                server.cancel();
            }
            let mut state = self.inner.state.lock();
            state.alive.remove(&id);
            state.calls.push(MockCall::Destroyed(id));
        }
        self.publish();
    }
}

/// A mock container's HTTP server, on the thread that created it, until its token is cancelled.
async fn serve(listener: tokio::net::TcpListener, state: Arc<RuntimeState>) {
    loop {
        let stream = tokio::select! {
            _ = state.stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (stop, state) = (state.stop.clone(), state.clone());
        let service = hyper::service::service_fn(move |request| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(route(&state, request).await) }
        });
        let connection =
            hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// The largest body a mock container reads.
const MAX_BODY: usize = 64 * 1024 * 1024;

async fn route(state: &RuntimeState, request: Request<hyper::body::Incoming>) -> Response {
    let init = match request.uri().path() {
        "/init" => true,
        "/run" => false,
        _ => return json_value(StatusCode::NOT_FOUND, &json!({ "error": "no such route" })),
    };
    let body: Value = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => match serde_json::from_slice(&body.to_bytes()) {
            Ok(value) => value,
            Err(e) => return json_value(StatusCode::BAD_REQUEST, &json!({ "error": e.to_string() })),
        },
        Err(e) => return json_value(StatusCode::BAD_REQUEST, &json!({ "error": e.to_string() })),
    };
    if init {
        mock_init(&body)
    } else {
        mock_run(state, &body).await
    }
}

fn mock_init(body: &Value) -> Response {
    if body.pointer("/value/code").and_then(Value::as_str).is_some_and(|c| c.contains("fail_init")) {
        return json_value(StatusCode::BAD_GATEWAY, &json!({ "error": "the action failed to initialise" }));
    }
    json_value(StatusCode::OK, &json!({ "ok": true }))
}

async fn mock_run(state: &RuntimeState, body: &Value) -> Response {
    if state.factory.is_paused(state.id) {
        return json_value(StatusCode::SERVICE_UNAVAILABLE, &json!({ "error": "the container is paused" }));
    }
    let params = body.get("value").cloned().unwrap_or(Value::Null);
    let sleep = params.get("sleep_ms").and_then(Value::as_u64).map_or(state.run_latency, Duration::from_millis);
    tokio::time::sleep(sleep).await;
    let line = format!("mock run in container {}", state.id.0);
    // Its line and sentinels that long after its answer, as an engine's log stream passes them on.
    if let Some(after) = params.get("logs_after_ms").and_then(Value::as_u64).map(Duration::from_millis) {
        let logs = state.logs.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            logs.push(Stream::Stdout, line);
            logs.push(Stream::Stdout, SENTINEL.into());
            logs.push(Stream::Stderr, SENTINEL.into());
        });
        return json_value(StatusCode::OK, &json!({ "echo": params, "container": state.id.0 }));
    }
    state.logs.push(Stream::Stdout, line);
    if params.get("crash").and_then(Value::as_bool) == Some(true) {
        state.factory.log(MockCall::Crashed(state.id));
        state.logs.close();
        state.stop.cancel();
        std::future::pending::<()>().await;
    }
    state.logs.push(Stream::Stdout, SENTINEL.into());
    state.logs.push(Stream::Stderr, SENTINEL.into());
    if let Some(error) = params.get("error") {
        return json_value(StatusCode::OK, &json!({ "error": error }));
    }
    if let (Some(times), Some(key)) =
        (params.get("fail_times").and_then(Value::as_u64), params.get("fail_key").and_then(Value::as_str))
    {
        let before = state.factory.count_run(key);
        if before < times {
            return json_value(StatusCode::OK, &json!({ "error": format!("failed run {} of {times}", before + 1) }));
        }
    }
    json_value(StatusCode::OK, &json!({ "echo": params, "container": state.id.0 }))
}
