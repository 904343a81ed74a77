//! The process factory, the embedded default: each container is a local process of the kind's
//! runtime command, started through `invoker sandbox` (see `sandbox.rs`): in its own cgroups
//! (memory, pids, freezer), under a uid of its own, in its own root, mount, IPC and network
//! namespaces, in its own process group.
//!
//! No orphans: destroy kills every process in the container's cgroups (setsid and double
//! forks included); at shutdown every container is destroyed; if the invoker dies (SIGKILL),
//! its watchdog (`watchdog.rs`) removes them at once, whether their runtimes watch the invoker
//! or not; and every live container is recorded in `data_dir/processes/<invoker_id>/`, so that
//! a restart kills what an earlier run of the same invoker left (its cgroups, and the recorded
//! process groups whose environment names this invoker), and nothing else.
//!
//! It takes its own section of the config (`[factory.process]`) and the kinds it runs, as the
//! other backends take theirs; it depends on the factory contract and the project's own
//! runtime (run in place by the sandbox), never on the invoker.

// One audited exception: `sandbox` (the container's namespaces, mounts and limits).
#![deny(unsafe_code)]

mod cgroup;
pub mod memory_limit;
pub mod sandbox;
pub mod sandbox_fork;
pub mod sandbox_template;
mod snapshot;
pub mod watchdog;
mod zygote;

use crate::cgroup::ContainerCgroups;
use crate::sandbox::{resolve_interpreter, SandboxArgs, ACTION_PATH};
use crate::sandbox_fork::ForkServer;
use crate::watchdog::{remove_left, Watchdog, WatchdogArgs};
use crate::zygote::{ForkRequest, Zygote};
use invoker_factory::contract::{
    ContainerFactory, ContainerHandle, ContainerSpec, Epoch, FunctionStart, StatsReceiver, Transport,
};
use invoker_factory::error::{CreateError, FactoryError, SetupError};
use invoker_factory::fn_socket::ListenerWatch;
use invoker_factory::id_lock::IdLock;
use invoker_factory::kinds::{KindConfig, RuntimeProtocol};
use invoker_factory::logs::{LogBuffer, Stream};
use invoker_factory::netns::NetNs;
use invoker_factory::one_host::OneHost;
use invoker_factory::own_disk;
use invoker_factory::peer::{ContainerSocket, Peer, RuntimeLife};
use invoker_factory::pipe_lines::PipeLines;
use invoker_factory::settings::Network;
use invoker_factory::settings::{ProcessFactoryConfig, TransportKind};
use invoker_factory::uids::{HeldUid, UidRange};
use invoker_ids::{ContainerId, NodeId};
use invoker_wire::runtime::{fn_listener_env, FN_SOCKET_DIR};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{ChildStderr, ChildStdout, Command};
use tokio::sync::{mpsc, watch};

#[derive(Clone)]
pub struct ProcessFactory {
    inner: Arc<Inner>,
}

struct Inner {
    invoker_id: String,
    settings: ProcessFactoryConfig,
    kinds: BTreeMap<String, KindConfig>,
    executable: PathBuf,
    pid_dir: PathBuf,
    cgroups: Result<ContainerCgroups, String>,
    /// `Some` when containers are isolated (the default, as root).
    uids: Option<UidRange>,
    /// The environment every runtime gets besides its own variables (nothing of the invoker's:
    /// a key in it would reach every action).
    env: Vec<(String, String)>,
    /// Hidden inside every container even where a directory it sees holds them.
    masked: Vec<PathBuf>,
    host: OneHost,
    live: Mutex<HashMap<ContainerId, Live>>,
    watchdog: Mutex<Option<Watchdog>>,
    /// How the watchdog is started again should someone kill it.
    watchdog_args: WatchdogArgs,
    /// Forks the action processes of the python kinds (isolated containers only: the child
    /// must enter the container's namespaces and take its uid).
    zygote: Option<Zygote>,
    /// Forks each container's sandbox (`sandbox_fork.rs`); without it (it could not start),
    /// each is `invoker sandbox` executed.
    fork_server: Option<ForkServer>,
    /// The node launcher's startup snapshot, when a kind starts from one.
    node_snapshot: Option<PathBuf>,
    /// Whether each container gets a disk of its own (`own_disk.rs`; needs root).
    own_disks: bool,
    /// Containers whose runtime exited on its own, for the pool to remove.
    gone: mpsc::Sender<ContainerId>,
    gone_rx: Mutex<Option<mpsc::Receiver<ContainerId>>>,
    /// This invoker id, held on this machine for the life of the factory.
    _id: IdLock,
}

struct Live {
    pgid: Pid,
    /// How the runtime's exit is said: its status, once it exited.
    exit: watch::Receiver<Option<String>>,
    /// Ready: an exit from now on is the container's end, for the pool to hear of.
    ready: bool,
    /// Given back once every process of the container is gone.
    uid: Option<HeldUid>,
}

/// Containers whose runtime exited, not yet taken by the pool (it takes them at once).
const GONE_BACKLOG: usize = 1024;

fn setup_error(source: impl Into<SetupError>) -> FactoryError {
    FactoryError::Setup { factory: "process", source: source.into() }
}

fn at(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SetupError + '_ {
    move |source| SetupError::Path { path: path.to_path_buf(), source }
}

fn unfit(setting: &str, why: impl Into<String>) -> SetupError {
    SetupError::Unfit { setting: setting.into(), why: why.into() }
}

