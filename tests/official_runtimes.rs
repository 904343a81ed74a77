//! OpenWhisk's runtimes as OpenWhisk runs them, end to end with the process factory.
//!
//! OpenWhisk's own runtimes come from GitHub, which CI cannot reach, so the runtime that stands
//! for them is written here (`tests/runtimes/ow_nodejs.js`): a node HTTP server that closes
//! idle kept-alive connections as node's does, takes overlapping runs only with
//! `__OW_ALLOW_CONCURRENT`, writes its sentinels untagged, and can stream an answer that never
//! ends. The answers our own kinds must give are read from OpenWhisk's launchers (each case
//! says where).

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::{python, Invoker};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-ow-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

fn js(code: &str) -> Value {
    json!({ "exec": { "kind": "nodejs:20", "code": code } })
}

/// The `nodejs:ow` kind: the test runtime on :8080 of its own network namespace, as OpenWhisk's
/// image runs `app.js`; `env` adds to its environment.
fn ow_node(pause_grace: &str, env: &str, max_concurrency: u32) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/runtimes/ow_nodejs.js");
    format!(
        "[proxy]\npause_grace = \"{pause_grace}\"\n[kinds.\"nodejs:ow\"]\ncommand = [\"/usr/bin/node\", \"{script}\"]\n\
         network = \"isolated\"\npaths = [\"{script}\"]\nenv = {{ {env} }}\nmax_concurrency = {max_concurrency}\n"
    )
}

fn ow_js(code: &str) -> Value {
    json!({ "exec": { "kind": "nodejs:ow", "code": code } })
}

fn annotation<'a>(record: &'a Value, key: &str) -> &'a Value {
    let annotations = record["annotations"].as_array().expect("annotations");
    annotations.iter().find(|a| a["key"] == key).map(|a| &a["value"]).unwrap_or(&Value::Null)
}

fn logs(record: &Value) -> Vec<String> {
    record["logs"].as_array().expect("logs").iter().map(|l| l.as_str().unwrap().to_string()).collect()
}

/// Item 1: node closes a kept-alive connection idle 300 ms here (5 s by default), also when it
/// was frozen past that: warm calls after such idles reach the same container, whether it was
/// paused meanwhile or not, and after an idle longer than the client keeps connections too.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_call_after_the_runtime_closed_its_idle_connection_reaches_the_same_container() {
    for (pause_grace, label) in [("60s", "not paused"), ("50ms", "paused")] {
        let dir = tempdir();
        let inv = Invoker::start(dir.path(), &id("idle"), &ow_node(pause_grace, "KEEP_ALIVE_MS = \"300\"", 1));
        inv.put_action("pid", ow_js("function main(a) { return { pid: process.pid }; }")).await;
        let (status, first) = inv.invoke("pid", "blocking=true", json!({})).await;
        assert_eq!(status, 200, "{label}: {first}\n{}", inv.stderr());
        let pid = &first["response"]["result"]["pid"];
        for idle_ms in [700, 700, 1500, 700] {
            // Idle time between calls: what the keep-alive and the pause see.
            tokio::time::sleep(Duration::from_millis(idle_ms)).await;
            let (status, body) = inv.invoke("pid", "blocking=true", json!({})).await;
            assert_eq!(status, 200, "{label}, after {idle_ms} ms idle: {body}\n{}", inv.stderr());
            assert_eq!(&body["response"]["result"]["pid"], pid, "{label}: the same container, kept");
            assert_eq!(annotation(&body, "startKind"), "warm", "{label}: {body}");
        }
        assert!(!inv.stderr().contains("container discarded"), "{label}: {}", inv.stderr());
    }
}

const OVERLAPPING: &str = "import os, sys, time\ndef main(a):\n    me = os.environ['__OW_ACTIVATION_ID']\n    print('start', me)\n    time.sleep(0.5)\n    print('end', me, file=sys.stderr)\n    return {'id': me}\n";

const OVERLAPPING_JS: &str = "async function main(a) { const me = process.env.__OW_ACTIVATION_ID; console.log('start', me); await new Promise((r) => setTimeout(r, 500)); console.error('end', me); return { id: me }; }";

/// Four overlapping runs at once, `rounds` times; the records.
async fn overlapping_rounds(inv: &Invoker, name: &str, rounds: usize) -> Vec<Value> {
    let mut records = Vec::new();
    for _ in 0..rounds {
        let calls = (0..4).map(|_| inv.invoke(name, "blocking=true", json!({})));
        for (status, body) in futures_util::future::join_all(calls).await {
            assert_eq!(status, 200, "{body}\n{}", inv.stderr());
            records.push(body);
        }
    }
    records
}

