//! The action process behind a runtime: one long-lived child per container, spoken to with the
//! actionloop protocol (one JSON line in on stdin, one result line out on fd 3), so that a warm
//! `/run` starts no process.

use super::options::Launcher;
use super::string_frame::{self, STRING_VALUE};
use command_fds::{CommandFdExt, FdMapping};
use invoker_wire::runtime::{STREAM_END, STREAM_VALUE};
use serde::de::IgnoredAny;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixListener;
use tokio::process::{Child, ChildStdin, Command};
use tokio_util::either::Either;

/// Longest result line read from fd 3 (the largest payload limit an invoker may be set to, and
/// room for the line's envelope); a longer one is refused rather than buffered. The invoker
/// holds each result to its own limit.
pub(crate) const MAX_RESULT_BYTES: u64 = 257 * 1024 * 1024;

/// What one read of the launcher's results takes at most: a pipe's whole capacity, so that a
/// large result or a stream's values come in a few reads, not one per 8 KiB.
const RESULT_BUFFER: usize = 64 * 1024;

/// How long a launcher may take to load the action and acknowledge it.
const ACK_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a native executable must survive to count as started (as OpenWhisk's Go proxy).
const NATIVE_SURVIVAL: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    Init(String),
    #[error("the action process exited unexpectedly{0}")]
    Exited(String),
    #[error("The action did not return a dictionary or array.")]
    NotAnObject,
    /// The launcher answered a developer error (a line marked `!`): the JSON body to answer.
    #[error("{}", String::from_utf8_lossy(.0))]
    Developer(Vec<u8>),
    #[error("the action's result is larger than {MAX_RESULT_BYTES} bytes")]
    TooLarge,
    #[error("talking to the action process failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What a run's action process answered.
#[derive(Debug)]
pub enum Answered {
    /// One result, a JSON object or array.
    Result(Vec<u8>),
    /// The first line of a stream.
    Stream(StreamLine),
}

/// One line of a stream, as the launcher wrote it, its mark first and without its newline
/// (`invoker_wire::runtime::STREAM_TYPE`).
#[derive(Debug)]
pub enum StreamLine {
    /// `>` then a value's JSON.
    Value(Vec<u8>),
    /// `=` then `{}` or `{"error": ...}`.
    End(Vec<u8>),
}

impl StreamLine {
    /// The line's JSON, without its mark.
    pub fn json(&self) -> &[u8] {
        match self {
            StreamLine::Value(line) | StreamLine::End(line) => &line[1..],
        }
    }
}

fn stream_line(line: Vec<u8>) -> Result<StreamLine, ActionError> {
    match line.first() {
        Some(&STREAM_VALUE) => Ok(StreamLine::Value(line)),
        Some(&STREAM_END) => Ok(StreamLine::End(line)),
        _ => Err(ActionError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a line within a stream is neither a value nor its end",
        ))),
    }
}

/// What `/init` gave: the code and how to start it.
#[derive(Debug)]
pub struct InitSpec {
    pub main: String,
    pub code: Vec<u8>,
    pub binary: bool,
    pub env: BTreeMap<String, String>,
}

pub struct ActionProcess {
    owner: Owner,
    stdin: Either<ChildStdin, OwnedWriteHalf>,
    results: BufReader<Either<tokio::net::unix::pipe::Receiver, OwnedReadHalf>>,
}

/// Whose process it is: a child this runtime spawned, or a launcher the zygote forked into
/// this container (not a child: its end shows as the connection's end).
enum Owner {
    Child(Child),
    Adopted(nix::unistd::Pid),
}

/// The action written into its work directory, ready to start as many processes as runs
/// overlap (an action with a concurrency limit above 1 gets one process per concurrent run).
#[derive(Debug)]
pub struct PreparedAction {
    launcher: Launcher,
    work: PathBuf,
    program: Vec<String>,
    main: String,
    env: BTreeMap<String, String>,
}

impl PreparedAction {
    pub fn prepare(launcher: Launcher, work: &Path, spec: InitSpec) -> Result<Self, ActionError> {
        let program = write_action(launcher, work, &spec)?;
        Ok(PreparedAction { launcher, work: work.to_path_buf(), program, main: spec.main, env: spec.env })
    }
}

