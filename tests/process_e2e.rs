//! End to end with the process factory: the real `invoker` binary, its own action runtime, and
//! real python3, node and native processes.

mod support;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;
use support::{alive, host_listens_on, python, wait_gone, Invoker, SmallDisk};

const PID_ACTION: &str = "import os, time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    if a.get('crash'):\n        os._exit(3)\n    print('pid', os.getpid())\n    return {'pid': os.getpid(), 'runtime': os.getpgrp()}\n";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-e2e-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

#[tokio::test(flavor = "multi_thread")]
async fn three_kinds_blocking_non_blocking_and_logs() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("kinds"), "");
    let py = "import sys\ndef main(a):\n    print('py says', a['name'])\n    print('py complains', file=sys.stderr)\n    return {'hello': a['name']}\n";
    inv.put_action("py", python(py)).await;
    inv.put_action(
        "js",
        json!({"exec": {"kind": "nodejs:20", "code": "async function main(a) { console.log('js says', a.name); return {hello: a.name}; }"}}),
    )
    .await;
    let script = "#!/bin/sh\nwhile read line; do echo \"sh says $line\"; echo '{\"hello\":\"native\"}' >&3; done\n";
    inv.put_action("sh", json!({"exec": {"kind": "native", "code": script}})).await;

    for (name, expected) in [("py", "you"), ("js", "you"), ("sh", "native")] {
        let (status, body) = inv.invoke(name, "blocking=true&result=true", json!({"name": "you"})).await;
        assert_eq!((status, &body), (200, &json!({"hello": expected})), "{name}");

        let (status, body) = inv.invoke(name, "blocking=false", json!({"name": "you"})).await;
        assert_eq!(status, 202, "{name}: {body}");
        let id = body["activationId"].as_str().unwrap().to_string();
        let record = inv.record(&id).await;
        assert_eq!(record["response"]["statusCode"], 0, "{name}: {record}");
        assert_eq!(record["response"]["result"], json!({"hello": expected}));
        let (status, logs) = inv.get(&format!("activations/{id}/logs")).await;
        assert_eq!(status, 200);
        let logs = logs["logs"].as_array().unwrap();
        let says = logs.iter().filter(|l| l.as_str().unwrap().contains(&format!("stdout: {name} says"))).count();
        assert_eq!(says, 1, "this activation's line, not the one before: {name}: {logs:?}");
        assert!(!logs.iter().any(|l| l.as_str().unwrap().contains("XXX_THE_END")), "sentinels are not logs");
        if name == "py" {
            assert!(logs.iter().any(|l| l.as_str().unwrap().ends_with("stderr: py complains")), "{logs:?}");
        }
    }
}

/// Issue 57, item 4, on processes: the pipes are read once per stream at a warm run (the
/// reading task stops at a short read), and each record still holds exactly its own lines:
/// a chatty call, silent ones, and a line written after an Fn function's answer.
#[tokio::test(flavor = "multi_thread")]
async fn each_record_holds_exactly_its_own_lines_when_the_pipes_are_read_once_a_run() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("lines"), "");
    support::own_lines::each_record_holds_exactly_its_own_lines(&inv).await;
}

