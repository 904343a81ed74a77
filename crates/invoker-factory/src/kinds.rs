//! What `[kinds]` says of each action kind's runtime: the command that serves it, its network,
//! and the protocol it speaks. Here, beside the factories' other settings, because every factory
//! starts a kind's runtime and the proxy speaks its protocol; the checks stay with the rest of
//! the config's, in the invoker (`config::kinds`).

use crate::settings::Network;
use invoker_wire::runtime::{FDK_PYTHON_COMMAND, OPENWHISK_PORT};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn openwhisk_port() -> u16 {
    OPENWHISK_PORT
}

/// A host path a kind's containers see, read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindPath {
    /// At the same path: `"/opt/openwhisk"`.
    Same(PathBuf),
    /// At another path: `{ host = "/usr/bin/python3", at = "/usr/local/bin/python" }`
    /// (OpenWhisk's python `compile` runs `/usr/local/bin/python`, the image's path).
    At(PathAt),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathAt {
    pub host: PathBuf,
    pub at: PathBuf,
}

impl<'de> Deserialize<'de> for KindPath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = KindPath;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a path, or { host = \"...\", at = \"...\" }")
            }
            fn visit_str<E: serde::de::Error>(self, path: &str) -> Result<KindPath, E> {
                Ok(KindPath::Same(path.into()))
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<KindPath, M::Error> {
                let (mut host, mut at) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "host" => host = Some(map.next_value::<PathBuf>()?),
                        "at" => at = Some(map.next_value::<PathBuf>()?),
                        other => return Err(serde::de::Error::unknown_field(other, &["host", "at"])),
                    }
                }
                let host = host.ok_or_else(|| serde::de::Error::missing_field("host"))?;
                let at = at.ok_or_else(|| serde::de::Error::missing_field("at"))?;
                Ok(KindPath::At(PathAt { host, at }))
            }
        }
        deserializer.deserialize_any(Entry)
    }
}

impl KindPath {
    pub fn host(&self) -> &Path {
        match self {
            KindPath::Same(path) => path,
            KindPath::At(PathAt { host, .. }) => host,
        }
    }

    /// Where the container sees it.
    pub fn at(&self) -> &Path {
        match self {
            KindPath::Same(path) => path,
            KindPath::At(PathAt { at, .. }) => at,
        }
    }
}

/// The `--launcher` a runtime command passes, if any (our runtime's, whichever factory runs
/// it).
pub fn launcher_in(command: &[String]) -> Option<&str> {
    command.windows(2).find(|w| w[0] == "--launcher").map(|w| w[1].as_str())
}

/// The protocol a kind's runtime speaks; one file per protocol in `proxy::protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeProtocol {
    /// OpenWhisk's action runtime protocol: `POST /init` once, `POST /run` per activation.
    #[default]
    OpenWhisk,
    /// Fn's http-stream contract: the function serves `POST /call` on `lsnr.sock` in a socket
    /// directory of its own, one call at a time, with its code already in the container.
    Fn,
}

/// What the rest of the invoker asks of a protocol (the proxy, the pool, the API's checks):
/// the answers differ between protocols, and nothing outside `proxy::protocol` assumes one.
impl RuntimeProtocol {
    /// Whether a container is given its action's code (`/init`) before its first run; if not,
    /// it is ready to run once the factory has made it.
    pub fn initialises(self) -> bool {
        match self {
            RuntimeProtocol::OpenWhisk => true,
            RuntimeProtocol::Fn => false,
        }
    }

    /// Whether the runtime marks the end of each run in its logs (OpenWhisk's sentinel lines),
    /// which the proxy waits for (bounded) before it writes the run's record; if not, the
    /// record takes the lines there are when the run answers.
    pub fn marks_log_ends(self) -> bool {
        match self {
            RuntimeProtocol::OpenWhisk => true,
            RuntimeProtocol::Fn => false,
        }
    }

    /// The most runs one container takes at once whatever its kind says; `None`: its kind
    /// decides (`max_concurrency`).
    pub fn max_runs_at_once(self) -> Option<u32> {
        match self {
            RuntimeProtocol::OpenWhisk => None,
            RuntimeProtocol::Fn => Some(1),
        }
    }