impl ProcessFactory {
    /// Sets up the factory and kills what an earlier run of this invoker left behind.
    /// `kinds` are the runtimes it starts; `data_dir` holds the live containers' record (under
    /// `processes/<invoker_id>`); no action may see `data_dir` or `config_file`.
    pub fn new(
        settings: &ProcessFactoryConfig,
        kinds: &BTreeMap<String, KindConfig>,
        invoker_id: &str,
        data_dir: &Path,
        config_file: Option<&Path>,
        epoch: Epoch,
    ) -> Result<Self, FactoryError> {
        // Before anything of an earlier run of this id is touched: see `id_lock.rs`.
        let id = IdLock::take(invoker_id).map_err(setup_error)?;
        let settings = settings.clone();
        let pid_dir = data_dir.join("processes").join(invoker_id);
        let pid_dir = std::path::absolute(&pid_dir).map_err(|e| setup_error(at(&pid_dir)(e)))?;
        // A socket path must fit in sun_path (108 bytes) with `/<container id>/sock` appended.
        if pid_dir.as_os_str().len() > 80 {
            return Err(setup_error(unfit(
                "data_dir",
                format!(
                    "the process directory {} is longer than 80 bytes, too long for the runtimes' unix sockets; \
                     use a shorter data_dir",
                    pid_dir.display()
                ),
            )));
        }
        for dir in [pid_dir.parent().unwrap_or(&pid_dir), &pid_dir] {
            std::fs::create_dir_all(dir).map_err(|e| setup_error(at(dir)(e)))?;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        let executable = std::env::current_exe()
            .map_err(|e| setup_error(SetupError::Failed { what: "the invoker's own executable", source: e.into() }))?;
        let cgroups = ContainerCgroups::detect(settings.cgroup_root.as_deref(), invoker_id);
        if settings.require_memory_limit {
            if let Err(reason) = &cgroups {
                return Err(setup_error(unfit("factory.process.require_memory_limit", format!("set, but {reason}"))));
            }
        }
        let uids = if settings.unprivileged {
            if !nix::unistd::geteuid().is_root() {
                return Err(setup_error(unfit(
                    "factory.process.unprivileged",
                    "the process factory isolates each container (a uid of its own, its own root and network), \
                     which needs root; run the invoker as root, or set [factory.process] unprivileged = false to \
                     run actions as this user without isolation",
                )));
            }
            // Inside a container the binary is bound at its path under directories of the
            // sandbox's own: only the file's own mode matters, not its host directories'.
            let mode = std::fs::metadata(&executable).map(|m| m.permissions().mode()).unwrap_or(0);
            if mode & 0o001 == 0 {
                return Err(setup_error(unfit(
                    "factory.process.unprivileged",
                    format!(
                        "{} must be executable by other users (a container's uid runs it): chmod o+x, or set \
                         [factory.process] unprivileged = false",
                        executable.display()
                    ),
                )));
            }
            Some(
                UidRange::new(settings.uid_base, settings.uid_count)
                    .map_err(|e| setup_error(SetupError::Failed { what: "the uid locks", source: e.into() }))?,
            )
        } else {
            tracing::warn!(
                "[factory.process] unprivileged = false: actions run as the invoker's own user, in the \
                 invoker's filesystem and network; any action can read the config, the store and \
                 other actions' code"
            );
            None
        };
        if let Some(range) = &uids {
            probe_sandbox(&executable, &pid_dir, range)?;
        }
        if uids.is_none() {
            if let Some((name, _)) = kinds.iter().find(|(_, k)| k.network == Network::Isolated) {
                return Err(setup_error(unfit(
                    &format!("kinds.\"{name}\".network"),
                    "\"isolated\" gives each container a network namespace of its own, which only the isolated \
                     sandbox makes: run the invoker as root with [factory.process] unprivileged = true (the default)",
                )));
            }
        }
        let env = runtime_env(kinds, uids.is_some())?;
        if settings.transport == TransportKind::Tcp {
            let own: Vec<&str> =
                kinds.iter().filter(|(_, k)| k.network == Network::None).map(|(n, _)| n.as_str()).collect();
            if !own.is_empty() {
                tracing::info!(
                    kinds = own.join(", "),
                    "factory.process.transport = \"tcp\" applies to kinds with network = \"host\" only: \
                     these kinds have their own network namespace and are reached on a unix socket"
                );
            }
        }
        // What an earlier run of this invoker left goes (its watchdog and zygote included; see
        // `watchdog.rs`) before this run's watchdog and zygote start.
        let killed = remove_left(invoker_id, &pid_dir, cgroups.as_ref().ok());
        if killed > 0 {
            tracing::info!(killed, "removed runtime processes left by an earlier run of this invoker");
        }
        let watchdog_args = WatchdogArgs {
            invoker_id: invoker_id.to_string(),
            pid_dir: pid_dir.clone(),
            cgroup_root: settings.cgroup_root.clone(),
        };
        let watchdog = Watchdog::start(&executable, &watchdog_args).map_err(|e| {
            setup_error(SetupError::Failed { what: "the watchdog (invoker watchdog)", source: e.into() })
        })?;
        // Without it python containers start their own launcher, a little slower: no reason to
        // refuse the start (a full disk, say).
        let zygote = match uids {
            Some(_) => start_zygote(&env, invoker_id, &pid_dir, kinds).unwrap_or_else(|e| {
                tracing::warn!("{e}; python containers start without it");
                None
            }),
            None => None,
        };
        let node_snapshot = build_node_snapshot(&env, &pid_dir, kinds)?;
        let masked: Vec<PathBuf> =
            config_file.map(Path::to_path_buf).into_iter().chain(std::path::absolute(data_dir).ok()).collect();
        // A kind's `paths` are bound after the masks: one holding the config or the store would
        // show every tenant's records to its actions.
        for (name, kind) in kinds {
            let exposed = kind
                .paths
                .iter()
                .map(|p| p.host())
                .find(|p| masked.iter().any(|m| m.starts_with(p) || p.starts_with(m)));
            if let Some(path) = exposed {
                return Err(setup_error(unfit(
                    &format!("kinds.\"{name}\".paths"),
                    format!("{} holds or lies in the config file or data_dir, which no action may see", path.display()),
                )));
            }
        }
        let own_disks = own_disk::can_mount();
        if !own_disks {
            tracing::warn!(
                "the invoker is not root: containers get no disk of their own, limits.disk is NOT enforced and \
                 what an action writes lands in data_dir"
            );
        }
        let offered = match &settings.memory_limit_file {
            Some(path) => memory_limit::read(path, settings.own_memory_mb)
                .map_err(|e| setup_error(unfit("factory.process.memory_limit_file", e)))?
                .unwrap_or(settings.user_memory_mb),
            None => settings.user_memory_mb,
        };
        let fork_server = ForkServer::start(&executable, invoker_id, &pid_dir)
            .map_err(|e| {
                tracing::warn!("the sandbox fork server did not start ({e}); each container's sandbox is executed")
            })
            .ok();
        let host = OneHost::new(NodeId::new("local"), offered, epoch);
        let (gone, gone_rx) = mpsc::channel(GONE_BACKLOG);
        let factory = ProcessFactory {
            inner: Arc::new(Inner {
                invoker_id: invoker_id.to_string(),
                settings,
                kinds: kinds.clone(),
                executable,
                pid_dir,
                cgroups,
                uids,
                env,
                masked,
                host,
                live: Mutex::new(HashMap::new()),
                watchdog: Mutex::new(Some(watchdog)),
                watchdog_args,
                zygote,
                fork_server,
                node_snapshot,
                own_disks,
                gone,
                gone_rx: Mutex::new(Some(gone_rx)),
                _id: id,
            }),
        };
        factory.observe();
        if let Some(path) = &factory.inner.settings.memory_limit_file {
            let (own, unlimited) = (factory.inner.settings.own_memory_mb, factory.inner.settings.user_memory_mb);
            let inner = Arc::downgrade(&factory.inner);
            memory_limit::follow(path, own, unlimited, move |mb| {
                let Some(inner) = inner.upgrade() else { return false };
                if inner.host.set_capacity(mb) {
                    tracing::info!("the pod's memory limit now leaves {mb} MB for actions");
                }
                true
            });
        }
        Ok(factory)
    }
}

impl ContainerFactory for ProcessFactory {
    fn describe(&self) -> String {
        let isolation = if self.inner.uids.is_some() {
            "each container under its own uid, root, mount, IPC and network namespaces"
        } else {
            "containers NOT isolated (unprivileged = false)"
        };
        match &self.inner.cgroups {
            Ok(cg) => format!("process factory: {isolation}; limits enforced with {}", cg.describe()),
            Err(reason) => format!("process factory: {isolation}; memory and pids limits NOT enforced: {reason}"),
        }
    }

