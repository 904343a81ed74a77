//! The fake kubelet: runs a bound pod as a local process, after admitting it within its node's
//! allocatable memory, and keeps its status and its log as a kubelet would.

use super::{Kind, Shared};
use k8s_openapi::chrono::{self, DateTime, Utc};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// One line of a pod's output and when it was written.
type LogLine = (DateTime<Utc>, Vec<u8>);

/// A pod's output, line by line with the time each was written (stdout and stderr
/// interleaved, as the kubelet keeps them), and whether it ended.
#[derive(Default)]
pub(super) struct PodLog {
    pub(super) data: Mutex<(Vec<LogLine>, bool)>,
    pub(super) grew: Notify,
}

impl PodLog {
    fn append(&self, line: &[u8]) {
        let mut data = self.data.lock();
        // Strictly increasing, as a kubelet's nanosecond stamps are in practice.
        let now = Utc::now();
        let at = match data.0.last() {
            Some((last, _)) if *last >= now => *last + chrono::Duration::nanoseconds(1),
            _ => now,
        };
        data.0.push((at, line.to_vec()));
        drop(data);
        self.grew.notify_waiters();
    }

    fn end(&self) {
        self.data.lock().1 = true;
        self.grew.notify_waiters();
    }
}

/// Bytes of a memory quantity as the invoker writes them (`256Mi`, `1Gi`, plain bytes).
fn quantity_bytes(q: &str) -> Option<u64> {
    let (number, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = number.parse().ok()?;
    let factor = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    Some(n * factor)
}

/// The memory a pod asks for: its containers' requests (their limits where no request is set).
fn pod_request(pod: &Value) -> u64 {
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    containers
        .iter()
        .map(|c| {
            let r = &c["resources"];
            r["requests"]["memory"].as_str().or(r["limits"]["memory"].as_str()).and_then(quantity_bytes).unwrap_or(0)
        })
        .sum()
}

/// `$(NAME)` replaced by the variable's value, as the kubelet expands a container's command.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = arg.to_string();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    out
}