    /// Whether the invoker tells the runtime where to listen (`{listen}` in the command); Fn's
    /// functions listen where their environment says (`FN_LISTENER`).
    pub fn takes_listen_address(self) -> bool {
        match self {
            RuntimeProtocol::OpenWhisk => true,
            RuntimeProtocol::Fn => false,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KindConfig {
    /// The runtime's command line (an `fn` kind may have none: it runs only where an image
    /// holds the function). `{invoker}` is this executable, `{listen}` the address the
    /// runtime must serve the OpenWhisk runtime protocol on (with `network = "isolated"`,
    /// `0.0.0.0:<port>`; a runtime that listens on its own port need not take it).
    #[serde(default)]
    pub command: Vec<String>,
    /// `none`: a network namespace of the container's own, with only loopback, the runtime on a
    /// unix socket. `isolated`: the same namespace, the runtime on TCP `port` in it. `host`:
    /// the host's network, an explicit opt-in.
    #[serde(default)]
    pub network: Network,
    /// The port the runtime listens on in its own namespace (`network = "isolated"`).
    #[serde(default = "openwhisk_port")]
    pub port: u16,
    /// The runtime's environment besides the invoker's few variables; `{port}` and
    /// `{work_dir}` (the container's own writable directory, also its working directory) are
    /// substituted in the values.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Host paths the runtime needs besides the system's directories (its installation),
    /// visible read-only inside the container: at the same path, or `{ host, at }` at another.
    #[serde(default)]
    pub paths: Vec<KindPath>,
    /// What the runtime speaks (`openwhisk`, `fn`), whichever factory runs it.
    #[serde(default)]
    pub protocol: RuntimeProtocol,
    /// For a kind whose protocol gives no code at start (`fn`): the file in the container's
    /// work directory the action's code is written to before the command runs (`func.py`);
    /// unset, the command (its image) holds the function.
    #[serde(default)]
    pub code_file: Option<String>,
    /// How long a container of the kind may take to become ready before its creation fails.
    /// Unset: 5 s for an `fn` kind (Fn's `FN_HOT_START_TIMEOUT_MSECS`), the factory's
    /// `ready_timeout` for another.
    #[serde(default, with = "humantime_serde")]
    pub start_timeout: Option<std::time::Duration>,
    /// The most runs one container of the kind takes at once (an action's
    /// `limits.concurrency` above it is refused). Unset: `limits.concurrency_max` for the
    /// project's own runtime, 1 for any other (OpenWhisk's actionloop proxy loses answers to
    /// overlapping runs).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Whether the process factory forks the kind's action processes from a warm python
    /// zygote instead of starting an interpreter in each container. Unset: on for the project's
    /// own runtime with the python launcher; only such a kind may set it.
    #[serde(default)]
    pub zygote: Option<bool>,
    /// Whether the process factory starts the kind's node from a V8 startup snapshot of the
    /// launcher (built at the invoker's start) instead of running the launcher's script. Off
    /// unless set: on node 20 it starts a few milliseconds slower (see BENCHMARKS.md); only a
    /// kind running the project's own runtime with the nodejs launcher may set it.
    #[serde(default)]
    pub snapshot: bool,
}

impl KindConfig {
    /// Whether the kind runs the project's own runtime (`invoker action-runtime`).
    pub fn is_own_runtime(&self) -> bool {
        self.command.first().is_some_and(|c| c == "{invoker}")
            && self.command.get(1).is_some_and(|c| c == "action-runtime")
    }

    /// The `--launcher` its command passes, if any.
    pub fn launcher(&self) -> Option<&str> {
        launcher_in(&self.command)
    }

    /// Whether the kind runs our runtime with the python launcher (what the zygote serves).
    pub fn is_own_python(&self) -> bool {
        self.is_own_runtime() && self.launcher() == Some("python")
    }

    /// Whether the kind runs our runtime with the nodejs launcher (what a snapshot holds).
    pub fn is_own_nodejs(&self) -> bool {
        self.is_own_runtime() && self.launcher() == Some("nodejs")
    }

    /// Whether the process factory forks the kind's action processes from the python zygote.
    pub fn uses_zygote(&self) -> bool {
        self.zygote.unwrap_or(true) && self.is_own_python()
    }

    /// The most runs at once one container of the kind takes, `concurrency_max` the config's.
    pub fn max_concurrency(&self, concurrency_max: u32) -> u32 {
        let kind = runs_at_once(self.max_concurrency, self.is_own_runtime(), concurrency_max);
        self.protocol.max_runs_at_once().map_or(kind, |protocol| kind.min(protocol))
    }

    /// How long a container may take to become ready; `factory` is the factory's own bound.
    pub fn start_timeout_or(&self, factory: std::time::Duration) -> std::time::Duration {
        match (self.start_timeout, self.protocol) {
            (Some(set), _) => set,
            (None, RuntimeProtocol::Fn) => std::time::Duration::from_secs(5),
            (None, RuntimeProtocol::OpenWhisk) => factory,
        }
    }

    /// The command line with `{invoker}`, `{listen}` and `{main}` (the action's handler, for
    /// a kind that takes its code at start) filled in.
    pub fn command_for(&self, invoker: &Path, listen: &str, main: &str) -> Vec<String> {
        let invoker = invoker.to_string_lossy();
        let fill = |a: &String| a.replace("{invoker}", &invoker).replace("{listen}", listen).replace("{main}", main);
        self.command.iter().map(fill).collect()
    }

    /// The kind's own environment with `{port}` and `{work_dir}` filled in.
    pub fn env_for(&self, work_dir: &Path) -> Vec<(String, String)> {
        let (port, work_dir) = (self.port.to_string(), work_dir.to_string_lossy());
        self.env.iter().map(|(k, v)| (k.clone(), v.replace("{port}", &port).replace("{work_dir}", &work_dir))).collect()
    }
}

/// The most runs one container takes at once: what the config sets (within
/// `limits.concurrency_max`), else all of it for the project's own runtime and 1 for another's
/// (OpenWhisk's actionloop proxy loses answers to overlapping runs).
pub fn runs_at_once(set: Option<u32>, own_runtime: bool, concurrency_max: u32) -> u32 {
    match set {
        Some(n) => n.min(concurrency_max),
        None if own_runtime => concurrency_max,
        None => 1,
    }
}

fn builtin_runtime(launcher: &str) -> KindConfig {
    let command = ["{invoker}", "action-runtime", "--listen", "{listen}", "--launcher", launcher];
    KindConfig {
        command: command.iter().map(|s| s.to_string()).collect(),
        network: Network::None,
        port: OPENWHISK_PORT,
        env: BTreeMap::new(),
        paths: Vec::new(),
        protocol: RuntimeProtocol::OpenWhisk,
        code_file: None,
        start_timeout: None,
        max_concurrency: None,
        zygote: None,
        snapshot: false,
    }
}

/// Where `scripts/fdk.sh` installs Fn's function development kits from PyPI and npm, which
/// the built-in `fn:` kinds show read-only in their containers.
pub const FDK_DIR: &str = "/usr/local/lib/invoker-fdk";

/// A built-in Fn kind: the action's code in `code_file`, run by the system's interpreter
/// with the FDK on its module path.
fn fn_kind(command: &[&str], code_file: &str, env: &[(&str, String)], fdk: &str) -> KindConfig {
    KindConfig {
        command: command.iter().map(|s| s.to_string()).collect(),
        network: Network::None,
        port: OPENWHISK_PORT,
        env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        paths: vec![KindPath::Same(Path::new(FDK_DIR).join(fdk))],
        protocol: RuntimeProtocol::Fn,
        code_file: Some(code_file.into()),
        start_timeout: None,
        max_concurrency: None,
        zygote: None,
        snapshot: false,
    }
}

/// The kind of an Fn function whose `image` is an image of its own (not one of the `fn:` kinds):
/// the Docker and Kubernetes factories run that image's entry point; the process factory runs
/// no images.
pub const FN_IMAGE_KIND: &str = "fn:image";

/// The project's own runtime serves every built-in OpenWhisk kind (the launcher picks the
/// language); Fn's FDKs serve the `fn:` kinds.
pub fn default_kinds() -> BTreeMap<String, KindConfig> {
    // A function made from an image of its own: the image's entry point is the function.
    let fn_image = KindConfig { code_file: None, paths: Vec::new(), ..fn_kind(&[], "-", &[], "") };
    let python = fn_kind(
        &FDK_PYTHON_COMMAND,
        "func.py",
        &[("PYTHONPATH", format!("{FDK_DIR}/python")), ("PYTHONUNBUFFERED", "1".into())],
        "python",
    );
    let node = fn_kind(
        &["/usr/bin/node", "func.js"],
        "func.js",
        &[("NODE_PATH", format!("{FDK_DIR}/node/node_modules"))],
        "node",
    );
    BTreeMap::from([
        ("python:3".to_string(), builtin_runtime("python")),
        ("nodejs:20".to_string(), builtin_runtime("nodejs")),
        ("native".to_string(), builtin_runtime("native")),
        ("fn:python".to_string(), python),
        ("fn:node".to_string(), node),
        (FN_IMAGE_KIND.to_string(), fn_image),
    ])
}
