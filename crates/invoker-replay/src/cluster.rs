//! The cluster a replay runs on, all on loopback: one etcd of its own, a scheduler and the
//! capacity manager (which starts the invokers), each a process of this binary reading one config
//! file written here from the scenario. Everything it started is stopped by [`Cluster::stop`],
//! the invokers the manager started included (their pid files), and by `Drop` if the replay
//! ends early.

use crate::{io, ReplayArgs, ReplayError};
use invoker_core::sim::scenario::Scenario;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often an invoker publishes its registration (the config's `publish_interval`).
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(500);
/// The least memory an action may declare (the invoker's `limits.memory_min_mb`).
pub const MEMORY_MIN_MB: u32 = 128;
/// The cluster's etcd prefix.
pub const PREFIX: &str = "/replay";
/// The namespace the replay's actions live in, and its key (loopback only).
pub const NAMESPACE: &str = "guest";
pub const GUEST_KEY: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";
/// The scheduler's key to its invokers, and the capacity manager's admin key: this cluster's
/// own, on loopback, for as long as the replay runs.
const CONTROLLER_KEY: &str =
    "7a1e3c52-2d0b-4b8e-9a51-0c2f7e0d9b11:replayControllerKeyOnLoopbackOnlyNeverUsedOutsideOfOneReplayRun0";
pub const ADMIN_KEY: &str =
    "5b0f6a2e-8c41-4f3a-b7d2-6e9c1a4d3f20:replayAdminKeyOnLoopbackOnlyNeverUsedOutsideOfOneReplayRunxxxxxx";
/// How long a process has to answer once started.
const START_BOUND: Duration = Duration::from_secs(60);

pub struct Cluster {
    pub work: PathBuf,
    keep: bool,
    /// Owned when the replay made it (removed at the end unless kept).
    _temp: Option<tempfile::TempDir>,
    pub etcd_url: String,
    pub scheduler: String,
    pub capacity: String,
    children: Vec<(&'static str, Child)>,
}

fn free_port() -> Result<u16, ReplayError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("a free port"))?;
    Ok(listener.local_addr().map_err(io("a free port"))?.port())
}

/// A TOML string.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// A section of the scenario file as TOML, whatever its keys (the cluster reads it as the
/// invoker's own config does, and refuses what it does not know).
fn section(file: &toml::Table, path: &[&str]) -> String {
    let mut at = Some(file);
    for key in path {
        at = at.and_then(|t| t.get(*key)).and_then(toml::Value::as_table);
    }
    at.map(|t| toml::to_string(t).unwrap_or_default()).unwrap_or_default()
}

/// The config every process of the cluster reads: the scenario's `[pool]` and `[fleet.group]`
/// (as the group `default`, on the local control plane), its tick and `wait_for_room`; limits
/// wide enough for the trace's calls.
fn config(scenario_file: &toml::Table, scenario: &Scenario, etcd: &str) -> String {
    let fleet = scenario.fleet.as_ref();
    let tick = fleet.map_or(Duration::from_secs(1), |f| f.tick);
    let wait_for_room = fleet.map_or(Duration::from_secs(30), |f| f.wait_for_room);
    let invoker_mb = fleet.map_or(1024, |f| f.group.invoker_memory_mb);
    let mut group: toml::Table = scenario_file
        .get("fleet")
        .and_then(|f| f.get("group"))
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default();
    group.insert("control_plane".into(), toml::Value::String("local".into()));
    let group = toml::to_string(&group).unwrap_or_default();
    let pool = section(scenario_file, &["pool"]);
    // Not root: the invokers cannot isolate their containers (the process factory says so at
    // start); the replay measures the same paths without it.
    let factory = if nix::unistd::geteuid().is_root() {
        String::new()
    } else {
        eprintln!("replay: not root, so the invokers run their actions unprivileged = false (no isolation)");
        "[factory.process]\nunprivileged = false\n".to_string()
    };
    format!(
        "listen = \"127.0.0.1:0\"\n\n\
         [cluster]\netcd = [{etcd}]\nprefix = {prefix}\nlease_ttl = \"10s\"\npublish_interval = \"{publish}ms\"\n\
         controller_key = {controller}\n\n\
         [admin]\nkey = {admin}\ncontroller_keys = [{controller}]\n\n\
         [namespaces]\n{NAMESPACE} = {guest}\n\n\
         [limits]\nmemory_min_mb = {MEMORY_MIN_MB}\nmemory_max_mb = {invoker_mb}\nnamespace_concurrent = 100000\n\
         timeout_max_ms = 300000\n\n\
         [scheduler]\nid = \"replay0\"\nwait_for_room = \"{wait}ms\"\nmax_in_flight = 100000\n\n\
         [capacity]\ntick = \"{tick}ms\"\n\n[capacity.groups.default]\n{group}\n\
         [pool]\n{pool}\n{factory}",
        etcd = quoted(etcd),
        prefix = quoted(PREFIX),
        publish = PUBLISH_INTERVAL.as_millis(),
        controller = quoted(CONTROLLER_KEY),
        admin = quoted(ADMIN_KEY),
        guest = quoted(GUEST_KEY),
        wait = wait_for_room.as_millis(),
        tick = tick.as_millis(),
    )
}