    fn stats(&self) -> StatsReceiver {
        self.inner.host.subscribe()
    }

    fn take_gone(&self) -> Option<mpsc::Receiver<ContainerId>> {
        self.inner.gone_rx.lock().take()
    }

    /// Publishes a fresh snapshot: user memory minus the declared limits of ready containers
    /// (`one_host`: a starting one is the pool's reservation).
    fn observe(&self) {
        self.inner.host.publish();
        self.keep_watchdog();
    }

    async fn create(&self, spec: &ContainerSpec, node: &NodeId) -> Result<ContainerHandle, FactoryError> {
        let inner = &self.inner;
        let kind = inner.kinds.get(&spec.kind).ok_or_else(|| FactoryError::UnknownKind(spec.kind.clone()))?;
        if kind.command.is_empty() {
            return Err(CreateError::NoCommand(spec.kind.clone()).into());
        }
        let uid = match &inner.uids {
            Some(range) => Some(range.take().map_err(CreateError::from)?),
            None => None,
        };
        // Directories, a mount, `chown`s and cgroups: file system work, off the async thread
        // (the invoker's one thread also serves the API and the pool).
        let prepared = {
            let (factory, spec, kind, uid) = (self.clone(), spec.clone(), kind.clone(), uid.as_ref().map(|u| u.uid));
            tokio::task::spawn_blocking(move || factory.prepare(&spec, &kind, uid)).await
        };
        let prepared = prepared.unwrap_or_else(|_| Err(CreateError::Stopped("the container's set-up task").into()));
        let (reach, sandbox) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                // Whatever was made of the container (its directories, its cgroups) goes.
                self.kill(spec.id).await;
                return Err(e);
            }
        };
        let work = self.work_dir(spec.id);
        let adopt = self.dir(spec.id).join("launcher.sock");
        let zygote = inner.zygote.as_ref().filter(|_| kind.uses_zygote());
        let env = match (&reach, &spec.function) {
            (Reach::FnSocket { inside, .. }, Some(function)) => self.function_env(&work, kind, function, inside),
            _ => self.container_env(spec.id, kind, zygote.map(|_| adopt.as_path())),
        };
        // Set up before the function starts, so that its listener is never missed.
        let (reach, listener) = match reach {
            Reach::FnSocket { host, .. } => match ListenerWatch::on(&host) {
                Ok(watch) => (Reach::Listener, Some(watch)),
                Err(e) => {
                    self.kill(spec.id).await;
                    return Err(CreateError::Socket(e).into());
                }
            },
            reach => (reach, None),
        };
        let Started { pid, output, exited, life, ready: said_ready } = match self.start_sandbox(&sandbox, &env).await {
            Ok(started) => started,
            Err(e) => {
                self.kill(spec.id).await;
                return Err(e);
            }
        };
        let pgid = Pid::from_raw(pid as i32);
        // A file made on the data disk: off the thread that serves the API.
        let _ = tokio::fs::write(self.pid_file(spec.id), format!("{pid}\n")).await;
        let logs = Arc::new(LogBuffer::default());
        follow_output(output, &logs);
        let uid_number = uid.as_ref().map(|held| held.uid);
        let life = Arc::new(life);
        let mut exit = self.wait_for_exit(spec.id, exited, life.clone());
        inner.live.lock().insert(spec.id, Live { pgid, exit: exit.clone(), ready: false, uid });

