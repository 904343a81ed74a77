//! The Kubernetes factory end to end: the invoker (`[factory] kind = "kubernetes"`) against the
//! fake API server and its fake kubelet (`support::kube_api`), which run each pod as a local
//! process of the project's runtime and refuse a pod beyond its node's allocatable memory.
//! No Kubernetes cluster can run here; see docs/backends.md for what was tested only against the fake.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::kube_api::FakeApiServer;
use support::{python, Invoker};

const IMAGE: &str = "invoker-python:test";
const NAMESPACE: &str = "actions";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-k8s-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

/// The invoker's config: the fake's URL, our runtime for `python:3` (the pod's command runs the
/// test's binary: the fake's "image" is this machine), and `extra`.
fn config(api: &FakeApiServer, extra: &str) -> String {
    format!(
        "[factory]\nkind = \"kubernetes\"\n[factory.kubernetes]\napi_server = \"{}\"\nnamespace = \"{NAMESPACE}\"\n\
         create_timeout = \"20s\"\n{extra}\n[factory.kubernetes.kinds.\"python:3\"]\nimage = \"{IMAGE}\"\n\
         command = [\"{}\", \"action-runtime\", \"--listen\", \"{{listen}}\", \"--launcher\", \"python\"]\n",
        api.url,
        env!("CARGO_BIN_EXE_invoker")
    )
}

async fn cluster(nodes: &[(&str, u64)]) -> FakeApiServer {
    let api = FakeApiServer::start().await;
    api.add_image(IMAGE);
    for (name, mi) in nodes {
        api.add_node(name, *mi);
    }
    api
}

/// An action that logs a line, sleeps `sleep` seconds and says where it ran.
const WHERE: &str = "import os, time\ndef main(a):\n    print('hello from', a.get('name'))\n    time.sleep(a.get('sleep', 0))\n    return {'name': a.get('name'), 'pod_port': os.environ.get('PORT')}\n";

fn action(memory_mb: u32) -> Value {
    let mut body = python(WHERE);
    body["limits"] = json!({"memory": memory_mb});
    body
}

/// Waits, bounded, until the fake's pods in the namespace satisfy `check`.
async fn until_pods(api: &FakeApiServer, what: &str, check: impl Fn(&[(String, String)]) -> bool) {
    support::eventually(Duration::from_secs(20), what, || {
        let pods = api.pods(NAMESPACE);
        std::future::ready(if check(&pods) { Ok(()) } else { Err(format!("{pods:?}")) })
    })
    .await
}

