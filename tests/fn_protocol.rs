//! Fn functions, unmodified, on the process factory: the real `invoker`, Fn's python and node
//! FDKs from PyPI and npm (`scripts/fdk.sh`, which the README's test command runs), speaking
//! the http-stream contract over the unix socket each function makes.

mod support;

use serde_json::{json, Value};
use support::Invoker;

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-fn-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

/// A python function that says which process it runs in (a token drawn at import: pids repeat
/// across containers, each in its own pid namespace), and fails, sleeps or counts overlapping
/// calls as asked.
const PY: &str = r#"import io, json, time, uuid
TOKEN = uuid.uuid4().hex
INFLIGHT = [0]
def handler(ctx, data: io.BytesIO = None):
    args = json.loads(data.getvalue() or b"{}")
    INFLIGHT[0] += 1
    try:
        print("call", ctx.CallID(), "at", TOKEN)
        if args.get("raise"):
            raise Exception("asked to fail")
        time.sleep(args.get("sleep", 0))
        return json.dumps({"token": TOKEN, "overlap": INFLIGHT[0], "echo": args.get("echo"),
                           "call_id": ctx.CallID(), "deadline": ctx.Deadline(), "memory": ctx.Config().get("FN_MEMORY")})
    finally:
        INFLIGHT[0] -= 1
"#;

const JS: &str = r#"const fdk = require('@fnproject/fdk');
const token = Math.random().toString(36).slice(2);
fdk.handle(function (input, ctx) {
  console.log('call ' + ctx.callID);
  return {token: token, echo: input.echo, call_id: ctx.callID, memory: ctx.memory};
}, {inputMode: 'json'});
"#;

fn function(kind: &str, code: &str) -> Value {
    json!({"exec": {"kind": kind, "code": code}})
}

