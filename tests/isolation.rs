//! Tenant isolation on the real process factory: every escape a hostile action or tenant tried
//! (issue 18's probe) attempted again, and each must now fail. The sandbox needs root: without
//! it these tests say so and pass, except under `CI=true`, where they fail.

mod support;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;
use support::{alive, python, root_or_skip, wait_gone, Invoker, DISK_FILLER, GUEST, OTHER};

/// A world-readable test directory (as an operator's often is) with a 0644 config naming a
/// second namespace, `other`.
fn start(invoker_id: &str, extra: &str) -> (tempfile::TempDir, Invoker) {
    let dir = tempfile::Builder::new().prefix("invoker-iso-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = format!("[namespaces]\nguest = \"{GUEST}\"\nother = \"{OTHER}\"\n{extra}");
    let inv = Invoker::start(dir.path(), &format!("{invoker_id}-{}", std::process::id()), &config);
    std::fs::set_permissions(dir.path().join("invoker.toml"), std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, inv)
}

async fn run(inv: &Invoker, name: &str, code: &str, params: Value) -> (u16, Value) {
    inv.put_action(name, python(code)).await;
    inv.invoke(name, "blocking=true", params).await
}

/// The action's result, which must be a success.
async fn result(inv: &Invoker, name: &str, code: &str, params: Value) -> Value {
    let (status, body) = run(inv, name, code, params).await;
    assert_eq!(status, 200, "{name}: {body}");
    body["response"]["result"].clone()
}

const WHO: &str = r#"import os
def main(a):
    status = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
    return {'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(), 'cap_eff': status['CapEff'].strip(),
            'no_new_privs': status['NoNewPrivs'].strip(), 'pid': os.getpid(), 'runtime': os.getpgrp(),
            'cwd': os.getcwd()}
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn each_container_runs_under_a_uid_of_its_own_without_privileges() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-uid", "");
    let a = result(&inv, "a", WHO, json!({})).await;
    let b = result(&inv, "b", WHO, json!({})).await;
    for who in [&a, &b] {
        assert_ne!(who["uid"], 0, "{who}");
        assert_eq!(who["uid"], who["gid"], "{who}");
        assert_eq!(who["cap_eff"], "0000000000000000", "{who}");
        assert_eq!(who["no_new_privs"], "1", "{who}");
        assert!(who["groups"].as_array().unwrap().iter().all(|g| g == &who["gid"]), "{who}");
    }
    assert_ne!(a["uid"], b["uid"], "two live containers never share a uid");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn an_action_reads_neither_the_config_nor_the_store_nor_another_containers_code() {
    if !root_or_skip() {
        return;
    }
    let (dir, inv) = start("iso-files", "");
    let data = dir.path().join("data");
    // Another tenant's container: its code, its process.
    let victim = result(&inv, "victim", &format!("SECRET = 'hunter2'\n{WHO}"), json!({})).await;
    let victim_code = format!("{}/__main__.py", victim["cwd"].as_str().unwrap());
    let victim_environ = format!("/proc/{}/environ", victim["runtime"]);
    let targets = vec![
        dir.path().join("invoker.toml").display().to_string(),
        data.join("invoker.redb").display().to_string(),
        data.join("journal").display().to_string(),
        data.join("processes").display().to_string(),
        victim_code,
        victim_environ,
        "/etc/shadow".into(),
    ];
    let probe = r#"import os
def main(a):
    seen = {}
    for path in a['paths']:
        try:
            if os.path.isdir(path):
                seen[path] = 'listed: %s' % os.listdir(path)
            else:
                with open(path, 'rb') as f:
                    seen[path] = 'read: %r' % f.read(200)
        except OSError as e:
            seen[path] = 'refused: %s' % e.strerror
    seen['proc'] = sorted(p for p in os.listdir('/proc') if p.isdigit())
    seen['own'] = str(os.getpid())
    return seen
"#;
    let seen = result(&inv, "probe", probe, json!({ "paths": targets })).await;
    for path in &targets {
        let what = seen[path.as_str()].as_str().unwrap();
        assert!(what.starts_with("refused"), "{path}: {what}");
    }
    for secret in ["other-secret-key", "hunter2", "INVOKER_ID"] {
        assert!(!seen.to_string().contains(secret), "{secret} leaked: {seen}");
    }
    let procs = seen["proc"].as_array().unwrap();
    assert!(procs.len() <= 3 && procs.contains(&seen["own"]), "only its own processes in /proc: {procs:?}");
    // The store is the invoker's alone on the host too.
    for path in [data.join("invoker.redb"), data.join("journal")] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{}: {mode:o}", path.display());
    }
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o711);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn an_action_can_neither_leave_its_cgroup_nor_its_memory_limit() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-cgroup", "");
    let escape = r#"import os