/// Waits until the invoker sees every node's offer as `free` says (its `/health` lists them).
async fn until_offers(inv: &Invoker, what: &str, free: &[(&str, u64)]) {
    support::eventually(Duration::from_secs(20), what, || async {
        let (_, health) = inv.get_url("/health").await;
        let seen = |node: &str| {
            health["nodes"].as_array().and_then(|n| n.iter().find(|n| n["node"] == node)).map(|n| n["free_mb"].clone())
        };
        if free.iter().all(|(node, mb)| seen(node) == Some(json!(mb))) {
            Ok(())
        } else {
            Err(health.to_string())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_activation_runs_on_a_pod_bound_to_a_node_and_its_logs_are_in_the_record() {
    let api = cluster(&[("n1", 2048)]).await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("k8s-e2e"), &config(&api, ""));
    let mut hello = action(256);
    hello["limits"]["disk"] = json!(64);
    inv.put_action("hello", hello).await;
    let (status, record) = inv.invoke("hello", "blocking=true", json!({"name": "pods"})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["response"]["result"]["name"], "pods");
    // The answer goes out with the result; the record is whole once the pod's log came.
    let record = inv.record(record["activationId"].as_str().unwrap()).await;
    let logs = record["logs"].to_string();
    assert!(logs.contains("hello from pods"), "the pod's log, up to the sentinels: {logs}");
    // The server ends every stream (a restart): the log is followed again from its last line,
    // so the next run's lines arrive, and the first run's do not come twice.
    api.drop_watches();
    let (status, again) = inv.invoke("hello", "blocking=true", json!({"name": "again"})).await;
    assert_eq!(status, 200, "{again}");
    let again = inv.record(again["activationId"].as_str().unwrap()).await;
    let logs = again["logs"].to_string();
    assert!(logs.contains("hello from again") && !logs.contains("hello from pods"), "each run its own: {logs}");
    let pods = api.pods(NAMESPACE);
    assert_eq!(pods.len(), 1, "one warm pod for both: {pods:?}");
    assert_eq!(api.created_and_refused(), (1, 0));

    // The pod as the invoker made it: bound, Guaranteed, locked down, and off the network.
    let pod = api.pod_labeled(NAMESPACE, "invoker-action", "_hello").expect("the pod");
    assert_eq!(pod["spec"]["nodeName"], "n1");
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    let main = &pod["spec"]["containers"][0];
    assert_eq!(main["resources"]["requests"], main["resources"]["limits"], "{main}");
    assert_eq!(main["resources"]["limits"]["memory"], "256Mi");
    // What it may write: the action's disk, as ephemeral storage and as its volumes' sizes.
    assert_eq!(main["resources"]["limits"]["ephemeral-storage"], "64Mi");
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert!(volumes.iter().all(|v| v["emptyDir"]["sizeLimit"] == "64Mi"), "{volumes:?}");
    let mounts: Vec<&Value> = main["volumeMounts"].as_array().unwrap().iter().map(|m| &m["mountPath"]).collect();
    assert_eq!(mounts, [&json!("/tmp"), &json!("/dev/shm")]);
    assert_eq!(main["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    let policy_name = format!("invoker-{}-actions", inv.invoker_id);
    let policy = api.network_policy(NAMESPACE, &policy_name).expect("the action pods' network policy");
    let selector = &policy["spec"]["podSelector"]["matchLabels"]["invoker-id"];
    assert_eq!(selector, &pod["metadata"]["labels"]["invoker-id"], "it selects the invoker's pods");
    assert_eq!(policy["spec"]["egress"], json!([]), "no egress at all: {policy}");
}

/// The pods in the namespace whose names start with `prefix` (an invoker's, by its id).
fn pods_of(api: &FakeApiServer, invoker_id: &str) -> Vec<(String, String)> {
    let prefix = format!("inv-{}-", invoker_id.to_ascii_lowercase());
    api.pods(NAMESPACE).into_iter().filter(|(name, _)| name.starts_with(&prefix)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_past_what_the_nodes_hold_waits_for_room_and_the_kubelet_refuses_nothing() {
    // Two nodes of 1 GiB; another tenant holds 512 MiB of n1. Room for six 256 MB pods at once.
    // OpenWhisk's rule (its configured user memory, 2 GiB here, and no view of the nodes) would
    // start eight: the kubelet would refuse two.
    let api = cluster(&[("n1", 1024), ("n2", 1024)]).await;
    api.add_pod("other-tenant", "db", "n1", 512);
    let dir = tempdir();
    // Stats observed only every 150 s unless jobs wait for room: a burst that waited for
    // them would reach its 60 s deadline (as it waited 15 s with the default, before the pool
    // asked for fresh stats while jobs wait).
    let config = config(&api, "") + "[pool]\nstats_ttl = \"600s\"\n";
    let inv = Invoker::start(dir.path(), &id("k8s-burst"), &config);
    until_offers(&inv, "the nodes' offers", &[("n1", 512), ("n2", 1024)]).await;
    for i in 0..10 {
        inv.put_action(&format!("a{i}"), action(256)).await;
    }
    let runs = (0..10).map(|i| {
        let inv = &inv;
        async move { inv.invoke(&format!("a{i}"), "blocking=true", json!({"name": i, "sleep": 0.3})).await }
    });
    let answers = futures_util::future::join_all(runs).await;
    for (status, record) in &answers {
        assert_eq!(*status, 200, "{record}");
    }
    let (created, refused) = api.created_and_refused();
    assert_eq!(refused, 0, "no pod beyond what a node holds");
    assert_eq!(created, 10, "one pod per action");
    assert!(api.peak_mi("n1") <= 1024 && api.peak_mi("n2") <= 1024, "{} {}", api.peak_mi("n1"), api.peak_mi("n2"));
    assert_eq!(api.peak_mi("n1"), 1024, "n1 was used up to what it holds, the other tenant's pod included");
}

#[tokio::test(flavor = "multi_thread")]
async fn other_tenants_pods_a_cordon_and_a_node_not_ready_steer_pods_to_where_there_is_room() {
    let api = cluster(&[("n1", 1024), ("n2", 1024)]).await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("k8s-steer"), &config(&api, ""));
    for i in 0..4 {
        inv.put_action(&format!("s{i}"), action(256)).await;
    }
    let node_of = |api: &FakeApiServer, action: &str| -> String {
        let pod = api.pod_labeled(NAMESPACE, "invoker-action", &format!("_{action}")).expect("the action's pod");
        pod["spec"]["nodeName"].as_str().unwrap_or_default().to_string()
    };
    // n1 cordoned: it offers nothing; another tenant's pod on n2 leaves it 128 MB.
    api.cordon("n1", true);
    api.add_pod("other-tenant", "big", "n2", 896);
    until_offers(&inv, "n1 cordoned, n2 nearly full", &[("n1", 0), ("n2", 128)]).await;
    api.delete_pod("other-tenant", "big");
    until_offers(&inv, "n2 free again", &[("n1", 0), ("n2", 1024)]).await;
    let (status, record) = inv.invoke("s0", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(node_of(&api, "s0"), "n2", "not on the cordoned node");

    api.cordon("n1", false);
    api.set_ready("n2", false);
    until_offers(&inv, "n2 not Ready", &[("n1", 1024), ("n2", 0)]).await;
    let (status, record) = inv.invoke("s1", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(node_of(&api, "s1"), "n1", "not on the node that is not Ready");

    api.set_ready("n2", true);
    api.add_pod("other-tenant", "big", "n1", 768);
    until_offers(&inv, "another tenant fills n1", &[("n1", 0)]).await;
    let (status, record) = inv.invoke("s2", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(node_of(&api, "s2"), "n2", "n1 holds another tenant's pod and ours");
    assert_eq!(api.created_and_refused().1, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_evicted_pod_is_replaced_and_a_pod_that_cannot_start_fails_its_activation_cleanly() {
    let api = cluster(&[("n1", 2048)]).await;
    let dir = tempdir();
    let invoker_id = id("k8s-evict");
    let missing = "[factory.kubernetes.kinds.\"python:missing\"]\nimage = \"missing:latest\"\n\
                   command = [\"/invoker\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"python\"]";
    let inv = Invoker::start(dir.path(), &invoker_id, &config(&api, missing));
    inv.put_action("e", action(256)).await;
    let (status, record) = inv.invoke("e", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    let first = pods_of(&api, &invoker_id);
    assert_eq!(first.len(), 1, "{first:?}");
    api.evict(NAMESPACE, &first[0].0);
    until_pods(&api, "the evicted pod deleted", |pods| !pods.iter().any(|(n, _)| *n == first[0].0)).await;
    let (status, record) = inv.invoke("e", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "a new pod: {record}");
    let now = pods_of(&api, &invoker_id);
    assert!(now.len() == 1 && now[0].0 != first[0].0, "{now:?}");

    // An image the kubelet cannot pull: the activation is answered with the reason and its
    // record stored; the pod goes.
    let mut body = python(WHERE);
    body["exec"]["kind"] = json!("python:missing");
    inv.put_action("m", body).await;
    let (status, record) = inv.invoke("m", "blocking=true", json!({})).await;
    assert!(status >= 500, "{status} {record}");
    assert!(record["annotations"].to_string().contains("create_failed"), "{record}");
    let said = record["response"]["result"]["error"].as_str().unwrap_or_default();
    assert!(said.contains("its image cannot be had"), "the user sees it is the image: {record}");
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(log.contains("ErrImagePull"), "the operator sees why");
    until_pods(&api, "the failed pod deleted", |pods| pods.iter().all(|(n, _)| *n == now[0].0)).await;
    // An image that keeps failing is a broken invoker, not a full one.
    for _ in 0..2 {
        assert!(inv.invoke("m", "blocking=true", json!({})).await.0 >= 500);
    }
    let (_, health) = inv.get_url("/health").await;
    assert_eq!(health["status"], "unhealthy", "{health}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_the_kubelet_refuses_is_answered_recorded_and_counted_and_refusals_in_a_row_are_overload() {
    // The kubelet holds 896 MiB of n1 that the API does not show: the offer says 1024 free, the
    // kubelet admits 128. A 256 MB pod is refused (OutOfmemory).
    let api = cluster(&[("n1", 1024)]).await;
    api.hide_memory("n1", 896);
    let dir = tempdir();
    let invoker_id = id("k8s-refused");
    let inv = Invoker::start(dir.path(), &invoker_id, &config(&api, ""));
    inv.put_action("r", action(256)).await;
    for attempt in 0..3 {
        let (status, record) = inv.invoke("r", "blocking=true", json!({})).await;
        assert!(status >= 500, "attempt {attempt}: {status} {record}");
        assert!(record["annotations"].to_string().contains("create_failed"), "{record}");
        let id = record["activationId"].as_str().unwrap();
        let (status, stored) = inv.get(&format!("activations/{id}")).await;
        assert_eq!(status, 200, "the record is stored: {stored}");
    }
    assert_eq!(api.created_and_refused(), (3, 3), "each refusal counted by the kubelet");
    until_pods(&api, "the refused pods deleted", |pods| pods.is_empty()).await;
    let (_, health) = inv.get_url("/health").await;
    // The kubelet has no room: the invoker is full, not broken (an image it cannot pull is
    // unhealthy, below).
    assert_eq!(health["status"], "overloaded", "creations keep being refused: {health}");
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(log.contains("OutOfmemory"), "the operator sees why");

    // The memory comes back: the next creation works and the invoker is healthy again.
    api.unhide_memory("n1");
    let (status, record) = inv.invoke("r", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    let (_, health) = inv.get_url("/health").await;
    assert_eq!(health["status"], "healthy", "{health}");
}

#[tokio::test(flavor = "multi_thread")]
async fn watches_dropped_compacted_or_down_resume_and_a_creation_never_hangs() {
    let api = cluster(&[("n1", 2048)]).await;
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("k8s-watch"), &config(&api, "call_timeout = \"2s\""));
    for i in 0..4 {
        inv.put_action(&format!("w{i}"), action(256)).await;
    }
    let (status, record) = inv.invoke("w0", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");

    // Every watch ends; a new pod's Ready still reaches the invoker on the resumed watches.
    api.drop_watches();
    let (status, record) = inv.invoke("w1", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "after the watches were dropped: {record}");

    // Down for a while, the history compacted meanwhile: the watches get 410 and list again.
    api.set_down(true);
    api.add_pod("other-tenant", "db", "n1", 1024);
    api.compact();
    // A creation while the API server is down fails within its bound, and is recorded.
    let (status, record) = inv.invoke("w2", "blocking=true", json!({})).await;
    assert!(status >= 500, "{status} {record}");
    api.set_down(false);
    until_offers(&inv, "relisted after 410", &[("n1", 512)]).await;
    assert!(api.served().2 >= 1, "a watch was refused with 410: {:?}", api.served());
    let (status, record) = inv.invoke("w3", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    let (status, record) = inv.invoke("w0", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "the first pod is still warm: {record}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_deletes_the_pods_its_earlier_run_left_and_no_other() {
    let api = cluster(&[("n1", 2048)]).await;
    let dir = tempdir();
    let invoker_id = id("k8s-restart");
    let mut inv = Invoker::start(dir.path(), &invoker_id, &config(&api, ""));
    inv.put_action("a", action(256)).await;
    inv.put_action("b", action(256)).await;
    for name in ["a", "b"] {
        let (status, record) = inv.invoke(name, "blocking=true", json!({})).await;
        assert_eq!(status, 200, "{record}");
    }
    let left = pods_of(&api, &invoker_id);
    assert_eq!(left.len(), 2, "{left:?}");
    // Another invoker's pod in the same namespace, and another tenant's elsewhere.
    api.add_labeled_pod(NAMESPACE, "inv-someone-else-1-1", "n1", json!({"invoker-id": "someone-else"}));
    api.add_pod("other-tenant", "db", "n1", 128);
    inv.signal(nix::sys::signal::Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    assert_eq!(pods_of(&api, &invoker_id).len(), 2, "pods outlive their invoker, as on a real cluster");

    let inv = Invoker::start(dir.path(), &invoker_id, &config(&api, ""));
    until_pods(&api, "the earlier run's pods deleted", |pods| {
        !pods.iter().any(|(n, _)| left.iter().any(|(l, _)| l == n))
    })
    .await;
    let names: Vec<String> = api.pods(NAMESPACE).into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"inv-someone-else-1-1".to_string()), "another invoker's pod stays: {names:?}");
    assert_eq!(api.pods("other-tenant").len(), 1, "another tenant's pod stays");
    let (status, record) = inv.invoke("a", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
    // The new run found its policy (409), replaced it, and only then created pods.
    assert!(api.network_policy(NAMESPACE, &format!("invoker-{invoker_id}-actions")).is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_or_slow_api_server_fails_creations_in_bounded_time_and_leaves_no_pod() {
    let api = cluster(&[("n1", 2048)]).await;
    let dir = tempdir();
    let invoker_id = id("k8s-slow");
    let inv = Invoker::start(dir.path(), &invoker_id, &config(&api, "call_timeout = \"1s\""));
    inv.put_action("t", action(256)).await;
    // 429: the creation fails, the activation is answered and recorded.
    api.throttle_creates(1);
    let (status, record) = inv.invoke("t", "blocking=true", json!({})).await;
    assert!(status >= 500 && record["annotations"].to_string().contains("create_failed"), "{status} {record}");
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(log.contains("429"), "the operator sees the API server's answer");

    // A server slower than call_timeout: the creation is given up; the pod the server makes
    // afterwards is deleted once the watch shows it, and its deletion, refused once by the
    // server, is tried again.
    api.slow_creates(Duration::from_secs(3));
    let (status, record) = inv.invoke("t", "blocking=true", json!({})).await;
    assert!(status >= 500 && record["annotations"].to_string().contains("create_failed"), "{status} {record}");
    let created = api.created_and_refused().0;
    api.slow_creates(Duration::ZERO);
    api.fail_deletes(1);
    support::eventually(Duration::from_secs(20), "the slow server made the pod", || {
        std::future::ready(support::done(api.created_and_refused().0 != created))
    })
    .await;
    until_pods(&api, "the late pod deleted", |pods| pods.is_empty()).await;
    assert_eq!(api.failed_deletes(), 1, "the late pod's first deletion was refused");
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(log.contains("500"), "the operator sees the refused deletion");
    let (status, record) = inv.invoke("t", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{record}");
}

const FN_IMAGE: &str = "invoker-fn-python:test";
const BRIDGE_IMAGE: &str = "invoker-native:test";

/// A python function that says which process it runs in and fails when asked.
const FN_PY: &str = r#"import io, json, uuid
TOKEN = uuid.uuid4().hex
def handler(ctx, data: io.BytesIO = None):
    args = json.loads(data.getvalue() or b"{}")
    print("call", ctx.CallID())
    if args.get("raise"):
        raise Exception("asked to fail")
    return json.dumps({"token": TOKEN, "echo": args.get("echo"), "call_id": ctx.CallID()})
"#;

/// The invoker's config with Fn kinds: Fn's python FDK (on this machine: the fake's "image"
/// is this machine, so the FDK `scripts/fdk.sh` installed), one that links its listener from
/// outside its directory, and the bridge (the test's binary).
fn fn_config(api: &FakeApiServer) -> String {
    let fdk_main = "import sys; from fdk.scripts.fdk import main; sys.argv[0] = 'fdk'; main()";
    let absolute =
        "import os, socket, time; s = socket.socket(socket.AF_UNIX); s.bind('/tmp/iofs/phony'); s.listen(); \
                    os.symlink('/tmp/iofs/phony', '/tmp/iofs/lsnr.sock'); time.sleep(30)";
    format!(
        "{}[factory.kubernetes.kinds.\"fn:python\"]\nimage = \"{FN_IMAGE}\"\ncode_file = \"func.py\"\n\
         command = [\"/usr/bin/env\", \"PYTHONPATH=/usr/local/lib/invoker-fdk/python\", \"PYTHONUNBUFFERED=1\", \
         \"/usr/bin/python3\", \"-c\", \"{fdk_main}\", \"func.py\", \"{{main}}\"]\n\
         [factory.kubernetes.kinds.\"fn:absolute\"]\nimage = \"{FN_IMAGE}\"\ncommand = [\"/usr/bin/python3\", \"-c\", \"{absolute}\"]\n\
         [factory.kubernetes.fn_bridge]\nimage = \"{BRIDGE_IMAGE}\"\ncommand = [\"{}\", \"fn-bridge\"]\n\
         [kinds.\"fn:absolute\"]\nprotocol = \"fn\"\n",
        config(api, ""),
        env!("CARGO_BIN_EXE_invoker")
    )
}

/// An Fn function on Kubernetes: a pod of the function and `invoker fn-bridge`, which offers
/// the function's socket on the pod's port once Fn's readiness rule holds. Calls go through it
/// (each with its own logs, a failure keeping the pod); a function that links its listener
/// from outside its directory fails its creation, the bridge's reason in the invoker's log.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn an_fn_function_runs_in_a_pod_beside_its_bridge_and_a_broken_one_fails_with_the_reason() {
    let api = cluster(&[("n1", 4096)]).await;
    api.add_image(FN_IMAGE);
    api.add_image(BRIDGE_IMAGE);
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), &id("k8s-fn"), &fn_config(&api));
    inv.put_action("py", json!({"exec": {"kind": "fn:python", "code": FN_PY}, "limits": {"memory": 256}})).await;

    let (status, first) = inv.invoke("py", "blocking=true", json!({"echo": "one"})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["response"]["result"]["statusCode"], 200, "{first}");
    let body = |record: &Value| -> Value {
        serde_json::from_str(record["response"]["result"]["body"].as_str().unwrap()).unwrap()
    };
    let said = body(&first);
    assert_eq!((said["echo"].as_str(), &said["call_id"]), (Some("one"), &first["activationId"]), "{said}");
    let whole = inv.record(first["activationId"].as_str().unwrap()).await;
    let logs = whole["logs"].to_string();
    assert!(logs.contains(&format!("stdout: call {}", first["activationId"].as_str().unwrap())), "{logs}");

    let (status, failed) = inv.invoke("py", "blocking=true", json!({"raise": true})).await;
    assert_eq!(status, 502, "{failed}");
    assert_eq!(failed["response"]["result"]["error"], "function failed", "{failed}");
    let (status, after) = inv.invoke("py", "blocking=true", json!({"echo": "two"})).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(body(&after)["token"], said["token"], "the pod was kept");
    let logs = inv.record(after["activationId"].as_str().unwrap()).await["logs"].to_string();
    let own = |record: &Value| format!("stdout: call {}", record["activationId"].as_str().unwrap());
    assert!(logs.contains(&own(&after)) && !logs.contains(&own(&first)), "each call its own lines: {logs}");

    // The pod: the function (its code from the pod's annotation, read-only at /function) and
    // the bridge, which alone has a port; the bridge's memory out of the action's.
    let pod = api.pod_labeled(NAMESPACE, "invoker-action", "_py").expect("the pod");
    let containers = pod["spec"]["containers"].as_array().unwrap();
    let names: Vec<&str> = containers.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "fn-bridge"]);
    assert_eq!(containers[0]["resources"]["limits"]["memory"], "240Mi");
    assert_eq!(containers[1]["resources"]["limits"]["memory"], "16Mi");
    assert!(containers[0]["ports"].is_null() && containers[1]["ports"][0]["name"] == "http", "{pod}");
    assert_eq!(containers[0]["workingDir"], "/function");
    assert_eq!(pod["metadata"]["annotations"]["invoker.dev/code"], FN_PY);
    let volumes = pod["spec"]["volumes"].to_string();
    assert!(volumes.contains("\"medium\":\"Memory\"") && volumes.contains("downwardAPI"), "{volumes}");

    inv.put_action("absolute", json!({"exec": {"kind": "fn:absolute", "code": "unused"}, "limits": {"memory": 256}}))
        .await;
    let (status, record) = inv.invoke("absolute", "blocking=true", json!({})).await;
    assert!(status >= 500, "{status} {record}");
    assert!(record["annotations"].to_string().contains("create_failed"), "{record}");
    let log = inv.stderr();
    assert!(log.contains("not in its own directory"), "the bridge's reason reaches the invoker's log: {log}");
}

/// An Fn function made from an image of its own (as `fn build` makes one) on Kubernetes: its
/// pod runs the image's entry point (no command of ours, no code volume) beside the bridge; an
/// image the kubelet cannot pull is Fn's "Failed to pull image", and nothing ran.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn an_fn_function_made_from_its_own_image_runs_its_entry_point_in_a_pod() {
    let api = cluster(&[("n1", 4096)]).await;
    // The image's content, on this machine (the fake kubelet's "images" are its programs):
    // its entry point a script, whose own paths the kubelet leaves alone (it maps /tmp in a
    // command's arguments to the pod's own).
    let content = tempdir();
    let func = content.path().join("func.py");
    std::fs::write(&func, "import io, json\ndef handler(ctx, data: io.BytesIO = None):\n    return json.dumps({'said': data.getvalue().decode()})\n").unwrap();
    let script = content.path().join("entrypoint");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec /usr/bin/env PYTHONPATH=/usr/local/lib/invoker-fdk/python /usr/bin/python3 -c \"{}\" {} handler\n",
            invoker_wire::runtime::FDK_MAIN,
            func.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let entrypoint = [script.to_str().unwrap()];
    api.add_image_with_entrypoint("guest/own:0.0.2", &entrypoint);
    api.add_image(BRIDGE_IMAGE);
    let dir = tempdir();
    let config = format!("{}[factory.kubernetes.kinds.\"fn:image\"]\nimage = \"\"\n", fn_config(&api));
    let inv = Invoker::start(dir.path(), &id("k8s-fn-image"), &config);
    let (status, app) = inv.send_json("POST", "/v2/apps", json!({"name": "imaged"})).await;
    assert_eq!(status, 200, "{app}");
    let f = json!({"name": "own", "app_id": app["id"], "image": "guest/own:0.0.2", "memory": 256});
    let (status, function) = inv.send_json("POST", "/v2/fns", f).await;
    assert_eq!(status, 200, "{function}");
    let url = function["annotations"]["fnproject.io/fn/invokeEndpoint"].as_str().unwrap();
    let path = &url[url.find("/invoke/").unwrap()..];
    let (status, _, body) = inv.send("POST", path, support::GUEST, &[], b"hello pod".to_vec()).await;
    assert_eq!(status, 200, "{}\n{}", String::from_utf8_lossy(&body), inv.stderr());
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), json!({"said": "hello pod"}));
    let pod = api.pod_labeled(NAMESPACE, "invoker-action", "").expect("the pod");
    let main = &pod["spec"]["containers"][0];
    assert_eq!((main["image"].as_str(), &main["command"]), (Some("guest/own:0.0.2"), &Value::Null), "{pod}");
    assert!(main["workingDir"].is_null() && pod["metadata"]["annotations"].is_null(), "no code of ours: {pod}");
    assert_eq!(pod["spec"]["containers"][1]["name"], "fn-bridge");

    let (status, _, body) = inv.call_new_fn_of_image(&app["id"], "missing", "none/such:1").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("Failed to pull image 'none/such:1'"), "{body}");
}

/// Stems on Kubernetes (`[[pool.prewarm]]`), as on Docker: a pod of the runtime started ahead
/// with its python launcher waiting; the first call of a new action of its kind and memory
/// takes it (`startKind: prewarm`, no creation on its path), two such calls at once never share
/// it (the other gets a pod of its own), a taken stem is replaced by a new pod, and a drain
/// deletes the stems with the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_stem_pod_is_taken_by_one_first_call_refilled_and_deleted_on_drain() {
    let api = cluster(&[("n1", 2048)]).await;
    let dir = tempdir();
    let invoker_id = id("k8s-stem");
    let stem = "[[pool.prewarm]]\nkind = \"python:3\"\nmemory_mb = 128\ncount = 1\n";
    let mut inv = Invoker::start(dir.path(), &invoker_id, &(config(&api, "") + stem));
    let first_stem = support::eventually(Duration::from_secs(30), "a stem ready", || inv.ready_stems()).await;
    assert_eq!(pods_of(&api, &invoker_id).len(), 1, "the stem is a pod");
    for name in ["a", "b"] {
        inv.put_action(name, action(128)).await;
    }
    inv.first_calls_at_one_stem(&first_stem, ["a", "b"]).await;
    let refilled = support::eventually(Duration::from_secs(30), "the stem refilled", || inv.ready_stems()).await;
    assert_eq!(refilled.len(), 1);
    assert_ne!(refilled, first_stem, "a new stem");
    // Two action pods and the new stem, each created once; the node refused none.
    assert_eq!(pods_of(&api, &invoker_id).len(), 3, "{:?}", pods_of(&api, &invoker_id));
    assert_eq!(api.created_and_refused(), (3, 0));

    inv.signal(nix::sys::signal::Signal::SIGTERM);
    inv.wait_exit(Duration::from_secs(60));
    until_pods(&api, "every pod of the invoker deleted on drain", |_| pods_of(&api, &invoker_id).is_empty()).await;
}