        // The zygote forks the launcher while the sandbox sets up; the child joins the
        // container's cgroups at once and enters the rest once the runtime is up.
        let forking = async {
            let (zygote, uid) = (zygote?, uid_number?);
            let request = ForkRequest {
                pid,
                cgroups: &sandbox.cgroup_procs,
                uid,
                work: &work,
                socket: &adopt,
                wait_ms: inner.settings.ready_timeout.as_millis() as u64,
                open_files: crate::sandbox::CONTAINER_OPEN_FILES,
                env: env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            };
            Some(zygote.fork(&request).await)
        };
        let bound = kind.start_timeout_or(inner.settings.ready_timeout);
        let ready = async {
            match listener {
                Some(watch) => wait_listener(&mut exit, watch, bound).await,
                None => wait_ready(&mut exit, pid, reach, said_ready, bound).await,
            }
        };
        let (ready, forked) = tokio::join!(ready, forking);
        let transport = match ready {
            Ok(transport) => transport,
            Err(e) => {
                self.kill(spec.id).await;
                // The sandbox says on stderr which step failed.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Err(e.with_said(logs.last_stderr()));
            }
        };
        if let Some(Err(e)) = forked {
            tracing::warn!(container = spec.id.0, "{e}; the runtime starts its own launcher");
            // As root: the runtime tells the invoker from a launcher and stops waiting.
            drop(tokio::net::UnixStream::connect(&adopt).await);
        }
        // Counted while it is known live: a kill takes it out of `live` before it uncounts it.
        let ready_at = match inner.live.lock().get_mut(&spec.id) {
            Some(live) if live.exit.borrow().is_none() => {
                live.ready = true;
                Some(inner.host.count(spec.id, spec.memory_mb))
            }
            _ => None,
        };
        let Some(ready_at) = ready_at else {
            // Whatever was made of it goes, as for any failed create.
            self.kill(spec.id).await;
            return Err(CreateError::ExitedAsReady.into());
        };
        let peer = Peer {
            uid: uid_number,
            // Containers that share the invoker's uid are told apart by their cgroup.
            procs: match (&inner.cgroups, uid_number) {
                (Ok(cg), None) => Some(cg.procs_file(spec.id)),
                _ => None,
            },
            cgroup_name: None,
            runtime: Some(life),
        };
        Ok(ContainerHandle { id: spec.id, node: node.clone(), transport, peer: Arc::new(peer), logs, ready_at })
    }

    async fn pause(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.signal(c.id, Signal::SIGSTOP, "pause")
    }

    async fn resume(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.signal(c.id, Signal::SIGCONT, "resume")
    }

    async fn destroy(&self, c: &ContainerHandle) -> Result<(), FactoryError> {
        self.kill(c.id).await;
        c.logs.close();
        Ok(())
    }

    /// True when the kernel's OOM killer struck inside this container's memory limit.
    fn was_oom_killed(&self, c: &ContainerHandle) -> bool {
        self.inner.cgroups.as_ref().is_ok_and(|cg| cg.oom_killed(c.id))
    }

    async fn destroy_all(&self) {
        if let Some(zygote) = &self.inner.zygote {
            zygote.stop().await;
        }
        let ids: Vec<ContainerId> = self.inner.live.lock().keys().copied().collect();
        for id in ids {
            self.kill(id).await;
        }
    }
}

