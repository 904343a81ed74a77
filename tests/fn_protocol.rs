//! Fn functions, unmodified, on the process factory: the real `invoker`, Fn's python and node
//! FDKs from PyPI and npm (`scripts/fdk.sh`, which the README's test command runs), speaking
//! the http-stream contract over the unix socket each function makes.

mod support;

use serde_json::{json, Value};
use support::{Invoker, GUEST};

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

/// A python function behind Fn's routes: it says what it got (raw body, headers, the gateway's
/// method and URL, its configuration) and answers with a status and a header of its own.
const PY_GATEWAY: &str = r#"import io, json, os
from fdk import response
def handler(ctx, data: io.BytesIO = None):
    print("gateway call", ctx.CallID())
    said = {"body": data.getvalue().decode(), "method": ctx.Method(), "url": ctx.RequestURL(),
            "x_in": ctx.Headers().get("x-in"), "greeting": os.environ.get("GREETING"), "who": os.environ.get("WHO"),
            "auth": ctx.Headers().get("authorization")}
    return response.Response(ctx, response_data=json.dumps(said), headers={"X-Made": "yes", "Content-Type": "application/json"}, status_code=201)
"#;

/// The same in node: the gateway's method and a header in, a status and a header out.
const JS_GATEWAY: &str = r#"const fdk = require('@fnproject/fdk');
fdk.handle(function (input, ctx) {
  const gw = ctx.httpGateway;
  gw.statusCode = 202;
  gw.setResponseHeader('X-Made', 'node');
  return {body: input, method: gw.method, x_in: gw.getHeader('X-In'), greeting: process.env.GREETING};
}, {inputMode: 'string'});
"#;

