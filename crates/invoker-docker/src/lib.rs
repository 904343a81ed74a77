//! The Docker factory: each action container is a Docker container on one engine, reached over
//! a unix socket in a per-container directory bind-mounted from `data_dir` (no network at all,
//! Fn's design); on a port of its own loopback (`isolated`: no network but loopback, the
//! invoker connecting from inside the container's namespace, see `netns.rs`), as OpenWhisk's
//! images serve; or on a 127.0.0.1 port with the host's network.
//!
//! Limits: memory = memory+swap = the action's memory, CPU shares in proportion to it, a pids
//! limit, a read-only root, no new privileges, every capability dropped, a non-root user. What
//! a container may write is its own: `/tmp` (where our runtime keeps the code) and `/dev/shm`
//! are each a tmpfs of the action's `limits.disk`, and the socket directory bound from
//! `data_dir` is a small disk of its own (`own_disk.rs`), so nothing it writes reaches the
//! host's filesystem. A container's output: where the kind runs our runtime in a socket
//! directory, the runtime writes it to two named pipes there that the invoker made and reads
//! as the process factory reads its pipes (`action-runtime --output`), so the engine carries
//! none of it; every other container's comes from the engine's log stream (`log_stream.rs`),
//! each line stamped by the daemon. Every container carries the `invoker_id` label; at start
//! the factory removes what an earlier run of the same invoker left, and nothing else. An Fn
//! function is made as Fn's agent makes one (`function.rs`).

#![forbid(unsafe_code)]

mod function;
mod log_stream;

/// The engine's client, for what the invoker's own tests ask of the engine directly.
pub use bollard;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions};
use bollard::Docker;
use invoker_factory::contract::{ContainerFactory, ContainerHandle, ContainerSpec, Epoch, StatsReceiver, Transport};
use invoker_factory::error::{Cause, CreateError, FactoryError, SetupError};
use invoker_factory::logs::{LogBuffer, Stream};
use invoker_factory::netns::NetNs;
use invoker_factory::one_host::OneHost;
use invoker_factory::own_disk;
use invoker_factory::peer::{ContainerSocket, Peer};
use invoker_factory::pipe_lines::{NamedPipe, PipeLines};
use invoker_factory::settings::{DockerFactoryConfig, DockerKindConfig, LocalImages, Network};
use invoker_ids::{ContainerId, NodeId, Time};
use invoker_wire::runtime::OUTPUT_PIPES;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Where the per-container directory appears inside the container.
const SOCKET_DIR: &str = "/run/action";
/// The per-container directory's own disk: it holds a socket; anything else written there is
/// bounded by this.
const SOCKET_DIR_MB: u32 = 1;
const LABEL_INVOKER: &str = "invoker_id";
const LABEL_CONTAINER: &str = "invoker_container";
const LABEL_ACTION: &str = "invoker_action";

#[derive(Clone)]
pub struct DockerFactory {
    inner: Arc<Inner>,
}

struct Inner {
    docker: Docker,
    config: DockerFactoryConfig,
    invoker_id: String,
    /// This invoker id, held on this machine for the life of the factory (`id_lock.rs`).
    _id: invoker_factory::id_lock::IdLock,
    host: OneHost,
    dir: PathBuf,
    owner: (u32, u32),
    creates: Semaphore,
    live: Mutex<HashMap<ContainerId, Live>>,
    /// The invoker's own writing ends of each container's output pipes, let go when it is gone
    /// (`NamedPipe`: its reading tasks end then).
    output_held: Mutex<HashMap<ContainerId, [OwnedFd; 2]>>,
}

struct Live {
    docker_id: String,
}

fn setup(source: impl Into<SetupError>) -> FactoryError {
    FactoryError::Setup { factory: "docker", source: source.into() }
}

fn unfit(setting: &str, why: impl Into<String>) -> SetupError {
    SetupError::Unfit { setting: setting.into(), why: why.into() }
}

fn op(op: &'static str) -> impl Fn(bollard::errors::Error) -> FactoryError {
    move |e| FactoryError::Operation { op, source: Cause::backend(e) }
}

