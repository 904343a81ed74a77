//! Issue 43's attacks on the tenant boundary, on the real process factory with two namespaces:
//! a call never runs in another tenant's container (whatever an action does to its runtime's
//! socket), a runtime replaced by its own action is noticed, and a deleted action's code never
//! runs again. The sandbox needs root: without it these tests say so and pass, except under
//! `CI=true`, where they fail.

mod support;

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;
use support::{eventually, python, root_or_skip, Invoker, GUEST, OTHER};

/// An invoker with two namespaces, `guest` (the attacker, A) and `other` (B); containers are
/// not paused while idle (B is reachable whenever A tries), unless `extra` says otherwise.
fn start(invoker_id: &str, extra: &str) -> (tempfile::TempDir, Invoker) {
    let dir = tempfile::Builder::new().prefix("invoker-ten-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config =
        format!("[namespaces]\nguest = \"{GUEST}\"\nother = \"{OTHER}\"\n[proxy]\npause_grace = \"60s\"\n{extra}");
    let inv = Invoker::start(dir.path(), &format!("{invoker_id}-{}", std::process::id()), &config);
    (dir, inv)
}

/// B's side: `PUT` and a blocking call in namespace `other`.
async fn put_as_other(inv: &Invoker, name: &str, body: Value) {
    let path = format!("/api/v1/namespaces/_/actions/{name}");
    let headers = [("content-type", "application/json")];
    let (status, _, text) = inv.send("PUT", &path, OTHER, &headers, body.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
}

async fn invoke_as_other(inv: &Invoker, name: &str, params: Value) -> (u16, Value) {
    let path = format!("/api/v1/namespaces/_/actions/{name}?blocking=true");
    let headers = [("content-type", "application/json")];
    let (status, _, body) = inv.send("POST", &path, OTHER, &headers, params.to_string().into_bytes()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// The ids of the containers that run `action` (`namespace/name`), from the admin's pool view.
async fn containers_of(inv: &Invoker, action: &str) -> Vec<u64> {
    let (status, pool) = inv.get_url("/v1/pool").await;
    assert_eq!(status, 200, "{pool}");
    let containers = pool["containers"].as_array().cloned().unwrap_or_default();
    let live = containers.iter().filter(|c| c["action"] == action && c["state"] != "removing");
    live.filter_map(|c| c["id"].as_u64()).collect()
}

/// Where the process factory keeps container `id`'s directory on the host.
fn container_dir(inv: &Invoker, id: u64) -> PathBuf {
    inv.dir.join("data").join("processes").join(&inv.invoker_id).join(id.to_string())
}

/// B: counts the calls its process served and says whose payload it saw.
const VICTIM: &str = r#"CALLS = [0]
def main(a):
    CALLS[0] += 1
    return {'who': 'B', 'calls': CALLS[0], 'saw': a}
"#;

/// A: when asked, puts a link to `target` where its own runtime socket was (its container's
/// directory is its working directory's parent).
const SWAPPER: &str = r#"import os
def main(a):
    if 'target' in a:
        sock = os.path.join(os.path.dirname(os.getcwd()), 'sock')
        os.unlink(sock)
        os.symlink(a['target'], sock)
    return {'who': 'A', 'pid': os.getpid()}
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
async fn a_runtime_socket_swapped_for_a_link_to_another_tenants_never_reaches_it() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("ten-sock", "");
    put_as_other(&inv, "victim", python(VICTIM)).await;
    let (status, b) = invoke_as_other(&inv, "victim", json!({})).await;
    assert_eq!((status, &b["response"]["result"]["calls"]), (200, &json!(1)), "{b}");
    let victim = containers_of(&inv, "other/victim").await;
    assert_eq!(victim.len(), 1, "{victim:?}");
    let target = container_dir(&inv, victim[0]).join("sock");
    assert!(target.exists(), "B's socket is where the attacker guesses it: {}", target.display());

    inv.put_action("swapper", python(SWAPPER)).await;
    let (status, a) = inv.invoke("swapper", "blocking=true", json!({"target": target})).await;
    assert_eq!(status, 200, "{a}");
    // Past the client's bound on reusing an idle connection: the next call connects anew.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, a) = inv.invoke("swapper", "blocking=true", json!({"payload": "A's secret"})).await;
    assert_ne!(a["response"]["result"]["who"], "B", "A's call ran in B's container: {a}");
    assert_eq!(status, 502, "the link is the action's own doing, a developer error: {a}");
    let said = a["response"]["result"]["error"].as_str().unwrap_or_default().to_string();
    assert!(said.contains("not a socket") || said.contains("link"), "the record says why: {a}");

    let (status, b) = invoke_as_other(&inv, "victim", json!({})).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["response"]["result"]["calls"], 2, "B served only its own calls: {b}");
    // Removed once its run's record is whole (its logs, for at most 200 ms without sentinels).
    eventually(Duration::from_secs(10), "A's container removed", || async {
        let left = containers_of(&inv, "guest/swapper").await;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    // A's action still works, in a new container.
    let (status, a) = inv.invoke("swapper", "blocking=true", json!({})).await;
    assert_eq!((status, &a["response"]["result"]["who"]), (200, &json!("A")), "{a}");
    assert!(inv.stderr().contains("runtime socket"), "the operator's log says why: {}", inv.stderr());
}

/// A: when asked, kills the runtime the invoker started and serves its socket itself, from a
/// daemon of its own, answering every run with `hijacked`.
const HIJACKER: &str = r#"import os, socket, time
def serve(sock, runtime):
    time.sleep(0.3)
    os.kill(runtime, 9)
    time.sleep(0.2)
    if os.path.exists(sock):
        os.unlink(sock)
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.listen(16)
    body = b'{"hijacked": true}'
    while True:
        c, _ = s.accept()
        c.recv(65536)
        c.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (len(body), body))
        c.close()
def main(a):
    if a.get('hijack'):
        sock = os.path.join(os.path.dirname(os.getcwd()), 'sock')
        runtime = os.getpgrp()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                try:
                    serve(sock, runtime)
                finally:
                    os._exit(0)
            os._exit(0)
        os.wait()
    return {'who': 'runtime', 'pid': os.getpid()}
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
async fn a_runtime_killed_and_replaced_by_its_own_action_ends_its_container() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("ten-hijack", "");
    inv.put_action("hijacker", python(HIJACKER)).await;
    let (status, first) = inv.invoke("hijacker", "blocking=true", json!({"hijack": true})).await;
    assert_eq!(status, 200, "{first}");
    let before = containers_of(&inv, "guest/hijacker").await;
    // The attack's own time: what the action left behind kills its runtime 0.3 s after the
    // answer and serves its socket 0.2 s later; nothing of ours to wait on happens meanwhile.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let (status, next) = inv.invoke("hijacker", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["response"]["result"]["who"], "runtime", "a call was served by the action's own server: {next}");
    let after = containers_of(&inv, "guest/hijacker").await;
    assert!(
        after.iter().all(|c| !before.contains(c)),
        "the container whose runtime died was removed: {before:?} {after:?}"
    );
    assert!(inv.stderr().contains("runtime exited"), "the operator's log says why: {}", inv.stderr());
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
async fn a_deleted_action_created_again_never_runs_its_old_code() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("ten-delete", "");
    let version = |v: u32| format!("def main(a):\n    return {{'version': {v}}}\n");
    let node = |v: u32| json!({"exec": {"kind": "nodejs:20", "code": format!("function main() {{ return {{version: {v}}}; }}")}});
    for (kind, first, second) in [("python", python(&version(1)), python(&version(2))), ("node", node(1), node(2))] {
        let name = format!("again-{kind}");
        inv.put_action(&name, first).await;
        let (status, r) = inv.invoke(&name, "blocking=true", json!({})).await;
        assert_eq!((status, &r["response"]["result"]["version"]), (200, &json!(1)), "{kind}: {r}");
        let (status, _) = inv.send_json("DELETE", &format!("/api/v1/namespaces/_/actions/{name}"), Value::Null).await;
        assert_eq!(status, 200);
        assert!(
            containers_of(&inv, &format!("guest/{name}")).await.is_empty(),
            "{kind}: the delete removed the idle container at once"
        );
        inv.put_action(&name, second).await;
        let (status, r) = inv.invoke(&name, "blocking=true", json!({})).await;
        assert_eq!(
            (status, &r["response"]["result"]["version"]),
            (200, &json!(2)),
            "{kind}: the deleted code ran: {r}"
        );
    }
    // An update removes the older revision's idle container too.
    inv.put_action("updated", python(&version(1))).await;
    inv.invoke("updated", "blocking=true", json!({})).await;
    let (status, _) = inv.try_put_action("updated?overwrite=true", python(&version(3))).await;
    assert_eq!(status, 200);
    assert!(containers_of(&inv, "guest/updated").await.is_empty(), "the old revision's idle container went");
}

/// B as an Fn function: says it is B and what it was sent.
const FN_VICTIM: &str = r#"import io, json
def handler(ctx, data: io.BytesIO = None):
    return json.dumps({"who": "B", "saw": data.getvalue().decode()})
"#;

/// A as an Fn function: when asked, swaps its listener for an absolute link to `target`.
const FN_SWAPPER: &str = r#"import io, json, os
def handler(ctx, data: io.BytesIO = None):
    args = json.loads(data.getvalue() or b"{}")
    if "target" in args:
        os.unlink("/tmp/iofs/lsnr.sock")
        os.symlink(args["target"], "/tmp/iofs/lsnr.sock")
    return json.dumps({"who": "A"})
"#;

fn function(code: &str) -> Value {
    json!({"exec": {"kind": "fn:python", "code": code}})
}

/// The function's own answer (its body as JSON) out of a record's result.
fn answer(record: &Value) -> Value {
    let body = record["response"]["result"]["body"].as_str().unwrap_or_else(|| panic!("no body: {record}"));
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

/// Where B's function listens, as the host sees it.
async fn fn_listener_of(inv: &Invoker, action: &str) -> PathBuf {
    let ids = containers_of(inv, action).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    let listener = container_dir(inv, ids[0]).join("tmp").join("iofs").join("lsnr.sock");
    assert!(
        listener.symlink_metadata().is_ok(),
        "B's listener is where the attacker guesses it: {}",
        listener.display()
    );
    listener
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn an_fn_listener_swapped_after_it_was_ready_for_a_link_to_another_tenants_never_reaches_it() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("ten-fn-swap", "");
    put_as_other(&inv, "victim", function(FN_VICTIM)).await;
    let (status, b) = invoke_as_other(&inv, "victim", json!({})).await;
    assert_eq!((status, &answer(&b)["who"]), (200, &json!("B")), "{b}");
    let target = fn_listener_of(&inv, "other/victim").await;

    inv.put_action("swapper", function(FN_SWAPPER)).await;
    let (status, a) = inv.invoke("swapper", "blocking=true", json!({"target": target})).await;
    assert_eq!(status, 200, "{a}");
    // The attack's own time: what A's function left behind tries its swap meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        let (status, a) = inv.invoke("swapper", "blocking=true", json!({"payload": "A's secret"})).await;
        assert_eq!(status, 200, "{a}");
        assert_eq!(answer(&a)["who"], "A", "A's call was answered by B's function: {a}");
    }
}

/// A kind whose "function" makes `lsnr.sock -> phony.sock -> <B's listener>` and waits.
const CHAIN_KIND: &str = r#"
[kinds."fn:chain"]
protocol = "fn"
command = ["/usr/bin/python3", "func.py"]
code_file = "func.py"
start_timeout = "5s"
"#;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn an_fn_listener_that_is_a_chain_of_links_to_another_tenants_is_refused_at_start() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("ten-fn-chain", CHAIN_KIND);
    put_as_other(&inv, "victim", function(FN_VICTIM)).await;
    let (status, b) = invoke_as_other(&inv, "victim", json!({})).await;
    assert_eq!(status, 200, "{b}");
    let target = fn_listener_of(&inv, "other/victim").await;
    let chain = format!(
        "import os, time\nos.symlink({:?}, '/tmp/iofs/phony.sock')\nos.symlink('phony.sock', '/tmp/iofs/lsnr.sock')\ntime.sleep(30)\n",
        target.display().to_string()
    );
    inv.put_action("chain", json!({"exec": {"kind": "fn:chain", "code": chain}})).await;
    let (status, a) = inv.invoke("chain", "blocking=true", json!({"payload": "A's secret"})).await;
    assert!(status >= 500, "the chain passed the readiness check: {status} {a}");
    assert_ne!(a["response"]["result"]["body"].as_str().map(|b| b.contains("\"B\"")), Some(true), "{a}");
    assert!(a["annotations"].to_string().contains("create_failed"), "{a}");
    assert!(inv.stderr().contains("chain of links"), "the operator's log says why: {}", inv.stderr());
}

const CONTROLLER: &str = "cccccccc-0000-0000-0000-000000000000:controller-secret";

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_delete_through_the_scheduler_removes_the_idle_containers_on_its_invokers() {
    if !root_or_skip() {
        return;
    }
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let keys = format!(
        "[cluster]\netcd = [\"{}\"]\nlease_ttl = \"3s\"\npublish_interval = \"100ms\"\n\
         controller_key = \"{CONTROLLER}\"\n[admin]\ncontroller_keys = [\"{CONTROLLER}\"]\n[proxy]\npause_grace = \"60s\"\n",
        etcd.url()
    );
    let (invoker_dir, scheduler_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let invoker = Invoker::start(invoker_dir.path(), &format!("ten-cluster-{}", std::process::id()), &keys);
    let scheduler = Invoker::start_scheduler(
        scheduler_dir.path(),
        &format!("{keys}[scheduler]\nid = \"s1\"\nrefresh_interval = \"50ms\"\n"),
    );
    scheduler.until_an_invoker_serves().await;
    let version = |v: u32| python(&format!("def main(a):\n    return {{'version': {v}}}\n"));
    scheduler.put_action("again", version(1)).await;
    let (status, r) = scheduler.invoke("again", "blocking=true", json!({})).await;
    assert_eq!((status, &r["response"]["result"]["version"]), (200, &json!(1)), "{r}");
    assert_eq!(containers_of(&invoker, "guest/again").await.len(), 1, "warm on the invoker");

    let (status, _) = scheduler.send_json("DELETE", "/api/v1/namespaces/_/actions/again", Value::Null).await;
    assert_eq!(status, 200);
    assert!(containers_of(&invoker, "guest/again").await.is_empty(), "the delete reached the invoker's pool");
    scheduler.put_action("again", version(2)).await;
    let (status, r) = scheduler.invoke("again", "blocking=true", json!({})).await;
    assert_eq!((status, &r["response"]["result"]["version"]), (200, &json!(2)), "the deleted code ran: {r}");
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox (run by .ci/run)")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn an_fn_app_deleted_and_created_again_never_runs_the_deleted_functions_code() {
    if !root_or_skip() {
        return;
    }
    let (_dir, inv) = start("ten-fn-again", "");
    let code = |v: u32| {
        format!(
            "import io, json, os\ndef handler(ctx, data: io.BytesIO = None):\n    \
             return json.dumps({{'version': {v}, 'fn_id': os.environ.get('FN_FN_ID')}})\n"
        )
    };
    let mut seen = Vec::new();
    for v in [1, 2] {
        let (status, app) = inv.send_json("POST", "/v2/apps", json!({"name": "again"})).await;
        assert_eq!(status, 200, "{app}");
        let new_fn = json!({"name": "f", "app_id": app["id"], "image": "fn:python", "code": code(v)});
        let (status, function) = inv.send_json("POST", "/v2/fns", new_fn).await;
        assert_eq!(status, 200, "{function}");
        let fn_id = function["id"].as_str().unwrap().to_string();
        let (status, _, body) = inv.send("POST", &format!("/invoke/{fn_id}"), support::GUEST, &[], Vec::new()).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let said: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (said["version"].as_u64(), said["fn_id"].as_str()),
            (Some(u64::from(v)), Some(fn_id.as_str())),
            "{said}"
        );
        seen.push(fn_id);
        assert_eq!(containers_of(&inv, "guest/again.f").await.len(), 1, "warm");
        let (status, _) =
            inv.send_json("DELETE", &format!("/v2/apps/{}", app["id"].as_str().unwrap()), Value::Null).await;
        assert_eq!(status, 204);
        assert!(containers_of(&inv, "guest/again.f").await.is_empty(), "the delete removed the idle container");
    }
    assert_ne!(seen[0], seen[1]);
}