def main(a):
    tried = {}
    paths = ['/sys/fs/cgroup/memory/cgroup.procs', '/sys/fs/cgroup/cgroup.procs']
    for line in open('/proc/self/cgroup').read().splitlines():
        rel = line.split(':', 2)[2]
        parent = os.path.dirname(rel.rstrip('/'))
        paths += ['/sys/fs/cgroup/memory%s/cgroup.procs' % parent, '/sys/fs/cgroup%s/cgroup.procs' % parent]
    for p in paths:
        try:
            with open(p, 'w') as f:
                f.write(str(os.getpid()))
            tried[p] = 'moved'
        except OSError as e:
            tried[p] = e.strerror
    if a.get('allocate'):
        block = bytearray(400 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        tried['allocated'] = len(block)
    return tried
"#;
    inv.put_action(
        "escape",
        json!({"exec": {"kind": "python:3", "code": escape}, "limits": {"memory": 128, "timeout": 20000}}),
    )
    .await;
    let (status, body) = inv.invoke("escape", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let tried = &body["response"]["result"];
    assert!(!tried.to_string().contains("moved"), "{tried}");
    let (status, body) = inv.invoke("escape", "blocking=true", json!({"allocate": true})).await;
    assert_eq!(status, 502, "400 MB under a 128 MB limit: {body}");
    assert!(body["response"]["result"]["error"].as_str().unwrap().contains("memory"), "{body}");
}

const ESCAPER: &str = r#"import os, time
def main(a):
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(300)
        os._exit(0)
    pid = int(os.read(r, 32))
    return {'escaped': pid}
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn no_process_of_an_action_outlives_its_container_nor_an_invoker_crash() {
    if !root_or_skip() {
        return;
    }
    // Removal when the container goes idle.
    let (dir, mut inv) = start("iso-orphans", "[pool]\nidle_timeout = \"1s\"\n");
    let first = result(&inv, "escaper", ESCAPER, json!({})).await["escaped"].as_u64().unwrap() as u32;
    assert!(alive(first), "the double-forked, setsid child runs while its container lives");
    assert!(wait_gone(&[first], Duration::from_secs(15)).is_empty(), "{first} outlived its container's removal");
    // A SIGKILL of the invoker, then a restart of the same invoker id.
    let (status, body) = inv.invoke("escaper", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let second = body["escaped"].as_u64().unwrap() as u32;
    assert!(alive(second));
    inv.signal(Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    let id = inv.invoker_id.clone();
    drop(inv);
    let config = std::fs::read_to_string(dir.path().join("invoker.toml")).unwrap();
    let extra = config.split_once('\n').map(|(_, rest)| rest.to_string()).unwrap_or_default();
    let _restarted = Invoker::start(dir.path(), &id, &extra);
    assert!(wait_gone(&[second], Duration::from_secs(10)).is_empty(), "{second} outlived the restart");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let data = dir.path().join("data").display().to_string();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(data.as_str())).collect();
    assert!(left.is_empty(), "the crashed run's container disks are detached: {left:?}");
}

/// The groups named `name` anywhere in the cgroup hierarchies (v1's memory one may sit a few
/// levels down, under the machine's own groups).
fn cgroups_named(name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut level = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    for _ in 0..5 {
        let mut next = Vec::new();
        for dir in level {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                // (A link is not a directory here: `file_type` does not follow it.)
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    if entry.file_name() == name {
                        found.push(path);
                    } else {
                        next.push(path);
                    }
                }
            }
        }
        level = next;
    }
    found
}

/// An invoker that ran containers and stopped leaves no cgroup behind: not its containers',
/// nor its own parent groups (each run of a new invoker id left three, in the memory, pids and
/// freezer hierarchies), whether it stopped on SIGTERM or was killed.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn an_invoker_that_stops_leaves_no_cgroup_behind() {
    if !root_or_skip() {
        return;
    }
    for (name, signal) in [("iso-cg-term", Signal::SIGTERM), ("iso-cg-kill", Signal::SIGKILL)] {
        let (_dir, mut inv) = start(name, "");
        let who = result(&inv, "who", WHO, json!({})).await;
        assert!(who["uid"].as_u64().unwrap() > 0, "{who}");
        let group = format!("invoker-{}", inv.invoker_id);
        assert!(!cgroups_named(&group).is_empty(), "the running invoker has its groups");
        inv.signal(signal);
        inv.wait_exit(Duration::from_secs(20));
        let gone = |left: Vec<std::path::PathBuf>| if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) };
        let what = format!("the groups of an invoker stopped by {signal} are gone");
        support::eventually(Duration::from_secs(20), &what, || async { gone(cgroups_named(&group)) }).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn a_fork_bomb_stops_at_pids_max_and_the_invoker_still_serves() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-pids", "[factory.process]\npids_max = 32\n");
    let bomb = r#"import os, time