const OTHER: &str = "11111111-2222-3333-4444-555555555555:other-secret-key";

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn fn_routes_make_an_app_a_function_and_a_trigger_and_call_it_through_invoke_and_http() {
    let dir = tempdir();
    let namespaces = format!("[namespaces]\nguest = \"{GUEST}\"\nother = \"{OTHER}\"\n");
    let inv = Invoker::start(dir.path(), &id("fn-routes"), &namespaces);
    let (status, app) = inv.send_json("POST", "/v2/apps", json!({"name": "myapp", "config": {"GREETING": "hi"}})).await;
    assert_eq!(status, 200, "{app}");
    let app_id = app["id"].as_str().unwrap().to_string();
    let (status, again) = inv.send_json("POST", "/v2/apps", json!({"name": "myapp"})).await;
    assert_eq!((status, again["message"].as_str()), (409, Some("App already exists")));
    let new_fn = json!({"name": "hello", "app_id": app_id, "image": "fn:python", "code": PY_GATEWAY,
                        "memory": 256, "timeout": 5, "config": {"WHO": "fn"}});
    let (status, function) = inv.send_json("POST", "/v2/fns", new_fn).await;
    assert_eq!(status, 200, "{function}");
    let fn_id = function["id"].as_str().unwrap().to_string();
    assert_eq!(
        (function["memory"].as_u64(), function["timeout"].as_u64(), function["idle_timeout"].as_u64()),
        (Some(256), Some(5), Some(30))
    );
    // Its detached calls' policy, from its annotations, checked as an action's.
    let strict = json!({"name": "strict", "app_id": app_id, "image": "fn:python", "code": PY_GATEWAY,
                        "annotations": {"max-retry-attempts": 5}});
    let (status, refused) = inv.send_json("POST", "/v2/fns", strict).await;
    assert!(status == 400 && refused.to_string().contains("annotations.max-retry-attempts"), "{refused}");
    let (status, listed) = inv.send_json("GET", &format!("/v2/fns?app_id={app_id}"), Value::Null).await;
    assert_eq!((status, listed["items"][0]["id"].as_str()), (200, Some(fn_id.as_str())));

    // /invoke: the body as it came, the caller's headers but its key, the function's answer.
    let headers = [("x-in", "1"), ("content-type", "text/plain")];
    let (status, got, body) =
        inv.send("POST", &format!("/invoke/{fn_id}"), GUEST, &headers, b"raw body".to_vec()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let said: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((said["body"].as_str(), said["x_in"].as_str()), (Some("raw body"), Some("1")));
    assert_eq!(
        (said["greeting"].as_str(), said["who"].as_str()),
        (Some("hi"), Some("fn")),
        "the app's and the fn's config"
    );
    assert!(said["auth"].is_null(), "the caller's key never reaches the function: {said}");
    assert_eq!(got["x-made"], "yes", "the function's header, as it sent it");
    let call_id = got["fn-call-id"].to_str().unwrap().to_string();

    // Detached (Fn-Invoke-Type: detached): 202 at once with its call id; it runs from the
    // durable queue with the body and headers it came with, and its record says so.
    let headers = [("fn-invoke-type", "detached"), ("x-in", "d")];
    let (status, got, _) = inv.send("POST", &format!("/invoke/{fn_id}"), GUEST, &headers, b"later".to_vec()).await;
    assert_eq!(status, 202);
    let detached = inv.record(got["fn-call-id"].to_str().unwrap()).await;
    assert_eq!(detached["response"]["statusCode"], 0, "{detached}");
    let said: Value = serde_json::from_str(detached["response"]["result"]["body"].as_str().unwrap()).unwrap();
    assert_eq!((said["body"].as_str(), said["x_in"].as_str()), (Some("later"), Some("d")), "{said}");

    // An HTTP trigger: Fn's gateway both ways.
    let trigger = json!({"name": "t", "app_id": app_id, "fn_id": fn_id, "type": "http", "source": "/hello/there"});
    let (status, trigger) = inv.send_json("POST", "/v2/triggers", trigger).await;
    assert_eq!(status, 200, "{trigger}");
    let endpoint = trigger["annotations"]["fnproject.io/trigger/httpEndpoint"].as_str().unwrap();
    assert!(endpoint.ends_with("/t/myapp/hello/there"), "{endpoint}");
    let headers = [("x-in", "2")];
    let (status, got, body) = inv.send("PUT", "/t/myapp/hello/there?q=1", GUEST, &headers, b"via http".to_vec()).await;
    assert_eq!(status, 201, "Fn-Http-Status becomes the status: {}", String::from_utf8_lossy(&body));
    assert_eq!(got["x-made"], "yes");
    assert!(got.get("fn-fdk-version").is_none(), "the FDK's own headers stay behind: {got:?}");
    let said: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (said["method"].as_str(), said["body"].as_str(), said["x_in"].as_str()),
        (Some("PUT"), Some("via http"), Some("2"))
    );
    assert!(said["url"].as_str().unwrap().ends_with("/t/myapp/hello/there?q=1"), "{said}");

    // The same with node's FDK.
    let js = json!({"name": "hellojs", "app_id": app_id, "image": "fn:node", "code": JS_GATEWAY});
    let (status, js) = inv.send_json("POST", "/v2/fns", js).await;
    assert_eq!(status, 200, "{js}");
    let js_id = js["id"].as_str().unwrap();
    let trigger = json!({"name": "tjs", "app_id": app_id, "fn_id": js_id, "type": "http", "source": "/js"});
    assert_eq!(inv.send_json("POST", "/v2/triggers", trigger).await.0, 200);
    let (status, _, body) = inv.send("POST", &format!("/invoke/{js_id}"), GUEST, &[], b"direct".to_vec()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let said: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((said["body"].as_str(), said["greeting"].as_str()), (Some("direct"), Some("hi")));
    let (status, got, body) = inv.send("DELETE", "/t/myapp/js", GUEST, &[("x-in", "3")], b"gw".to_vec()).await;
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    assert_eq!(got["x-made"], "node");
    let said: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (said["method"].as_str(), said["x_in"].as_str(), said["body"].as_str()),
        (Some("DELETE"), Some("3"), Some("gw"))
    );

    // Where a trigger leads is read once and kept, until a trigger, function or app changes: a
    // source moved to another function calls that one from the next call on.
    let moved = json!({"name": "m", "app_id": app_id, "fn_id": fn_id, "type": "http", "source": "/moved"});
    let (status, moved) = inv.send_json("POST", "/v2/triggers", moved).await;
    assert_eq!(status, 200, "{moved}");
    for _ in 0..2 {
        let (status, got, _) = inv.send("POST", "/t/myapp/moved", GUEST, &[], b"m".to_vec()).await;
        assert_eq!((status, got["x-made"].to_str().unwrap()), (201, "yes"), "the python function");
    }
    let moved_id = moved["id"].as_str().unwrap();
    assert_eq!(
        inv.send_json("DELETE", &format!("/v2/triggers/{moved_id}"), Value::Null).await.0,
        204,
        "Fn's delete: 204, no body"
    );
    let (status, _, _) = inv.send("POST", "/t/myapp/moved", GUEST, &[], b"m".to_vec()).await;
    assert_eq!(status, 404, "the trigger is gone");
    let again = json!({"name": "m2", "app_id": app_id, "fn_id": js_id, "type": "http", "source": "/moved"});
    let (status, again) = inv.send_json("POST", "/v2/triggers", again).await;
    assert_eq!(status, 200, "{again}");
    let (status, got, _) = inv.send("POST", "/t/myapp/moved", GUEST, &[], b"m".to_vec()).await;
    assert_eq!((status, got["x-made"].to_str().unwrap()), (202, "node"), "the node function now");

    // A trigger's source can move (its route with it); its name cannot, nor can it take the
    // source of another trigger of the app.
    let m2 = format!("/v2/triggers/{}", again["id"].as_str().unwrap());
    let (status, updated) = inv.send_json("PUT", &m2, json!({"source": "/elsewhere", "annotations": {"a": 1}})).await;
    assert_eq!(status, 200, "{updated}");
    let endpoint = updated["annotations"]["fnproject.io/trigger/httpEndpoint"].as_str().unwrap();
    assert!(endpoint.ends_with("/t/myapp/elsewhere") && updated["annotations"]["a"] == 1, "{updated}");
    let (status, _, _) = inv.send("POST", "/t/myapp/moved", GUEST, &[], b"m".to_vec()).await;
    assert_eq!(status, 404, "the old source leads nowhere");
    let (status, got, _) = inv.send("POST", "/t/myapp/elsewhere", GUEST, &[], b"m".to_vec()).await;
    assert_eq!((status, got["x-made"].to_str().unwrap()), (202, "node"), "the new one leads to it");
    let (status, refused) = inv.send_json("PUT", &m2, json!({"name": "renamed"})).await;
    assert_eq!((status, refused["message"].as_str()), (400, Some("name: a trigger's name cannot be changed")));
    let (status, taken) = inv.send_json("PUT", &m2, json!({"source": "/js"})).await;
    assert_eq!(status, 409, "{taken}");
    let (status, _, _) = inv.send("POST", "/t/myapp/elsewhere", GUEST, &[], b"m".to_vec()).await;
    assert_eq!(status, 202, "a refused update changed nothing");
    let (status, wrong) = inv.send_json("PUT", "/v2/apps", json!({"name": "x"})).await;
    assert_eq!(status, 405, "a collection is listed and added to, not put: {wrong}");

    // Each call is an activation with its record and logs.
    let record = inv.record(&call_id).await;
    assert_eq!(record["name"], "myapp.hello");
    assert!(logs(&record).iter().any(|l| l.ends_with(&format!("gateway call {call_id}"))), "{record}");

    // Fn's errors, and the tenant's walls.
    let (status, missing) = inv.send_json("POST", "/invoke/NOSUCHFN", json!({})).await;
    assert_eq!(status, 404);
    assert!(missing["message"].as_str().unwrap().starts_with("Fn not found"), "{missing}");
    let (status, bad) = inv.send_json("GET", "/v2/fns", Value::Null).await;
    assert_eq!((status, bad["message"].as_str()), (400, Some("app_id: is required")));
    let (status, _, body) = inv.send("POST", &format!("/invoke/{fn_id}"), OTHER, &[], Vec::new()).await;
    assert_eq!(status, 404, "another namespace's key finds no such fn: {}", String::from_utf8_lossy(&body));
    let (status, _, _) = inv.send("GET", &format!("/v2/apps/{app_id}"), OTHER, &[], Vec::new()).await;
    assert_eq!(status, 404);
    let (status, _, _) = inv.send("GET", "/t/myapp/hello/there", OTHER, &[], Vec::new()).await;
    assert_eq!(status, 404);

    // Deleting the app takes its function and trigger with it.
    let (status, _) = inv.send_json("DELETE", &format!("/v2/apps/{app_id}"), Value::Null).await;
    assert_eq!(status, 204);
    let (status, _) = inv.send_json("GET", &format!("/v2/fns/{fn_id}"), Value::Null).await;
    assert_eq!(status, 404);
    let (status, _) = inv.get("actions/myapp.hello").await;
    assert_eq!(status, 404, "its action went too");
    let (status, _, _) = inv.send("POST", &format!("/invoke/{fn_id}"), GUEST, &[], Vec::new()).await;
    assert_eq!(status, 404, "a call to it leads nowhere");
    let (status, _, _) = inv.send("POST", "/t/myapp/hello/there", GUEST, &[], Vec::new()).await;
    assert_eq!(status, 404);
}

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000c0de:the-fn-tests-controller-secret";

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn an_fn_function_runs_through_the_scheduler_on_an_invoker_of_the_cluster() {
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("fn-cluster");
    let (_invoker, scheduler) = Invoker::invoker_and_scheduler(dir.path(), &etcd.url(), CONTROLLER, &invoker_id).await;
    let (status, app) =
        scheduler.send_json("POST", "/v2/apps", json!({"name": "clustered", "config": {"GREETING": "hey"}})).await;
    assert_eq!(status, 200, "{app}");
    let new_fn = json!({"name": "hello", "app_id": app["id"], "image": "fn:python", "code": PY_GATEWAY});
    let (status, function) = scheduler.send_json("POST", "/v2/fns", new_fn).await;
    assert_eq!(status, 200, "{function}");
    let path = format!("/invoke/{}", function["id"].as_str().unwrap());
    let (status, got, body) =
        scheduler.send("POST", &path, GUEST, &[("x-in", "9")], b"through the scheduler".to_vec()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let said: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((said["body"].as_str(), said["x_in"].as_str()), (Some("through the scheduler"), Some("9")));
    assert_eq!(said["greeting"], "hey");
    let record = scheduler.record(got["fn-call-id"].to_str().unwrap()).await;
    let ran_on =
        record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "invoker").map(|a| a["value"].clone());
    assert_eq!(ran_on, Some(json!(invoker_id)), "{record}");
}

