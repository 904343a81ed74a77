//! The floor of the warm path: the least an invoker can do for a blocking invoke (hyper in, a
//! `/run` to a warm runtime on its unix socket over a kept-alive connection, the answer out; no
//! store, no pool, no record), in a process of its own (this binary, `--floor`), on one thread
//! as the invoker runs its API, pool and proxies. Each real path is reported as a ratio of it.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

/// Serves the floor on a loopback port in front of the runtimes at `sockets`; prints
/// `listening on <addr>` and never returns.
pub fn serve(sockets: Vec<PathBuf>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening on {}", listener.local_addr()?);
        let floor = Rc::new(Floor { sockets, idle: RefCell::new(Vec::new()), next: Cell::new(0) });
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
    sockets: Vec<PathBuf>,
    /// Kept-alive connections to the runtimes (opened round the runtimes in turn). One thread:
    /// no lock.
    idle: RefCell<Vec<SendRequest<Full<Bytes>>>>,
    next: Cell<u64>,
}

impl Floor {
    async fn forward(
        &self,
        request: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Response<Full<Bytes>>, anyhow::Error> {
        let body = request.into_body().collect().await?.to_bytes();
        let params: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
        let n = self.next.get();
        self.next.set(n + 1);
        let run = json!({"value": params, "namespace": "guest", "action_name": "/guest/noop",
            "activation_id": format!("{n:032x}"), "transaction_id": format!("floor{n}"),
            "deadline": (invoker_wire::model::epoch_ms() + 60_000).to_string()});
        let popped = self.idle.borrow_mut().pop();
        let mut sender = match popped {
            Some(sender) => sender,
            None => {
                let socket = &self.sockets[n as usize % self.sockets.len()];
                let stream = tokio::net::UnixStream::connect(socket).await?;
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::task::spawn_local(connection);
                sender
            }
        };
        let to_runtime = hyper::Request::post("/run")
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&run)?)))?;
        let answer = sender.send_request(to_runtime).await?;
        let status = answer.status();
        let result = answer.into_body().collect().await?.to_bytes();
        self.idle.borrow_mut().push(sender);
        let mut response = hyper::Response::new(Full::new(result));
        *response.status_mut() = status;
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse()?);
        Ok(response)
    }
}

/// The floor's process (this binary with `--floor`), stopped when dropped.
pub struct FloorProcess {
    child: std::process::Child,
    /// Its blocking invoke URL, as the invoker's.
    pub url: String,
}

impl FloorProcess {
    pub fn start(sockets: &[PathBuf]) -> anyhow::Result<FloorProcess> {
        use anyhow::Context as _;
        use std::io::BufRead as _;
        let exe = std::env::current_exe()?;
        let mut child = std::process::Command::new(exe)
            .arg("--floor")
            .args(sockets)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let mut lines = std::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("listening on ").map(str::to_string))
            .context("the floor did not start")?;
        Ok(FloorProcess {
            child,
            url: format!("http://{addr}/api/v1/namespaces/_/actions/noop?blocking=true&result=true"),
        })
    }
}

impl Drop for FloorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
