//! The node launcher's V8 startup snapshot, for kinds that start from one (`[kinds] snapshot`).
//!
//! Node cannot fork (V8's and libuv's threads do not survive it), so it has no zygote. What it
//! has is `node --build-snapshot`: the launcher runs once, at the invoker's start, up to the
//! point where it would load an action, and its heap is written to a blob; each container's node
//! then starts with `--snapshot-blob` and deserializes that heap instead of running the
//! launcher's top level. The blob holds the launcher and node's modules, nothing of any tenant;
//! containers see it read-only. It is built again at every start, for the node installed then.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LAUNCHER: &str = invoker_runtime::launchers::NODEJS;

/// How long `node --build-snapshot` may take (a fraction of a second here).
const BUILD_DEADLINE: Duration = Duration::from_secs(60);

/// Builds the blob in `dir` (created 0755: containers' uids read the blob) with `node`; returns
/// its path.
pub fn build(node: &Path, dir: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt as _;
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(|e| io(dir, e))?;
    let (script, blob) = (dir.join("launcher.js"), dir.join("nodejs-launcher.blob"));
    std::fs::write(&script, LAUNCHER).map_err(|e| io(&script, e))?;
    let _ = std::fs::remove_file(&blob);
    let mut child = Command::new(node)
        .arg("--snapshot-blob")
        .arg(&blob)
        .arg("--build-snapshot")
        .arg(&script)
        .current_dir(dir)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io(node, e))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| io(node, e))? {
            break status;
        }
        if started.elapsed() > BUILD_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("node --build-snapshot took more than {BUILD_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if !status.success() {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            use std::io::Read as _;
            let _ = pipe.by_ref().take(4096).read_to_string(&mut stderr);
        }
        return Err(format!("node --build-snapshot exited with {status}: {}", stderr.trim()));
    }
    std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o444)).map_err(|e| io(&blob, e))?;
    Ok(blob)
}