impl ProcessFactory {
    /// Starts the container's sandbox with its runtime: forked by the fork server, or, without
    /// one that answers, `invoker sandbox` executed. Its pid (its process group's), its stdout
    /// and stderr to read, and its exit to await.
    async fn start_sandbox(
        &self,
        sandbox: &SandboxArgs,
        env: &BTreeMap<String, String>,
    ) -> Result<Started, FactoryError> {
        let inner = &self.inner;
        if let Some(server) = &inner.fork_server {
            let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            match server.fork(&sandbox.to_args(), &env).await {
                Ok(forked) => {
                    let exited: Exited = Box::pin(forked.exit.status());
                    let life = RuntimeLife::of_pidfd(forked.pid as i32, forked.pidfd);
                    return Ok(Started {
                        pid: forked.pid,
                        output: [Ok(forked.stdout), Ok(forked.stderr)],
                        exited,
                        life,
                        ready: Some(forked.ready),
                    });
                }
                Err(e) => tracing::warn!("the sandbox fork server did not fork ({e}); the sandbox is executed"),
            }
        }
        let mut cmd = Command::new(&inner.executable);
        cmd.arg("sandbox")
            .args(sandbox.to_args())
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| CreateError::Path { path: inner.executable.clone(), source })?;
        let pid = child.id().ok_or_else(|| CreateError::Exited { what: "runtime", status: "at once".into() })?;
        let output = [
            child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout")).and_then(ChildStdout::into_owned_fd),
            child.stderr.take().ok_or_else(|| std::io::Error::other("no stderr")).and_then(ChildStderr::into_owned_fd),
        ];
        let exited: Exited =
            Box::pin(async move { child.wait().await.map_or_else(|e| e.to_string(), |s| s.to_string()) });
        Ok(Started { pid, output, exited, life: RuntimeLife::new(pid as i32), ready: None })
    }

    /// Makes the container's directory on a disk of its own (`own_disk.rs`) with its work dir,
    /// `/tmp` and `/dev/shm` in it (its uid's), its root's mount point, its cgroups, and the
    /// address its runtime will serve on; returns how to reach it and the sandbox's arguments.
    fn prepare(
        &self,
        spec: &ContainerSpec,
        kind: &KindConfig,
        uid: Option<u32>,
    ) -> Result<(Reach, SandboxArgs), FactoryError> {
        let inner = &self.inner;
        let dir = self.dir(spec.id);
        let create_err = |step: &'static str, e: std::io::Error| FactoryError::from(CreateError::step(step, e));
        // Ids are not reused within a run, and a start removed what an earlier run left.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| create_err("container directory", e))?;
        let owner =
            uid.map_or_else(|| (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw()), |uid| (uid, uid));
        if inner.own_disks {
            own_disk::mount_on(&dir, spec.disk_mb, owner, 0o700).map_err(|e| create_err("container disk", e))?;
        }
        let work = self.work_dir(spec.id);
        let (tmp, shm) = (dir.join("tmp"), dir.join("shm"));
        // `/tmp` and `/dev/shm` are the sandbox's: without isolation the runtime has the host's.
        let mut made = vec![(&dir, 0o700), (&work, 0o700)];
        if uid.is_some() {
            made.extend([(&tmp, 0o1777), (&shm, 0o1777)]);
        }
        for (made, mode) in made {
            if made != &dir {
                std::fs::create_dir(made).map_err(|e| create_err("container directory", e))?;
            }
            if uid.is_some() {
                let (user, group) = (nix::unistd::Uid::from_raw(owner.0), nix::unistd::Gid::from_raw(owner.1));
                nix::unistd::chown(made, Some(user), Some(group))
                    .map_err(|e| create_err("container directory", e.into()))?;
            }
            let _ = std::fs::set_permissions(made, std::fs::Permissions::from_mode(mode));
        }
        if uid.is_some() {
            std::fs::create_dir(self.root(spec.id)).map_err(|e| create_err("container root", e))?;
        }
        if let Some(file) = &kind.code_file {
            let code = spec.function.as_ref().and_then(|f| f.code.as_deref());
            let code = code.ok_or_else(|| CreateError::NoCode(file.clone()))?;
            let path = work.join(file);
            std::fs::write(&path, code).map_err(|e| create_err("the action's code", e))?;
            own_file(&path, uid.map(|_| owner), 0o600).map_err(|e| create_err("the action's code", e))?;
        }
        let (reach, listen) = match (kind.protocol, kind.network, inner.settings.transport) {
            (RuntimeProtocol::Fn, ..) => {
                // Fresh and empty for each container (a socket left by an earlier process stops
                // the FDKs from binding), open to the function's user as Fn's agent makes it.
                let (host, inside) = match uid {
                    Some(_) => (tmp.join("iofs"), FN_SOCKET_DIR.to_string()),
                    None => (dir.join("iofs"), dir.join("iofs").display().to_string()),
                };
                std::fs::create_dir(&host).map_err(|e| create_err("socket directory", e))?;
                own_file(&host, uid.map(|_| owner), 0o777).map_err(|e| create_err("socket directory", e))?;
                (Reach::FnSocket { host, inside }, String::new())
            }
            (_, Network::Isolated, _) => {
                (Reach::Namespace(kind.port), SocketAddr::from(([0, 0, 0, 0], kind.port)).to_string())
            }
            (_, Network::Host, TransportKind::Tcp) => {
                let addr = free_port()?;
                (Reach::At(Transport::Tcp(addr)), invoker_runtime::Listen::Tcp(addr).to_string())
            }
            _ => {
                let path = dir.join("sock");
                // Opened before the runtime starts: see `peer.rs`.
                let socket = ContainerSocket::in_dir(&dir, "sock").map_err(|e| create_err("container directory", e))?;
                (Reach::At(Transport::Unix(Arc::new(socket))), invoker_runtime::Listen::Unix(path).to_string())
            }
        };
        let cgroup_procs = match &inner.cgroups {
            Ok(cg) => cg
                .create(spec.id, spec.memory_mb, inner.settings.pids_max)
                .map_err(|e| CreateError::step("cgroups", e))?,
            Err(_) => Vec::new(),
        };
        let sandbox = SandboxArgs {
            cgroup_procs,
            isolate: uid.is_some(),
            uid: uid.unwrap_or(0),
            host_network: kind.network == Network::Host,
            root: Some(self.root(spec.id)),
            dir: Some(dir.clone()),
            work_dir: Some(work),
            bind_files: std::iter::once(inner.executable.as_path())
                .chain(kind.paths.iter().filter(|p| p.host() == p.at()).map(|p| p.host()))
                .chain(inner.node_snapshot.as_deref().filter(|_| kind.snapshot))
                .map(std::path::Path::to_path_buf)
                .collect(),
            bind_at: kind
                .paths
                .iter()
                .filter(|p| p.host() != p.at())
                .flat_map(|p| [p.host().to_path_buf(), p.at().to_path_buf()])
                .collect(),
            mask: inner.masked.clone(),
            tmp: uid.is_some().then(|| tmp.clone()),
            shm: uid.is_some().then(|| shm.clone()),
            command: kind
                .command_for(&inner.executable, &listen, spec.function.as_ref().map_or("", |f| &f.main))
                .into_iter()
                .map(Into::into)
                .collect(),
        };
        Ok((reach, sandbox))
    }

    fn signal(&self, id: ContainerId, signal: Signal, op: &'static str) -> Result<(), FactoryError> {
        let pgid = self.inner.live.lock().get(&id).map(|l| l.pgid);
        let pgid = pgid.ok_or(FactoryError::NoSuchContainer { op })?;
        killpg(pgid, signal).map_err(|e| FactoryError::Operation { op, source: e.into() })
    }

    /// Kills the container's process group, then every process left in its cgroups (what left
    /// the group), then removes its files; its uid goes back last.
    async fn kill(&self, id: ContainerId) {
        let live = self.inner.live.lock().remove(&id);
        if let Some(live) = &live {
            let _ = killpg(live.pgid, Signal::SIGKILL);
        }
        let (exit, uid) = match live {
            Some(live) => (Some(live.exit), live.uid),
            None => (None, None),
        };
        if let Some(mut exit) = exit {
            let _ = tokio::time::timeout(Duration::from_secs(5), exit.wait_for(Option::is_some)).await;
        }
        // File system work, off the async thread.
        let factory = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            // Before the cgroups go: its pages are charged there.
            own_disk::unmount(&factory.dir(id));
            if let Ok(cg) = &factory.inner.cgroups {
                cg.remove(id);
            }
            factory.remove_files(id);
        })
        .await;
        drop(uid);
        self.inner.host.uncount(id);
    }

    /// Waits for the runtime's exit in a task of its own, and says it: to `life` (so that no
    /// connection is trusted from then on), on the returned channel, and, when the container was
    /// ready and not being removed, to the pool (its runtime died, or its action killed it).
    fn wait_for_exit(
        &self,
        id: ContainerId,
        exited: impl std::future::Future<Output = String> + Send + 'static,
        life: Arc<RuntimeLife>,
    ) -> watch::Receiver<Option<String>> {
        let (said, exit) = watch::channel(None);
        let factory = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let status = exited.await;
            life.mark_exited();
            let _ = said.send(Some(status.clone()));
            let Some(inner) = factory.upgrade() else { return };
            if inner.live.lock().get(&id).is_some_and(|l| l.ready) {
                tracing::warn!(
                    container = id.0,
                    "the runtime exited ({status}) while its container was live: the container is removed, and no \
                     connection to it is trusted any more"
                );
                if inner.gone.try_send(id).is_err() {
                    tracing::warn!(container = id.0, "the pool was not told of a container whose runtime exited");
                }
            }
        });
        exit
    }

    fn remove_files(&self, id: ContainerId) {
        let _ = std::fs::remove_file(self.pid_file(id));
        let _ = std::fs::remove_dir(self.root(id));
        let _ = std::fs::remove_dir_all(self.dir(id));
    }

    /// The container's own directory (its socket and work dir), owned by its uid, 0700.
    fn dir(&self, id: ContainerId) -> PathBuf {
        self.inner.pid_dir.join(id.0.to_string())
    }

    /// A runtime's whole environment: the invoker's few variables for every runtime, the kind's
    /// own, then the container's (which the kind cannot override: a restart finds what an
    /// earlier run left by `INVOKER_ID`), and where the zygote's launcher connects.
    fn container_env(
        &self,
        id: ContainerId,
        kind: &KindConfig,
        adopt: Option<&std::path::Path>,
    ) -> BTreeMap<String, String> {
        let inner = &self.inner;
        let work = self.work_dir(id);
        let mut env: Vec<(String, String)> = inner.env.iter().cloned().chain(kind.env_for(&work)).collect();
        env.extend([
            ("INVOKER_ID".to_string(), inner.invoker_id.clone()),
            ("INVOKER_CONTAINER".into(), id.0.to_string()),
            ("INVOKER_PARENT_PID".into(), std::process::id().to_string()),
            ("INVOKER_WORK_DIR".into(), work.display().to_string()),
        ]);
        if let Some(adopt) = adopt {
            env.push(("INVOKER_ADOPT".into(), adopt.display().to_string()));
        }
        if let Some(blob) = inner.node_snapshot.as_ref().filter(|_| kind.snapshot) {
            env.push((invoker_runtime::NODE_SNAPSHOT.into(), blob.display().to_string()));
        }
        env.into_iter().collect()
    }

    /// An Fn function's whole environment: the system's few variables, its kind's, then what
    /// Fn's agent gives (the protocol's variables, the function's configuration, where to
    /// listen). Of the invoker's, only `INVOKER_ID`, which marks its processes for the watchdog
    /// when no cgroup holds them.
    fn function_env(
        &self,
        work: &std::path::Path,
        kind: &KindConfig,
        function: &FunctionStart,
        inside: &str,
    ) -> BTreeMap<String, String> {
        let inner = &self.inner;
        let mut env: BTreeMap<String, String> = inner.env.iter().cloned().chain(kind.env_for(work)).collect();
        // No log frames: the function's pipes are read to their end at each answer, which
        // tells its lines apart exactly, with nothing more for it to write or us to read.
        env.extend(function.env.iter().filter(|(name, _)| !name.starts_with("FN_LOGFRAME_")).cloned());
        env.extend([fn_listener_env(inside), ("INVOKER_ID".into(), inner.invoker_id.clone())]);
        env
    }

    /// The runtime's working directory, inside the container's own.
    fn work_dir(&self, id: ContainerId) -> PathBuf {
        self.dir(id).join("work")
    }

    /// Where the sandbox builds the container's root (an empty directory on the host).
    fn root(&self, id: ContainerId) -> PathBuf {
        self.inner.pid_dir.join(format!("{}.root", id.0))
    }

    fn pid_file(&self, id: ContainerId) -> PathBuf {
        self.inner.pid_dir.join(format!("{}.pid", id.0))
    }

    /// A watchdog that someone killed is started again (its absence would let containers
    /// outlive a crash of the invoker).
    fn keep_watchdog(&self) {
        let mut watchdog = self.inner.watchdog.lock();
        if watchdog.as_mut().is_some_and(|w| !w.alive()) {
            tracing::warn!("the watchdog exited; starting it again");
            *watchdog = Watchdog::start(&self.inner.executable, &self.inner.watchdog_args)
                .inspect_err(|e| tracing::error!("the watchdog could not be started again: {e}"))
                .ok();
        }
    }
}