impl DockerFactory {
    /// Connects to the engine (negotiating its API version: Debian's engine speaks an older one
    /// than bollard's default), reads the host's memory, and removes what an earlier run of this
    /// invoker left.
    /// `data_dir` holds the containers' socket directories (under `docker/<invoker_id>`).
    pub async fn new(
        dc: &DockerFactoryConfig,
        invoker_id: &str,
        data_dir: &Path,
        epoch: Epoch,
    ) -> Result<Self, FactoryError> {
        // Before the clean-up of an earlier run's containers: see `id_lock.rs`.
        let id = invoker_factory::id_lock::IdLock::take(invoker_id).map_err(setup)?;
        let dc = dc.clone();
        let socket = dc.socket.to_string_lossy().to_string();
        let docker = Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION)
            .map_err(|e| setup(unfit("factory.docker.socket", format!("{socket}: {e}"))))?;
        let docker = docker.negotiate_version().await.map_err(|e| {
            setup(unfit(
                "factory.docker.socket",
                format!("no Docker Engine answers on {socket} (scripts/dockerd.sh starts one): {e}"),
            ))
        })?;
        let info = docker.info().await.map_err(op("docker info"))?;
        let total_mb = info.mem_total.unwrap_or(0).max(0) as u64 / (1024 * 1024);
        let capacity_mb = total_mb.saturating_sub(dc.reserve_mb);
        if capacity_mb == 0 {
            return Err(setup(unfit("factory.docker.reserve_mb", format!("the host has {total_mb} MB, no more"))));
        }
        let dir = std::path::absolute(data_dir.join("docker").join(invoker_id))
            .map_err(|e| setup(unfit("data_dir", e.to_string())))?;
        if dc.network == Network::None && dir.as_os_str().len() > 80 {
            return Err(setup(unfit(
                "factory.docker.network",
                format!(
                    "\"none\" puts a unix socket under {} (too long for a socket path); use a shorter data_dir",
                    dir.display()
                ),
            )));
        }
        let owner =
            parse_user(&dc.user).ok_or_else(|| setup(unfit("factory.docker.user", "must be 'uid:gid' (numbers)")))?;
        if owner.0 == 0 {
            return Err(setup(unfit("factory.docker.user", "must not be root")));
        }
        if dc.local_images == LocalImages::Shared {
            tracing::warn!(
                "factory.docker.local_images = \"shared\": every namespace may run every image built on this \
                 engine, and read the code in it; keep this to an engine with a single user"
            );
        }
        let node = NodeId::new(info.name.as_deref().unwrap_or("docker"));
        let factory = DockerFactory {
            inner: Arc::new(Inner {
                docker,
                creates: Semaphore::new(dc.max_concurrent_creates.max(1)),
                config: dc,
                invoker_id: invoker_id.to_string(),
                _id: id,
                host: OneHost::new(node, capacity_mb, epoch),
                dir,
                owner,
                live: Mutex::new(HashMap::new()),
                output_held: Mutex::new(HashMap::new()),
            }),
        };
        factory.clean_up_earlier_run().await?;
        std::fs::create_dir_all(&factory.inner.dir)
            .map_err(|source| setup(SetupError::Path { path: factory.inner.dir.clone(), source }))?;
        factory.observe();
        Ok(factory)
    }
}

impl ContainerFactory for DockerFactory {
    fn describe(&self) -> String {
        format!(
            "docker factory: node {} offers {} MB; containers {} network, memory and pids limits, read-only root, \
             user {}",
            self.inner.host.node,
            self.inner.host.capacity_mb(),
            match self.inner.config.network {
                Network::None => "without",
                Network::Isolated => "with only a loopback",
                Network::Host => "on the host's",
            },
            self.inner.config.user
        )
    }

    fn stats(&self) -> StatsReceiver {
        self.inner.host.subscribe()
    }

    /// Publishes the host's memory for actions minus the limits of the ready containers it
    /// runs (`one_host`: a starting one is the pool's reservation).
    fn observe(&self) {
        self.inner.host.publish();
    }

