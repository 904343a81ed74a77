//! The fake kubelet: runs a bound pod as a local process, after admitting it within its node's
//! allocatable memory, and keeps its status and its log as a kubelet would.

use super::{kill_group, Kind, Shared};
use invoker_kubernetes::k8s_openapi::chrono::{self, DateTime, Utc};
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
pub(super) fn quantity_bytes(q: &str) -> Option<u64> {
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
pub(super) fn pod_request(pod: &Value) -> u64 {
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    containers
        .iter()
        .map(|c| {
            let r = &c["resources"];
            r["requests"]["memory"].as_str().or(r["limits"]["memory"].as_str()).and_then(quantity_bytes).unwrap_or(0)
        })
        .sum()
}

/// A container's memory limit as its cgroup's `memory.max` says it: bytes, or `max`.
pub(super) fn limit_bytes(container: &Value) -> String {
    let limit = container["resources"]["limits"]["memory"].as_str().and_then(quantity_bytes);
    limit.map_or("max".to_string(), |b| b.to_string())
}

/// `$(NAME)` replaced by the variable's value, as the kubelet expands a container's command.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = arg.to_string();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    out
}

/// A pod's volumes as directories of this machine: an `emptyDir` is a fresh directory, a
/// `downwardAPI` volume one holding its items' files (annotations, labels, name, namespace).
/// The fake has no mount namespace: a container sees a volume through its mount path being
/// rewritten to the directory in its command, environment and working directory.
struct Volumes {
    dirs: BTreeMap<String, tempfile::TempDir>,
}

impl Volumes {
    fn make(pod: &Value) -> Result<Volumes, String> {
        let mut dirs = BTreeMap::new();
        for v in pod["spec"]["volumes"].as_array().cloned().unwrap_or_default() {
            let name = v["name"].as_str().unwrap_or_default().to_string();
            // Short: a unix socket's path in it must stay under 108 bytes.
            let dir = tempfile::Builder::new().prefix("kv").tempdir_in("/tmp").map_err(|e| e.to_string())?;
            std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .map_err(|e| e.to_string())?;
            for item in v["downwardAPI"]["items"].as_array().cloned().unwrap_or_default() {
                let field = item["fieldRef"]["fieldPath"].as_str().unwrap_or_default();
                let value = field_value(pod, field).ok_or_else(|| format!("downwardAPI: no field {field}"))?;
                let path = dir.path().join(item["path"].as_str().unwrap_or_default());
                std::fs::write(&path, value).map_err(|e| e.to_string())?;
            }
            dirs.insert(name, dir);
        }
        Ok(Volumes { dirs })
    }

    /// A container's mounts as (mount path, directory), the longest path first (nested
    /// mounts are rewritten before the one they are in).
    fn mounts(&self, container: &Value) -> Vec<(String, String)> {
        let mut mounts: Vec<(String, String)> = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let dir = self.dirs.get(m["name"].as_str()?)?;
                Some((m["mountPath"].as_str()?.to_string(), dir.path().display().to_string()))
            })
            .collect();
        mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        mounts
    }
}

/// A downward API field of `pod`: `metadata.name`, `metadata.namespace`,
/// `metadata.annotations['k']`, `metadata.labels['k']`.
fn field_value(pod: &Value, field: &str) -> Option<String> {
    let meta = &pod["metadata"];
    let keyed = |prefix: &str| field.strip_prefix(prefix)?.strip_suffix("']").map(str::to_string);
    match field {
        "metadata.name" | "metadata.namespace" => meta[&field[9..]].as_str().map(str::to_string),
        _ => {
            if let Some(k) = keyed("metadata.annotations['") {
                return meta["annotations"][&k].as_str().map(str::to_string);
            }
            keyed("metadata.labels['").and_then(|k| meta["labels"][&k].as_str().map(str::to_string))
        }
    }
}