/// Starts the python zygote when a kind uses it (containers are isolated: the caller checks).
fn start_zygote(
    env: &[(String, String)],
    invoker_id: &str,
    pid_dir: &std::path::Path,
    kinds: &BTreeMap<String, KindConfig>,
) -> Result<Option<Zygote>, FactoryError> {
    if !kinds.values().any(KindConfig::uses_zygote) {
        return Ok(None);
    }
    let Some((_, python)) = env.iter().find(|(k, _)| k == "INVOKER_PYTHON") else { return Ok(None) };
    let mut env = env.to_vec();
    env.push(("INVOKER_ID".into(), invoker_id.to_string()));
    Zygote::start(python.into(), pid_dir.join("zygote"), env)
        .map(Some)
        .map_err(|e| setup_error(SetupError::Failed { what: "the python zygote", source: e.into() }))
}

/// Builds the node launcher's startup snapshot when a kind starts from one; a node that cannot
/// build it stops the start, naming the kind, rather than failing each of its activations.
fn build_node_snapshot(
    env: &[(String, String)],
    pid_dir: &std::path::Path,
    kinds: &BTreeMap<String, KindConfig>,
) -> Result<Option<PathBuf>, FactoryError> {
    let Some((name, _)) = kinds.iter().find(|(_, k)| k.snapshot) else { return Ok(None) };
    let node = env.iter().find(|(k, _)| k == "INVOKER_NODE").map_or("node", |(_, v)| v.as_str());
    let blob = crate::snapshot::build(std::path::Path::new(node), &pid_dir.join("snapshot"))
        .map_err(|e| setup_error(unfit(&format!("kinds.\"{name}\".snapshot"), e.to_string())))?;
    tracing::info!(blob = %blob.display(), "built the node launcher's startup snapshot");
    Ok(Some(blob))
}