    async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        let inner = &self.inner;
        let kind = inner.config.kinds.get(&spec.kind).ok_or_else(|| FactoryError::UnknownKind(spec.kind.clone()))?;
        if let Some(function) = &spec.function {
            return self.create_function(spec, function, kind, node).await;
        }
        let _slot = inner.creates.acquire().await.map_err(|_| CreateError::Stopped("its create slots closed"))?;
        let dir = self.container_dir(spec.id);
        let network = kind.network(inner.config.network);
        // Our runtime in a directory of its own writes its output to pipes there, which the
        // invoker reads as the process factory reads its containers' (no engine on the way).
        let mut output = None;
        let (transport, listen) = match network {
            Network::None => {
                // A mount, a directory and pipes: file system work, off the async thread.
                let (at, owner, own_runtime) = (dir.clone(), inner.owner, kind.is_own_runtime());
                let prepared = tokio::task::spawn_blocking(move || {
                    prepare_dir(&at, owner)?;
                    own_runtime.then(|| output_pipes(&at, owner)).transpose()
                })
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                output = prepared.map_err(|source| CreateError::Path { path: dir.clone(), source })?;
                let listen = format!("unix:{SOCKET_DIR}/runtime.sock");
                // Opened before the container starts: see `peer.rs`.
                let socket = ContainerSocket::in_dir(&dir, "runtime.sock")
                    .map_err(|source| CreateError::Path { path: dir.clone(), source })?;
                (Some(Transport::Unix(Arc::new(socket))), listen)
            }
            // Known once the container runs: its namespace.
            Network::Isolated => (None, std::net::SocketAddr::from(([0, 0, 0, 0], kind.port())).to_string()),
            Network::Host => {
                let port = |e| CreateError::step("a free port", e);
                let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(port)?;
                let addr = listener.local_addr().map_err(port)?;
                (Some(Transport::Tcp(addr)), addr.to_string())
            }
        };
        let body = self.container_body(spec, kind, network, &listen, &dir, output.is_some());
        let logs = Arc::new(LogBuffer::default());
        // Followed before the container starts: a create that fails ends them (`forget`).
        let piped = output.is_some();
        if let Some([stdout, stderr]) = output {
            inner.output_held.lock().insert(spec.id, [stdout.held, stderr.held]);
            for (pipe, stream) in [(stdout.reader, Stream::Stdout), (stderr.reader, Stream::Stderr)] {
                if let Err(source) = PipeLines::follow(pipe, stream, &logs) {
                    self.forget(spec.id).await;
                    return Err(CreateError::Path { path: dir.clone(), source }.into());
                }
            }
        }
        let docker_id = self.create_and_start(spec, &kind.image, body).await?;
        if !piped {
            self.follow_logs(&docker_id, logs.clone());
        }
        let ready = async {
            let transport = match transport {
                Some(transport) => transport,
                None => Transport::Netns(Arc::new(self.namespace_of(&docker_id).await?), kind.port()),
            };
            self.wait_ready(&docker_id, &transport).await.map(|()| transport)
        };
        let transport = match ready.await {
            Ok(transport) => transport,
            Err(e) => {
                let said = match &e {
                    FactoryError::Create(_) => self.last_words(&docker_id, &logs).await,
                    _ => None,
                };
                self.remove(spec.id).await;
                return Err(e.with_said(said));
            }
        };
        // Its processes, and no other container's, are in cgroups that name it.
        let peer = Arc::new(Peer { cgroup_name: Some(docker_id), ..Peer::default() });
        let ready_at = self.count_ready(spec).await?;
        Ok(ContainerHandle { id: spec.id, node: node.clone(), transport, peer, logs, ready_at })
    }

    async fn pause(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        let id = self.docker_id(c.id).ok_or(FactoryError::NoSuchContainer { op: "pause" })?;
        self.inner.docker.pause_container(&id).await.map_err(op("docker pause"))
    }

    async fn resume(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        let id = self.docker_id(c.id).ok_or(FactoryError::NoSuchContainer { op: "resume" })?;
        self.inner.docker.unpause_container(&id).await.map_err(op("docker unpause"))
    }

    async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.remove(c.id).await;
        c.logs.close();
        Ok(())
    }

    async fn destroy_all(&self) {
        let ids: Vec<ContainerId> = self.inner.live.lock().keys().copied().collect();
        for id in ids {
            self.remove(id).await;
        }
    }

    /// True when the kernel's OOM killer struck inside the container's memory cgroup (the
    /// runtime itself may survive: the killer takes the largest process, the action's).
    fn was_oom_killed(&self, c: &ContainerHandle) -> bool {
        self.docker_id(c.id).is_some_and(|docker_id| oom_kills(&docker_id) > 0)
    }
}