/// How long `/init` waits for the zygote's launcher to connect before it starts one itself
/// (it connects within milliseconds; a burst of fifty on two cores within half a second).
const ADOPT_WAIT: Duration = Duration::from_secs(3);

impl ActionProcess {
    /// Starts a process of the action and waits for it to load the action.
    pub async fn start(action: &PreparedAction) -> Result<Self, ActionError> {
        let (launcher, program) = (action.launcher, &action.program);
        let process = Self::spawn(launcher, &action.work, program, &action.env).await?;
        if launcher == Launcher::Native {
            return Ok(process);
        }
        process.acknowledged().await
    }

    /// Starts the python launcher before any action exists, with the runtime: the interpreter's
    /// start and the launcher's imports (most of a python cold start) are paid while the
    /// container waits for its `/init` (a stem's, for as long as it waits to be adopted), which
    /// then only writes the code and hands it the entry point ([`Self::hand`]), as to a
    /// launcher the zygote forked.
    /// The same for node: its start and the launcher's (30 to 50 ms on this machine) before
    /// `/init`.
    pub async fn prestart(launcher: Launcher, work: &Path) -> Result<Self, ActionError> {
        let mut program = match launcher {
            Launcher::Python => write_launcher(work)?,
            Launcher::Nodejs => write_node_launcher(work)?,
            Launcher::Native => return Err(ActionError::Init("a native action has no launcher".into())),
        };
        program.push(WAIT_FOR_ACTION.into());
        Self::spawn(launcher, work, &program, &BTreeMap::new()).await
    }

