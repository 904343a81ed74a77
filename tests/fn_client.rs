//! Fn's own command-line client, `fn` (`../shared/tools/fn-cli/fn`, built unchanged from
//! fnproject/cli), against a started invoker: its context (the API URL and the namespace's key
//! as its token), and apps, functions and triggers through every command that manages them,
//! with their exit codes and output, as an Fn user runs them.

mod support;

use serde_json::{json, Value};
use support::fn_cli::Fn;
use support::{Invoker, GUEST, OTHER};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-fn-client-").tempdir().unwrap()
}

const HELLO: &str = r#"import io, json
def handler(ctx, data: io.BytesIO = None):
    return json.dumps({"got": data.getvalue().decode(), "type": ctx.Headers().get("content-type")})
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn fns_own_client_manages_apps_functions_and_triggers_and_invokes() {
    let dir = tempdir();
    let namespaces = format!("[namespaces]\nguest = \"{GUEST}\"\nother = \"{OTHER}\"\n");
    let inv = Invoker::start(dir.path(), &format!("fn-client-{}", std::process::id()), &namespaces);
    let fn_cli = Fn::new();
    fn_cli.use_context("ours", &inv.base, GUEST, "local");

    // Apps: create, list, inspect, config, update, and Fn's words for a clash.
    let made = fn_cli.ok(&["create", "app", "a1"]);
    assert!(made.contains("Successfully created app:  a1") || made.contains("a1"), "{made}");
    let clash = fn_cli.run(&["create", "app", "a1"], b"");
    assert_ne!(clash.code, 0);
    assert!(clash.err.contains("App already exists") || clash.out.contains("App already exists"), "{}", clash.err);
    assert!(fn_cli.ok(&["list", "apps"]).lines().any(|l| l.trim_start().starts_with("a1")));
    let listed = fn_cli.run(&["list", "apps", "--output", "json"], b"").json();
    assert_eq!(listed[0]["name"], "a1", "{listed}");
    fn_cli.ok(&["config", "app", "a1", "GREETING", "hi"]);
    assert_eq!(fn_cli.ok(&["get", "config", "app", "a1", "GREETING"]).trim(), "hi");
    fn_cli.ok(&["update", "app", "a1", "--annotation", "team=\"blue\""]);
    let app = fn_cli.run(&["inspect", "app", "a1"], b"").json();
    assert_eq!((app["config"]["GREETING"].as_str(), app["annotations"]["team"].as_str()), (Some("hi"), Some("blue")));

    // A function (its code through our API: Fn's client sends no code) the client lists,
    // inspects, updates and invokes through the URL its annotation names.
    let f = json!({"name": "f1", "app_id": app["id"], "image": "fn:python", "code": HELLO, "memory": 128});
    let (status, made) = inv.send_json("POST", "/v2/fns", f).await;
    assert_eq!(status, 200, "{made}");
    assert!(fn_cli.ok(&["list", "functions", "a1"]).contains("f1"));
    let fn_id = made["id"].as_str().unwrap().to_string();
    // A function made from an image of its own, which this (process) factory cannot run: refused
    // at create, naming the factory that runs it.
    let image = fn_cli.run(&["create", "function", "a1", "f2", "fnproject/hello:0.0.1"], b"");
    assert_ne!(image.code, 0, "{}", image.out);
    assert!(image.err.contains("the process factory does not run") && image.err.contains("docker"), "{}", image.err);
    let function = fn_cli.run(&["inspect", "function", "a1", "f1"], b"").json();
    let endpoint = function["annotations"]["fnproject.io/fn/invokeEndpoint"].as_str().unwrap().to_string();
    assert!(endpoint.starts_with(&format!("{}/invoke/{fn_id}/", inv.base)), "{endpoint}");
    assert!(function.get("invoke_key").is_none(), "the key is shown in the URL only: {function}");
    fn_cli.ok(&["update", "function", "a1", "f1", "--memory", "256"]);
    let function = fn_cli.run(&["inspect", "function", "a1", "f1"], b"").json();
    assert_eq!(function["memory"], 256, "{function}");
    assert_eq!(function["annotations"]["fnproject.io/fn/invokeEndpoint"], endpoint.as_str(), "an update keeps it");

    // `fn invoke` calls that URL with no credential: the key in it is the credential.
    // (The client's flags go before its arguments.)
    let said = fn_cli.run(&["invoke", "--content-type", "application/json", "a1", "f1"], b"{\"a\": 1}").ok();
    let said: Value = serde_json::from_str(said.trim()).unwrap_or_else(|_| panic!("{said}"));
    assert_eq!((said["got"].as_str(), said["type"].as_str()), (Some("{\"a\": 1}"), Some("application/json")), "{said}");
    // A function that fails: Fn's message, which the client prints on stdout, exiting 0 (its
    // own way with an answer of 400 and above, `commands/invoke.go`).
    let boom = "def handler(ctx, data=None):\n    raise Exception('asked to fail')\n";
    let f = json!({"name": "boom", "app_id": app["id"], "image": "fn:python", "code": boom});
    let (status, made) = inv.send_json("POST", "/v2/fns", f).await;
    assert_eq!(status, 200, "{made}");
    let failed = fn_cli.run(&["invoke", "a1", "boom"], b"");
    assert_eq!(
        (failed.code, failed.out.trim()),
        (0, "Error invoking function. status: 502 message: function failed"),
        "{}",
        failed.err
    );
    fn_cli.ok(&["delete", "function", "a1", "boom"]);
    let http = reqwest::Client::new();
    let post = |url: String| {
        let http = http.clone();
        async move { http.post(url).body("x").send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post(format!("{}/invoke/{fn_id}", inv.base)).await, 401, "no key, no call");
    assert_eq!(post(format!("{}/invoke/{fn_id}/{}", inv.base, "0".repeat(32))).await, 404, "a made-up key");
    // Another namespace's function's key opens that function, not this one.
    let (_, _, theirs) = inv.send("POST", "/v2/apps", OTHER, &[], json!({"name": "b1"}).to_string().into()).await;
    let theirs: Value = serde_json::from_slice(&theirs).unwrap();
    let f = json!({"name": "g", "app_id": theirs["id"], "image": "fn:python", "code": HELLO});
    let (_, _, g) = inv.send("POST", "/v2/fns", OTHER, &[], f.to_string().into()).await;
    let g: Value = serde_json::from_slice(&g).unwrap();
    let their_url = g["annotations"]["fnproject.io/fn/invokeEndpoint"].as_str().unwrap().to_string();
    let their_key = their_url.rsplit('/').next().unwrap();
    assert_eq!(post(format!("{}/invoke/{fn_id}/{their_key}", inv.base)).await, 404, "their key, our function");
    assert_eq!(post(their_url).await, 200, "their key, their function");

    // A trigger: created, listed with its endpoint, inspected, deleted.
    fn_cli.ok(&["create", "trigger", "a1", "f1", "t1", "--type", "http", "--source", "/hello"]);
    let triggers = fn_cli.ok(&["list", "triggers", "a1"]);
    assert!(triggers.contains("t1") && triggers.contains("/t/a1/hello"), "{triggers}");
    let trigger = fn_cli.run(&["inspect", "trigger", "a1", "f1", "t1"], b"").json();
    assert_eq!(trigger["source"], "/hello", "{trigger}");
    fn_cli.ok(&["delete", "trigger", "a1", "f1", "t1"]);
    // An empty list is the client's error, as against Fn's server.
    let none = fn_cli.run(&["list", "triggers", "a1"], b"");
    assert!(none.code != 0 && none.err.contains("no triggers found for app: a1"), "{} {}", none.out, none.err);

    // Another namespace's key sees none of it; a wrong key is refused.
    let other = Fn::new();
    other.use_context("theirs", &inv.base, OTHER, "local");
    assert!(!other.ok(&["list", "apps"]).contains("a1"));
    let stranger = Fn::new();
    stranger.use_context("nobody", &inv.base, "00000000-0000-0000-0000-000000000000:wrong", "local");
    let refused = stranger.run(&["list", "apps"], b"");
    assert_ne!(refused.code, 0, "{}", refused.out);

    // Deletes: Fn's 204, which the client takes as done.
    fn_cli.ok(&["delete", "function", "a1", "f1"]);
    assert!(!fn_cli.run(&["list", "functions", "a1"], b"").out.contains("f1"));
    fn_cli.ok(&["delete", "app", "a1"]);
    assert_eq!(post(endpoint).await, 404, "a deleted function's URL leads nowhere");
    let gone = fn_cli.run(&["inspect", "app", "a1"], b"");
    assert_ne!(gone.code, 0, "{}", gone.out);
}

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000c0de:the-fn-client-tests-controller-secret";

/// The same client against a scheduler of a cluster: the scheduler keeps the apps and
/// functions, and `fn invoke` through the URL it names runs the function on an invoker.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn fns_own_client_invokes_through_a_scheduler() {
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let dir = tempdir();
    let invoker_id = format!("fn-client-cluster-{}", std::process::id());
    let (_invoker, scheduler) = Invoker::invoker_and_scheduler(dir.path(), &etcd.url(), CONTROLLER, &invoker_id).await;
    let fn_cli = Fn::new();
    fn_cli.use_context("cluster", &scheduler.base, GUEST, "local");
    fn_cli.ok(&["create", "app", "c1"]);
    let app = fn_cli.run(&["inspect", "app", "c1"], b"").json();
    let f = json!({"name": "f1", "app_id": app["id"], "image": "fn:python", "code": HELLO});
    let (status, made) = scheduler.send_json("POST", "/v2/fns", f).await;
    assert_eq!(status, 200, "{made}");
    let said = fn_cli.run(&["invoke", "--display-call-id", "c1", "f1"], b"through the scheduler").ok();
    let (call_id, answer) = said.trim().split_once('\n').unwrap_or_else(|| panic!("{said}"));
    let answer: Value = serde_json::from_str(answer.trim()).unwrap_or_else(|_| panic!("{said}"));
    assert_eq!(answer["got"], "through the scheduler", "{said}");
    let call_id = call_id.trim().trim_start_matches("Call ID:").trim();
    let record = scheduler.record(call_id).await;
    let ran_on =
        record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "invoker").map(|a| a["value"].clone());
    assert_eq!(ran_on, Some(json!(invoker_id)), "{record}");
}
