//! The process factory, the embedded default: each container is a local process of the kind's
//! runtime command on 127.0.0.1, in its own process group, with the action's memory limit
//! enforced by the cgroup memory controller where one is writable.
//!
//! No orphans: destroy kills the process group; at shutdown every container is destroyed; and
//! every live process is recorded in `data_dir/processes/<invoker_id>/`, so that a restart
//! after SIGKILL kills what the earlier run of the same invoker left, and nothing else.

use super::cgroup::MemoryCgroups;
use super::logs::{LogBuffer, Stream};
use super::{one_host_stats, ContainerHandle, ContainerSpec, Epoch, FactoryError, StatsReceiver, Transport};
use crate::config::{Config, KindConfig, TransportKind};
use crate::pool::core::{ContainerId, NodeId, NodeStatsUpdate};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Longest log line kept whole; longer ones are cut.
const MAX_LINE: u64 = 64 * 1024;

#[derive(Clone)]
pub struct ProcessFactory {
    inner: Arc<Inner>,
}

struct Inner {
    invoker_id: String,
    node: NodeId,
    user_memory_mb: u64,
    ready_timeout: Duration,
    transport: TransportKind,
    kinds: BTreeMap<String, KindConfig>,
    executable: PathBuf,
    pid_dir: PathBuf,
    cgroups: Result<MemoryCgroups, String>,
    epoch: Epoch,
    stats: watch::Sender<Vec<NodeStatsUpdate>>,
    live: Mutex<HashMap<ContainerId, Live>>,
}

struct Live {
    pgid: Pid,
    memory_mb: u32,
    child: Option<Child>,
}

impl ProcessFactory {
    /// Sets up the factory and kills what an earlier run of this invoker left behind.
    pub fn new(config: &Config, epoch: Epoch) -> Result<Self, FactoryError> {
        let setup = |reason: String| FactoryError::Operation { op: "process factory setup", reason };
        let pid_dir = config.data_dir.join("processes").join(&config.invoker_id);
        let pid_dir = std::path::absolute(&pid_dir).map_err(|e| setup(format!("{}: {e}", pid_dir.display())))?;
        // A socket path must fit in sun_path (108 bytes) with the container id appended.
        if config.factory.process.transport == TransportKind::Unix && pid_dir.as_os_str().len() > 80 {
            return Err(setup(format!(
                "factory.process.transport = \"unix\" needs data_dir shorter than 80 bytes with the \
                 process directory ({} is too long); use a shorter data_dir or transport = \"tcp\"",
                pid_dir.display()
            )));
        }
        std::fs::create_dir_all(&pid_dir).map_err(|e| setup(format!("{}: {e}", pid_dir.display())))?;
        let executable = std::env::current_exe().map_err(|e| setup(e.to_string()))?;
        let cgroups = MemoryCgroups::detect(config.factory.process.cgroup_root.as_deref(), &config.invoker_id);
        if config.factory.process.require_memory_limit {
            if let Err(reason) = &cgroups {
                return Err(setup(format!("factory.process.require_memory_limit is set, but {reason}")));
            }
        }
        let (stats, _) = watch::channel(Vec::new());
        let factory = ProcessFactory {
            inner: Arc::new(Inner {
                invoker_id: config.invoker_id.clone(),
                node: NodeId::new("local"),
                user_memory_mb: config.factory.process.user_memory_mb,
                ready_timeout: config.factory.process.ready_timeout,
                transport: config.factory.process.transport,
                kinds: config.kinds.clone(),
                executable,
                pid_dir,
                cgroups,
                epoch,
                stats,
                live: Mutex::new(HashMap::new()),
            }),
        };
        factory.clean_up_earlier_run();
        factory.observe();
        Ok(factory)
    }

    pub fn describe(&self) -> String {
        match &self.inner.cgroups {
            Ok(cg) => format!("process factory: action memory limits enforced with {}", cg.describe()),
            Err(reason) => format!("process factory: action memory limits NOT enforced: {reason}"),
        }
    }

    pub fn stats(&self) -> StatsReceiver {
        self.inner.stats.subscribe()
    }

    /// Publishes a fresh snapshot: user memory minus the declared limits of live containers.
    pub fn observe(&self) {
        let inner = &self.inner;
        let live = inner.live.lock();
        let limits = live.values().map(|l| l.memory_mb);
        inner.stats.send_replace(one_host_stats(&inner.node, inner.user_memory_mb, limits, inner.epoch.now()));
    }