/// `text` with each mount path that stands as a path of its own (not inside a longer name,
/// and followed by `/` or nothing) replaced by its directory, in one pass, the longest mount
/// path first where several start at one place.
fn remount(text: &str, mounts: &[(String, String)]) -> String {
    let name_char = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
    let mut out = String::new();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let starts = i == 0 || !text[..i].chars().next_back().is_some_and(name_char);
        let hit = mounts.iter().find(|(path, _)| {
            starts && rest.starts_with(path.as_str()) && {
                let after = &rest[path.len()..];
                after.is_empty() || after.starts_with('/')
            }
        });
        match hit {
            Some((path, dir)) => {
                out.push_str(dir);
                i += path.len();
            }
            None => {
                let c = rest.chars().next().expect("within the text");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// A container's status, as a kubelet writes it.
fn container_status(name: &Value, image: &str, ready: bool, state: Value) -> Value {
    json!({"name": name, "ready": ready, "restartCount": 0, "image": image, "imageID": "", "state": state})
}

/// The fake kubelet for one pod: admission, "pull", start (each container in order, one
/// process group), readiness, end.
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
    let containers = pod["spec"]["containers"].as_array().cloned().unwrap_or_default();
    let images: Vec<String> = containers.iter().map(|c| c["image"].as_str().unwrap_or_default().to_string()).collect();
    if let Some((i, image)) =
        images.iter().enumerate().find(|(_, image)| !shared.cluster.lock().images.contains_key(*image))
    {
        let image = image.clone();
        shared.update_pod(&key, &uid, |p| {
            p["status"]["containerStatuses"] = json!([container_status(
                &containers[i]["name"],
                &image,
                false,
                json!({"waiting": {"reason": "ErrImagePull", "message": format!("pull access denied for {image}")}})
            )]);
        });
        return;
    }
    let volumes = match Volumes::make(&pod) {
        Ok(v) => v,
        Err(e) => {
            shared.cluster.lock().admitted.remove(&key);
            shared.update_pod(&key, &uid, |p| {
                p["status"] = json!({"phase": "Failed", "reason": "CreateContainerConfigError", "message": e});
            });
            return;
        }
    };
    // The one container with a port gets a port of its own (the fake has no pod network).
    let served = containers.iter().position(|c| c["ports"].as_array().is_some_and(|p| !p.is_empty()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // The pod's own /tmp (its emptyDir), gone with the pod, for a container without one.
    let tmp = tempfile::Builder::new().prefix("fake-pod-tmp-").tempdir().unwrap();
    let mut children = Vec::new();
    let mut logs = Vec::new();
    let mut group: Option<i32> = None;
    // Each container's cgroup directory: its `memory.max`, which a resize rewrites.
    let mut cgroups = Vec::new();
    for (i, container) in containers.iter().enumerate() {
        let mut mounts = volumes.mounts(container);
        let cgroup = tempfile::Builder::new().prefix("kcg").tempdir_in("/tmp").unwrap();
        std::fs::write(cgroup.path().join("memory.max"), limit_bytes(container)).unwrap();
        mounts.push(("/sys/fs/cgroup".to_string(), cgroup.path().display().to_string()));
        let name = container["name"].as_str().unwrap_or_default();
        shared.cluster.lock().cgroups.insert(format!("{key}#{name}"), cgroup.path().to_path_buf());
        cgroups.push(cgroup);
        let mut env = BTreeMap::new();
        for var in container["env"].as_array().cloned().unwrap_or_default() {
            let name = var["name"].as_str().unwrap_or_default().to_string();
            let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("status.podIP") | Some("status.hostIP") => "127.0.0.1".to_string(),
                Some(field) => field_value(&pod, field).unwrap_or_default(),
                _ if name == "PORT" && served == Some(i) => port.to_string(),
                _ => remount(var["value"].as_str().unwrap_or_default(), &mounts),
            };
            env.insert(name, value);
        }
        // The program is the image's (this machine's, in the fake): never a volume's, so its
        // path is taken as it is, even under a mount path (a test binary under /tmp).
        let entrypoint = shared.cluster.lock().images.get(&images[i]).cloned().unwrap_or_default();
        let command: Vec<String> = match container["command"].as_array() {
            Some(command) => command.iter().filter_map(|a| a.as_str()).map(String::from).collect(),
            None => entrypoint,
        };
        let args = container["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str()).map(String::from);
        let argv: Vec<String> = command
            .into_iter()
            .chain(args)
            .enumerate()
            .map(|(i, a)| if i == 0 { expand(&a, &env) } else { remount(&expand(&a, &env), &mounts) })
            .collect();
        let tmpdir =
            mounts.iter().find(|(path, _)| path == "/tmp").map_or(tmp.path().display().to_string(), |(_, d)| d.clone());
        let started = match argv.split_first() {
            Some((program, args)) => {
                let mut command = tokio::process::Command::new(program);
                command
                    .args(args)
                    .env_clear()
                    .envs(&env)
                    .env("TMPDIR", &tmpdir)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .process_group(group.unwrap_or(0))
                    .kill_on_drop(true);
                if let Some(dir) = container["workingDir"].as_str() {
                    command.current_dir(remount(dir, &mounts));
                }
                command.spawn().map_err(|e| e.to_string())
            }
            None => Err("no command, and the image has no entry point".to_string()),
        };
        let mut child = match started {
            Ok(child) => child,
            Err(e) => {
                shared.cluster.lock().admitted.remove(&key);
                if let Some(pgid) = group {
                    kill_group(pgid);
                }
                shared.update_pod(&key, &uid, |p| {
                    p["status"] = json!({"phase": "Failed", "containerStatuses": [container_status(&container["name"],
                        &images[i], false, json!({"terminated": {"exitCode": 128, "reason": "StartError", "message": e}}))]});
                });
                return;
            }
        };
        group.get_or_insert(child.id().unwrap_or_default() as i32);
        let log = Arc::new(PodLog::default());
        let readers = [
            tokio::spawn(copy_into(child.stdout.take(), log.clone())),
            tokio::spawn(copy_into(child.stderr.take(), log.clone())),
        ];
        logs.push(log);
        children.push((child, readers));
    }
    {
        let mut cluster = shared.cluster.lock();
        if !cluster.objects.contains_key(&(Kind::Pod, key.clone())) {
            return; // deleted meanwhile: the children are killed on drop
        }
        cluster.processes.insert(key.clone(), group.unwrap_or_default());
        // The pod's log is its first container's; each container's under `<key>#<name>`.
        cluster.logs.insert(key.clone(), logs[0].clone());
        for (c, log) in containers.iter().zip(&logs) {
            cluster.logs.insert(format!("{key}#{}", c["name"].as_str().unwrap_or_default()), log.clone());
        }
    }
    // Each container's state: running, or terminated with its exit code (and, under
    // `FallbackToLogsOnError`, its log's last lines as the message).
    let states: Arc<Mutex<Vec<Value>>> =
        Arc::new(Mutex::new(vec![json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}); containers.len()]));
    let status_of = {
        let (containers, images, states) = (containers.clone(), images.clone(), states.clone());
        move |ready: bool| {
            let states = states.lock().clone();
            let all_ended = states.iter().all(|s| !s["terminated"].is_null());
            let failed = states.iter().any(|s| s["terminated"]["exitCode"].as_i64().is_some_and(|c| c != 0));
            let statuses: Vec<Value> = containers
                .iter()
                .zip(&images)
                .zip(&states)
                .map(|((c, image), state)| {
                    container_status(&c["name"], image, ready && state["terminated"].is_null(), state.clone())
                })
                .collect();
            let phase = match (all_ended, failed) {
                (false, _) => "Running",
                (true, true) => "Failed",
                (true, false) => "Succeeded",
            };
            let ready = ready && !all_ended && statuses.iter().all(|s| s["ready"] == true);
            json!({"phase": phase, "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": statuses})
        }
    };
    let running = |ready: bool, status_of: &dyn Fn(bool) -> Value| {
        let status = status_of(ready);
        move |p: &mut Value| {
            // What each container was given (its last resize's, else its spec at the start) and
            // a resize left pending stay as they were.
            let given: Vec<Value> = p["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
            let pending: Vec<Value> = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["type"] == "PodResizePending")
                .cloned()
                .collect();
            let specs = p["spec"]["containers"].clone();
            let mut status = status.clone();
            for s in status["containerStatuses"].as_array_mut().into_iter().flatten() {
                let before = given.iter().find(|g| g["name"] == s["name"] && !g["resources"].is_null());
                let spec = specs.as_array().into_iter().flatten().find(|c| c["name"] == s["name"]);
                let resources = before.map(|g| g["resources"].clone()).or(spec.map(|c| c["resources"].clone()));
                s["resources"] = resources.clone().unwrap_or(Value::Null);
                s["allocatedResources"] = resources.map_or(Value::Null, |r| r["requests"].clone());
            }
            if let Some(conditions) = status["conditions"].as_array_mut() {
                conditions.extend(pending);
            }
            if let Some(i) = served {
                if let Some(first) =
                    p["spec"]["containers"][i]["ports"].as_array_mut().and_then(|ports| ports.first_mut())
                {
                    first["containerPort"] = json!(port);
                }
                if let Some(vars) = p["spec"]["containers"][i]["env"].as_array_mut() {
                    for var in vars.iter_mut().filter(|v| v["name"] == "PORT") {
                        var["value"] = json!(port.to_string());
                    }
                }
            }
            p["status"] = status;
        }
    };
    if !shared.update_pod(&key, &uid, running(served.is_none(), &status_of)) {
        return;
    }
    // Readiness: a TCP probe on the served port until it answers; each container's end noted.
    let mut ready = served.is_none();
    let mut waits: Vec<_> = children
        .into_iter()
        .enumerate()
        .map(|(i, (mut child, readers))| {
            let (states, log) = (states.clone(), logs[i].clone());
            let fallback = containers[i]["terminationMessagePolicy"] == "FallbackToLogsOnError";
            tokio::spawn(async move {
                let status = child.wait().await;
                for reader in readers {
                    let _ = reader.await;
                }
                log.end();
                let code = status.ok().and_then(|s| s.code()).unwrap_or(137);
                let message = (fallback && code != 0).then(|| {
                    let data = log.data.lock();
                    let tail: Vec<String> = data
                        .0
                        .iter()
                        .rev()
                        .take(80)
                        .rev()
                        .map(|(_, l)| String::from_utf8_lossy(l).into_owned())
                        .collect();
                    tail.concat()
                });
                let reason = if code == 0 { "Completed" } else { "Error" };
                let mut terminated = json!({"terminated": {"exitCode": code, "reason": reason}});
                if let Some(m) = message {
                    terminated["terminated"]["message"] = json!(m);
                }
                states.lock()[i] = terminated;
            })
        })
        .collect();
    while !waits.is_empty() {
        if !ready && tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            ready = true;
            if !shared.update_pod(&key, &uid, running(true, &status_of)) {
                return;
            }
        }
        let wait = if ready { Duration::from_secs(3600) } else { Duration::from_millis(20) };
        let any = futures_util::future::select_all(waits.iter_mut());
        if tokio::time::timeout(wait, any).await.is_ok() {
            waits.retain(|w| !w.is_finished());
            if !waits.is_empty() && !shared.update_pod(&key, &uid, running(ready, &status_of)) {
                return;
            }
        }
    }
    let evicted = {
        let mut cluster = shared.cluster.lock();
        cluster.admitted.remove(&key);
        cluster.cgroups.retain(|k, _| !k.starts_with(&format!("{key}#")));
        cluster.processes.remove(&key);
        cluster.evicting.remove(&key)
    };
    let last = status_of(false);
    shared.update_pod(&key, &uid, |p| {
        p["status"] = if evicted {
            json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."})
        } else {
            last
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