def main(a):
    children = 0
    try:
        for _ in range(500):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            children += 1
    except OSError as e:
        return {'children': children, 'stopped': e.strerror}
    return {'children': children}
"#;
    let stopped = result(&inv, "bomb", bomb, json!({})).await;
    assert!(stopped["children"].as_u64().unwrap() < 32, "{stopped}");
    assert!(stopped["stopped"].is_string(), "{stopped}");
    let who = result(&inv, "after", WHO, json!({})).await;
    assert!(who["uid"].as_u64().unwrap() > 0, "the invoker still serves: {who}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn an_action_has_no_network_but_its_own_loopback() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-net", "");
    let port: u16 = inv.base.rsplit(':').next().unwrap().parse().unwrap();
    let probe = r#"import socket
def main(a):
    out = {}
    for name, addr in [('invoker', ('127.0.0.1', a['port'])), ('outside', ('10.255.255.1', 80))]:
        try:
            socket.create_connection(addr, timeout=2).close()
            out[name] = 'connected'
        except OSError as e:
            out[name] = e.strerror or str(e)
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen()
    socket.create_connection(server.getsockname(), timeout=2).close()
    out['loopback'] = 'works'
    out['interfaces'] = [name for _, name in socket.if_nameindex()]
    return out
"#;
    let out = result(&inv, "net", probe, json!({ "port": port })).await;
    assert_ne!(out["invoker"], "connected", "{out}");
    assert_ne!(out["outside"], "connected", "{out}");
    assert_eq!(out["loopback"], "works", "{out}");
    assert_eq!(out["interfaces"], json!(["lo"]), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn a_tenant_key_reads_no_other_namespace_and_no_admin_route() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-keys", "");
    let secret =
        "def main(a):\n    print('the password is', a.get('password'))\n    return {'password': a.get('password')}\n";
    inv.put_action("secret", python(secret)).await;
    let http = reqwest::Client::new();
    let (other_user, other_pass) = OTHER.split_once(':').unwrap();
    let put = http
        .put(inv.url("actions/mine"))
        .basic_auth(other_user, Some(other_pass))
        .json(&python("def main(a):\n    return {'mine': True}\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // guest's activation through the shim, then other's replay of its id.
    let id = invoker_wire::model::new_activation_id();
    let message = |ns: &str, action: &str, subject: &str| {
        json!({"transid": ["t", 1], "action": {"path": ns, "name": action},
               "user": {"subject": subject, "namespace": {"name": ns}}, "activationId": id, "blocking": true,
               "content": {"password": "hunter2"}})
    };
    let (guest_user, guest_pass) = GUEST.split_once(':').unwrap();
    let shim = format!("{}/v1/activations", inv.base);
    let first = http
        .post(&shim)
        .basic_auth(guest_user, Some(guest_pass))
        .json(&message("guest", "secret", "guest"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    for body in [message("other", "mine", "other"), message("other", "mine", "guest")] {
        let r = http.post(&shim).basic_auth(other_user, Some(other_pass)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert!(status == 409 || status == 403, "{status}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
    for path in ["/v1/pool", "/metrics"] {
        let r = http.get(format!("{}{path}", inv.base)).basic_auth(other_user, Some(other_pass)).send().await.unwrap();
        assert_eq!(r.status(), 403, "{path}");
    }
    let health: Value = http
        .get(format!("{}/health", inv.base))
        .basic_auth(other_user, Some(other_pass))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health.as_object().map(|o| o.len()), Some(1), "the state word only: {health}");
    let (status, pool) = inv.get_url("/v1/pool").await;
    assert!(status == 200 && pool.to_string().contains("secret"), "the admin key sees the pool: {pool}");
}

/// Started by a user that is not root, the invoker refuses the isolated process factory with a
/// message naming the setting, and runs with `unprivileged = false` (warning that actions are
/// not isolated).
#[test]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
fn without_root_the_process_factory_needs_an_explicit_unprivileged_false() {
    if !root_or_skip() {
        return;
    }
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::Builder::new().prefix("invoker-iso-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy the other user can reach, wherever the build lies (a checkout under /root is not).
    let binary = dir.path().join("invoker");
    std::fs::copy(env!("CARGO_BIN_EXE_invoker"), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let start = |extra: &str| {
        let config = dir.path().join(format!("c{}.toml", extra.len()));
        std::fs::write(&config, format!("invoker_id = \"iso-nobody-{}\"\n{extra}", std::process::id())).unwrap();
        std::process::Command::new(&binary)
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let refused = start("").wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("unprivileged = false"), "{said}");
    let mut relaxed = start("[factory.process]\nunprivileged = false\n");
    let stdout = BufReader::new(relaxed.stdout.take().unwrap());
    let listening = stdout.lines().map_while(Result::ok).any(|l| l.starts_with("listening on "));
    let _ = relaxed.kill();
    let output = relaxed.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(listening, "{said}");
    assert!(said.contains("without isolation") || said.contains("NOT isolated"), "{said}");
}

/// A root without `CAP_SYS_ADMIN` (a container, a seccomp profile) cannot make namespaces: the
/// invoker says so at start, naming the step and the setting, instead of failing every
/// activation later.
#[test]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
fn a_machine_where_the_sandbox_cannot_work_is_refused_at_start() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::Builder::new().prefix("invoker-iso-").tempdir().unwrap();
    let config = dir.path().join("invoker.toml");
    std::fs::write(&config, format!("invoker_id = \"iso-nocap-{}\"\n", std::process::id())).unwrap();
    // setpriv (util-linux) drops the capability from the bounding set before executing it.
    let output = std::process::Command::new("setpriv")
        .args(["--bounding-set", "-sys_admin"])
        .arg(env!("CARGO_BIN_EXE_invoker"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("setpriv from util-linux");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("sandbox does not work") && said.contains("unshare"), "{said}");
    assert!(said.contains("unprivileged = false"), "{said}");
}

/// An action's environment is the runtime protocol's and the factory's, nothing of the
/// invoker's own (whose environment may hold `INVOKER_GUEST_KEY` or a cloud credential).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn an_action_sees_none_of_the_invokers_environment() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-env", "");
    let env = result(&inv, "env", "import os\ndef main(a):\n    return dict(os.environ)\n", json!({})).await;
    let keys: Vec<&String> = env.as_object().unwrap().keys().collect();
    let expected = |k: &str| {
        ["PATH", "HOME", "LANG", "PWD", "INVOKER_PYTHON", "INVOKER_NODE", "INVOKER_ACTION_SCHED", "LC_CTYPE"]
            .contains(&k)
            || k.starts_with("__OW_")
            || ["INVOKER_ID", "INVOKER_CONTAINER", "INVOKER_PARENT_PID", "INVOKER_WORK_DIR", "INVOKER_ADOPT"]
                .contains(&k)
    };
    let unexpected: Vec<&&String> = keys.iter().filter(|k| !expected(k)).collect();
    assert!(unexpected.is_empty(), "the invoker's environment leaked: {unexpected:?}");
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")), "the test's own environment has CARGO_*");
    assert_eq!(env["PATH"], "/usr/local/bin:/usr/bin:/bin");
}

/// A kind's `paths` are shown to its actions: one holding the store or the config would show
/// them every tenant's records and keys, so the invoker refuses to start with one.
#[test]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
fn a_kinds_paths_may_not_expose_the_store_or_the_config() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::Builder::new().prefix("invoker-iso-").tempdir().unwrap();
    let config = dir.path().join("invoker.toml");
    let kind = format!(
        "invoker_id = \"iso-paths-{}\"\n[kinds.\"python:ow\"]\ncommand = [\"/usr/bin/python3\"]\nnetwork = \"isolated\"\npaths = [\"{}\"]\n",
        std::process::id(),
        dir.path().display()
    );
    std::fs::write(&config, kind).unwrap();
    let stderr = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_invoker"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the invoker started with its store among a kind's paths");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert!(said.contains("kinds.\"python:ow\".paths"), "{said}");
}

/// A disk limit holds wherever the container may write: its working directory (where its code
/// lies), `/tmp` and `/dev/shm` all stop it at `limits.disk` with ENOSPC, inside the action; the
/// invoker and another tenant notice nothing.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn a_write_past_the_disk_limit_fails_inside_the_action_and_nothing_outside_notices() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("iso-disk", "");
    let filler = json!({"exec": {"kind": "python:3", "code": DISK_FILLER},
                        "limits": {"memory": 256, "disk": 64, "timeout": 60000}});
    inv.put_action("filler", filler).await;
    let limit = 64 << 20;
    for dir in [".", "/tmp", "/dev/shm"] {
        let (status, body) = inv.invoke("filler", "blocking=true", json!({ "dir": dir })).await;
        assert_eq!(status, 200, "{dir}: {body}");
        let got = &body["response"]["result"];
        assert_eq!(got["stopped"], "ENOSPC", "{dir}: {got}");
        let written = got["written"].as_u64().unwrap();
        assert!(written <= limit && written > limit - (8 << 20), "{dir}: {written} bytes of a 64 MB disk: {got}");
        assert_eq!(got["size"], limit, "{dir}: the container's own disk: {got}");
    }
    let http = reqwest::Client::new();
    let (user, pass) = OTHER.split_once(':').unwrap();
    let hello = python("def main(a):\n    return {'hello': 'other'}\n");
    let put = http.put(inv.url("actions/hello")).basic_auth(user, Some(pass)).json(&hello).send().await.unwrap();
    assert_eq!(put.status(), 200, "the other tenant's PUT");
    let invoke = http
        .post(format!("{}?blocking=true", inv.url("actions/hello")))
        .basic_auth(user, Some(pass))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(invoke.status(), 200, "the other tenant's invoke");
    let (status, body) = inv.invoke("filler", "blocking=true", json!({ "dir": "." })).await;
    assert_eq!((status, &body["response"]["result"]["stopped"]), (200, &json!("ENOSPC")), "and again: {body}");
}

/// The process factory's fork server copies each container's root from a template of its kind
/// (`sandbox_template.rs`) once the kind's first container was made: what the copies share is
/// read-only, each container's directory lies in a tmpfs of its own on the parent, and the
/// host's mount table keeps nothing of the template. The invoker's directory is outside
/// `/tmp` here, where the parent's tmpfs is used (under `/tmp` the container's own `/tmp`
/// holds it).
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn a_kinds_roots_are_copied_from_a_read_only_template_and_keep_their_own_parts() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::Builder::new().prefix("iso-tpl-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let invoker_id = format!("iso-tpl-{}", std::process::id());
    let inv = Invoker::start(dir.path(), &invoker_id, &format!("[namespaces]\nguest = \"{GUEST}\"\n"));
    let processes = std::fs::canonicalize(dir.path().join("data/processes").join(&invoker_id)).unwrap();
    let probe = r#"import os
def main(a):
    out = {'cwd': os.getcwd(), 'others': {}, 'refused': {}}
    for other in a['others']:
        try:
            os.stat(other)
            out['others'][other] = 'found'
        except OSError as e:
            out['others'][other] = e.strerror
    for line in open('/proc/self/mountinfo'):
        fields, rest = line.split(' - ')
        if fields.split(' ')[4] == '/':
            out['root'] = rest.split(' ')[2]
    for path in ['/new', '/dev/new', '/etc/new', a['parent'] + '/new']:
        try:
            open(path, 'w').close()
            out['refused'][path] = 'written'
        except OSError as e:
            out['refused'][path] = e.strerror
    return out
"#;
    let (mut roots, mut others) = (Vec::new(), Vec::new());
    for name in ["tpl1", "tpl2", "tpl3"] {
        let out = result(&inv, name, probe, json!({ "parent": processes, "others": others })).await;
        assert!(out["cwd"].as_str().unwrap().starts_with(processes.to_str().unwrap()), "{out}");
        for (other, what) in out["others"].as_object().unwrap() {
            assert_eq!(what, "No such file or directory", "{name} reached {other}: {out}");
        }
        others.push(out["cwd"].clone());
        for (path, what) in out["refused"].as_object().unwrap() {
            assert_ne!(what, "written", "{name} wrote {path}: {out}");
        }
        roots.push(out["root"].as_str().unwrap().to_string());
    }
    // The first of a kind may be built whole (its tmpfs `rw` under a read-only mount); the
    // template is there by the third.
    assert!(roots[2].starts_with("ro,"), "the third container's root is the template's: {roots:?}; {}", inv.stderr());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let template = processes.join("template").display().to_string();
    assert!(!table.contains(&template), "the host's mount table holds the template: {table}");
}