/// Runs the sandbox once, around `invoker --version`, so that a machine where it cannot work
/// (no mount or network namespaces: a container without `CAP_SYS_ADMIN`, a seccomp profile)
/// is refused at start with the step that failed, rather than failing every activation.
fn probe_sandbox(
    executable: &std::path::Path,
    pid_dir: &std::path::Path,
    range: &UidRange,
) -> Result<(), FactoryError> {
    let held = range.take().map_err(setup_error)?;
    let (dir, root) = (pid_dir.join("probe"), pid_dir.join("probe.root"));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir(&root);
    let made = [&dir, &root, &dir.join("tmp"), &dir.join("shm")].into_iter().try_for_each(std::fs::create_dir);
    made.map_err(|e| setup_error(at(&dir)(e)))?;
    let args = SandboxArgs {
        isolate: true,
        uid: held.uid,
        root: Some(root.clone()),
        dir: Some(dir.clone()),
        bind_files: vec![executable.to_path_buf()],
        tmp: Some(dir.join("tmp")),
        shm: Some(dir.join("shm")),
        command: vec![executable.into(), "--version".into()],
        ..SandboxArgs::default()
    };
    let output = std::process::Command::new(executable).arg("sandbox").args(args.to_args()).env_clear().output();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir(&root);
    let output = output.map_err(|e| setup_error(at(executable)(e)))?;
    if output.status.success() {
        return Ok(());
    }
    Err(setup_error(unfit(
        "factory.process.unprivileged",
        format!(
            "the container sandbox does not work on this machine ({}); run the invoker where it may create \
             namespaces, or set [factory.process] unprivileged = false",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    )))
}

/// The environment of every runtime: a system `PATH`, and the interpreters the built-in
/// launchers run, resolved now to paths a container's uid can execute (isolated) or as found.
fn runtime_env(kinds: &BTreeMap<String, KindConfig>, isolated: bool) -> Result<Vec<(String, String)>, FactoryError> {
    let path = if isolated { ACTION_PATH.to_string() } else { std::env::var("PATH").unwrap_or_default() };
    let mut env = vec![("PATH".to_string(), path), ("HOME".into(), "/tmp".into()), ("LANG".into(), "C.UTF-8".into())];
    if let Ok(sched) = std::env::var("INVOKER_ACTION_SCHED") {
        env.push(("INVOKER_ACTION_SCHED".into(), sched));
    }
    for (launcher, program, variable) in [("python", "python3", "INVOKER_PYTHON"), ("nodejs", "node", "INVOKER_NODE")] {
        let used = kinds.values().any(|k| k.launcher() == Some(launcher));
        if !used {
            continue;
        }
        let found =
            if isolated { resolve_interpreter(program).map_err(|why| setup_error(unfit("kinds", why)))? } else { None };
        match found {
            Some(path) => env.push((variable.into(), path.display().to_string())),
            None if isolated => tracing::warn!("{program} is not installed: actions of the {launcher} kinds will fail"),
            None => {}
        }
    }
    Ok(env)
}

/// Gives `path` to `owner` (a container's uid, when isolated) with `mode`.
fn own_file(path: &std::path::Path, owner: Option<(u32, u32)>, mode: u32) -> std::io::Result<()> {
    if let Some((user, group)) = owner {
        nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(user)), Some(nix::unistd::Gid::from_raw(group)))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

fn free_port() -> Result<SocketAddr, FactoryError> {
    let port = |e| CreateError::step("a free port", e);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(port)?;
    Ok(listener.local_addr().map_err(port)?)
}

/// How the invoker will reach a container's runtime.
enum Reach {
    /// At an address known before it starts (a unix socket, a host port).
    At(Transport),
    /// Where an Fn function's listener, once verified, says (see `fn_socket.rs`).
    Listener,
    /// On this port of the network namespace the sandbox makes (known once it unshared).
    Namespace(u16),
    /// Where an Fn function makes its listener: its socket directory on the host, and as the
    /// container sees it.
    FnSocket { host: PathBuf, inside: String },
}

/// Waits for an Fn function's listener (`fn_socket`): the socket verified, or why the
/// creation fails.
async fn wait_listener(
    exit: &mut watch::Receiver<Option<String>>,
    watch: ListenerWatch,
    bound: Duration,
) -> Result<Transport, FactoryError> {
    tokio::select! {
        ready = watch.ready() => match ready {
            Ok(listener) => Ok(Transport::Unix(Arc::new(listener))),
            Err(e) => Err(CreateError::Socket(e).into()),
        },
        status = exit.wait_for(Option::is_some) => {
            let status = status.ok().and_then(|s| s.clone()).unwrap_or_default();
            Err(CreateError::Exited { what: "function", status: status.to_string() }.into())
        }
        () = tokio::time::sleep(bound) => Err(FactoryError::NotReady(bound)),
    }
}

/// Waits until the runtime accepts connections; returns where.
async fn wait_ready(
    exit: &mut watch::Receiver<Option<String>>,
    pid: u32,
    reach: Reach,
    said_ready: Option<OwnedFd>,
    bound: Duration,
) -> Result<Transport, FactoryError> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut attempt = 0u32;
    // While the runtime may still say it listens, it is looked at when it does, and polled
    // only as a safety net; once it cannot (its byte read, or none will come), polled closely.
    let mut said_ready = said_ready.and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok());
    loop {
        let transport = match &reach {
            Reach::At(transport) => Some(transport.clone()),
            Reach::FnSocket { .. } | Reach::Listener => None,
            Reach::Namespace(port) => match NetNs::of_process(pid) {
                Ok(ns) if !ns.is_invokers() => Some(Transport::Netns(Arc::new(ns), *port)),
                _ => None,
            },
        };
        if let Some(transport) = transport {
            if transport.accepts().await {
                return Ok(transport);
            }
        }
        if let Some(status) = exit.borrow().clone() {
            return Err(CreateError::Exited { what: "runtime", status: status.to_string() }.into());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(FactoryError::NotReady(bound));
        }
        // A runtime is up in a few milliseconds: poll closely at first, then ease off.
        let pause = Duration::from_millis(if attempt < 100 { 1 } else { 5 });
        match said_ready.as_mut() {
            Some(pipe) => {
                let mut byte = [0u8; 1];
                tokio::select! {
                    // The byte, the end of the file, or an error: look now, and poll after.
                    _ = tokio::io::AsyncReadExt::read(pipe, &mut byte) => said_ready = None,
                    () = tokio::time::sleep(SAID_READY_SAFETY_NET) => {}
                }
            }
            None => tokio::time::sleep(pause).await,
        }
        attempt += 1;
    }
}

/// Reads the container's stdout and stderr into `logs` (`PipeLines`: so that a run's last
/// lines can be read at once when its answer comes).
fn follow_output(output: [std::io::Result<OwnedFd>; 2], logs: &Arc<LogBuffer>) {
    for (fd, stream) in output.into_iter().zip([Stream::Stdout, Stream::Stderr]) {
        if let Err(e) = fd.and_then(|pipe| PipeLines::follow(pipe, stream, logs)) {
            tracing::warn!("a container's {} is not read: {e}", stream.name());
        }
    }
}

/// How a started sandbox's exit is awaited: its status, as `ExitStatus` says it.
type Exited = std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>;

/// How often a runtime that may still say it listens is polled anyway.
const SAID_READY_SAFETY_NET: Duration = Duration::from_millis(20);

/// A started sandbox: its pid, its stdout and stderr, its exit, its life, and (forked by the
/// fork server) the pipe its runtime says it listens on.
struct Started {
    pid: u32,
    output: [std::io::Result<OwnedFd>; 2],
    exited: Exited,
    life: RuntimeLife,
    ready: Option<OwnedFd>,
}