/// A runtime's answer is the result as the bytes it came as: a number no float holds, a
/// number's own spelling and the answer's spacing reach the caller and the record unchanged
/// (they were decoded into a tree and encoded again before).
#[tokio::test(flavor = "multi_thread")]
async fn the_result_is_the_runtimes_answer_byte_for_byte() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("bytes"), "");
    let answer = r#"{"n": 12345678901234567890123, "f": 1.50, "s": "caf\u00e9"}"#;
    let script = format!("#!/bin/sh\nwhile read line; do echo '{answer}' >&3; done\n");
    inv.put_action("raw", json!({"exec": {"kind": "native", "code": script}})).await;
    let path = "/api/v1/namespaces/_/actions/raw?blocking=true";
    let (status, _, body) = inv.send("POST", &format!("{path}&result=true"), support::GUEST, &[], Vec::new()).await;
    assert_eq!((status, String::from_utf8_lossy(&body).as_ref()), (200, answer));
    let (status, _, record) = inv.send("POST", path, support::GUEST, &[], Vec::new()).await;
    let record = String::from_utf8_lossy(&record);
    assert!(status == 200 && record.contains(&format!(r#""result":{answer},"size":{}"#, answer.len())), "{record}");
}

#[tokio::test(flavor = "multi_thread")]
async fn application_error_is_502_with_the_error() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("apperr"), "");
    inv.put_action("fails", python("def main(a):\n    return {'error': 'no such user'}\n")).await;
    let (status, body) = inv.invoke("fails", "blocking=true", json!({})).await;
    assert_eq!(status, 502);
    assert_eq!(body["response"]["statusCode"], 1);
    assert_eq!(body["response"]["result"]["error"], "no such user");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dict_or_an_array_is_a_result_and_anything_else_a_developer_error_in_every_kind() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("shapes"), "");
    let js =
        |value: &str| json!({"exec": {"kind": "nodejs:20", "code": format!("function main(a) {{ return {value}; }}")}});
    let sh = |value: &str| {
        let script = format!("#!/bin/sh\nwhile read line; do echo '{value}' >&3; done\n");
        json!({"exec": {"kind": "native", "code": script}})
    };
    let cases = [
        ("py-list", python("def main(a):\n    return [1, 2]\n"), Some(json!([1, 2]))),
        ("py-int", python("def main(a):\n    return 5\n"), None),
        ("py-none", python("def main(a):\n    return None\n"), None),
        ("py-set", python("def main(a):\n    return {'s': {1}}\n"), None),
        ("js-list", js("[1, 2]"), Some(json!([1, 2]))),
        ("js-int", js("5"), None),
        // As OpenWhisk's nodejs runtime: undefined is {}.
        ("js-undefined", js("undefined"), Some(json!({}))),
        ("sh-list", sh("[1,2]"), Some(json!([1, 2]))),
        ("sh-int", sh("5"), None),
    ];
    for (name, action, result) in cases {
        inv.put_action(name, action).await;
        let (status, body) = inv.invoke(name, "blocking=true", json!({})).await;
        match result {
            Some(result) => {
                assert_eq!((status, &body["response"]["result"]), (200, &result), "{name}: {body}");
                assert_eq!(body["response"]["statusCode"], 0, "{name}: {body}");
            }
            None => {
                assert_eq!(status, 502, "{name}: {body}");
                assert_eq!(body["response"]["statusCode"], 2, "{name}: a developer error: {body}");
                // Each kind's message is its OpenWhisk runtime's (nodejs's own; the Go proxy's).
                let error = &body["response"]["result"]["error"];
                let expected = match name.starts_with("js") {
                    true => "The action did not return a dictionary.",
                    false => "The action did not return a dictionary or array.",
                };
                assert_eq!(error, expected, "{name}: {body}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_calls_reuse_one_process_over_either_transport() {
    for transport in ["unix", "tcp"] {
        let dir = tempdir();
        // TCP reaches only a runtime on the host's network: the kind must opt in.
        let config = format!(
            "[factory.process]\ntransport = \"{transport}\"\n[kinds.\"python:3\"]\nnetwork = \"host\"\n\
             command = [\"{{invoker}}\", \"action-runtime\", \"--listen\", \"{{listen}}\", \"--launcher\", \"python\"]\n"
        );
        let inv = Invoker::start(dir.path(), &id(&format!("warm-{transport}")), &config);
        inv.put_action("pid", python(PID_ACTION)).await;
        let mut pids = Vec::new();
        for _ in 0..10 {
            let (status, body) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
            assert_eq!(status, 200, "{transport}: {body}");
            pids.push(body["pid"].as_u64().unwrap());
        }
        assert!(pids.iter().all(|&p| p == pids[0]), "{transport}: {pids:?}");
        let runtime = body_runtime(&inv).await;
        assert_eq!(listens_on_loopback_tcp(runtime), transport == "tcp", "{transport}");
    }
}

/// Whether process `pid` holds a TCP socket listening on 127.0.0.1 (its descriptors' socket
/// inodes against its network namespace's `/proc/<pid>/net/tcp`).
fn listens_on_loopback_tcp(pid: u64) -> bool {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    let sockets: Vec<String> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // local_address, st (0A: LISTEN), inode.
        fields.len() > 9
            && fields[1].starts_with("0100007F:")
            && fields[3] == "0A"
            && sockets.contains(&fields[9].to_string())
    })
}

/// The runtime process of the `pid` action's warm container.
async fn body_runtime(inv: &Invoker) -> u64 {
    let (_, body) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    body["runtime"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_runs_in_one_container_get_their_own_action_processes() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("conc"), "");
    let mut action = python(PID_ACTION);
    action["limits"] = json!({"concurrency": 4});
    inv.put_action("pid", action).await;
    let calls = (0..4).map(|_| inv.invoke("pid", "blocking=true&result=true", json!({"sleep": 1})));
    let answers = futures_util::future::join_all(calls).await;
    let mut runtimes = std::collections::BTreeSet::new();
    let mut pids = std::collections::BTreeSet::new();
    for (status, body) in answers {
        assert_eq!(status, 200, "{body}");
        runtimes.insert(body["runtime"].as_u64().unwrap());
        pids.insert(body["pid"].as_u64().unwrap());
    }
    assert_eq!(runtimes.len(), 1, "one container took all four runs");
    assert!(pids.len() >= 2, "overlapping runs ran in parallel processes: {pids:?}");
}

const POLICY_ACTION: &str =
    "import os\ndef main(a):\n    return {'policy': os.sched_getscheduler(0), 'runtime': os.getpgrp()}\n";

/// The runtime and its action run as `SCHED_BATCH` (3) unless the kind's command says
/// `--sched normal`, when they keep the invoker's policy.
#[tokio::test(flavor = "multi_thread")]
async fn actions_run_as_sched_batch_unless_the_kind_says_normal() {
    let invoker_policy = invoker_runtime::policy_of(std::process::id()).unwrap();
    let normal = r#"[kinds."python:3"]
command = ["{invoker}", "action-runtime", "--listen", "{listen}", "--launcher", "python", "--sched", "normal"]
"#;
    for (config, expected) in [("", libc::SCHED_BATCH as u32), (normal, invoker_policy)] {
        let dir = tempdir();
        let inv = Invoker::start(dir.path(), &id(&format!("sched{expected}")), config);
        inv.put_action("policy", python(POLICY_ACTION)).await;
        let (status, body) = inv.invoke("policy", "blocking=true&result=true", json!({})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["policy"], expected, "the action, with {config:?}");
        let runtime = body["runtime"].as_u64().unwrap() as u32;
        assert_eq!(invoker_runtime::policy_of(runtime).unwrap(), expected, "the runtime, with {config:?}");
    }
}

/// A runtime this test started: killed when the test ends, whether it passes or panics.
struct RuntimeProcess(std::process::Child);

impl Drop for RuntimeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The project's action runtime on a unix socket, listening.
fn spawn_runtime(launcher: &str, socket: &std::path::Path) -> RuntimeProcess {
    let runtime = RuntimeProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_invoker"))
            .args(["action-runtime", "--launcher", launcher, "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(std::time::Instant::now() < deadline, "the runtime never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    runtime
}

fn post(path: &str, body: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len())
}

/// One HTTP/1.1 exchange on a fresh unix connection to a runtime: the status and the body.
fn exchange(socket: &std::path::Path, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// The runtime on its own: the protocol's routes, and a 4xx naming the reason for the rest.
#[test]
fn the_runtime_speaks_init_and_run_and_refuses_the_rest() {
    let dir = tempdir();
    let socket = dir.path().join("runtime.sock");
    let _runtime = spawn_runtime("python", &socket);
    let (status, body) = exchange(&socket, "GET /run HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert_eq!((status, body.contains("POST only")), (405, true), "{body}");
    let (status, body) = exchange(&socket, &post("/nope", "{}"));
    assert_eq!((status, body.contains("no route /nope")), (404, true), "{body}");
    let huge = "POST /init HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 999999999\r\n\r\n";
    let (status, body) = exchange(&socket, huge);
    assert_eq!((status, body.contains("larger than")), (413, true), "{body}");
    let (status, body) = exchange(&socket, &post("/init", "not json"));
    assert_eq!((status, body.contains("not valid")), (400, true), "{body}");
    let init = r#"{"value": {"main": "main", "code": "def main(a):\n    return {'twice': a['n'] * 2}\n"}}"#;
    assert_eq!(exchange(&socket, &post("/init", init)).0, 200);
    assert_eq!(exchange(&socket, &post("/init", init)).0, 403, "a second /init");
    let (status, body) = exchange(&socket, &post("/run", r#"{"value": {"n": 21}}"#));
    assert_eq!((status, body.as_str()), (200, r#"{"twice":42}"#));
}

/// The children of `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    list.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// A python runtime without a zygote starts its launcher with itself, before `/init`: the
/// process that then runs the action is the one that waited, with `/init`'s environment and
/// the modules of a zip written after it started; one that died while it waited is replaced at
/// `/init`, and an action that fails to load says why either way. (Before, the interpreter
/// started at `/init`, on the first call's path: a stem on Docker saved its container's creation
/// and still paid python's start.)
#[test]
fn the_python_launcher_starts_with_the_runtime_and_init_hands_it_the_action() {
    use base64::Engine as _;
    use std::io::Write as _;
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let files: [(&str, &[u8]); 2] = [
        (
            "__main__.py",
            b"import os, helper
def main(a):
    return {'pid': os.getpid(), 'x': os.environ.get('X'), 'h': helper.VALUE}
",
        ),
        (
            "helper.py",
            b"VALUE = 'from the zip'
",
        ),
    ];
    for (name, data) in files {
        writer.start_file(name, zip::write::SimpleFileOptions::default()).unwrap();
        writer.write_all(data).unwrap();
    }
    let code = base64::engine::general_purpose::STANDARD.encode(writer.finish().unwrap().into_inner());
    let init = json!({"value": {"main": "main", "code": code, "binary": true, "env": {"X": "from init"}}}).to_string();
    let check = |answer: &Value| {
        assert_eq!((answer["x"].as_str(), answer["h"].as_str()), (Some("from init"), Some("from the zip")), "{answer}");
    };
    the_waiting_launcher_takes_the_action("python", &init, check, "def main(a:\n");
}

/// Node the same: the launcher starts with the runtime, and `/init` hands the one that waited
/// the entry point and the environment, which the action's module sees as it loads; one that
/// died while it waited is replaced; a module that fails to load says why.
#[test]
fn the_node_launcher_starts_with_the_runtime_and_init_hands_it_the_action() {
    let code = "const X = process.env.X;\nfunction main(a) { return { pid: process.pid, x: X, y: process.env.Y }; }\n";
    let init = json!({"value": {"main": "main", "code": code, "env": {"X": "from init"}}}).to_string();
    let check = |answer: &Value| {
        assert_eq!(answer["x"], "from init", "the module saw /init's environment as it loaded: {answer}");
    };
    the_waiting_launcher_takes_the_action("nodejs", &init, check, "function main(a {\n");
}

/// The launcher `launcher` started with its runtime takes `init`'s action (one SIGKILLed while
/// it waited is replaced by a new one), `check` reads the first run's answer, and an action of
/// `broken` code fails `/init` with its `SyntaxError`.
fn the_waiting_launcher_takes_the_action(launcher: &str, init: &str, check: impl Fn(&Value), broken: &str) {
    for killed in [false, true] {
        let dir = tempdir();
        let socket = dir.path().join("runtime.sock");
        let runtime = spawn_runtime(launcher, &socket);
        let waiting = waiting_launcher(&runtime);
        if killed {
            sigkill(waiting);
        }
        assert_eq!(exchange(&socket, &post("/init", init)).0, 200, "killed: {killed}");
        let (status, answer) = exchange(&socket, &post("/run", r#"{"value": {}}"#));
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        check(&answer);
        assert_eq!(answer["pid"] == waiting, !killed, "the waiting launcher runs it, unless it died: {answer}");
    }
    let dir = tempdir();
    let socket = dir.path().join("runtime.sock");
    let runtime = spawn_runtime(launcher, &socket);
    waiting_launcher(&runtime);
    let broken = json!({"value": {"main": "main", "code": broken}}).to_string();
    let (status, body) = exchange(&socket, &post("/init", &broken));
    assert_eq!((status, body.contains("SyntaxError")), (502, true), "{body}");
}

/// The one launcher a runtime started with itself, once it is there.
fn waiting_launcher(runtime: &RuntimeProcess) -> u32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let [pid] = children(runtime.0.id())[..] {
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "no launcher started with the runtime");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL to `pid`, returning once it is dead (a zombie its parent has not reaped yet, or gone).
fn sigkill(pid: u32) {
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.is_ok_and(|s| s.success()), "kill -9 {pid}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) state ...`: the state follows the last parenthesis.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{pid} outlived its SIGKILL");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Each run sets the activation's `__OW_*` variables, with a new id and deadline every time.
/// glibc's `setenv` keeps every `NAME=value` string it was ever given, so a python launcher that
/// set them through it grew by ~250 bytes per activation, for as long as the container stayed
/// warm. (node's launcher had the same leak; V8's own growth hides it from a test this short,
/// so for node this checks only that the action and its children see each run's values.)
#[test]
fn a_warm_action_does_not_grow_with_each_runs_context() {
    const PYTHON: &str = "import os, subprocess\ndef main(a):\n    out = {'rss_kb': int(open('/proc/self/statm').read().split()[1]) * 4, 'id': os.environ['__OW_ACTIVATION_ID']}\n    if a.get('child'):\n        out['child'] = subprocess.run(['sh', '-c', 'echo $__OW_ACTIVATION_ID'], capture_output=True, text=True).stdout.strip()\n    return out\n";
    const NODE: &str = "function main(a) {\n  const out = {id: process.env.__OW_ACTIVATION_ID};\n  if (a.child) out.child = require('child_process').execSync('echo $__OW_ACTIVATION_ID').toString().trim();\n  return out;\n}\n";
    // (launcher, action, runs, whether the action's size is checked)
    for (launcher, code, runs, sized) in [("python", PYTHON, 3300, true), ("nodejs", NODE, 20, false)] {
        let dir = tempdir();
        let socket = dir.path().join("runtime.sock");
        let _runtime = spawn_runtime(launcher, &socket);
        let init = json!({"value": {"main": "main", "code": code}}).to_string();
        assert_eq!(exchange(&socket, &post("/init", &init)).0, 200, "{launcher}");
        let run = |n: u64, child: bool| -> Value {
            let body = json!({"value": {"child": child}, "activation_id": format!("{n:032x}"),
                "transaction_id": format!("tx{n}"), "deadline": (1_800_000_000_000 + n).to_string()});
            let (status, answer) = exchange(&socket, &post("/run", &body.to_string()));
            assert_eq!(status, 200, "{launcher}: {answer}");
            let answer: Value = serde_json::from_str(&answer).unwrap();
            assert_eq!(answer["id"], format!("{n:032x}"), "{launcher}: this run's id");
            answer
        };
        let sizes: Vec<Value> = (0..runs).map(|n| run(n, false)["rss_kb"].clone()).collect();
        if sized {
            let kb = |i: u64| sizes[i as usize].as_u64().expect("the action reports its size");
            let grown = kb(runs - 1).saturating_sub(kb(runs / 10));
            assert!(grown < 256, "{launcher}: {grown} kB more over {} runs (the leak was ~700 kB)", runs * 9 / 10);
        }
        let last = run(runs, true);
        assert_eq!(last["child"], format!("{runs:032x}"), "{launcher}: a child process sees the run's id");
    }
}

/// The process state letter from /proc (R, S, T for stopped, ...).
fn process_state(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()).unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_runtime_is_frozen_and_thawed_for_the_next_call() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("pause"), "[proxy]\npause_grace = \"50ms\"\n");
    inv.put_action("pid", python(PID_ACTION)).await;
    let (_, first) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    let pid = first["pid"].as_u64().unwrap() as u32;
    support::eventually(Duration::from_secs(10), "the idle runtime stopped", || {
        let state = process_state(pid);
        std::future::ready(if state == "T" { Ok(()) } else { Err(state) })
    })
    .await;
    let (status, second) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["pid"], first["pid"], "the same process ran the warm call after a pause");
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_and_crash_are_developer_errors_and_the_container_is_replaced() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fail"), "");
    let mut action = python(PID_ACTION);
    action["limits"] = json!({"timeout": 500});
    inv.put_action("pid", action).await;
    let pid_of = |body: &Value| body["pid"].as_u64().unwrap();

    let (_, first) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    let (status, body) = inv.invoke("pid", "blocking=true", json!({"sleep": 3})).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["response"]["statusCode"], 2);
    assert!(body["annotations"].as_array().unwrap().contains(&json!({"key": "timeout", "value": true})));
    let (_, second) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_ne!(pid_of(&first), pid_of(&second), "a timed-out container is never reused");
    assert!(!alive(pid_of(&first) as u32), "the timed-out process was removed");

    let (status, body) = inv.invoke("pid", "blocking=true", json!({"crash": true})).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["response"]["statusCode"], 2);
    let (status, third) = inv.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200);
    assert_ne!(pid_of(&second), pid_of(&third), "a crashed container is never reused");
}

#[tokio::test(flavor = "multi_thread")]
async fn allocating_past_the_memory_limit_is_a_developer_error() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("oom"), "");
    if inv.stderr().contains("NOT enforced") {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and no memory limit can be enforced here: {}",
            inv.stderr()
        );
        eprintln!("SKIPPED: no memory limit can be enforced on this machine (this fails under CI=true)");
        return;
    }
    let hog = "def main(a):\n    blocks = [bytearray(64 * 1024 * 1024) for _ in range(16)]\n    return {'held_mb': 64 * len(blocks)}\n";
    let mut action = python(hog);
    action["limits"] = json!({"memory": 128});
    inv.put_action("hog", action).await;
    let (status, body) = inv.invoke("hog", "blocking=true", json!({})).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["response"]["statusCode"], 2, "{body}");
    let error = body["response"]["result"]["error"].as_str().unwrap();
    assert!(error.contains("memory"), "the error names the memory limit: {error}");
    inv.put_action("fine", python("def main(a):\n    return {'ok': True}\n")).await;
    let (status, _) = inv.invoke("fine", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "the invoker still runs actions after an OOM kill");
}