impl Cluster {
    /// Starts etcd, then a scheduler and the capacity manager, and waits until each answers.
    pub async fn start(args: &ReplayArgs, scenario: &Scenario) -> Result<Cluster, ReplayError> {
        let (work, temp) = match &args.work_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(io(dir.display().to_string()))?;
                (std::path::absolute(dir).map_err(io(dir.display().to_string()))?, None)
            }
            // Short: the invokers' runtime sockets live below it.
            None => {
                let temp =
                    tempfile::Builder::new().prefix("irp-").tempdir_in("/tmp").map_err(io("a work directory"))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let text = std::fs::read_to_string(&args.scenario).map_err(io(args.scenario.display().to_string()))?;
        let file: toml::Table =
            toml::from_str(&text).map_err(|e| ReplayError::Cluster(format!("{}: {e}", args.scenario.display())))?;
        let mut cluster = Cluster {
            work: work.clone(),
            keep: args.keep,
            // Kept: the directory outlives the replay (its path is printed at the end).
            _temp: match (temp, args.keep) {
                (Some(temp), true) => {
                    let _kept = temp.keep();
                    None
                }
                (temp, _) => temp,
            },
            etcd_url: String::new(),
            scheduler: String::new(),
            capacity: String::new(),
            children: Vec::new(),
        };
        let (client, peer) = (free_port()?, free_port()?);
        cluster.etcd_url = format!("http://127.0.0.1:{client}");
        let etcd = Command::new(&args.etcd_binary)
            .args(["--name", "replay", "--data-dir"])
            .arg(work.join("etcd"))
            .args(["--listen-client-urls", &cluster.etcd_url, "--advertise-client-urls", &cluster.etcd_url])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("replay=http://127.0.0.1:{peer}"), "--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log(&work, "etcd")?)
            .stderr(log(&work, "etcd")?)
            .spawn()
            .map_err(io(format!("{} (scripts/etcd.sh installs one)", args.etcd_binary.display())))?;
        cluster.children.push(("etcd", etcd));
        cluster.wait_answering(&format!("{}/health", cluster.etcd_url), None).await?;
        let config_path = work.join("cluster.toml");
        std::fs::write(&config_path, config(&file, scenario, &cluster.etcd_url))
            .map_err(io(config_path.display().to_string()))?;
        let exe = std::env::current_exe().map_err(io("this executable"))?;
        for (name, command) in [("scheduler", "scheduler"), ("capacity", "capacity")] {
            let port = free_port()?;
            let child = Command::new(&exe)
                .args([command, "--config"])
                .arg(&config_path)
                .args(["--etcd", &cluster.etcd_url, "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
                .arg(work.join(name))
                .stdin(Stdio::null())
                .stdout(log(&work, name)?)
                .stderr(log(&work, name)?)
                .spawn()
                .map_err(io(exe.display().to_string()))?;
            cluster.children.push((name, child));
            let url = format!("http://127.0.0.1:{port}");
            match name {
                "scheduler" => cluster.scheduler = url,
                _ => cluster.capacity = url,
            }
        }
        cluster.wait_answering(&format!("{}/ping", cluster.scheduler), None).await?;
        cluster.wait_answering(&format!("{}/v1/capacity", cluster.capacity), Some(ADMIN_KEY)).await?;
        Ok(cluster)
    }

    /// Waits until `url` answers 200, or a process of the cluster exited (its log says why).
    async fn wait_answering(&mut self, url: &str, key: Option<&str>) -> Result<(), ReplayError> {
        let deadline = Instant::now() + START_BOUND;
        loop {
            if let Ok((200, _)) = crate::client::get(url, key).await {
                return Ok(());
            }
            for (name, child) in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(ReplayError::Cluster(format!(
                        "{name} exited ({status}); see {}",
                        self.work.join(format!("{name}.log")).display()
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(ReplayError::Cluster(format!("{url} did not answer within {START_BOUND:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The invokers the capacity manager started, by their pid files.
    fn invokers(&self) -> Vec<Pid> {
        let dir = self.work.join("capacity").join("invokers");
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|text| text.split_whitespace().next()?.parse::<i32>().ok())
            .map(Pid::from_raw)
            .collect()
    }

    /// Stops the manager first (so that it starts nothing more), then its invokers, the
    /// scheduler and etcd: each asked to stop (SIGTERM), then killed past a bound.
    pub async fn stop(mut self) {
        self.stop_now(Duration::from_secs(20)).await;
    }

    async fn stop_now(&mut self, grace: Duration) {
        let take = |children: &mut Vec<(&'static str, Child)>, name: &str| {
            children.iter().position(|(n, _)| *n == name).map(|i| children.remove(i).1)
        };
        if let Some(manager) = take(&mut self.children, "capacity") {
            stop_child(manager, grace).await;
        }
        let invokers = self.invokers();
        for pid in &invokers {
            let _ = kill(*pid, Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while invokers.iter().any(|pid| kill(*pid, None).is_ok()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for pid in &invokers {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        for name in ["scheduler", "etcd"] {
            if let Some(child) = take(&mut self.children, name) {
                stop_child(child, grace).await;
            }
        }
        if self.keep {
            eprintln!("replay: the cluster's files are kept in {}", self.work.display());
        }
    }
}

impl Drop for Cluster {
    /// A replay that ended early (an error, a panic) leaves nothing running.
    fn drop(&mut self) {
        for pid in self.invokers() {
            let _ = kill(pid, Signal::SIGKILL);
        }
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn stop_child(mut child: Child, grace: Duration) {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn log(work: &Path, name: &str) -> Result<std::fs::File, ReplayError> {
    let path = work.join(format!("{name}.log"));
    std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io(path.display().to_string()))
}