/// Fn's `idle_timeout`: a function's idle container goes once idle that long (the pool's own
/// keep-alive would keep it ten minutes), and the next call starts a new one.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn a_functions_idle_timeout_ends_its_idle_container() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-idle"), "");
    let (_, app) = inv.send_json("POST", "/v2/apps", json!({"name": "idleapp"})).await;
    let app_id = app["id"].as_str().unwrap().to_string();
    let call = |fn_id: String| {
        let inv = &inv;
        async move {
            let (status, _, body) = inv.send("POST", &format!("/invoke/{fn_id}"), GUEST, &[], b"{}".to_vec()).await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            serde_json::from_slice::<Value>(&body).unwrap()["token"].clone()
        }
    };
    let mut tokens = Vec::new();
    for (name, idle) in [("brief", 1), ("kept", 3600)] {
        let spec = json!({"name": name, "app_id": app_id, "image": "fn:python", "code": PY, "idle_timeout": idle});
        let (status, function) = inv.send_json("POST", "/v2/fns", spec).await;
        assert_eq!(status, 200, "{function}");
        let fn_id = function["id"].as_str().unwrap().to_string();
        tokens.push((fn_id.clone(), call(fn_id).await));
    }
    // Idle time: past the first function's 1 s idle_timeout, within the second's.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (brief, kept) = (&tokens[0], &tokens[1]);
    assert_ne!(call(brief.0.clone()).await, brief.1, "idle past its 1 s: a new container");
    assert_eq!(call(kept.0.clone()).await, kept.1, "idle within its hour: the same container");
}