/// Warms a python and a node container and returns every process behind them.
async fn warm_processes(inv: &Invoker) -> Vec<u32> {
    inv.put_action("pid", python(PID_ACTION)).await;
    inv.put_action(
        "jspid",
        json!({"exec": {"kind": "nodejs:20", "code": "function main() { return {pid: process.pid, runtime: process.ppid}; }"}}),
    )
    .await;
    let mut pids = Vec::new();
    for name in ["pid", "jspid"] {
        let (status, body) = inv.invoke(name, "blocking=true&result=true", json!({})).await;
        assert_eq!(status, 200, "{body}");
        pids.push(body["pid"].as_u64().unwrap() as u32);
        pids.push(body["runtime"].as_u64().unwrap() as u32);
    }
    assert!(pids.iter().all(|&p| alive(p)));
    pids
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_and_leaves_no_process() {
    let dir = tempdir();
    let mut inv = Invoker::start(dir.path(), &id("term"), "");
    let pids = warm_processes(&inv).await;
    inv.signal(Signal::SIGTERM);
    let status = inv.wait_exit(Duration::from_secs(40));
    assert!(status.success(), "{status}: {}", inv.stderr());
    assert_eq!(wait_gone(&pids, Duration::from_secs(2)), Vec::<u32>::new(), "processes left after SIGTERM");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_and_restart_leave_no_process_of_this_invoker_only() {
    let dir = tempdir();
    let other_dir = tempdir();
    let other = Invoker::start(other_dir.path(), &id("other"), "");
    let other_pids = warm_processes(&other).await;

    let id = id("kill");
    let mut inv = Invoker::start(dir.path(), &id, "");
    let pids = warm_processes(&inv).await;
    inv.signal(Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    let restarted = Invoker::start(dir.path(), &id, "");
    assert_eq!(wait_gone(&pids, Duration::from_secs(5)), Vec::<u32>::new(), "processes left after SIGKILL + restart");
    assert!(other_pids.iter().all(|&p| alive(p)), "another invoker's processes were touched");
    let (status, _) = restarted.invoke("pid", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200, "the restarted invoker runs actions");
}

/// Spawns `sleep` in its own process group with `INVOKER_ID` set, as a runtime would be.
fn stray(invoker_id: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt as _;
    std::process::Command::new("sleep").arg("120").env("INVOKER_ID", invoker_id).process_group(0).spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_kills_the_recorded_processes_of_its_own_invoker_id_only() {
    // Runtimes exit on their own when their invoker dies; this covers the ones that could not
    // (ignoring signals, or wedged): the restart kills what the records of this id name.
    let dir = tempdir();
    let id = id("records");
    let records = dir.path().join("data/processes").join(&id);
    std::fs::create_dir_all(&records).unwrap();
    let mut ours = stray(&id);
    let mut foreign = stray("someone-else");
    std::fs::write(records.join("1.pid"), format!("{}\n", ours.id())).unwrap();
    std::fs::write(records.join("2.pid"), format!("{}\n", foreign.id())).unwrap();
    let _inv = Invoker::start(dir.path(), &id, "");
    support::eventually(Duration::from_secs(10), "the earlier run's process killed", || {
        std::future::ready(support::done(ours.try_wait().unwrap().is_some()))
    })
    .await;
    assert!(foreign.try_wait().unwrap().is_none(), "a process that is not this invoker's was spared");
    foreign.kill().unwrap();
    foreign.wait().unwrap();
    assert!(!records.join("1.pid").exists() && !records.join("2.pid").exists(), "the records were cleared");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prewarmed_python_process_is_initialised_for_the_first_action_that_needs_it() {
    let dir = tempdir();
    let config = "[[pool.prewarm]]\nkind = \"python:3\"\nmemory_mb = 256\ncount = 1\n";
    let inv = Invoker::start(dir.path(), &id("prewarm"), config);
    let prewarm_pid = support::eventually(Duration::from_secs(20), "a prewarm container", || async {
        let (_, pool) = inv.get_url("/v1/pool").await;
        let ready = pool["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["state"] == "prewarm").map(|c| c["id"].as_u64().unwrap()));
        ready.ok_or_else(|| pool.to_string())
    })
    .await;
    // The stem's memory, where an operator looks: the pool's view and the metrics.
    let (_, pool) = inv.get_url("/v1/pool").await;
    assert_eq!((pool["prewarm"].as_u64(), pool["prewarm_mb"].as_u64()), (Some(1), Some(256)), "{pool}");
    let metrics = support::eventually(Duration::from_secs(10), "the stem in the metrics", || async {
        let (_, _, body) = inv.send("GET", "/metrics", &inv.admin, &[], Vec::new()).await;
        let text = String::from_utf8_lossy(&body).to_string();
        let holds =
            text.contains("invoker_prewarm_memory_mb 256") && text.contains("invoker_containers{state=\"prewarm\"} 1");
        if holds {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    assert!(metrics.contains("# HELP invoker_prewarm_memory_mb"), "{metrics}");
    inv.put_action("pid", python(PID_ACTION)).await;
    let (status, record) = inv.invoke("pid", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    let annotations = record["annotations"].as_array().unwrap();
    let start_kind = annotations.iter().find(|a| a["key"] == "startKind").map(|a| a["value"].clone());
    assert_eq!(start_kind, Some(json!("prewarm")), "{record}");
    let (_, pool) = inv.get_url("/v1/pool").await;
    let adopted = pool["containers"].as_array().unwrap().iter().find(|c| c["id"] == prewarm_pid).cloned();
    assert_eq!(adopted.map(|c| c["action"].clone()), Some(json!("guest/pid")), "{pool}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_action_sees_the_run_context_of_the_runtime_protocol() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("context"), "");
    let code = "import os\ndef main(a):\n    return {k: os.environ.get('__OW_' + k.upper()) for k in \
                ['namespace', 'action_name', 'action_version', 'activation_id', 'transaction_id', 'deadline', 'api_key']} | {'a': a}\n";
    let mut action = python(code);
    action["annotations"] = json!([{"key": "provide-api-key", "value": true}]);
    inv.put_action("ctx", action).await;
    let (status, record) = inv.invoke("ctx", "blocking=true", json!({"x": [1, {"y": "z"}]})).await;
    assert_eq!(status, 200, "{record}");
    let seen = &record["response"]["result"];
    assert_eq!(seen["a"], json!({"x": [1, {"y": "z"}]}), "the parameters, whole");
    assert_eq!(seen["namespace"], "guest");
    assert_eq!(seen["action_name"], "/guest/ctx");
    assert_eq!(seen["action_version"], "0.0.1");
    assert_eq!(seen["activation_id"], record["activationId"]);
    assert!(seen["transaction_id"].as_str().is_some_and(|t| !t.is_empty()), "{seen}");
    let deadline: u64 = seen["deadline"].as_str().unwrap().parse().unwrap();
    let start = record["start"].as_u64().unwrap();
    assert!(deadline >= start + 59_000 && deadline <= start + 61_000, "the default 60 s timeout: {seen} {record}");
    assert!(seen["api_key"].as_str().unwrap().starts_with("23bc46b1-"), "provide-api-key: {seen}");
}

/// A kind whose runtime is not ours: `tests/runtimes/listen_8080.py`, which takes no
/// arguments, ignores the invoker's environment and listens on `:8080` only.
fn foreign_kind() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/runtimes/listen_8080.py");
    format!(
        "[proxy]\npause_grace = \"50ms\"\n[kinds.\"python:ow\"]\ncommand = [\"/usr/bin/python3\", \"{script}\"]\n\
         network = \"isolated\"\npaths = [\"{script}\"]\nenv = {{ OW_SEEN = \"{{port}} {{work_dir}}\" }}\n"
    )
}

const FOREIGN_ACTION: &str = "import os, time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    print('ow says', a.get('name'))\n    return {'pid': os.getpid(), 'uid': os.getuid(), 'cwd': os.getcwd(), 'seen': os.environ.get('OW_SEEN'), 'net': os.readlink('/proc/self/ns/net')}\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_that_knows_nothing_of_the_invoker_runs_on_8080_of_its_own_namespace() {
    let dir = tempdir();
    let mut inv = Invoker::start(dir.path(), &id("foreign"), &foreign_kind());
    let listened_before = host_listens_on(8080);
    inv.put_action("ow", json!({"exec": {"kind": "python:ow", "code": FOREIGN_ACTION}})).await;

    // Two runs at once: two containers (one run at a time each), both on :8080.
    let slow = json!({"name": "you", "sleep": 0.5});
    let ((s1, a), (s2, b)) =
        tokio::join!(inv.invoke("ow", "blocking=true", slow.clone()), inv.invoke("ow", "blocking=true", slow));
    assert_eq!((s1, s2), (200, 200), "{a}\n{b}");
    let (a, b) = (&a["response"]["result"], &b["response"]["result"]);
    assert_ne!(a["pid"], b["pid"], "two containers");
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap().display().to_string();
    assert!(a["net"] != b["net"] && a["net"] != json!(host_net) && b["net"] != json!(host_net), "{a} {b} {host_net}");
    assert!(a["uid"].as_u64().unwrap() >= 100_000, "its own unprivileged uid: {a}");
    let work = a["cwd"].as_str().unwrap();
    assert!(work.ends_with("/work"), "its own working directory: {a}");
    assert_eq!(a["seen"], json!(format!("8080 {work}")), "the kind's environment, substituted");
    assert_eq!(host_listens_on(8080), listened_before, "nothing of it listens on the host");

    // Logs in the record, and a pause and resume between two runs of the same process.
    let pid = a["pid"].as_u64().unwrap() as u32;
    support::eventually(Duration::from_secs(10), "the idle runtime stopped", || {
        let state = process_state(pid);
        std::future::ready(if state == "T" { Ok(()) } else { Err(state) })
    })
    .await;
    let (status, record) = inv.invoke("ow", "blocking=true", json!({"name": "again"})).await;
    assert_eq!(status, 200, "{record}");
    let ran_in = record["response"]["result"]["pid"].as_u64().unwrap() as u32;
    assert!([pid, b["pid"].as_u64().unwrap() as u32].contains(&ran_in), "a warm container ran it: {record}");
    let logs = record["logs"].as_array().unwrap();
    assert!(logs.iter().any(|l| l.as_str().unwrap().ends_with("stdout: ow says again")), "{logs:?}");
    assert!(!logs.iter().any(|l| l.as_str().unwrap().contains("XXX_THE_END")), "{logs:?}");

    // The invoker dies without a word: nothing of the runtimes outlives it, with no restart.
    let pids = [pid, b["pid"].as_u64().unwrap() as u32];
    inv.signal(Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    assert_eq!(wait_gone(&pids, Duration::from_secs(10)), Vec::<u32>::new(), "runtimes left after SIGKILL");
}

/// The invoker's own disk fills up (its data_dir on a small filesystem, most of it taken by a
/// ballast file, the rest by a stream of activations with large results): new work gets 503
/// with Retry-After and a reason naming the disk, never a 500; `/health` says unhealthy with
/// the reason; every activation that was accepted has its record. Once the ballast goes, the
/// same invoker takes work again, actions and activations, without a restart.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
async fn a_full_disk_is_answered_503_nothing_accepted_is_lost_and_the_invoker_recovers_by_itself() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let Some(disk) = SmallDisk::mount(&data, 32) else { return };
    // A reserve for endings that fits the small disk (the default is 32 MB).
    let inv = Invoker::start(dir.path(), &id("diskfull"), "[store]\nend_reserve_mb = 4\n");
    inv.put_action("big", python("def main(a):\n    return {'data': 'x' * 200000}\n")).await;
    let (status, body) = inv.invoke("big", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{body}");
    // All but 4 MB taken: about ten records' worth (each is written to the journal, then redb).
    let ballast = disk.fill(4 << 20);

    let http = reqwest::Client::new();
    let (user, pass) = support::GUEST.split_once(':').unwrap();
    let url = format!("{}?blocking=true", inv.url("actions/big"));
    let mut accepted = Vec::new();
    let mut refused = 0;
    for round in 0..20 {
        let calls = (0..4).map(|_| http.post(&url).basic_auth(user, Some(pass)).json(&json!({})).send());
        for response in futures_util::future::join_all(calls).await {
            let response = response.unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").is_some();
            let body: Value = response.json().await.unwrap();
            match status {
                200 | 202 | 502 => accepted.push(body["activationId"].as_str().unwrap().to_string()),
                503 => {
                    let reason = body["error"].as_str().unwrap_or_default();
                    assert!(reason.contains("is full") && reason.contains(&data.display().to_string()), "{body}");
                    assert!(retry_after, "503 says when to come back");
                    refused += 1;
                }
                _ => panic!("round {round}: {status} {body}"),
            }
        }
    }
    assert!(refused > 0, "the disk filled up: {} accepted", accepted.len());
    let (_, health) = inv.get_url("/health").await;
    assert_eq!(health["status"], "unhealthy", "{health}");
    assert!(health["store"].as_str().unwrap_or_default().contains("is full"), "{health}");
    let r = http
        .put(inv.url("actions/other"))
        .basic_auth(user, Some(pass))
        .json(&python("def main(a):\n    return {'ok': True}\n"))
        .send()
        .await
        .unwrap();
    // redb may still hold free pages of its own for a small write; if not, a 503 as above.
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert!(
        status == 200 || status == 503 && text.contains("is full"),
        "a PUT while the disk is full: {status} {text}"
    );

    std::fs::remove_file(&ballast).unwrap();
    support::eventually(Duration::from_secs(30), "the invoker healthy again", || async {
        let (_, health) = inv.get_url("/health").await;
        if health["status"] == "healthy" {
            Ok(())
        } else {
            Err(health.to_string())
        }
    })
    .await;
    inv.put_action("after", python("def main(a):\n    return {'ok': True}\n")).await;
    let (status, body) = inv.invoke("after", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, body), (200, json!({"ok": true})), "no restart needed");
    for id in &accepted {
        let record = inv.record(id).await;
        assert_eq!(record["response"]["result"]["data"].as_str().map(str::len), Some(200000), "{id}");
    }
    assert!(!inv.stderr().contains("panicked"), "{}", inv.stderr());
}

/// Issue 59: the binary runs anywhere. Started outside a checkout with no `--config` (as after
/// `cargo install`), it takes the default compiled into it, keeps its data under the user's
/// data directory, and serves a first action.
#[tokio::test(flavor = "multi_thread")]
async fn started_outside_a_checkout_it_runs_on_the_embedded_default() {
    use std::io::BufRead;
    let dir = tempdir();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_invoker"))
        .args(["--listen", "127.0.0.1:0", "--invoker-id", &id("anywhere")])
        .current_dir(dir.path())
        .env("HOME", &home)
        .env_remove("XDG_DATA_HOME")
        .env_remove("INVOKER_CONFIG")
        .env_remove("INVOKER_DATA_DIR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30));
    let answer = match &addr {
        Ok(addr) => {
            let http = reqwest::Client::new();
            let (user, pass) = support::GUEST.split_once(':').unwrap();
            let action = python("def main(a):\n    return {'hello': a.get('name')}\n");
            let put = http
                .put(format!("http://{addr}/api/v1/namespaces/_/actions/hello"))
                .basic_auth(user, Some(pass))
                .json(&action)
                .send()
                .await
                .unwrap();
            assert_eq!(put.status(), 200);
            let r = http
                .post(format!("http://{addr}/api/v1/namespaces/_/actions/hello?blocking=true&result=true"))
                .basic_auth(user, Some(pass))
                .json(&json!({ "name": "anywhere" }))
                .send()
                .await
                .unwrap();
            Some(r.json::<Value>().await.unwrap())
        }
        Err(_) => None,
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let _ = child.wait();
    assert!(addr.is_ok(), "it did not start outside the checkout");
    assert_eq!(answer, Some(json!({ "hello": "anywhere" })));
    assert!(home.join(".local/share/invoker/data").is_dir(), "its data under the user's data directory");
    assert!(!dir.path().join("data").exists(), "nothing in the directory it was started from");
}

/// Issue 61: a starting container is counted once. The node holds two 256 MB containers; one
/// starts and is not ready for minutes (a kind whose command only sleeps), and a call of
/// another action must start beside it. Before, the node's stats showed the starting container
/// while the pool also held it reserved, so the node looked full and the call waited for room
/// until its deadline (503).
#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_fits_beside_a_starting_container_does_not_wait_for_its_start() {
    let dir = tempdir();
    let extra = "[factory.process]\nuser_memory_mb = 512\n[pool]\nwait_deadline = \"5s\"\n\
                 [kinds.\"python:sleepy\"]\ncommand = [\"/bin/sh\", \"-c\", \"sleep 600\", \"sh\", \"{listen}\"]\n\
                 zygote = false\nstart_timeout = \"10m\"\n";
    let inv = Invoker::start(dir.path(), &id("starting"), extra);
    let sleepy =
        json!({"exec": {"kind": "python:sleepy", "code": "def main(a):\n    return a\n"}, "limits": {"memory": 256}});
    inv.put_action("sleepy", sleepy).await;
    let mut quick = python("def main(a):\n    return {'quick': True}\n");
    quick["limits"] = json!({"memory": 256});
    inv.put_action("quick", quick).await;

    let (status, body) = inv.invoke("sleepy", "blocking=false", json!({})).await;
    assert_eq!(status, 202, "{body}");
    let sleepy_id = body["activationId"].as_str().unwrap().to_string();
    support::eventually(Duration::from_secs(10), "the sleepy container starting", || {
        let inv = &inv;
        async move {
            let (_, pool) = inv.get_url("/v1/pool").await;
            support::done(pool["starting"] == 1)
        }
    })
    .await;

    let (status, body) = inv.invoke("quick", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, body), (200, json!({"quick": true})));
    let (_, pool) = inv.get_url("/v1/pool").await;
    assert_eq!(pool["starting"], 1, "answered while the other container still starts: {pool}");
    let (status, _) = inv.get(&format!("activations/{sleepy_id}")).await;
    assert_eq!(status, 404, "the sleepy call has no record yet");
}

/// The parent of process `pid`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// The pids whose command line holds every one of `words`.
fn processes_with(words: &[&str]) -> Vec<i32> {
    let pids = std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok());
    pids.filter(|pid: &i32| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        words.iter().all(|w| text.contains(w))
    })
    .collect()
}

/// Each runtime is forked by the invoker's sandbox server (its parent, not the invoker; its
/// command line the server's, which names the invoker's directory); a server killed takes its
/// runtimes with it, is started again at the next cold start, and every call still succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn runtimes_are_forked_by_the_sandbox_server_which_comes_back_if_killed() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("forks"), "");
    let pid_dir = dir.path().join("data").join("processes").join(&inv.invoker_id);
    let invoker = inv.child.id() as i32;
    // The server is the invoker's child; the runtimes it forked carry its command line.
    let named = || processes_with(&["sandbox-server", "--pid-dir", pid_dir.to_str().unwrap()]);
    let servers = || named().into_iter().filter(|&p| parent_of(p) == Some(invoker)).collect::<Vec<_>>();
    inv.put_action("first", python(PID_ACTION)).await;
    let (status, first) = inv.invoke("first", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200, "{first}");
    let runtime = first["runtime"].as_i64().unwrap() as i32;
    let server = servers();
    assert_eq!(server.len(), 1, "one server: {:?}", named());
    assert_eq!(parent_of(runtime), Some(server[0]), "the runtime's parent is the server");
    assert!(named().contains(&runtime), "the runtime's command line names the invoker's directory");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(server[0]), Signal::SIGKILL).unwrap();
    support::eventually(Duration::from_secs(10), "the server is gone", || async {
        let left = servers();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    inv.put_action("second", python(PID_ACTION)).await;
    let (status, second) = inv.invoke("second", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200, "a cold start after the server was killed: {second}");
    assert_eq!(servers().len(), 1, "started again");
    // The runtimes it forked went with it (their parent gone, as with the invoker's): the
    // action's next call starts another.
    let (status, again) = inv.invoke("first", "blocking=true&result=true", json!({})).await;
    assert_eq!(status, 200, "{again}");
    assert_ne!(again["runtime"], first["runtime"], "{again}");
}
