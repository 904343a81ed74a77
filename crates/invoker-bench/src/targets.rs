//! What the benchmark measures against each other: an invoker process driven through its REST
//! API, and action runtimes called directly on their unix sockets.

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const GUEST: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";
const NOOP: &str =
    "import time\ndef main(a):\n    s = a.get('sleep')\n    if s:\n        time.sleep(s)\n    return {}\n";

/// An invoker process on a loopback port, with its own configuration and data directory.
pub struct Invoker {
    child: Child,
    pub base: String,
    /// The admin key it printed (its metrics need it).
    pub admin: String,
    dir: tempfile::TempDir,
}

impl Invoker {
    pub fn start(exe: &Path, name: &str, extra: &str) -> anyhow::Result<Invoker> {
        Self::start_command(exe, &[], name, extra)
    }

    /// The binary with `subcommand` (`scheduler`; none: the invoker), with `extra` as its config.
    pub fn start_command(exe: &Path, subcommand: &[&str], name: &str, extra: &str) -> anyhow::Result<Invoker> {
        let dir = tempfile::Builder::new().prefix("invoker-bench-").tempdir()?;
        let config = dir.path().join("bench.toml");
        std::fs::write(&config, format!("invoker_id = \"{name}{}\"\n{extra}", std::process::id()))?;
        let mut child = Command::new(exe)
            .args(subcommand)
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let mut admin = String::new();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                if let Some(key) = l.strip_prefix("admin auth: ") {
                    admin = key.to_string();
                }
                l.strip_prefix("listening on ").map(str::to_string)
            })
            .context("the invoker did not start")?;
        std::thread::spawn(move || for _ in lines {});
        Ok(Invoker { child, base: format!("http://{addr}"), admin, dir })
    }

    pub fn rss_kb(&self) -> u64 {
        rss_kb(self.child.id())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The blocking invoke URL of an action.
    pub fn url(&self, action: &str, query: &str) -> String {
        format!("{}/api/v1/namespaces/_/actions/{action}?{query}", self.base)
    }

    /// The unix sockets of the runtimes this invoker's containers listen on (the Docker
    /// factory bind-mounts one directory per container under the data directory).
    pub fn runtime_sockets(&self) -> Vec<PathBuf> {
        self.sockets_named("runtime.sock")
    }

    /// The sockets called `name` under the invoker's data directory (its containers').
    pub fn sockets_named(&self, name: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut dirs = vec![self.dir.path().join("data")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.file_name().is_some_and(|n| n == name) {
                    found.push(path);
                }
            }
        }
        found.sort();
        found
    }
}

impl Drop for Invoker {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM);
        let _ = self.child.wait();
    }
}

pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// An action runtime called directly on its unix socket: one the benchmark started itself
/// (the same command the process factory runs), or one inside an invoker's container.
pub struct Direct {
    child: Option<Child>,
    client: reqwest::Client,
}

impl Direct {
    /// Starts a runtime, initialises it with the no-op action and runs it once; returns it
    /// with the time all that took (the floor of a cold start).
    pub async fn start(exe: &Path, socket: &Path) -> anyhow::Result<(Direct, Duration)> {
        let began = Instant::now();
        // The interpreter the invoker's containers run, so that both sides run the same python.
        let python = invoker_process::sandbox::resolve_interpreter("python3").ok().flatten();
        let python = python.map_or_else(|| "python3".into(), |p| p.display().to_string());
        let child = Command::new(exe)
            .args(["action-runtime", "--launcher", "python", "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .env("INVOKER_PYTHON", python)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::UnixStream::connect(socket).await.is_err() {
            if Instant::now() > deadline {
                bail!("the runtime did not listen on {}", socket.display());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let direct = Direct { child: Some(child), client: reqwest::Client::builder().unix_socket(socket).build()? };
        let init = json!({"value": {"name": "noop", "main": "main", "code": NOOP, "binary": false, "env": {}}});
        let r = direct.client.post("http://localhost/init").json(&init).send().await?;
        if !r.status().is_success() {
            bail!("/init: {}", r.text().await?);
        }
        direct.run().await?;
        Ok((direct, began.elapsed()))
    }

    /// A runtime an invoker started and initialised with the no-op action.
    pub async fn attach(socket: &Path) -> anyhow::Result<Direct> {
        let direct = Direct { child: None, client: reqwest::Client::builder().unix_socket(socket).build()? };
        direct.run().await.with_context(|| format!("calling the runtime at {}", socket.display()))?;
        Ok(direct)
    }

    /// One `/run` with the context an invoker sends: like an invoker's, each call has its own
    /// activation id, transaction id and deadline, which the action's environment carries.
    pub async fn run(&self) -> anyhow::Result<()> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let body = json!({"value": {}, "namespace": "guest", "action_name": "/guest/noop", "action_version": "0.0.1",
            "activation_id": format!("{n:032x}"), "transaction_id": format!("bench{n}"),
            "deadline": (invoker_wire::model::epoch_ms() + 60_000).to_string()});
        let r = self.client.post("http://localhost/run").json(&body).send().await?;
        if !r.status().is_success() {
            bail!("/run: {}", r.status());
        }
        r.bytes().await?;
        Ok(())
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub async fn invoke(client: &reqwest::Client, url: &str, params: Value) -> anyhow::Result<()> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let r = client.post(url).basic_auth(user, Some(pass)).json(&params).send().await?;
    let status = r.status();
    r.bytes().await?;
    if status != 200 {
        bail!("invoke: {status}");
    }
    Ok(())
}

pub async fn put_action(client: &reqwest::Client, base: &str, name: &str) -> anyhow::Result<()> {
    put_action_of(client, base, name, "python:3", NOOP).await
}

/// Creates (or replaces) action `name` of `kind` with `code`, 128 MB, one run at a time.
pub async fn put_action_of(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    kind: &str,
    code: &str,
) -> anyhow::Result<()> {
    put_action_sized(client, base, name, kind, code, 128).await
}

/// Creates (or replaces) action `name` of `kind` with `code`, `memory_mb`, one run at a time.
pub async fn put_action_sized(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    kind: &str,
    code: &str,
    memory_mb: u64,
) -> anyhow::Result<()> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let action = json!({"exec": {"kind": kind, "code": code}, "limits": {"memory": memory_mb, "concurrency": 1}});
    let r = client
        .put(format!("{base}/api/v1/namespaces/_/actions/{name}?overwrite=true"))
        .basic_auth(user, Some(pass))
        .json(&action)
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("create {name} ({kind}): {}", r.text().await?);
    }
    Ok(())
}

/// Containers started so far, from the invoker's own metrics.
pub async fn cold_starts(client: &reqwest::Client, invoker: &Invoker) -> anyhow::Result<u64> {
    let (user, pass) = invoker.admin.split_once(':').unwrap_or_default();
    let text =
        client.get(format!("{}/metrics", invoker.base)).basic_auth(user, Some(pass)).send().await?.text().await?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("invoker_container_starts_total{start=\"cold\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0))
}