/// Item 2, our runtime: overlapping runs on one container each get exactly their own lines
/// (their activation id starts each line, taken off in the record), and no sentinel text.
#[tokio::test(flavor = "multi_thread")]
async fn overlapping_runs_on_our_runtime_each_get_exactly_their_own_lines() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("overlap"), "");
    let mut action = python(OVERLAPPING);
    action["limits"] = json!({"concurrency": 4, "timeout": 10000, "memory": 256});
    inv.put_action("overlap", action).await;
    let mut js_action = js(OVERLAPPING_JS);
    js_action["limits"] = json!({"concurrency": 4, "timeout": 10000, "memory": 256});
    inv.put_action("overlap-js", js_action).await;
    for name in ["overlap", "overlap-js"] {
        let records = overlapping_rounds(&inv, name, 3).await;
        let containers: std::collections::HashSet<String> =
            records.iter().map(|r| annotation(r, "containerId").to_string()).collect();
        assert!(containers.len() < records.len(), "{name}: runs overlapped on a container: {containers:?}");
        for record in &records {
            let me = record["activationId"].as_str().unwrap();
            let lines = logs(record);
            assert_eq!(lines.len(), 2, "{name}: {me}: {lines:?}");
            assert!(lines[0].ends_with(&format!("stdout: start {me}")), "{name}: {me}: {lines:?}");
            assert!(lines[1].ends_with(&format!("stderr: end {me}")), "{name}: {me}: {lines:?}");
        }
    }
}

/// Item 2, a runtime that gives no way to tell whose a line is (`app.js` with
/// `__OW_ALLOW_CONCURRENT`): each run's record holds at least its own lines (and those of the
/// runs it overlapped), never a sentinel.
#[tokio::test(flavor = "multi_thread")]
async fn overlapping_runs_on_a_runtime_that_tags_nothing_keep_their_own_lines() {
    let dir = tempdir();
    let config = ow_node("60s", "__OW_ALLOW_CONCURRENT = \"true\"", 4);
    let inv = Invoker::start(dir.path(), &id("overlap-ow"), &config);
    let mut action = ow_js(OVERLAPPING_JS);
    action["limits"] = json!({"concurrency": 4, "timeout": 10000, "memory": 256});
    inv.put_action("overlap", action).await;
    for record in overlapping_rounds(&inv, "overlap", 3).await {
        let me = record["activationId"].as_str().unwrap();
        let lines = logs(&record);
        assert!(lines.iter().any(|l| l.ends_with(&format!("stdout: start {me}"))), "{me}: {lines:?}");
        assert!(lines.iter().any(|l| l.ends_with(&format!("stderr: end {me}"))), "{me}: {lines:?}");
        assert!(!lines.iter().any(|l| l.contains("XXX_THE_END")), "{me}: {lines:?}");
    }
}

/// Item 3: output without a final newline, then the runtime's sentinel on the same line: the
/// record holds the output alone, and the next call's logs are its own.
#[tokio::test(flavor = "multi_thread")]
async fn output_without_a_final_newline_ends_at_the_sentinel() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("newline"), "");
    inv.put_action("py", python("import sys\ndef main(a):\n    sys.stdout.write('x')\n    return {}\n")).await;
    inv.put_action("js", js("function main(a) { process.stdout.write('y'); return {}; }")).await;
    for (name, text) in [("py", "x"), ("js", "y")] {
        for call in 0..2 {
            let (status, record) = inv.invoke(name, "blocking=true", json!({})).await;
            assert_eq!(status, 200, "{name}: {record}");
            let lines = logs(&record);
            assert_eq!(lines.len(), 1, "{name}, call {call}: {lines:?}");
            assert!(lines[0].ends_with(&format!("stdout: {text}")), "{name}, call {call}: {lines:?}");
        }
    }
}

/// Issue 57: on processes, a run's record is whole with its answer (stored before it, so a
/// `GET` right after finds it), and a line an action writes after its answer, from a thread
/// it left behind, is the next run's: never its own, never lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_line_written_after_the_answer_is_the_next_runs_and_the_record_is_there_with_the_answer() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("late"), "");
    let code = "import os, threading, time
def main(a):
    me = os.environ['__OW_ACTIVATION_ID']
    print('own', me)
    if a.get('late'):
        threading.Timer(0.2, lambda: print('late', me, flush=True)).start()
    return {}