/// The fake kubelet for one pod: admission, "pull", start, readiness, end.
pub(super) async fn kubelet(shared: Arc<Shared>, key: String) {
    let Some(pod) = shared.get(Kind::Pod, &key) else { return };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
    let request = pod_request(&pod);
    // Admission: within the node's allocatable, counting every pod it admitted before.
    let refused = {
        let mut cluster = shared.cluster.lock();
        let allocatable = cluster
            .objects
            .get(&(Kind::Node, node.clone()))
            .and_then(|n| n["status"]["allocatable"]["memory"].as_str().and_then(quantity_bytes));
        let used: u64 = cluster.admitted.values().filter(|(n, _)| *n == node).map(|(_, b)| b).sum();
        match allocatable {
            Some(total) if used + request <= total => {
                cluster.admitted.insert(key.clone(), (node.clone(), request));
                let peak = cluster.peak.entry(node.clone()).or_default();
                *peak = (*peak).max(used + request);
                None
            }
            Some(total) => {
                cluster.refused += 1;
                Some(format!(
                    "Pod Node didn't have enough resource: memory, requested: {request}, used: {used}, capacity: {total}"
                ))
            }
            None => Some(format!("node \"{node}\" not found")),
        }
    };
    if let Some(message) = refused {
        shared.update_pod(&key, &uid, |p| {
            p["status"] = json!({"phase": "Failed", "reason": "OutOfmemory", "message": message});
        });
        return;
    }
    let container = pod["spec"]["containers"][0].clone();
    let image = container["image"].as_str().unwrap_or_default().to_string();
    if !shared.cluster.lock().images.contains(&image) {
        shared.update_pod(&key, &uid, |p| {
            p["status"]["containerStatuses"] = json!([{"name": container["name"], "ready": false, "restartCount": 0,
                "image": image, "imageID": "",
                "state": {"waiting": {"reason": "ErrImagePull", "message": format!("pull access denied for {image}")}}}]);
        });
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut env = BTreeMap::new();
    for var in container["env"].as_array().cloned().unwrap_or_default() {
        let name = var["name"].as_str().unwrap_or_default().to_string();
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("status.podIP") | Some("status.hostIP") => "127.0.0.1".to_string(),
            Some("metadata.name") => pod["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            Some("metadata.namespace") => pod["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
            _ if name == "PORT" => port.to_string(),
            _ => var["value"].as_str().unwrap_or_default().to_string(),
        };
        env.insert(name, value);
    }
    let argv: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .chain(container["args"].as_array())
        .flatten()
        .filter_map(|a| a.as_str())
        .map(|a| expand(a, &env))
        .collect();
    // The pod's own /tmp (its emptyDir), gone with the pod: the fake has no mount namespace, so
    // the process gets it as TMPDIR.
    let tmp = tempfile::Builder::new().prefix("fake-pod-tmp-").tempdir().unwrap();
    let started = match argv.split_first() {
        Some((program, args)) => tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .envs(&env)
            .env("TMPDIR", tmp.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string()),
        None => Err("the fake kubelet runs only pods with a command".to_string()),
    };
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            shared.cluster.lock().admitted.remove(&key);
            shared.update_pod(&key, &uid, |p| {
                p["status"] = json!({"phase": "Failed", "containerStatuses": [{"name": container["name"], "ready": false,
                    "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": e}}}]});
            });
            return;
        }
    };
    let log = Arc::new(PodLog::default());
    {
        let mut cluster = shared.cluster.lock();
        if !cluster.objects.contains_key(&(Kind::Pod, key.clone())) {
            return; // deleted meanwhile: the child is killed on drop
        }
        cluster.processes.insert(key.clone(), child.id().unwrap_or_default() as i32);
        cluster.logs.insert(key.clone(), log.clone());
    }
    let readers = [
        tokio::spawn(copy_into(child.stdout.take(), log.clone())),
        tokio::spawn(copy_into(child.stderr.take(), log.clone())),
    ];
    let running = |ready: bool| {
        move |p: &mut Value| {
            if let Some(ports) = p["spec"]["containers"][0]["ports"].as_array_mut() {
                if let Some(first) = ports.first_mut() {
                    first["containerPort"] = json!(port);
                }
            }
            if let Some(vars) = p["spec"]["containers"][0]["env"].as_array_mut() {
                for var in vars.iter_mut().filter(|v| v["name"] == "PORT") {
                    var["value"] = json!(port.to_string());
                }
            }
            let name = p["spec"]["containers"][0]["name"].clone();
            p["status"] = json!({"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": name, "ready": ready, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]});
        }
    };
    if !shared.update_pod(&key, &uid, running(false)) {
        return;
    }
    // Readiness: a TCP probe on the port until it answers or the process ends.
    let mut ready = false;
    let status = loop {
        if !ready && tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            ready = true;
            if !shared.update_pod(&key, &uid, running(true)) {
                return;
            }
        }
        let wait = if ready { Duration::from_secs(3600) } else { Duration::from_millis(20) };
        if let Ok(status) = tokio::time::timeout(wait, child.wait()).await {
            break status;
        }
    };
    for reader in readers {
        let _ = reader.await;
    }
    log.end();
    let evicted = {
        let mut cluster = shared.cluster.lock();
        cluster.admitted.remove(&key);
        cluster.processes.remove(&key);
        cluster.evicting.remove(&key)
    };
    let code = status.ok().and_then(|s| s.code()).unwrap_or(137);
    shared.update_pod(&key, &uid, |p| {
        let name = p["spec"]["containers"][0]["name"].clone();
        let terminated =
            json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }}});
        p["status"] = if evicted {
            json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."})
        } else {
            json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": name, "ready": false, "restartCount": 0, "state": terminated}]})
        };
    });
}

/// Whole lines, as a kubelet's log keeps them (each stream line by line, interleaved by arrival,
/// each with the time it came).
async fn copy_into(pipe: Option<impl tokio::io::AsyncRead + Unpin>, log: Arc<PodLog>) {
    use tokio::io::AsyncBufReadExt as _;
    let Some(pipe) = pipe else { return };
    let mut pipe = tokio::io::BufReader::new(pipe);
    let mut line = Vec::new();
    while pipe.read_until(b'\n', &mut line).await.is_ok_and(|n| n > 0) {
        log.append(&line);
        line.clear();
    }
}

/// A pod deleted with a grace period, as a kubelet ends it: SIGTERM to its processes, `grace`
/// to exit, then SIGKILL; the pod object goes once they are gone.
pub(super) async fn terminate(shared: Arc<Shared>, key: String, grace: Duration) {
    let pgid = shared.cluster.lock().processes.get(&key).copied();
    if let Some(pgid) = pgid {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while shared.cluster.lock().processes.contains_key(&key) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (ns, name) = key.split_once('/').expect("namespace/name");
    shared.remove_pod(ns, name);
}