/// The function's own answer (its body as JSON) out of a record's result.
fn answer(record: &Value) -> Value {
    let body = record["response"]["result"]["body"].as_str().unwrap_or_else(|| panic!("no body: {record}"));
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

fn logs(record: &Value) -> Vec<String> {
    record["logs"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn python_and_node_functions_answer_with_their_headers_and_logs_and_stay_warm() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-kinds"), "");
    inv.put_action("py", function("fn:python", PY)).await;
    inv.put_action("js", function("fn:node", JS)).await;

    let (status, first) = inv.invoke("py", "blocking=true", json!({"echo": "one"})).await;
    assert_eq!(status, 200, "{first}");
    let result = &first["response"]["result"];
    assert_eq!(result["statusCode"], 200, "{first}");
    assert!(result["headers"]["fn-fdk-version"].as_str().unwrap().starts_with("fdk-python/"), "{first}");
    let said = answer(&first);
    assert_eq!((said["echo"].as_str(), said["memory"].as_str()), (Some("one"), Some("256")));
    assert_eq!(said["call_id"], first["activationId"], "Fn-Call-Id is the activation id");
    assert!(said["deadline"].as_str().unwrap().ends_with('Z'), "an RFC 3339 Fn-Deadline: {said}");
    let lines = logs(&first);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].ends_with(&format!(
        "stdout: call {} at {}",
        said["call_id"].as_str().unwrap(),
        said["token"].as_str().unwrap()
    )));

    let (status, second) = inv.invoke("py", "blocking=true", json!({"echo": "two"})).await;
    assert_eq!(status, 200);
    assert_eq!(answer(&second)["token"], said["token"], "the same warm process");
    let lines = logs(&second);
    assert!(
        lines.len() == 1 && lines[0].contains(second["activationId"].as_str().unwrap()),
        "its own line only: {lines:?}"
    );

    for _ in 0..2 {
        let (status, record) = inv.invoke("js", "blocking=true", json!({"echo": "node"})).await;
        assert_eq!(status, 200, "{record}");
        let said = answer(&record);
        assert_eq!((said["echo"].as_str(), said["memory"].as_u64()), (Some("node"), Some(256)));
        assert_eq!(said["call_id"], record["activationId"]);
        let lines = logs(&record);
        assert!(
            lines.len() == 1 && lines[0].ends_with(&format!("call {}", said["call_id"].as_str().unwrap())),
            "{lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn a_function_that_raises_fails_its_call_and_keeps_its_container() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-raise"), "");
    inv.put_action("py", function("fn:python", PY)).await;
    let (_, before) = inv.invoke("py", "blocking=true", json!({})).await;
    let (status, failed) = inv.invoke("py", "blocking=true", json!({"raise": true})).await;
    assert_eq!(status, 502, "{failed}");
    let result = &failed["response"]["result"];
    assert_eq!((result["error"].as_str(), result["statusCode"].as_u64()), (Some("function failed"), Some(502)));
    assert_eq!(result["body"], "asked to fail", "the FDK's own words");
    assert_eq!(failed["response"]["status"], "application error");
    assert!(logs(&failed).iter().any(|l| l.contains("stderr:") && l.contains("asked to fail")), "{failed}");
    let (status, after) = inv.invoke("py", "blocking=true", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(answer(&after)["token"], answer(&before)["token"], "the container was kept");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn a_call_past_its_deadline_is_cut_and_its_container_replaced() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-deadline"), "");
    let mut slow = function("fn:python", PY);
    slow["limits"] = json!({"timeout": 1000});
    inv.put_action("py", slow).await;
    let (_, before) = inv.invoke("py", "blocking=true", json!({})).await;
    let (status, cut) = inv.invoke("py", "blocking=true", json!({"sleep": 5})).await;
    assert_eq!(status, 502, "{cut}");
    assert_eq!(cut["response"]["result"]["error"], "Timed out", "{cut}");
    assert!(cut["annotations"].to_string().contains("\"timeout\""), "the record says timeout: {cut}");
    assert!(cut["duration"].as_u64().unwrap() < 4000, "cut at the deadline, not at the function's end: {cut}");
    let (status, after) = inv.invoke("py", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{after}");
    assert_ne!(answer(&after)["token"], answer(&before)["token"], "a new container serves the next call");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn large_bodies_go_in_and_out_whole() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-large"), "");
    inv.put_action("py", function("fn:python", PY)).await;
    let big = "x".repeat(600 * 1024);
    let (status, record) = inv.invoke("py", "blocking=true", json!({"echo": big})).await;
    assert_eq!(status, 200);
    assert_eq!(answer(&record)["echo"].as_str().map(str::len), Some(600 * 1024));
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn ten_concurrent_calls_never_share_a_container_and_more_than_one_at_once_is_refused() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-ten"), "");
    let mut two = function("fn:python", PY);
    two["limits"] = json!({"concurrency": 2});
    let (status, said) = inv.try_put_action("two", two).await;
    assert_eq!(status, 400, "{said}");
    assert!(said.contains("limits.concurrency") && said.contains("1 call at a time"), "names both: {said}");

    inv.put_action("py", function("fn:python", PY)).await;
    let calls = (0..10).map(|_| inv.invoke("py", "blocking=true", json!({"sleep": 0.3})));
    let records = futures_util::future::join_all(calls).await;
    let mut tokens = std::collections::HashSet::new();
    for (status, record) in &records {
        assert_eq!(*status, 200, "{record}");
        let said = answer(record);
        assert_eq!(said["overlap"], 1, "two calls in one container at once: {said}");
        tokens.insert(said["token"].as_str().unwrap().to_string());
    }
    assert!(tokens.len() > 1 && tokens.len() <= 10, "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn openwhisk_actions_and_fn_functions_run_side_by_side() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-both"), "");
    inv.put_action("ow", support::python("def main(a):\n    return {'kind': 'openwhisk', 'n': a['n']}")).await;
    inv.put_action("fn", function("fn:python", PY)).await;
    let calls = (0..6).map(|n| {
        let name = if n % 2 == 0 { "ow" } else { "fn" };
        inv.invoke(name, "blocking=true", json!({"n": n, "echo": n}))
    });
    for (n, (status, record)) in futures_util::future::join_all(calls).await.into_iter().enumerate() {
        assert_eq!(status, 200, "{record}");
        if n % 2 == 0 {
            assert_eq!(record["response"]["result"], json!({"kind": "openwhisk", "n": n}));
        } else {
            assert_eq!(answer(&record)["echo"], n);
        }
    }
}

/// Kinds whose command breaks the contract: one never makes its socket, one links it from
/// outside its directory.
const BROKEN_KINDS: &str = r#"
[kinds."fn:silent"]
protocol = "fn"
command = ["/bin/sleep", "30"]
start_timeout = "1s"

[kinds."fn:absolute"]
protocol = "fn"
command = ["/usr/bin/python3", "-c", "import os, socket, time; s = socket.socket(socket.AF_UNIX); s.bind('/tmp/iofs/phony'); s.listen(); os.symlink('/tmp/iofs/phony', '/tmp/iofs/lsnr.sock'); time.sleep(30)"]
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    invoker_without_root,
    ignore = "needs root: the sandbox shows the socket directory at /tmp/iofs (run by .ci/run)"
)]
async fn a_function_that_never_makes_its_socket_or_links_it_from_elsewhere_fails_its_creation() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-broken"), BROKEN_KINDS);
    inv.put_action("silent", function("fn:silent", "unused")).await;
    inv.put_action("absolute", function("fn:absolute", "unused")).await;

    let (status, record) = inv.invoke("silent", "blocking=true", json!({})).await;
    assert!(status >= 500, "{status} {record}");
    assert!(record["annotations"].to_string().contains("create_failed"), "{record}");
    let (status, record) = inv.invoke("absolute", "blocking=true", json!({})).await;
    assert!(status >= 500, "{status} {record}");
    assert!(record["annotations"].to_string().contains("create_failed"), "{record}");
    let log = inv.stderr();
    assert!(log.contains("did not become ready within 1s"), "the operator sees the bound: {log}");
    assert!(log.contains("not in its own directory"), "the operator sees the absolute link: {log}");
}
