//! The floor of each warm path: the least an invoker (or a scheduler) can do for one call, in a
//! process of its own (this binary, `--floor`), on one thread as the invoker runs its API, pool
//! and proxies: hyper in, one request to what serves the call over a kept-alive connection, the
//! answer out; no store, no pool, no record, no placement. Each real path is reported as a
//! ratio of the floor in front of the same servers.
//! - [`FloorKind::Openwhisk`]: a blocking invoke made a `/run` to a warm action runtime on its
//!   unix socket, as the invoker's proxy sends it.
//! - [`FloorKind::Fn`]: an Fn `/invoke` made a `/call` to a warm FDK on its unix socket, with
//!   the headers the invoker sends (`Fn-Call-Id`, `Fn-Deadline`).
//! - [`FloorKind::Forward`]: any request passed on as it came to one HTTP server (an invoker)
//!   at a loopback address: the least a scheduler in front of an invoker can do.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

/// What a floor forwards to, and how.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum FloorKind {
    Openwhisk,
    Fn,
    Forward,
}

impl FloorKind {
    fn arg(self) -> &'static str {
        match self {
            FloorKind::Openwhisk => "openwhisk",
            FloorKind::Fn => "fn",
            FloorKind::Forward => "forward",
        }
    }
}

/// Serves the floor on a loopback port in front of `targets` (unix sockets, or one
/// `host:port` for [`FloorKind::Forward`]); prints `listening on <addr>` and never returns.
pub fn serve(kind: FloorKind, targets: Vec<String>) -> anyhow::Result<()> {
    anyhow::ensure!(!targets.is_empty(), "a floor needs at least one target");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening on {}", listener.local_addr()?);
        let floor = Rc::new(Floor { kind, targets, idle: RefCell::new(Vec::new()), next: Cell::new(0) });
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let floor = floor.clone();
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let floor = floor.clone();
                async move { floor.forward(request).await }
            });
            tokio::task::spawn_local(async move {
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}

struct Floor {
    kind: FloorKind,
    targets: Vec<String>,
    /// Kept-alive connections to the targets (opened round the targets in turn). One thread:
    /// no lock.
    idle: RefCell<Vec<SendRequest<Full<Bytes>>>>,
    next: Cell<u64>,
}

impl Floor {
    async fn connect(&self, n: u64) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let target = &self.targets[n as usize % self.targets.len()];
        let sender = match self.kind {
            FloorKind::Forward => {
                let stream = tokio::net::TcpStream::connect(target).await?;
                stream.set_nodelay(true)?;
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::task::spawn_local(connection);
                sender
            }
            FloorKind::Openwhisk | FloorKind::Fn => {
                let stream = tokio::net::UnixStream::connect(target).await?;
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::task::spawn_local(connection);
                sender
            }
        };
        Ok(sender)
    }

    /// The request the target gets for the one that came in.
    fn onward(
        &self,
        n: u64,
        head: &hyper::http::request::Parts,
        body: Bytes,
    ) -> anyhow::Result<hyper::Request<Full<Bytes>>> {
        let request = match self.kind {
            FloorKind::Openwhisk => {
                let params: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
                let run = json!({"value": params, "namespace": "guest", "action_name": "/guest/noop",
                    "activation_id": format!("{n:032x}"), "transaction_id": format!("floor{n}"),
                    "deadline": (invoker_wire::model::epoch_ms() + 60_000).to_string()});
                hyper::Request::post("/run")
                    .header(HOST, "localhost")
                    .header(CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(serde_json::to_vec(&run)?)))?
            }
            FloorKind::Fn => {
                let deadline = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(60));
                let mut onward = hyper::Request::post("/call")
                    .header(HOST, "localhost")
                    .header("fn-call-id", format!("{n:032x}"))
                    .header("fn-deadline", deadline.to_string());
                if let Some(kind) = head.headers.get(CONTENT_TYPE) {
                    onward = onward.header(CONTENT_TYPE, kind);
                }
                onward.body(Full::new(body))?
            }
            FloorKind::Forward => {
                let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
                let mut onward = hyper::Request::builder().method(head.method.clone()).uri(path);
                onward = onward.header(HOST, self.targets[0].as_str());
                for name in [AUTHORIZATION, CONTENT_TYPE] {
                    if let Some(value) = head.headers.get(&name) {
                        onward = onward.header(name, value);
                    }
                }
                onward.body(Full::new(body))?
            }
        };
        Ok(request)
    }

    async fn forward(
        &self,
        request: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Response<Full<Bytes>>, anyhow::Error> {
        let (head, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let n = self.next.get();
        self.next.set(n + 1);
        let onward = self.onward(n, &head, body)?;
        let popped = self.idle.borrow_mut().pop();
        let mut sender = match popped {
            Some(sender) => sender,
            None => self.connect(n).await?,
        };
        let answer = sender.send_request(onward).await?;
        let status = answer.status();
        let kind = answer.headers().get(CONTENT_TYPE).cloned();
        let result = answer.into_body().collect().await?.to_bytes();
        self.idle.borrow_mut().push(sender);
        let mut response = hyper::Response::new(Full::new(result));
        *response.status_mut() = status;
        if let Some(kind) = kind {
            response.headers_mut().insert(CONTENT_TYPE, kind);
        }
        Ok(response)
    }
}

/// The floor's process (this binary with `--floor`), stopped when dropped.
pub struct FloorProcess {
    child: std::process::Child,
    /// `http://host:port`, where the floor listens.
    pub base: String,
}

impl FloorProcess {
    pub fn start(kind: FloorKind, targets: &[impl AsRef<std::ffi::OsStr>]) -> anyhow::Result<FloorProcess> {
        use anyhow::Context as _;
        use std::io::BufRead as _;
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new(exe)
            .args(["--floor-kind", kind.arg(), "--floor"])
            .args(targets)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let mut lines = std::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("listening on ").map(str::to_string))
            .context("the floor did not start")?;
        Ok(FloorProcess { child, base: format!("http://{addr}") })
    }

    /// The floor's blocking invoke URL of the no-op action (an OpenWhisk floor's).
    pub fn invoke_url(&self) -> String {
        format!("{}/api/v1/namespaces/_/actions/noop?blocking=true&result=true", self.base)
    }
}

impl Drop for FloorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