/// A node function that writes two server-sent events, waiting 30 s between them when asked.
const SSE: &str = r#"const fdk = require('@fnproject/fdk');
const { Readable } = require('stream');
fdk.handle(function (input, ctx) {
  ctx.responseContentType = 'text/event-stream';
  async function* events() {
    yield 'data: first\n\n';
    if (input.wait) await new Promise((r) => setTimeout(r, 30000));
    yield 'data: second\n\n';
  }
  return fdk.streamResult(Readable.from(events()));
}, {inputMode: 'json'});
"#;

/// A node function that writes server-sent events with the FDK's `streamResult`: each event
/// reaches the caller of `/invoke` as the function writes it, with the function's headers
/// (the first one read while the function still waits 30 s: a bound, not a measure); a caller
/// that leaves ends the call, and the container takes the next one. A whole stream's record
/// keeps its count of parts, its size and its last part. Through an HTTP trigger, the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_functions_response_in_chunks_reaches_the_caller_as_it_is_written() {
    use futures_util::StreamExt as _;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("fn-sse"), "");
    let (status, app) = inv.send_json("POST", "/v2/apps", json!({"name": "streams"})).await;
    assert_eq!(status, 200, "{app}");
    let new_fn = json!({"name": "sse", "app_id": app["id"], "image": "fn:node", "code": SSE});
    let (status, function) = inv.send_json("POST", "/v2/fns", new_fn).await;
    assert_eq!(status, 200, "{function}");
    let path = format!("/invoke/{}", function["id"].as_str().unwrap());

    let (user, pass) = GUEST.split_once(':').unwrap();
    let call = |body: Value| {
        reqwest::Client::new().post(format!("{}{path}", inv.base)).basic_auth(user, Some(pass)).json(&body).send()
    };
    let response = call(json!({ "wait": true })).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let call_id = response.headers()["fn-call-id"].to_str().unwrap().to_string();
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), body.next()).await;
    let first = first.expect("the first event came while the function waited").unwrap().unwrap();
    assert_eq!(&first[..], b"data: first\n\n");
    drop(body);
    let record = inv.record(&call_id).await;
    let stream = &record["response"]["result"]["stream"];
    assert_eq!((stream["end"].as_str(), stream["parts"].as_u64()), (Some("the caller left"), Some(1)), "{record}");

    let response = call(json!({})).await.unwrap();
    let call_id = response.headers()["fn-call-id"].to_str().unwrap().to_string();
    assert_eq!(response.text().await.unwrap(), "data: first\n\ndata: second\n\n");
    let record = inv.record(&call_id).await;
    let result = &record["response"]["result"];
    assert_eq!(result["stream"], json!({ "parts": 2, "bytes": 27, "end": "complete" }), "{record}");
    assert_eq!(result["body"], "data: second\n\n", "the last part is kept");
    let startkind = record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "startKind").cloned();
    assert_eq!(startkind.unwrap()["value"], "warm", "the caller that left did not cost the container");

    // Through an HTTP trigger the same: the first event while the function still waits, under
    // its content type (the gateway's mapping of the headers), then the rest.
    let trigger =
        json!({"name": "t", "app_id": app["id"], "fn_id": function["id"], "type": "http", "source": "/events"});
    let (status, trigger) = inv.send_json("POST", "/v2/triggers", trigger).await;
    assert_eq!(status, 200, "{trigger}");
    let url = format!("{}/t/streams/events", inv.base);
    let response = reqwest::Client::new().post(url).basic_auth(user, Some(pass)).json(&json!({ "wait": true }));
    let response = response.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), body.next()).await;
    let first = first.expect("the first event came through the trigger while the function waited").unwrap().unwrap();
    assert_eq!(&first[..], b"data: first\n\n");
}