    pub async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        let kind = self.inner.kinds.get(&spec.kind).ok_or_else(|| FactoryError::UnknownKind(spec.kind.clone()))?;
        let (transport, listen) = match self.inner.transport {
            TransportKind::Tcp => {
                let addr = free_port()?;
                (Transport::Tcp(addr), crate::runtime::Listen::Tcp(addr).to_string())
            }
            TransportKind::Unix => {
                let path = self.socket(spec.id);
                let _ = std::fs::remove_file(&path);
                let listen = crate::runtime::Listen::Unix(path.clone()).to_string();
                (Transport::Unix(path), listen)
            }
        };
        let args = kind.command_for(&self.inner.executable, &listen);
        let mut cmd = Command::new(&args[0]);
        cmd.args(&args[1..])
            .env("INVOKER_ID", &self.inner.invoker_id)
            .env("INVOKER_CONTAINER", spec.id.0.to_string())
            .env("INVOKER_PARENT_PID", std::process::id().to_string())
            .env("INVOKER_WORK_DIR", self.work_dir(spec.id))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| FactoryError::Create(format!("{}: {e}", args[0])))?;
        let pid = child.id().ok_or_else(|| FactoryError::Create("the runtime exited at once".into()))?;
        let pgid = Pid::from_raw(pid as i32);
        let _ = std::fs::write(self.pid_file(spec.id), format!("{pid}\n"));
        let logs = Arc::new(LogBuffer::default());
        spawn_reader(child.stdout.take(), Stream::Stdout, logs.clone());
        spawn_reader(child.stderr.take(), Stream::Stderr, logs.clone());
        self.inner.live.lock().insert(spec.id, Live { pgid, memory_mb: spec.memory_mb, child: None });
        self.observe();

        if let Ok(cg) = &self.inner.cgroups {
            if let Err(e) = cg.confine(spec.id, spec.memory_mb, pid) {
                self.kill(spec.id, Some(child)).await;
                return Err(FactoryError::Create(format!("memory limit: {e}")));
            }
        }
        if let Err(e) = wait_ready(&mut child, &transport, self.inner.ready_timeout).await {
            self.kill(spec.id, Some(child)).await;
            return Err(e);
        }
        if let Some(live) = self.inner.live.lock().get_mut(&spec.id) {
            live.child = Some(child);
        }
        let ready_at = self.inner.epoch.now();
        self.observe();
        Ok(ContainerHandle { id: spec.id, node: node.clone(), transport, logs, ready_at })
    }

    pub async fn pause(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.signal(c.id, Signal::SIGSTOP, "pause")
    }

    pub async fn resume(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.signal(c.id, Signal::SIGCONT, "resume")
    }

    pub async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.kill(c.id, None).await;
        c.logs.close();
        Ok(())
    }

    /// True when the kernel's OOM killer struck inside this container's memory limit.
    pub fn was_oom_killed(&self, id: ContainerId) -> bool {
        self.inner.cgroups.as_ref().is_ok_and(|cg| cg.oom_killed(id))
    }

    pub async fn destroy_all(&self) {
        let ids: Vec<ContainerId> = self.inner.live.lock().keys().copied().collect();
        for id in ids {
            self.kill(id, None).await;
        }
    }

    fn signal(&self, id: ContainerId, signal: Signal, op: &'static str) -> Result<(), FactoryError> {
        let pgid = self.inner.live.lock().get(&id).map(|l| l.pgid);
        let pgid = pgid.ok_or(FactoryError::Operation { op, reason: "no such container".into() })?;
        killpg(pgid, signal).map_err(|e| FactoryError::Operation { op, reason: e.to_string() })
    }

    async fn kill(&self, id: ContainerId, child: Option<Child>) {
        let live = self.inner.live.lock().remove(&id);
        if let Some(live) = &live {
            let _ = killpg(live.pgid, Signal::SIGKILL);
        }
        if let Some(mut child) = child.or(live.and_then(|l| l.child)) {
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        if let Ok(cg) = &self.inner.cgroups {
            cg.remove(id).await;
        }
        let _ = std::fs::remove_file(self.pid_file(id));
        let _ = std::fs::remove_file(self.socket(id));
        let _ = tokio::fs::remove_dir_all(self.work_dir(id)).await;
        self.observe();
    }

    /// Where the container's runtime writes the action's code.
    fn work_dir(&self, id: ContainerId) -> PathBuf {
        self.inner.pid_dir.join(format!("{}.work", id.0))
    }

    fn socket(&self, id: ContainerId) -> PathBuf {
        self.inner.pid_dir.join(format!("{}.sock", id.0))
    }

    fn pid_file(&self, id: ContainerId) -> PathBuf {
        self.inner.pid_dir.join(format!("{}.pid", id.0))
    }

    /// Kills the process groups an earlier run of this invoker recorded, if they are still its
    /// own (the environment names this invoker), then forgets them.
    fn clean_up_earlier_run(&self) {
        let Ok(entries) = std::fs::read_dir(&self.inner.pid_dir) else { return };
        let marker = format!("INVOKER_ID={}", self.inner.invoker_id);
        let mut killed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(&path);
                continue;
            }
            let pid = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<i32>().ok());
            if let Some(pid) = pid {
                let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                if environ.split(|&b| b == 0).any(|v| v == marker.as_bytes()) {
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                    killed += 1;
                }
            }
            let _ = std::fs::remove_file(&path);
        }
        if let Ok(cg) = &self.inner.cgroups {
            cg.remove_all_blocking();
        }
        if killed > 0 {
            tracing::info!(killed, "removed runtime processes left by an earlier run of this invoker");
        }
    }
}

fn free_port() -> Result<SocketAddr, FactoryError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| FactoryError::Create(e.to_string()))?;
    listener.local_addr().map_err(|e| FactoryError::Create(e.to_string()))
}

async fn wait_ready(child: &mut Child, transport: &Transport, bound: Duration) -> Result<(), FactoryError> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if transport.accepts().await {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(FactoryError::Create(format!("the runtime exited before it was ready ({status})")));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(FactoryError::NotReady(bound));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn spawn_reader(stream: Option<impl AsyncRead + Unpin + Send + 'static>, which: Stream, logs: Arc<LogBuffer>) {
    let Some(stream) = stream else { return };
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    logs.push(which, text.trim_end_matches(['\n', '\r']).to_string());
                }
            }
        }
    });
}