    async fn spawn(
        launcher: Launcher,
        work: &Path,
        program: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<Self, ActionError> {
        let (writer, results) = tokio::net::unix::pipe::pipe()?;
        let mut cmd = Command::new(&program[0]);
        cmd.args(&program[1..])
            .current_dir(work)
            .envs(env)
            .envs(execution_env(launcher))
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        cmd.fd_mappings(vec![FdMapping { parent_fd: writer.into_blocking_fd()?, child_fd: 3 }])
            .map_err(|e| ActionError::Init(format!("fd 3: {e}")))?;
        let mut child = cmd.spawn().map_err(|e| ActionError::Init(format!("could not start {}: {e}", program[0])))?;
        // The parent's copy of the write end must close, or EOF never comes when the child dies.
        drop(cmd);
        let stdin = child.stdin.take().ok_or_else(|| ActionError::Init("no stdin".into()))?;
        if launcher == Launcher::Native {
            tokio::time::sleep(NATIVE_SURVIVAL).await;
            if let Some(status) = child.try_wait()? {
                return Err(ActionError::Init(format!("the executable exited at once ({status})")));
            }
        }
        Ok(ActionProcess {
            owner: Owner::Child(child),
            stdin: Either::Left(stdin),
            results: BufReader::with_capacity(RESULT_BUFFER, Either::Left(results)),
        })
    }

    /// Whether a launcher started ahead ([`Self::prestart`]) is still there to take an action.
    pub fn waiting(&mut self) -> bool {
        match &mut self.owner {
            Owner::Child(child) => matches!(child.try_wait(), Ok(None)),
            Owner::Adopted(_) => true,
        }
    }

    /// Takes the launcher the zygote forked into this container, which connects to `listener`
    /// as this container's uid, and hands it the action; `None` when none comes (the invoker
    /// connecting instead, as root, says the zygote could not fork one).
    pub async fn adopt(listener: &UnixListener, action: &PreparedAction) -> Result<Option<Self>, ActionError> {
        let Ok(accepted) = tokio::time::timeout(ADOPT_WAIT, listener.accept()).await else { return Ok(None) };
        let (stream, _) = accepted?;
        let peer = stream.peer_cred()?;
        let pid = match peer.pid() {
            Some(pid) if peer.uid() == nix::unistd::getuid().as_raw() && pid > 0 => pid,
            _ => return Ok(None),
        };
        let (read, write) = stream.into_split();
        let process = ActionProcess {
            owner: Owner::Adopted(nix::unistd::Pid::from_raw(pid)),
            stdin: Either::Right(write),
            results: BufReader::with_capacity(RESULT_BUFFER, Either::Right(read)),
        };
        process.hand(action).await.map(Some)
    }

    /// Hands a launcher that waits for its action (forked by the zygote, or started ahead) the
    /// entry point and the action's environment, and waits for it to load the action.
    pub async fn hand(mut self, action: &PreparedAction) -> Result<Self, ActionError> {
        let mut env = action.env.clone();
        env.extend(execution_env(action.launcher));
        let mut first = serde_json::to_vec(&serde_json::json!({ "main": action.main, "env": env }))
            .map_err(|e| ActionError::Init(e.to_string()))?;
        first.push(b'\n');
        if let Err(e) = self.send(&first).await {
            return Err(ActionError::Init(format!("the waiting launcher: {e}")));
        }
        self.acknowledged().await
    }

    /// Waits for the launcher to load the action and say so.
    async fn acknowledged(mut self) -> Result<Self, ActionError> {
        let process = &mut self;
        let ack = tokio::time::timeout(ACK_TIMEOUT, process.read_line()).await;
        let ack = ack.map_err(|_| ActionError::Init(format!("the action did not load within {ACK_TIMEOUT:?}")))?;
        match ack {
            Ok(line) => match serde_json::from_slice::<serde_json::Value>(&line) {
                Ok(v) if v.get("ok") == Some(&serde_json::Value::Bool(true)) => Ok(self),
                Ok(v) => Err(ActionError::Init(
                    v.get("error").and_then(|e| e.as_str()).map(str::to_owned).unwrap_or_else(|| v.to_string()),
                )),
                Err(_) => Err(ActionError::Init("the launcher's acknowledgement is not JSON".into())),
            },
            Err(ActionError::Exited(status)) => {
                Err(ActionError::Init(format!("the action exited while loading{status}")))
            }
            Err(e) => Err(e),
        }
    }

    /// Sends one `/run` body (already one line of JSON, without its newline) and returns the
    /// result line, checked to be a JSON object or array but otherwise passed through untouched,
    /// or the first line of a stream (the action's `main` returned a generator), whose next
    /// lines [`Self::next_in_stream`] reads.
    pub async fn run(&mut self, mut line: Vec<u8>) -> Result<Answered, ActionError> {
        // One write: a line in two would wake the action's reader twice.
        line.push(b'\n');
        if let Err(e) = self.send(&line).await {
            return Err(self.exited().await.unwrap_or(ActionError::Io(e)));
        }
        let mut result = self.read_line().await?;
        match result.first() {
            Some(b'!') => {
                result.remove(0);
                return Err(ActionError::Developer(result));
            }
            Some(&STREAM_VALUE | &STREAM_END) => return stream_line(result).map(Answered::Stream),
            Some(&STRING_VALUE) => return self.string_value(&result).await.map(Answered::Stream),
            _ => {}
        }
        let first = result.iter().find(|b| !b.is_ascii_whitespace());
        if !matches!(first, Some(b'{' | b'[')) || serde_json::from_slice::<IgnoredAny>(&result).is_err() {
            return Err(ActionError::NotAnObject);
        }
        Ok(Answered::Result(result))
    }

    /// The next line of a stream [`Self::run`] began.
    pub async fn next_in_stream(&mut self) -> Result<StreamLine, ActionError> {
        let line = self.read_line().await?;
        if line.first() == Some(&STRING_VALUE) {
            return self.string_value(&line).await;
        }
        stream_line(line)
    }

    /// A streamed string whose frame began with `head` (`string_frame`): its bytes read
    /// straight into the value's line, which is made around them.
    async fn string_value(&mut self, head: &[u8]) -> Result<StreamLine, ActionError> {
        let invalid =
            |e: string_frame::FrameError| ActionError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        let length = string_frame::length(head).map_err(invalid)?;
        if length > MAX_RESULT_BYTES {
            return Err(ActionError::TooLarge);
        }
        let start = string_frame::LINE_HEAD.len();
        // Room for the closing quote and the newline the line is sent with: no copy to add them.
        let mut line = Vec::with_capacity(start + length as usize + 2);
        line.extend_from_slice(string_frame::LINE_HEAD);
        line.resize(start + length as usize, 0);
        if let Err(e) = self.results.read_exact(&mut line[start..]).await {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => self.exited().await.unwrap_or(ActionError::Exited(String::new())),
                _ => ActionError::Io(e),
            });
        }
        string_frame::value_line(line).map(StreamLine::Value).map_err(invalid)
    }

    async fn send(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.stdin.write_all(line).await?;
        self.stdin.flush().await
    }

    async fn read_line(&mut self) -> Result<Vec<u8>, ActionError> {
        let mut line = Vec::new();
        let n = (&mut self.results).take(MAX_RESULT_BYTES + 1).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Err(self.exited().await.unwrap_or(ActionError::Exited(String::new())));
        }
        if line.last() != Some(&b'\n') && n as u64 > MAX_RESULT_BYTES {
            return Err(ActionError::TooLarge);
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        Ok(line)
    }

    async fn exited(&mut self) -> Option<ActionError> {
        match &mut self.owner {
            Owner::Child(child) => {
                let status = tokio::time::timeout(Duration::from_millis(500), child.wait()).await.ok()?.ok()?;
                Some(ActionError::Exited(format!(" ({status})")))
            }
            Owner::Adopted(_) => Some(ActionError::Exited(String::new())),
        }
    }

    pub fn kill(&mut self) {
        match &mut self.owner {
            Owner::Child(child) => {
                let _ = child.start_kill();
            }
            Owner::Adopted(pid) => {
                let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

impl Drop for ActionProcess {
    /// A process given up on (a failed run, a failed `/init`) goes with its handle: a spawned
    /// child through `kill_on_drop`, an adopted one here.
    fn drop(&mut self) {
        if let Owner::Adopted(pid) = self.owner {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// `__OW_EXECUTION_ENV` as OpenWhisk's runtimes give it: the Go proxy (python, native) passes
/// on its own `OW_EXECUTION_ENV` (the image's name) when set; the nodejs runtime gives none.
fn execution_env(launcher: Launcher) -> Option<(String, String)> {
    match launcher {
        Launcher::Nodejs => None,
        Launcher::Python | Launcher::Native => {
            std::env::var("OW_EXECUTION_ENV").ok().map(|env| ("__OW_EXECUTION_ENV".to_string(), env))
        }
    }
}

/// Where the process factory puts the node launcher's startup snapshot for a kind that starts
/// from one (`[kinds] snapshot`).
pub const NODE_SNAPSHOT: &str = "INVOKER_NODE_SNAPSHOT";

/// Writes the code where the launcher expects it and returns the command that runs it.
fn write_action(launcher: Launcher, work: &Path, spec: &InitSpec) -> Result<Vec<String>, ActionError> {
    let io = |what: &str, e: std::io::Error| ActionError::Init(format!("{what}: {e}"));
    std::fs::create_dir_all(work).map_err(|e| io("work directory", e))?;
    let path = |name: &str| -> PathBuf { work.join(name) };
    let text = || String::from_utf8(spec.code.clone()).map_err(|_| ActionError::Init("code is not UTF-8".into()));
    match launcher {
        Launcher::Python => {
            if spec.binary {
                extract_zip(&spec.code, work)?;
                if !path("__main__.py").exists() {
                    return Err(ActionError::Init("the zip file has no __main__.py".into()));
                }
            } else {
                std::fs::write(path("__main__.py"), text()?).map_err(|e| io("__main__.py", e))?;
            }
            let mut program = write_launcher(work)?;
            program.push(spec.main.clone());
            Ok(program)
        }
        Launcher::Nodejs => {
            if spec.binary {
                return Err(ActionError::Init(
                    "binary (zip) actions are not supported for nodejs; send the code as text".into(),
                ));
            }
            std::fs::write(path("index.js"), text()?).map_err(|e| io("index.js", e))?;
            let mut program = write_node_launcher(work)?;
            program.push(spec.main.clone());
            Ok(program)
        }
        Launcher::Native => {
            let exec = path("exec");
            std::fs::write(&exec, &spec.code).map_err(|e| io("exec", e))?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&exec, std::fs::Permissions::from_mode(0o755)).map_err(|e| io("exec", e))?;
            Ok(vec![exec.to_string_lossy().into_owned()])
        }
    }
}

/// A launcher's argument, in place of the entry point, that makes it wait for its entry point
/// and environment on its first line (`launchers/python.py`, `launchers/nodejs.js`), as a
/// forked one does. Not an option (node would take `--…` after a snapshot blob as its own), and
/// no function's name.
const WAIT_FOR_ACTION: &str = "@wait-for-action";

/// Writes the python launcher into `work`; returns the command that runs it, its entry point
/// (or [`WAIT_FOR_ACTION`]) still to add.
fn write_launcher(work: &Path) -> Result<Vec<String>, ActionError> {
    let io = |what: &str, e: std::io::Error| ActionError::Init(format!("{what}: {e}"));
    std::fs::create_dir_all(work).map_err(|e| io("work directory", e))?;
    write_whole(&work.join(".launcher.py"), crate::launchers::PYTHON).map_err(|e| io("launcher", e))?;
    Ok(vec![interpreter("INVOKER_PYTHON", "python3"), "-u".into(), ".launcher.py".into()])
}

/// Writes the node launcher into `work` (none where the kind starts from a V8 startup snapshot
/// of it); returns the command that runs it, its entry point (or [`WAIT_FOR_ACTION`]) still to
/// add.
fn write_node_launcher(work: &Path) -> Result<Vec<String>, ActionError> {
    let io = |what: &str, e: std::io::Error| ActionError::Init(format!("{what}: {e}"));
    let node = interpreter("INVOKER_NODE", "node");
    if let Ok(blob) = std::env::var(NODE_SNAPSHOT) {
        return Ok(vec![node, "--snapshot-blob".into(), blob]);
    }
    std::fs::create_dir_all(work).map_err(|e| io("work directory", e))?;
    write_whole(&work.join(".launcher.js"), crate::launchers::NODEJS).map_err(|e| io("launcher", e))?;
    Ok(vec![node, ".launcher.js".into()])
}

/// Writes `path` whole under another name, then renames it into place: a launcher started
/// with the runtime may still be reading the file when `/init` writes it again, and a file
/// truncated and rewritten under it read as cut short (python: a `SyntaxError` in the
/// launcher, the action "exited while loading"; seen on Kubernetes, where `/init` follows
/// the runtime's start at once). Renamed, the reader keeps the whole file it opened.
fn write_whole(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, contents)?;
    std::fs::rename(&partial, path)
}

/// The interpreter the invoker resolved at start (an absolute path a container's uid can run),
/// or the name on `PATH` when the runtime was started otherwise.
fn interpreter(variable: &str, name: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| name.to_string())
}

/// Extracts a python zip action with python's own zipfile (no zip crate for one rare path).
fn extract_zip(bytes: &[u8], work: &Path) -> Result<(), ActionError> {
    let zip = work.join(".action.zip");
    std::fs::write(&zip, bytes).map_err(|e| ActionError::Init(format!("action.zip: {e}")))?;
    let status = std::process::Command::new(interpreter("INVOKER_PYTHON", "python3"))
        .args(["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])"])
        .arg(&zip)
        .arg(work)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| ActionError::Init(format!("python3: {e}")))?;
    if !status.success() {
        return Err(ActionError::Init("the code is not a valid zip file".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// A launcher that opened its file before `/init` writes it again reads it whole: the
    /// file it opened is never written again (written in place, truncated and then written, a
    /// reader between the two found it cut short), and a new one takes its name.
    #[test]
    fn a_launcher_file_written_again_stays_whole_for_whoever_opened_it() {
        use std::os::unix::fs::MetadataExt as _;
        let work = tempfile::tempdir().unwrap();
        let path = work.path().join(".launcher.py");
        write_launcher(work.path()).unwrap();
        let mut reading = std::fs::File::open(&path).unwrap();
        write_launcher(work.path()).unwrap();
        let (opened, now) = (reading.metadata().unwrap(), std::fs::metadata(&path).unwrap());
        assert_ne!(opened.ino(), now.ino(), "the opened file was written again in place");
        let mut read = String::new();
        reading.read_to_string(&mut read).unwrap();
        assert_eq!(read, crate::launchers::PYTHON, "the opened file, whole");
        let names: Vec<String> = std::fs::read_dir(work.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [".launcher.py"], "nothing partial left");
    }
}