/// Through a scheduler the same: the first event reaches the caller while the function still
/// waits, under the function's content type (the invoker sends its headers beside the bytes,
/// `STREAM_HEADERS`); a whole stream's record, the invoker's, is the scheduler's.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_functions_response_in_chunks_passes_through_the_scheduler_as_it_is_written() {
    use futures_util::StreamExt as _;
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = id("fn-cluster-sse");
    let (_invoker, scheduler) = Invoker::invoker_and_scheduler(dir.path(), &etcd.url(), CONTROLLER, &invoker_id).await;
    let (status, app) = scheduler.send_json("POST", "/v2/apps", json!({"name": "clustered-streams"})).await;
    assert_eq!(status, 200, "{app}");
    let new_fn = json!({"name": "sse", "app_id": app["id"], "image": "fn:node", "code": SSE});
    let (status, function) = scheduler.send_json("POST", "/v2/fns", new_fn).await;
    assert_eq!(status, 200, "{function}");
    let url = format!("{}/invoke/{}", scheduler.base, function["id"].as_str().unwrap());
    let (user, pass) = GUEST.split_once(':').unwrap();
    let call = |body: Value| reqwest::Client::new().post(&url).basic_auth(user, Some(pass)).json(&body).send();

    let response = call(json!({ "wait": true })).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), body.next()).await;
    let first = first.expect("the first event came while the function waited").unwrap().unwrap();
    assert_eq!(&first[..], b"data: first\n\n");
    drop(body);

    let response = call(json!({})).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let call_id = response.headers()["fn-call-id"].to_str().unwrap().to_string();
    assert_eq!(response.text().await.unwrap(), "data: first\n\ndata: second\n\n");
    let record = scheduler.record(&call_id).await;
    assert_eq!(
        record["response"]["result"]["stream"],
        json!({ "parts": 2, "bytes": 27, "end": "complete" }),
        "{record}"
    );
    let ran_on =
        record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "invoker").map(|a| a["value"].clone());
    assert_eq!(ran_on, Some(json!(invoker_id)), "{record}");
}