";
    inv.put_action("py", python(code)).await;
    let (status, first) = inv.invoke("py", "blocking=true", json!({"late": true})).await;
    assert_eq!(status, 200, "{first}");
    let me = first["activationId"].as_str().unwrap().to_string();
    assert_eq!(logs(&first).len(), 1, "its own line, in the answer: {first}");
    let (status, stored) = inv.get(&format!("activations/{me}")).await;
    assert_eq!((status, &stored["logs"]), (200, &first["logs"]), "stored before the answer went");
    let late = format!("stdout: late {me}");
    support::eventually(Duration::from_secs(10), "the late line in a later run's record", || async {
        let (_, next) = inv.invoke("py", "blocking=true", json!({})).await;
        let lines = logs(&next);
        let own = format!("stdout: own {}", next["activationId"].as_str().unwrap());
        assert!(lines.iter().any(|l| l.ends_with(&own)), "{lines:?}");
        if lines.iter().any(|l| l.ends_with(&late)) {
            Ok(())
        } else {
            Err(format!("{lines:?}"))
        }
    })
    .await;
    let whole = inv.record(&me).await;
    assert!(!whole["logs"].to_string().contains("late"), "never its own: {whole}");
}

/// Item 4: an action stored when its kind took 4 runs at once still gets one at a time once
/// the kind's `max_concurrency` is 1 (the runtime answers 403 to an overlapping run, as
/// `app.js` without `__OW_ALLOW_CONCURRENT`); a zip action on a kind that runs none is refused
/// at `PUT`.
#[tokio::test(flavor = "multi_thread")]
async fn a_lowered_max_concurrency_holds_at_run_time_and_zips_are_refused_where_they_cannot_run() {
    let dir = tempdir();
    let slow = "async function main(a) { await new Promise((r) => setTimeout(r, 300)); return { ok: true }; }";
    {
        let inv = Invoker::start(dir.path(), &id("lowered"), &ow_node("60s", "", 4));
        let mut action = ow_js(slow);
        action["limits"] = json!({"concurrency": 4, "timeout": 10000, "memory": 256});
        inv.put_action("slow", action).await;
    }
    let inv = Invoker::start(dir.path(), &id("lowered"), &ow_node("60s", "", 1));
    let calls = (0..4).map(|_| inv.invoke("slow", "blocking=true", json!({})));
    for (status, body) in futures_util::future::join_all(calls).await {
        assert_eq!((status, &body["response"]["result"]), (200, &json!({"ok": true})), "{body}");
    }

    // An empty zip file: "PK\x05\x06" and 18 zero bytes.
    let zip = "UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA==";
    let url = inv.url("actions/zipped");
    let (user, pass) = support::GUEST.split_once(':').unwrap();
    let body = json!({"exec": {"kind": "nodejs:20", "code": zip, "binary": true}});
    let r = reqwest::Client::new().put(url).basic_auth(user, Some(pass)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("exec.binary") && text.contains("nodejs:20"), "{text}");
}

/// Item 5: a runtime that streams an answer without end: the invoker reads the payload limit
/// and a little more, then answers a developer error naming the limit; its memory stays small.
#[tokio::test(flavor = "multi_thread")]
async fn an_endless_answer_is_cut_at_the_payload_limit() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("endless"), &ow_node("60s", "", 1));
    let mut action = ow_js("function main(a) { return { stream_forever: true }; }");
    action["limits"] = json!({"timeout": 5000, "memory": 256});
    inv.put_action("endless", action).await;
    for _ in 0..2 {
        let (status, body) = inv.invoke("endless", "blocking=true", json!({})).await;
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["response"]["statusCode"], 2, "a developer error: {body}");
        let error = body["response"]["result"]["error"].as_str().unwrap();
        assert!(error.contains("exceeded the allowed length") && error.contains("1048576 bytes"), "{error}");
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", inv.child.id())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(peak_kb < 200 * 1024, "the invoker's peak memory: {peak_kb} kB");
}

