//! The python zygote, from the invoker's side: a python interpreter started with the process
//! factory that has imported the launcher, and forks one into each new python container
//! instead of a new interpreter starting there (SOCK, USENIX ATC 2018). What the child does
//! before it runs anything of an action is in `invoker-runtime`'s `launchers/zygote.py`.
//!
//! The container is made as any other (its directory, cgroups, uid; the sandbox's namespaces
//! and root; our runtime serving `/init` and `/run` on its socket); only its action process
//! comes from the zygote rather than from an exec in the runtime. The runtime waits for it on
//! a unix socket in the container's directory (`INVOKER_ADOPT`); when the zygote cannot fork
//! one, the invoker connects there itself (as root, which the runtime tells apart) and the
//! runtime starts the launcher as it always did.
//!
//! The zygote runs as root in the invoker's namespaces and cgroup (it must join the
//! container's), in a process group of its own, recorded as `zygote.pid` so that a restart
//! removes an earlier run's. It exits when its stdin (the invoker's pipe) closes. A zygote that
//! died is started again at the next fork; the containers it forked before keep running (they
//! are not its children in any way that matters: the kernel reaps them).

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const ZYGOTE: &str = invoker_runtime::launchers::ZYGOTE;
const LAUNCHER: &str = invoker_runtime::launchers::PYTHON;

/// A fork answers in about a millisecond; a zygote that takes this long is broken.
const FORK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the child needs to become the container's launcher.
#[derive(Serialize)]
pub struct ForkRequest<'a> {
    /// The container's runtime: its namespaces, process group, stdout and stderr.
    pub pid: u32,
    pub cgroups: &'a [PathBuf],
    pub uid: u32,
    pub work: &'a Path,
    /// Where the runtime waits for it: the child enters the container once it exists (the
    /// sandbox has then finished), within `wait_ms`.
    pub socket: &'a Path,
    pub wait_ms: u64,
    /// The container's bound on open files, soft and hard (see `sandbox::CONTAINER_OPEN_FILES`).
    pub open_files: u64,
    pub env: BTreeMap<&'a str, &'a str>,
}

pub struct Zygote {
    python: PathBuf,
    dir: PathBuf,
    env: Vec<(String, String)>,
    running: tokio::sync::Mutex<Option<Running>>,
}

/// Why a fork from the zygote gave no launcher (the runtime then starts its own).
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error("the fork request could not be encoded: {0}")]
    Encode(serde_json::Error),
    #[error("starting the zygote: {0}")]
    Start(std::io::Error),
    /// The zygote's own words (its fork or its set-up in the container failed).
    #[error("the zygote could not fork: {0}")]
    Refused(String),
    #[error("the zygote answered without a pid")]
    NoPid,
    #[error("the zygote failed: {0}")]
    Talk(std::io::Error),
    #[error("the zygote failed: its answer is not JSON: {0}")]
    Answer(serde_json::Error),
    #[error("the zygote failed: it exited")]
    Exited,
    #[error("the zygote failed: no answer within {0:?}")]
    Timeout(Duration),
}

struct Running {
    child: Child,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
}

#[derive(serde::Deserialize)]
struct Answer {
    pid: Option<u32>,
    error: Option<String>,
}

impl Zygote {
    /// Writes the zygote's files into `dir` (root's, 0700) and starts it.
    pub fn start(python: PathBuf, dir: PathBuf, env: Vec<(String, String)>) -> std::io::Result<Zygote> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        // As an earlier run left them, most often: then nothing is written (a full disk).
        for (name, text) in [("zygote.py", ZYGOTE), ("launcher.py", LAUNCHER)] {
            let path = dir.join(name);
            if std::fs::read(&path).ok().as_deref() != Some(text.as_bytes()) {
                std::fs::write(&path, text)?;
            }
        }
        let zygote = Zygote { python, dir, env, running: tokio::sync::Mutex::new(None) };
        let running = zygote.spawn()?;
        *zygote.running.try_lock().expect("not shared yet") = Some(running);
        Ok(zygote)
    }

    /// Its record beside the containers' (`zygote.pid`), which a restart reads.
    fn pid_file(&self) -> PathBuf {
        self.dir.with_file_name("zygote.pid")
    }

    fn spawn(&self) -> std::io::Result<Running> {
        let mut child = Command::new(&self.python)
            .arg("-u")
            .arg(self.dir.join("zygote.py"))
            .current_dir(&self.dir)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let requests = child.stdin.take().ok_or_else(|| std::io::Error::other("no stdin"))?;
        let answers = BufReader::new(child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?);
        if let Some(pid) = child.id() {
            std::fs::write(self.pid_file(), format!("{pid}\n"))?;
        }
        Ok(Running { child, requests, answers })
    }

    /// Forks a launcher into the container `request` describes; returns its pid. A zygote
    /// that is gone or does not answer is started again, once per request.
    pub async fn fork(&self, request: &ForkRequest<'_>) -> Result<u32, ZygoteError> {
        let mut line = serde_json::to_vec(request).map_err(ZygoteError::Encode)?;
        line.push(b'\n');
        let mut running = self.running.lock().await;
        let mut failure = ZygoteError::Exited;
        for _ in 0..2 {
            if running.as_mut().is_none_or(|r| !matches!(r.child.try_wait(), Ok(None))) {
                if running.is_some() {
                    tracing::warn!("the python zygote exited; starting it again");
                }
                *running = Some(self.spawn().map_err(ZygoteError::Start)?);
            }
            let Some(process) = running.as_mut() else { continue };
            match tokio::time::timeout(FORK_TIMEOUT, process.ask(&line)).await {
                Ok(Ok(Answer { pid: Some(pid), .. })) => return Ok(pid),
                Ok(Ok(Answer { error: Some(error), .. })) => return Err(ZygoteError::Refused(error)),
                Ok(Ok(Answer { error: None, .. })) => return Err(ZygoteError::NoPid),
                Ok(Err(e)) => failure = e,
                Err(_) => failure = ZygoteError::Timeout(FORK_TIMEOUT),
            }
            // Broken: killed on drop, started again.
            *running = None;
        }
        Err(failure)
    }

    /// Stops the zygote (shutdown: nothing is forked any more) and forgets its record.
    pub async fn stop(&self) {
        if let Some(mut running) = self.running.lock().await.take() {
            let _ = running.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), running.child.wait()).await;
        }
        let _ = std::fs::remove_file(self.pid_file());
    }
}

impl Running {
    async fn ask(&mut self, line: &[u8]) -> Result<Answer, ZygoteError> {
        self.requests.write_all(line).await.map_err(ZygoteError::Talk)?;
        self.requests.flush().await.map_err(ZygoteError::Talk)?;
        let mut answer = String::new();
        if self.answers.read_line(&mut answer).await.map_err(ZygoteError::Talk)? == 0 {
            return Err(ZygoteError::Exited);
        }
        serde_json::from_str(&answer).map_err(ZygoteError::Answer)
    }
}
