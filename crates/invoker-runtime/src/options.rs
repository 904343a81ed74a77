//! How the runtime is started: its command line.

use super::sched::SchedPolicy;
use std::path::PathBuf;
use std::time::Duration;

/// The largest `/init` or `/run` body accepted: parameters up to the largest payload limit an
/// invoker may be set to (256 MiB, `[limits] payload_max_bytes`) with the run's context, and
/// code up to OpenWhisk's 48 MB, base64-encoded. The invoker holds each call to its own limit.
pub(super) const MAX_BODY: usize = 257 * 1024 * 1024;

/// How often the runtime checks that the invoker that started it is still alive.
pub(super) const PARENT_CHECK: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Launcher {
    Python,
    Nodejs,
    Native,
}

/// Where the runtime listens: `127.0.0.1:PORT`, or `unix:/path/to.sock`.
#[derive(Clone, Debug)]
pub enum Listen {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Ok(Listen::Unix(path.into())),
            Some(_) => Err("unix: needs a socket path".into()),
            None => s.parse().map(Listen::Tcp).map_err(|e| format!("'{s}' is not ADDR:PORT or unix:PATH: {e}")),
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// `invoker action-runtime`'s options (also run in place by the sandbox, see `sandbox.rs`).
#[derive(clap::Args, Debug)]
pub struct RuntimeOptions {
    /// ADDR:PORT or unix:PATH.
    #[arg(long)]
    pub listen: Listen,
    #[arg(long, value_enum)]
    pub launcher: Launcher,
    /// Where the action's code is written; a fresh temporary directory when not given.
    #[arg(long, env = "INVOKER_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// The invoker's pid: when it dies, the runtime and its action exit too.
    #[arg(long, env = "INVOKER_PARENT_PID")]
    pub parent_pid: Option<i32>,
    /// How the runtime and its action are scheduled: `batch` never preempts the invoker when a
    /// run wakes it.
    #[arg(long, value_enum, env = "INVOKER_ACTION_SCHED", default_value_t)]
    pub sched: SchedPolicy,
    /// A unix socket where the zygote's launcher for this container connects (python): the
    /// action process is then forked from a warm interpreter instead of started here.
    #[arg(long, env = "INVOKER_ADOPT")]
    pub adopt: Option<PathBuf>,
    /// A directory holding the named pipes `stdout` and `stderr`, which the invoker made and
    /// reads: the runtime's and its action's output goes there rather than to this process's
    /// own streams (a container's, which an engine would carry through its log path).
    #[arg(long)]
    pub output: Option<PathBuf>,
}