/// Item 6: the same action on OpenWhisk's runtime and on ours gives the same answer and the
/// same error class. Each expected answer is read from OpenWhisk's code, as named.
#[tokio::test(flavor = "multi_thread")]
async fn our_runtimes_answer_as_openwhisks_do() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("answers"), "");
    // (name, action, HTTP status, statusCode, result)
    let cases: Vec<(&str, Value, u16, u64, Value)> = vec![
        // openwhisk-runtime-nodejs, core/nodejsActionBase/runner.js `run`: a throw rejects;
        // src/service.js `runCode`: 502 "An error has occurred: " + the error.
        (
            "js-throw",
            js("function main(a) { throw new Error('boom'); }"),
            502,
            2,
            json!({"error": "An error has occurred: Error: boom"}),
        ),
        // runner.js `finalizeResult`: a rejection is {error: serializeError(reason)} (the npm
        // package serialize-error 9.1.0: own enumerable properties), an application error.
        (
            "js-reject",
            js("function main(a) { return Promise.reject({ message: 'm', code: 42 }); }"),
            502,
            1,
            json!({"error": {"message": "m", "code": 42}}),
        ),
        // runner.js `finalizeResult`: undefined resolves to {}.
        ("js-undefined", js("function main(a) { return undefined; }"), 200, 0, json!({})),
        // service.js `runCode`: a result that is not an object is 502 "The action did not
        // return a dictionary."
        (
            "js-number",
            js("function main(a) { return 5; }"),
            502,
            2,
            json!({"error": "The action did not return a dictionary."}),
        ),
        // The whole node process exits: the connection drops, and OpenWhisk's invoker answers
        // (ActivationResponse, a connection error) "...did not produce a valid response and
        // exited unexpectedly."
        (
            "js-exit",
            js("function main(a) { process.exit(3); }"),
            502,
            2,
            json!({"error": "The action did not produce a valid response and exited unexpectedly."}),
        ),
        // openwhisk-runtime-python, core/python3Action/lib/launcher.py catches Exception only:
        // SystemExit ends the launcher, and the Go proxy (openwhisk/runHandler.go) answers 400
        // "command exited".
        ("py-exit", python("import sys\ndef main(a):\n    sys.exit(3)\n"), 502, 2, json!({"error": "command exited"})),
        // launcher.py: an exception is {"error": str(ex)}, an application error.
        ("py-raise", python("def main(a):\n    raise ValueError('boom')\n"), 502, 1, json!({"error": "boom"})),
        // core/nodejs20Action/Dockerfile sets no __OW_EXECUTION_ENV (the Go proxy of the python
        // images sets it from OW_EXECUTION_ENV, which the image names).
        (
            "js-env",
            js("function main(a) { return { env: process.env.__OW_EXECUTION_ENV === undefined ? null : 'set' }; }"),
            200,
            0,
            json!({"env": null}),
        ),
    ];
    for (name, action, status, code, result) in cases {
        inv.put_action(name, action).await;
        let (got, body) = inv.invoke(name, "blocking=true", json!({})).await;
        assert_eq!(got, status, "{name}: {body}");
        assert_eq!(body["response"]["statusCode"], code, "{name}: {body}");
        assert_eq!(body["response"]["result"], result, "{name}: {body}");
    }
}

/// Item 7: a container given up says why in the invoker's log: the container, the action and
/// the reason (once per reason and action per second: `proxy::discard`'s unit test).
#[tokio::test(flavor = "multi_thread")]
async fn a_discarded_container_is_logged_with_its_action_and_reason() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("discard"), "");
    let mut action = python("import time\ndef main(a):\n    time.sleep(5)\n    return {}\n");
    action["limits"] = json!({"timeout": 300, "memory": 256});
    inv.put_action("sleepy", action).await;
    for _ in 0..3 {
        let (status, body) = inv.invoke("sleepy", "blocking=true", json!({})).await;
        assert_eq!(status, 502, "{body}");
    }
    let log = inv.stderr();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("container discarded")).collect();
    assert!(!lines.is_empty(), "{log}");
    assert!(lines.iter().all(|l| l.contains("guest/sleepy") && l.contains("timeout")), "{lines:?}");
}

/// Item 8: a kind's `paths` entry `{ host, at }` shows a host path at another path inside the
/// container (OpenWhisk's python `compile` runs the image's `/usr/local/bin/python`): one in a
/// directory of its own, one in a system directory (bound read-only from the host) where the
/// host has nothing at that path, which stays so on the host.
#[tokio::test(flavor = "multi_thread")]
async fn a_kind_path_is_shown_at_another_path_inside_the_container() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/runtimes/listen_8080.py");
    let python_at = format!("/usr/local/bin/python-invoker-test-{}", std::process::id());
    assert!(!std::path::Path::new(&python_at).exists());
    let config = format!(
        "[kinds.\"python:ow\"]\ncommand = [\"{python_at}\", \"/opt/ow/runtime.py\"]\nnetwork = \"isolated\"\n\
         paths = [{{ host = \"{script}\", at = \"/opt/ow/runtime.py\" }}, {{ host = \"/usr/bin/python3\", at = \"{python_at}\" }}]\n"
    );
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("paths-at"), &config);
    let code = "import os, sys\ndef main(a):\n    return {'exe': sys.executable, 'local': sorted(os.listdir('/usr/local/bin')), 'runtime': os.path.exists('/opt/ow/runtime.py')}\n";
    inv.put_action("at", json!({"exec": {"kind": "python:ow", "code": code}})).await;
    let (status, body) = inv.invoke("at", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{body}\n{}", inv.stderr());
    let result = &body["response"]["result"];
    assert_eq!(result["exe"], json!(python_at), "{result}");
    assert_eq!(result["runtime"], true, "{result}");
    let mut on_host: Vec<String> = std::fs::read_dir("/usr/local/bin")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_host.push(python_at.rsplit('/').next().unwrap().to_string());
    on_host.sort();
    assert_eq!(result["local"], json!(on_host), "the rest of the directory is still there");
    assert!(!std::path::Path::new(&python_at).exists(), "nothing was made on the host");
}