impl DockerFactory {
    /// The network namespace of a running container (its first process's), which the invoker
    /// can enter: the engine must run in the invoker's pid namespace, on the same host.
    async fn namespace_of(&self, docker_id: &str) -> Result<NetNs, FactoryError> {
        let inspected = self.inner.docker.inspect_container(docker_id, None).await.map_err(op("docker inspect"))?;
        let pid = inspected.state.and_then(|s| s.pid).filter(|&p| p > 0);
        let pid = pid.ok_or(CreateError::NoPid)?;
        let ns = NetNs::of_process(pid as u32).map_err(|source| CreateError::Netns { pid, source })?;
        if ns.is_invokers() {
            return Err(CreateError::SharedNetwork(pid).into());
        }
        Ok(ns)
    }

    /// Creates the container (recorded as live first, so that a clean-up finds it) and starts
    /// it; answers its engine id. What failed is cleaned up.
    async fn create_and_start(
        &self,
        spec: &ContainerSpec,
        image: &str,
        body: ContainerCreateBody,
    ) -> Result<String, FactoryError> {
        let inner = &self.inner;
        let name = format!("invoker-{}-{}", inner.invoker_id, spec.id.0);
        let options = CreateContainerOptions { name: Some(name), ..Default::default() };
        inner.live.lock().insert(spec.id, Live { docker_id: String::new() });
        let docker_id = match inner.docker.create_container(Some(options), body).await {
            Ok(c) => c.id,
            Err(e) => {
                self.forget(spec.id).await;
                // The engine answers 404 to a create whose image it does not hold.
                let no_image = matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. });
                return Err(if no_image {
                    FactoryError::Image(format!("image {image}: {e}"))
                } else {
                    CreateError::Engine { op: "docker create", source: Cause::backend(e) }.into()
                });
            }
        };
        if let Some(live) = inner.live.lock().get_mut(&spec.id) {
            live.docker_id = docker_id.clone();
        }
        if let Err(e) = inner.docker.start_container(&docker_id, None).await {
            self.remove(spec.id).await;
            return Err(CreateError::Engine { op: "docker start", source: Cause::backend(e) }.into());
        }
        Ok(docker_id)
    }

    /// Counts a ready container in the node's stats and answers its `ready_at`. Only while it
    /// is known live: a removal takes it out of `live` before it uncounts it.
    async fn count_ready(&self, spec: &ContainerSpec) -> Result<Time, FactoryError> {
        let inner = &self.inner;
        let ready_at = inner.live.lock().get(&spec.id).map(|_| inner.host.count(spec.id, spec.memory_mb));
        match ready_at {
            Some(at) => Ok(at),
            None => {
                self.remove(spec.id).await;
                Err(CreateError::ExitedAsReady.into())
            }
        }
    }

    /// Every action container's limits: memory, CPU in proportion, pids, a read-only root, the
    /// writable places within the disk limit, no privileges, no network.
    fn limited_host(&self, spec: &ContainerSpec) -> HostConfig {
        let memory = i64::from(spec.memory_mb) * 1024 * 1024;
        HostConfig {
            memory: Some(memory),
            memory_swap: Some(memory),
            // Docker's default weight (1024) for a 256 MB action, in proportion for the others.
            cpu_shares: Some((i64::from(spec.memory_mb) * 4).max(2)),
            pids_limit: Some(self.inner.config.pids_limit),
            readonly_rootfs: Some(true),
            // The writable places, each within the disk limit; `/tmp` `exec`, since a native
            // action is an uploaded executable.
            tmpfs: Some(HashMap::from([(
                "/tmp".into(),
                format!("rw,exec,nosuid,nodev,mode=1777,size={}m", spec.disk_mb),
            )])),
            shm_size: Some(i64::from(spec.disk_mb) * 1024 * 1024),
            security_opt: Some(vec!["no-new-privileges".into()]),
            cap_drop: Some(vec!["ALL".into()]),
            network_mode: Some("none".into()),
            ..Default::default()
        }
    }

    /// What marks a container as this invoker's (the start-up clean-up finds them by it).
    fn labels(&self, spec: &ContainerSpec) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_INVOKER.to_string(), self.inner.invoker_id.clone()),
            (LABEL_CONTAINER.to_string(), spec.id.0.to_string()),
            (LABEL_ACTION.to_string(), spec.action_path.clone()),
        ])
    }

    fn container_body(
        &self,
        spec: &ContainerSpec,
        kind: &DockerKindConfig,
        network: Network,
        listen: &str,
        dir: &Path,
        piped_output: bool,
    ) -> ContainerCreateBody {
        let (image, command) = (&kind.image, &kind.command);
        let c = &self.inner.config;
        let mut host = self.limited_host(spec);
        if network == Network::Host {
            host.network_mode = Some("host".into());
        }
        if network == Network::None {
            host.binds = Some(vec![format!("{}:{SOCKET_DIR}", dir.display())]);
        }
        let output = piped_output.then(|| ["--output".to_string(), SOCKET_DIR.to_string()]);
        let cmd = (!command.is_empty()).then(|| {
            command.iter().map(|a| a.replace("{listen}", listen)).chain(output.into_iter().flatten()).collect()
        });
        ContainerCreateBody {
            image: Some(image.into()),
            cmd,
            user: Some(c.user.clone()),
            labels: Some(self.labels(spec)),
            env: Some(vec![format!("INVOKER_ID={}", self.inner.invoker_id), "TMPDIR=/tmp".into()]),
            // `isolated` keeps the namespace's loopback, where the runtime serves.
            network_disabled: Some(network == Network::None),
            host_config: Some(host),
            ..Default::default()
        }
    }

    /// Waits until the runtime accepts a connection, or the container stops, or the bound passes.
    async fn wait_ready(&self, docker_id: &str, transport: &Transport) -> Result<(), FactoryError> {
        let bound = self.inner.config.ready_timeout;
        let deadline = tokio::time::Instant::now() + bound;
        let mut attempt = 0u32;
        loop {
            if transport.accepts().await {
                return Ok(());
            }
            attempt += 1;
            if attempt.is_multiple_of(20) {
                let state = self.inner.docker.inspect_container(docker_id, None).await.ok().and_then(|c| c.state);
                if state.as_ref().is_some_and(|s| s.running == Some(false)) {
                    let code = state.and_then(|s| s.exit_code).unwrap_or(-1);
                    return Err(CreateError::Exited { what: "runtime", status: format!("code {code}") }.into());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(FactoryError::NotReady(bound));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What a container whose runtime never became ready last wrote on stderr, which names what
    /// failed: in its log buffer, or (what its runtime wrote before it sent its output to the
    /// pipes: an argument it does not take, from an image built before the invoker) in the
    /// engine's log.
    async fn last_words(&self, docker_id: &str, logs: &LogBuffer) -> Option<String> {
        if let Some(said) = logs.last_stderr() {
            return Some(said);
        }
        let options = LogsOptions { stderr: true, tail: "10".into(), ..Default::default() };
        let engines = futures_util::StreamExt::collect::<Vec<_>>(self.inner.docker.logs(docker_id, Some(options)));
        let chunks = tokio::time::timeout(Duration::from_secs(2), engines).await.ok()?;
        let text: String = chunks.into_iter().filter_map(Result::ok).map(|c| c.to_string()).collect();
        // A usage error ends with help; the line that says what was wrong begins `error`.
        let lines = || text.lines().map(str::trim).filter(|l| !l.is_empty());
        let last = lines().rfind(|l| l.to_ascii_lowercase().starts_with("error")).or_else(|| lines().next_back())?;
        Some(last.chars().take(300).collect())
    }

    /// Streams the container's stdout and stderr into its log buffer, line by line, each
    /// stamped by the daemon (`log_stream.rs`), for as long as the container is live.
    fn follow_logs(&self, docker_id: &str, logs: Arc<LogBuffer>) {
        let docker = self.inner.docker.clone();
        let (id, weak) = (docker_id.to_string(), Arc::downgrade(&self.inner));
        let open = {
            let id = id.clone();
            move |since: i32| {
                let options = LogsOptions {
                    follow: true,
                    stdout: true,
                    stderr: true,
                    timestamps: true,
                    since,
                    ..Default::default()
                };
                docker.logs(&id, Some(options))
            }
        };
        let live = move || weak.upgrade().is_some_and(|inner| inner.live.lock().values().any(|l| l.docker_id == id));
        tokio::spawn(log_stream::follow(open, logs, live));
    }

    fn docker_id(&self, id: ContainerId) -> Option<String> {
        self.inner.live.lock().get(&id).map(|l| l.docker_id.clone()).filter(|d| !d.is_empty())
    }

    async fn remove(&self, id: ContainerId) {
        if let Some(docker_id) = self.docker_id(id) {
            let options = RemoveContainerOptions { force: true, ..Default::default() };
            if let Err(e) = self.inner.docker.remove_container(&docker_id, Some(options)).await {
                tracing::warn!(container = id.0, "docker rm failed: {e}");
            }
        }
        self.forget(id).await;
    }

    async fn forget(&self, id: ContainerId) {
        self.inner.live.lock().remove(&id);
        self.inner.output_held.lock().remove(&id);
        let dir = self.container_dir(id);
        let _ = tokio::task::spawn_blocking(move || {
            own_disk::unmount(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        })
        .await;
        self.inner.host.uncount(id);
    }

    fn container_dir(&self, id: ContainerId) -> PathBuf {
        self.inner.dir.join(id.0.to_string())
    }

    /// Removes every container labelled with this invoker's id (and only those), and the
    /// directories of its earlier run.
    async fn clean_up_earlier_run(&self) -> Result<(), FactoryError> {
        let filters =
            HashMap::from([("label".to_string(), vec![format!("{LABEL_INVOKER}={}", self.inner.invoker_id)])]);
        let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let left = self.inner.docker.list_containers(Some(options)).await.map_err(op("docker ps"))?;
        let mut removed = 0;
        for c in left {
            let Some(id) = c.id else { continue };
            let options = RemoveContainerOptions { force: true, ..Default::default() };
            if self.inner.docker.remove_container(&id, Some(options)).await.is_ok() {
                removed += 1;
            }
        }
        own_disk::unmount_under(&self.inner.dir);
        let _ = std::fs::remove_dir_all(&self.inner.dir);
        if removed > 0 {
            tracing::info!(removed, "removed containers left by an earlier run of this invoker");
        }
        Ok(())
    }
}

fn parse_user(user: &str) -> Option<(u32, u32)> {
    let (uid, gid) = user.split_once(':')?;
    Some((uid.parse().ok()?, gid.parse().ok()?))
}

/// The per-container directory: owned by the container's user, so its runtime can make its
/// socket there, and by nobody else; a disk of its own, so that the container, which may write
/// there, cannot fill `data_dir`.
fn prepare_dir(dir: &Path, owner: (u32, u32)) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    own_disk::mount_on(dir, SOCKET_DIR_MB, owner, 0o700)
}

/// The pipes our runtime writes its stdout and stderr to, in the per-container directory
/// (`action-runtime --output`), their reading ends opened.
fn output_pipes(dir: &Path, owner: (u32, u32)) -> std::io::Result<[NamedPipe; 2]> {
    let [stdout, stderr] = OUTPUT_PIPES.map(|name| NamedPipe::make(&dir.join(name), owner));
    Ok([stdout?, stderr?])
}

/// OOM kills counted by the container's memory cgroup, wherever the engine put it (cgroup v1
/// or v2, cgroupfs or systemd driver); 0 when none can be read.
fn oom_kills(docker_id: &str) -> u64 {
    let candidates = [
        format!("/sys/fs/cgroup/memory/docker/{docker_id}/memory.oom_control"),
        format!("/sys/fs/cgroup/docker/{docker_id}/memory.events"),
        format!("/sys/fs/cgroup/system.slice/docker-{docker_id}.scope/memory.events"),
        format!("/sys/fs/cgroup/memory/system.slice/docker-{docker_id}.scope/memory.oom_control"),
    ];
    candidates
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .find_map(|text| {
            text.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse::<u64>().ok()))
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_numeric_pairs() {
        assert_eq!(parse_user("65534:65534"), Some((65534, 65534)));
        assert_eq!(parse_user("nobody"), None);
        assert_eq!(parse_user("1:x"), None);
    }
}
