//! End to end with the Docker factory against a real Docker Engine: the real `invoker` binary,
//! the images `scripts/build-images.sh` builds, and the engine `scripts/dockerd.sh` starts.
//!
//! Ignored in a plain `cargo test` (no engine on most machines); `.ci/run` starts the engine,
//! builds the images and runs them with `--ignored`, where a missing engine fails them.

mod support;

use invoker_docker::bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions, RemoveImageOptions,
};
use invoker_docker::bollard::Docker;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;
use support::{host_listens_on, python, Invoker, DISK_FILLER};

const MB: u64 = 1024 * 1024;

fn socket() -> String {
    std::env::var("INVOKER_DOCKER_SOCKET").unwrap_or_else(|_| "/run/invoker-docker/docker.sock".into())
}

async fn engine() -> Docker {
    let docker =
        Docker::connect_with_unix(&socket(), 60, invoker_docker::bollard::API_DEFAULT_VERSION).expect("docker socket");
    let docker = docker.negotiate_version().await.expect("a Docker Engine answers (scripts/dockerd.sh)");
    sweep_earlier_test_runs(&docker).await;
    docker
}

/// Removes containers that test invokers of earlier runs left (a failed test kills its invoker
/// without letting it clean up); this run's are left alone.
async fn sweep_earlier_test_runs(docker: &Docker) {
    let filters = HashMap::from([("label".to_string(), vec!["invoker_id".to_string()])]);
    let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
    let this_run = format!("-{}", std::process::id());
    for c in docker.list_containers(Some(options)).await.unwrap_or_default() {
        let owner = c.labels.as_ref().and_then(|l| l.get("invoker_id")).cloned().unwrap_or_default();
        if owner.starts_with("dk-") && !owner.ends_with(&this_run) {
            let options = RemoveContainerOptions { force: true, ..Default::default() };
            let _ = docker.remove_container(c.id.as_deref().unwrap_or_default(), Some(options)).await;
        }
    }
}

/// Stops the invoker as an operator would (SIGTERM): it removes its containers on the way out.
async fn stop(mut inv: Invoker, docker: &Docker, invoker_id: &str) {
    inv.signal(Signal::SIGTERM);
    inv.wait_exit(Duration::from_secs(60));
    assert!(containers_of(docker, invoker_id).await.is_empty(), "{invoker_id} left containers behind");
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-docker-").tempdir().unwrap()
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

/// The invoker on Docker, offering `action_mb` MB to actions (the rest of the host reserved).
async fn start(dir: &std::path::Path, invoker_id: &str, action_mb: Option<u64>, extra: &str) -> Invoker {
    let reserve = match action_mb {
        Some(mb) => {
            let total = engine().await.info().await.unwrap().mem_total.unwrap() as u64 / MB;
            total - mb
        }
        None => 512,
    };
    let config = format!(
        "[factory]\nkind = \"docker\"\n[factory.docker]\nsocket = \"{}\"\nreserve_mb = {reserve}\n{extra}",
        socket()
    );
    Invoker::start(dir, invoker_id, &config)
}

/// The containers the engine holds with this invoker's label.
async fn containers_of(docker: &Docker, invoker_id: &str) -> Vec<String> {
    let filters = HashMap::from([("label".to_string(), vec![format!("invoker_id={invoker_id}")])]);
    let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
    docker.list_containers(Some(options)).await.unwrap().into_iter().filter_map(|c| c.id).collect()
}

fn annotation(record: &Value, key: &str) -> Value {
    record["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .map_or(Value::Null, |a| a["value"].clone())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn python_and_native_actions_run_in_isolated_containers_and_are_reused_warm() {
    let dir = tempdir();
    let invoker_id = id("dk-basic");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    inv.put_action("py", python("import os\ndef main(a):\n    print('uid', os.getuid())\n    return {'hello': a['name'], 'uid': os.getuid()}\n")).await;
    let script = "#!/bin/sh\nwhile read line; do echo \"native saw $line\"; echo '{\"native\":true}' >&3; done\n";
    inv.put_action("sh", json!({"exec": {"kind": "native", "code": script}})).await;

    let (status, first) = inv.invoke("py", "blocking=true", json!({"name": "docker"})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["response"]["result"], json!({"hello": "docker", "uid": 65534}), "runs as a non-root user");
    // The answer goes with the result; the record is whole once the run's lines are read.
    let whole = inv.record(first["activationId"].as_str().unwrap()).await;
    assert!(whole["logs"].to_string().contains("uid 65534"), "{whole}");
    let (_, second) = inv.invoke("py", "blocking=true", json!({"name": "again"})).await;
    assert_eq!(annotation(&second, "startKind"), json!("warm"));
    assert_eq!(annotation(&first, "containerId"), annotation(&second, "containerId"), "the same container, warm");

    let (status, native) = inv.invoke("sh", "blocking=true&result=true", json!({"x": 1})).await;
    assert_eq!((status, &native), (200, &json!({"native": true})), "{native}");

    let docker = engine().await;
    let ids = containers_of(&docker, &invoker_id).await;
    assert_eq!(ids.len(), 2, "one container per action: {ids:?}");
    for id in &ids {
        let c = docker.inspect_container(id, None::<InspectContainerOptions>).await.unwrap();
        let host = c.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.memory, Some(256 * MB as i64));
        assert_eq!(host.memory_swap, host.memory, "no swap beyond the memory limit");
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert!(host.pids_limit.is_some_and(|p| p > 0));
        assert_eq!(c.config.unwrap().user.as_deref(), Some("65534:65534"));
        // Our runtime's output (the action's lines, the sentinels) went to the invoker through
        // the pipes in its directory: the engine's log of the container holds none of it.
        let engines = engine_log(&docker, id).await;
        assert!(!engines.contains("uid 65534") && !engines.contains("native saw"), "{engines}");
    }
    stop(inv, &docker, &invoker_id).await;
}

/// What the engine logged of a container's stdout and stderr.
async fn engine_log(docker: &Docker, id: &str) -> String {
    use futures_util::StreamExt;
    let options = LogsOptions { stdout: true, stderr: true, ..Default::default() };
    let chunks: Vec<_> = docker.logs(id, Some(options)).collect().await;
    chunks.into_iter().filter_map(Result::ok).map(|c| c.to_string()).collect()
}

/// A runtime that cannot start says why, and the invoker's log says it (the record says only
/// that the container could not be created): here an image whose runtime does not take an
/// argument the invoker passes (as one built before it would), which it says before its
/// output goes to the pipes, in the engine's log.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn a_runtime_that_cannot_start_says_why_in_the_invokers_log() {
    let docker = engine().await;
    let dir = tempdir();
    let invoker_id = id("dk-why");
    let kind = "[factory.docker.kinds.\"python:3\"]\nimage = \"invoker-python:latest\"\n\
                command = [\"/invoker\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"python\", \
                \"--no-such-flag\"]\n";
    let inv = start(dir.path(), &invoker_id, None, kind).await;
    inv.put_action("why", python("def main(a):\n    return {}\n")).await;
    let (status, record) = inv.invoke("why", "blocking=true", json!({})).await;
    assert_eq!(annotation(&record, "rejected"), json!("create_failed"), "{status} {record}");
    support::eventually(Duration::from_secs(10), "the invoker's log says why", || async {
        support::done(inv.stderr().contains("unexpected argument '--no-such-flag'")).map_err(|_| inv.stderr())
    })
    .await;
    stop(inv, &docker, &invoker_id).await;
}

/// A create that fails after the factory made a container's output pipes (here the engine
/// holds no such image) leaves nothing open behind it: the pipes' readers, which never saw the
/// runtime that would have written, are ended with the container.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn creates_that_fail_leave_no_output_pipes_open() {
    let docker = engine().await;
    let dir = tempdir();
    let invoker_id = id("dk-pipes");
    let kind = "[factory.docker.kinds.\"python:3\"]\nimage = \"invoker-no-such-image:latest\"\n\
                command = [\"/invoker\", \"action-runtime\", \"--listen\", \"{listen}\", \"--launcher\", \"python\"]\n";
    let inv = start(dir.path(), &invoker_id, None, kind).await;
    inv.put_action("gone", python("def main(a):\n    return {}\n")).await;
    let open_files = || std::fs::read_dir(format!("/proc/{}/fd", inv.child.id())).unwrap().count();
    let (status, first) = inv.invoke("gone", "blocking=true", json!({})).await;
    assert_ne!(status, 200, "{first}");
    let before = open_files();
    for _ in 0..20 {
        let (status, record) = inv.invoke("gone", "blocking=true", json!({})).await;
        assert_ne!(status, 200, "{record}");
    }
    // Two pipes a create: forty more had each reader waited for a writer that never came.
    support::eventually(Duration::from_secs(10), "the failed creates' pipes are closed", || async {
        let now = open_files();
        support::done(now < before + 10).map_err(|_| format!("{before} open files before, {now} after"))
    })
    .await;
    stop(inv, &docker, &invoker_id).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn an_action_cannot_reach_any_network() {
    let dir = tempdir();
    let invoker_id = id("dk-net");
    let docker = engine().await;
    let inv = start(dir.path(), &invoker_id, None, "").await;
    // The invoker itself listens on the host's loopback: from inside, that port is not there.
    let port: u16 = inv.base.rsplit(':').next().unwrap().parse().unwrap();
    let code = "import socket\ndef main(a):\n    try:\n        socket.create_connection(('127.0.0.1', a['port']), timeout=2)\n        return {'reached': True}\n    except OSError as e:\n        return {'reached': False, 'why': str(e)}\n";
    inv.put_action("net", python(code)).await;
    let (status, result) = inv.invoke("net", "blocking=true&result=true", json!({"port": port})).await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["reached"], json!(false), "{result}");
    stop(inv, &docker, &invoker_id).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn a_restarted_invoker_removes_its_earlier_containers_and_nothing_else() {
    let dir = tempdir();
    let invoker_id = id("dk-restart");
    let other_id = id("dk-other");
    let docker = engine().await;
    let other_dir = tempdir();
    let other = start(other_dir.path(), &other_id, None, "").await;
    other.put_action("keep", python("def main(a):\n    return {}\n")).await;
    assert_eq!(other.invoke("keep", "blocking=true", json!({})).await.0, 200);

    let mut inv = start(dir.path(), &invoker_id, None, "").await;
    inv.put_action("py", python("def main(a):\n    return {'ok': True}\n")).await;
    assert_eq!(inv.invoke("py", "blocking=true", json!({})).await.0, 200);
    assert_eq!(containers_of(&docker, &invoker_id).await.len(), 1);
    inv.signal(Signal::SIGKILL);
    inv.wait_exit(Duration::from_secs(10));
    assert_eq!(containers_of(&docker, &invoker_id).await.len(), 1, "a SIGKILL leaves the container behind");

    let again = start(dir.path(), &invoker_id, None, "").await;
    assert!(containers_of(&docker, &invoker_id).await.is_empty(), "the restart removed what the first run left");
    assert_eq!(containers_of(&docker, &other_id).await.len(), 1, "another invoker's container is left alone");
    stop(again, &docker, &invoker_id).await;
    stop(other, &docker, &other_id).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn fifty_activations_over_five_actions_never_hold_more_containers_than_memory_for_six() {
    let dir = tempdir();
    let invoker_id = id("dk-burst");
    let inv = start(dir.path(), &invoker_id, Some(6 * 256), "[pool]\nwait_deadline = \"60s\"\n").await;
    for i in 0..5 {
        inv.put_action(
            &format!("a{i}"),
            python("import time\ndef main(a):\n    time.sleep(0.2)\n    return {'i': a['i']}\n"),
        )
        .await;
    }
    let docker = engine().await;
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (docker, invoker_id, watching) = (docker.clone(), invoker_id.clone(), watching.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(containers_of(&docker, &invoker_id).await.len());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            most
        })
    };
    let names: Vec<String> = (0..50).map(|i| format!("a{}", i % 5)).collect();
    let calls = names.iter().enumerate().map(|(i, name)| inv.invoke(name, "blocking=true", json!({"i": i})));
    let answers = futures_util::future::join_all(calls).await;
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.await.unwrap();
    assert!(most <= 6, "{most} containers at once with memory for 6");
    for (status, record) in &answers {
        assert!(*status == 200 || *status == 503, "{status}: {record}");
    }
    let done = answers.iter().filter(|(s, _)| *s == 200).count();
    assert!(done > 0, "some completed");
    stop(inv, &docker, &invoker_id).await;
}

fn container_id(record: &Value) -> u64 {
    annotation(record, "containerId").as_u64().unwrap_or_else(|| panic!("no containerId: {record}"))
}

/// The engine's view of the one container this invoker holds: (docker id, paused).
async fn the_container(docker: &Docker, invoker_id: &str) -> (String, bool) {
    let ids = containers_of(docker, invoker_id).await;
    assert_eq!(ids.len(), 1, "one container: {ids:?}");
    let c = docker.inspect_container(&ids[0], None::<InspectContainerOptions>).await.unwrap();
    (ids[0].clone(), c.state.and_then(|s| s.paused).unwrap_or(false))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn an_idle_container_is_paused_after_the_grace_and_resumed_for_the_next_call() {
    let dir = tempdir();
    let invoker_id = id("dk-pause");
    let docker = engine().await;
    let inv = start(dir.path(), &invoker_id, None, "[proxy]\npause_grace = \"100ms\"\n").await;
    inv.put_action("py", python("def main(a):\n    return {'n': a['n']}\n")).await;
    let (status, first) = inv.invoke("py", "blocking=true", json!({"n": 1})).await;
    assert_eq!(status, 200, "{first}");
    let docker_id = support::eventually(Duration::from_secs(20), "the idle container paused", || async {
        match the_container(&docker, &invoker_id).await {
            (docker_id, true) => Ok(docker_id),
            (docker_id, false) => Err(format!("{docker_id} runs")),
        }
    })
    .await;
    let (status, second) = inv.invoke("py", "blocking=true", json!({"n": 2})).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["response"]["result"], json!({"n": 2}));
    assert_eq!(annotation(&second, "startKind"), json!("warm"), "a resumed container is warm");
    assert_eq!(container_id(&first), container_id(&second), "the same container ran both calls");
    let (after, _) = the_container(&docker, &invoker_id).await;
    assert_eq!(after, docker_id, "the engine holds the same container");
    stop(inv, &docker, &invoker_id).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn a_timed_out_container_is_removed_and_replaced() {
    let dir = tempdir();
    let invoker_id = id("dk-timeout");
    let docker = engine().await;
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let mut action = python(
        "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {'slept': a.get('sleep', 0)}\n",
    );
    action["limits"] = json!({"timeout": 1000});
    inv.put_action("slow", action).await;
    let (status, first) = inv.invoke("slow", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{first}");
    let (timed_out_docker_id, _) = the_container(&docker, &invoker_id).await;

    let (status, body) = inv.invoke("slow", "blocking=true", json!({"sleep": 5})).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["response"]["statusCode"], 2, "a developer error: {body}");
    assert_eq!(annotation(&body, "timeout"), json!(true), "{body}");

    let (status, next) = inv.invoke("slow", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{next}");
    assert_ne!(container_id(&next), container_id(&first), "a timed-out container is never reused");
    // Its removal runs beside the next call: waited for, not assumed done.
    support::eventually(Duration::from_secs(20), "the engine no longer holds the timed-out container", || async {
        let inspect = docker.inspect_container(&timed_out_docker_id, None::<InspectContainerOptions>).await;
        support::done(inspect.is_err())
    })
    .await;
    stop(inv, &docker, &invoker_id).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn allocating_past_the_memory_limit_is_a_developer_error_and_the_container_is_replaced() {
    let dir = tempdir();
    let invoker_id = id("dk-oom");
    let docker = engine().await;
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let hog = "def main(a):\n    if a.get('hog'):\n        blocks = [bytearray(64 * 1024 * 1024) for _ in range(16)]\n        return {'held_mb': 64 * len(blocks)}\n    return {'ok': True}\n";
    let mut action = python(hog);
    action["limits"] = json!({"memory": 128});
    inv.put_action("hog", action).await;
    let (status, first) = inv.invoke("hog", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{first}");
    let (docker_id, _) = the_container(&docker, &invoker_id).await;
    let c = docker.inspect_container(&docker_id, None::<InspectContainerOptions>).await.unwrap();
    assert_eq!(c.host_config.unwrap().memory, Some(128 * MB as i64), "the action's limit is the container's");

    let (status, body) = inv.invoke("hog", "blocking=true", json!({"hog": true})).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["response"]["statusCode"], 2, "a developer error: {body}");
    let error = body["response"]["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("memory"), "the error names the memory limit: {body}");

    let (status, next) = inv.invoke("hog", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{next}");
    assert_ne!(container_id(&next), container_id(&first), "the killed container was replaced");
    stop(inv, &docker, &invoker_id).await;
}

/// What a container may write is bounded by the action's `limits.disk` wherever it may write:
/// `/tmp` (where our runtime keeps the code) and `/dev/shm`, each a tmpfs of the limit, and the
/// socket directory, a 1 MB disk of its own rather than `data_dir`'s filesystem.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn a_write_past_the_disk_limit_fails_inside_the_container() {
    let dir = tempdir();
    let invoker_id = id("dk-disk");
    let docker = engine().await;
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let mut action = python(DISK_FILLER);
    action["limits"] = json!({"memory": 256, "disk": 64, "timeout": 60000});
    inv.put_action("filler", action).await;
    for (at, size) in [(".", 64 * MB), ("/tmp", 64 * MB), ("/dev/shm", 64 * MB), ("/run/action", MB)] {
        let (status, body) = inv.invoke("filler", "blocking=true", json!({ "dir": at })).await;
        assert_eq!(status, 200, "{at}: {body}");
        let got = &body["response"]["result"];
        assert_eq!(got["stopped"], "ENOSPC", "{at}: {got}");
        assert!(got["written"].as_u64().unwrap() <= size, "{at}: {got}");
        assert_eq!(got["size"], size, "{at}: {got}");
    }
    let (docker_id, _) = the_container(&docker, &invoker_id).await;
    let host =
        docker.inspect_container(&docker_id, None::<InspectContainerOptions>).await.unwrap().host_config.unwrap();
    assert!(host.tmpfs.unwrap()["/tmp"].contains("size=64m"));
    assert_eq!(host.shm_size, Some(64 * MB as i64));
    let (status, body) = inv.invoke("filler", "blocking=true", json!({ "dir": "/tmp" })).await;
    assert_eq!((status, &body["response"]["result"]["stopped"]), (200, &json!("ENOSPC")), "and again: {body}");
    stop(inv, &docker, &invoker_id).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn an_image_serving_on_8080_of_its_own_network_runs_unchanged_with_no_host_port() {
    let dir = tempdir();
    let invoker_id = id("dk-ow");
    let docker = engine().await;
    let listened_before = host_listens_on(8080);
    // An image in OpenWhisk's shape: its own entry point, serving on :8080; `isolated` by default.
    let extra = "[factory.docker.kinds.\"native:ow\"]\nimage = \"invoker-ow-native:latest\"\n\
                 [proxy]\npause_grace = \"50ms\"\n";
    let inv = start(dir.path(), &invoker_id, None, extra).await;
    let script = "#!/bin/sh\nwhile read line; do echo \"ow saw $line\"; echo '{\"ow\":true}' >&3; done\n";
    inv.put_action("ow", json!({"exec": {"kind": "native:ow", "code": script}})).await;

    let (status, first) = inv.invoke("ow", "blocking=true", json!({"x": 1})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["response"]["result"], json!({"ow": true}));
    let whole = inv.record(first["activationId"].as_str().unwrap()).await;
    assert!(whole["logs"].to_string().contains("ow saw"), "the run's logs: {whole}");

    let (docker_id, _) = the_container(&docker, &invoker_id).await;
    let c = docker.inspect_container(&docker_id, None::<InspectContainerOptions>).await.unwrap();
    let host = c.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"), "no network but its loopback");
    assert!(host.port_bindings.unwrap_or_default().is_empty(), "no port published");
    assert!(host.binds.unwrap_or_default().is_empty(), "no socket directory: it serves on its own port");
    assert_eq!(host_listens_on(8080), listened_before, "nothing listens on the host's 8080");

    // Paused while idle, resumed for the next run, the same container.
    support::eventually(Duration::from_secs(10), "the idle container paused", || async {
        let state = docker.inspect_container(&docker_id, None::<InspectContainerOptions>).await.unwrap().state;
        support::done(state.and_then(|s| s.paused) == Some(true))
    })
    .await;
    let (status, second) = inv.invoke("ow", "blocking=true", json!({"x": 2})).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(annotation(&second, "startKind"), json!("warm"));
    assert_eq!(container_id(&second), container_id(&first), "the paused container, resumed");
    stop(inv, &docker, &invoker_id).await;
}

/// An Fn function on Docker, as Fn's agent runs one: the python FDK in `invoker-fn-python`,
/// the code read-only at /function, the socket directory at /tmp/iofs, no network.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn an_fn_function_runs_in_a_container_with_its_socket_directory_and_stays_warm() {
    let docker = engine().await;
    let dir = tempdir();
    let invoker_id = id("dk-fn");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let code = "import io, json, os\ndef handler(ctx, data: io.BytesIO = None):\n    args = json.loads(data.getvalue())\n    print('fn call', ctx.CallID())\n    if args.get('raise'):\n        raise Exception('asked to fail')\n    return json.dumps({'uid': os.getuid(), 'cwd': os.getcwd(), 'listener': os.environ['FN_LISTENER'], 'echo': args.get('echo')})\n";
    inv.put_action("f", json!({"exec": {"kind": "fn:python", "code": code}})).await;
    let (status, first) = inv.invoke("f", "blocking=true", json!({"echo": "docker"})).await;
    assert_eq!(status, 200, "{first}");
    let said: Value = serde_json::from_str(first["response"]["result"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        said,
        json!({"uid": 65534, "cwd": "/function", "listener": "unix:/tmp/iofs/lsnr.sock", "echo": "docker"})
    );
    let whole = inv.record(first["activationId"].as_str().unwrap()).await;
    let lines = whole["logs"].as_array().unwrap();
    assert!(
        lines.len() == 1
            && lines[0].as_str().unwrap().ends_with(&format!("fn call {}", first["activationId"].as_str().unwrap())),
        "{whole}"
    );
    let (status, failed) = inv.invoke("f", "blocking=true", json!({"raise": true})).await;
    assert_eq!(status, 502, "{failed}");
    assert_eq!(failed["response"]["result"]["error"], "function failed");
    let (_, again) = inv.invoke("f", "blocking=true", json!({"echo": "again"})).await;
    assert_eq!(annotation(&again, "startKind"), json!("warm"));
    assert_eq!(annotation(&first, "containerId"), annotation(&again, "containerId"), "kept after the failure, warm");
    let ids = containers_of(&docker, &invoker_id).await;
    assert_eq!(ids.len(), 1);
    let inspected = docker.inspect_container(&ids[0], None::<InspectContainerOptions>).await.unwrap();
    let host = inspected.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    let binds = host.binds.unwrap_or_default();
    assert!(
        binds.iter().any(|b| b.ends_with(":/tmp/iofs")) && binds.iter().any(|b| b.ends_with(":/function:ro")),
        "{binds:?}"
    );
    stop(inv, &docker, &invoker_id).await;
}

/// The same for Fn's node FDK: `invoker-fn-node` (this machine's node and the FDK), the code
/// read-only at /function as `func.js`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn an_fn_node_function_runs_in_a_container_of_its_image() {
    let docker = engine().await;
    let dir = tempdir();
    let invoker_id = id("dk-fn-node");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let code = "const fdk = require('@fnproject/fdk');\n\
                fdk.handle(function (input, ctx) {\n  console.log('node call ' + ctx.callID);\n  \
                return {uid: process.getuid(), cwd: process.cwd(), echo: input.echo};\n}, {inputMode: 'json'});\n";
    inv.put_action("f", json!({"exec": {"kind": "fn:node", "code": code}})).await;
    let (status, first) = inv.invoke("f", "blocking=true", json!({"echo": "node"})).await;
    assert_eq!(status, 200, "{first}");
    let said: Value = serde_json::from_str(first["response"]["result"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(said, json!({"uid": 65534, "cwd": "/function", "echo": "node"}));
    let logs = inv.record(first["activationId"].as_str().unwrap()).await["logs"].to_string();
    assert!(logs.contains(&format!("node call {}", first["activationId"].as_str().unwrap())), "{logs}");
    let (_, again) = inv.invoke("f", "blocking=true", json!({"echo": "again"})).await;
    assert_eq!(annotation(&again, "startKind"), json!("warm"));
    let ids = containers_of(&docker, &invoker_id).await;
    let inspected = docker.inspect_container(&ids[0], None::<InspectContainerOptions>).await.unwrap();
    assert_eq!(inspected.config.unwrap().image.as_deref(), Some("invoker-fn-node:latest"));
    stop(inv, &docker, &invoker_id).await;
}

/// An Fn function made from an image of its own (as `fn build` makes one): the image's entry
/// point and environment run it, with Fn's socket directory, no network and our user; an image
/// the engine lacks and cannot pull fails the call, its record saying so; and an image built on
/// the engine under another namespace's name is not run (it would show that tenant's code).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn an_fn_function_made_from_its_own_image_runs_its_entry_point() {
    let docker = engine().await;
    // The function's own image, built here from the FDK's image, as Fn's client builds one.
    let context = tempdir();
    std::fs::write(
        context.path().join("func.py"),
        "import io, json, os\ndef handler(ctx, data: io.BytesIO = None):\n    return json.dumps({'said': data.getvalue().decode(), 'uid': os.getuid(), 'cwd': os.getcwd(), 'mine': os.environ.get('MINE')})\n",
    )
    .unwrap();
    let fdk_main = invoker_wire::runtime::FDK_MAIN;
    std::fs::write(
        context.path().join("Dockerfile"),
        format!(
            "FROM invoker-fn-python:latest\nCOPY func.py /app/func.py\nWORKDIR /app\nENV MINE=from-the-image\n\
             ENTRYPOINT [\"/usr/bin/python3\", \"-c\", \"{fdk_main}\", \"func.py\", \"handler\"]\n"
        ),
    )
    .unwrap();
    let built = std::process::Command::new("docker")
        .args([
            "-H",
            &format!("unix://{}", socket()),
            "build",
            "-q",
            "-t",
            "guest/fn-own:test",
            "-t",
            "other/fn-own:test",
        ])
        .arg(context.path())
        .output()
        .expect("the docker client runs");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));

    let dir = tempdir();
    let invoker_id = id("dk-fn-image");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let (status, app) = inv.send_json("POST", "/v2/apps", json!({"name": "imaged"})).await;
    assert_eq!(status, 200, "{app}");
    let f = json!({"name": "own", "app_id": app["id"], "image": "guest/fn-own:test", "memory": 128});
    let (status, function) = inv.send_json("POST", "/v2/fns", f).await;
    assert_eq!(status, 200, "{function}");
    let url = function["annotations"]["fnproject.io/fn/invokeEndpoint"].as_str().unwrap();
    let path = &url[url.find("/invoke/").unwrap()..];
    let (status, _, body) = inv.send("POST", path, support::GUEST, &[], b"hello image".to_vec()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let said: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(said, json!({"said": "hello image", "uid": 65534, "cwd": "/app", "mine": "from-the-image"}));
    let ids = containers_of(&docker, &invoker_id).await;
    assert_eq!(ids.len(), 1);
    let inspected = docker.inspect_container(&ids[0], None::<InspectContainerOptions>).await.unwrap();
    let image = docker.inspect_image("guest/fn-own:test").await.unwrap();
    assert_eq!(inspected.config.unwrap().image, image.id, "run by its id, whatever its tag says later");
    assert_eq!(inspected.host_config.unwrap().network_mode.as_deref(), Some("none"));

    // The same build under another namespace's name: refused, and nothing started.
    let (status, headers, body) = inv.call_new_fn_of_image(&app["id"], "theirs", "other/fn-own:test").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Image 'other/fn-own:test'") && body.contains("namespace"), "{body}");
    let record = inv.record(headers["fn-call-id"].to_str().unwrap()).await;
    let error = record["response"]["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("not named after the action's namespace"), "{record}");
    assert_eq!(containers_of(&docker, &invoker_id).await.len(), 1, "only the first function's container");

    // An image no registry serves: on loopback, so that no traffic leaves the machine.
    let (status, headers, body) = inv.call_new_fn_of_image(&app["id"], "missing", "127.0.0.1:9/none/such:test").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("Failed to pull image '127.0.0.1:9/none/such:test'"), "{body}");
    let record = inv.record(headers["fn-call-id"].to_str().unwrap()).await;
    let error = record["response"]["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("its image cannot be had; nothing ran"), "{record}");
    stop(inv, &docker, &invoker_id).await;
}

/// Fn's own workflow, offline, with Fn's client unchanged: `fn init --runtime python|node`,
/// `fn deploy --local` (which runs `docker build` on Fn's build and run images, here the ones
/// `scripts/fn-images.sh` made) and `fn invoke`, with the answer, status and headers Fn's server
/// gives for the same FDK (`../shared/reference/fn-http-stream.md`, section 4).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and Fn's images (scripts/build-images.sh): run by .ci/run"]
async fn fns_workflow_inits_deploys_locally_and_invokes_python_and_node() {
    let docker = engine().await;
    let dir = tempdir();
    let invoker_id = id("dk-fn-flow");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let host = format!("unix://{}", socket());
    // Loopback proxies: `fn init` asks PyPI and npm for the latest FDK, and gets nowhere.
    let fn_cli = support::fn_cli::Fn::new().with_env(&[
        ("DOCKER_HOST", &host),
        ("HTTPS_PROXY", "http://127.0.0.1:9"),
        ("HTTP_PROXY", "http://127.0.0.1:9"),
        ("FN_NODE_FDK_VERSION", "0.0.76"),
    ]);
    // Images named after the namespace: the engine's local builds run only for their own.
    fn_cli.use_context("ours", &inv.base, support::GUEST, "guest");
    fn_cli.ok(&["create", "app", "flow"]);
    let work = tempdir();
    let mut built = Vec::new();

    let runtimes = [
        ("python", "pyf", "{\"message\": \"Hello World\"}", "{\"message\": \"Hello Bob\"}", "fdk-python/0.1.128"),
        ("node", "nodef", "{\"message\":\"Hello World\"}", "{\"message\":\"Hello Bob\"}", "fdk-node/0.0.76"),
    ];
    for (runtime, name, hello, bob, fdk) in runtimes {
        let made = fn_cli.run_in(work.path(), &["init", "--runtime", runtime, name], b"").ok();
        assert!(made.contains("func.yaml created."), "{made}");
        let function_dir = work.path().join(name);
        let deployed = fn_cli.run_in(&function_dir, &["deploy", "--app", "flow", "--local"], b"").ok();
        let image = format!("guest/{name}:0.0.2");
        assert!(deployed.contains(&format!("Successfully created function: {name} with {image}")), "{deployed}");
        assert_eq!(fn_cli.ok(&["invoke", "flow", name]).trim(), hello);
        let said = fn_cli.run(&["invoke", "--content-type", "application/json", "flow", name], b"{\"name\":\"Bob\"}");
        assert_eq!(said.ok().trim(), bob);

        // What Fn's server answers for the same FDK: 200, the FDK's headers, its body.
        let function = fn_cli.run(&["inspect", "function", "flow", name], b"").json();
        assert_eq!(function["image"], image.as_str(), "{function}");
        let url = function["annotations"]["fnproject.io/fn/invokeEndpoint"].as_str().unwrap();
        let path = &url[url.find("/invoke/").unwrap()..];
        let (status, headers, body) = inv.send("POST", path, support::GUEST, &[], Vec::new()).await;
        assert_eq!((status, String::from_utf8_lossy(&body).trim()), (200, hello));
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        assert!(header("content-type").starts_with("application/json"), "{headers:?}");
        assert!(header("fn-fdk-version").starts_with(fdk), "{headers:?}");
        assert!(!header("fn-call-id").is_empty() && headers.get("keep-alive").is_none(), "{headers:?}");
        let record = inv.record(&header("fn-call-id")).await;
        assert_eq!(annotation(&record, "startKind"), json!("warm"), "the third call: {record}");
        built.push(image);
    }
    assert_eq!(containers_of(&docker, &invoker_id).await.len(), 2, "one container per function, kept warm");
    stop(inv, &docker, &invoker_id).await;
    for image in built {
        docker.remove_image(&image, None::<RemoveImageOptions>, None).await.ok();
    }
}

/// Issue 57, item 4, on Docker: each call is answered before the daemon passes its lines on,
/// the container takes the next call at once, and each record, once whole, holds exactly its
/// own lines (`support::own_lines`). OpenWhisk's python action by its sentinels on each stream;
/// an Fn function by its FDK's log frames.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn each_record_holds_exactly_its_own_lines_when_the_answer_goes_before_them() {
    let docker = engine().await;
    let dir = tempdir();
    let invoker_id = id("dk-lines");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    support::own_lines::each_record_holds_exactly_its_own_lines(&inv).await;
    stop(inv, &docker, &invoker_id).await;
}

/// A generator's values stream from a container of the runtime image as from a process: the
/// first value is read while the generator still sleeps 30 s (a bound, not a measure), the
/// caller that leaves stops it, and the container takes the next call warm.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn a_generator_streams_from_a_container_and_a_caller_that_leaves_stops_it() {
    use futures_util::StreamExt as _;
    let dir = tempdir();
    let invoker_id = id("dk-stream");
    let inv = start(dir.path(), &invoker_id, None, "").await;
    let code = "import time\ndef main(a):\n    yield {'first': True}\n    if a.get('wait'):\n        time.sleep(30)\n    yield {'second': True}\n";
    inv.put_action("gen", python(code)).await;
    let (user, pass) = support::GUEST.split_once(':').unwrap();
    let response = reqwest::Client::new()
        .post(inv.url("actions/gen?blocking=true"))
        .basic_auth(user, Some(pass))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "wait": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-openwhisk-activation-id"].to_str().unwrap().to_string();
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(20), body.next()).await.expect("the first value came early");
    assert_eq!(&first.unwrap().unwrap()[..], b"{\"first\":true}\n");
    drop(body);
    let record = inv.record(&id).await;
    assert_eq!(record["response"]["result"]["end"], "the caller left", "{record}");
    let (status, next) = inv.invoke("gen", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["response"]["result"], json!([{ "first": true }, { "second": true }]));
    assert_eq!(annotation(&next, "startKind"), json!("warm"));
    assert_eq!(annotation(&next, "containerId"), annotation(&record, "containerId"));
    stop(inv, &engine().await, &invoker_id).await;
}

/// The pool's ready stem containers (`state: prewarm`), by container id.
/// Stems on Docker (`[[pool.prewarm]]`): a container of the runtime image started ahead, its
/// python launcher waiting; the first call of a new action of its kind and memory takes it
/// (`startKind: prewarm`, no creation on its path), two such calls at once never share it (the
/// other starts cold), a taken stem is replaced, and a drain removes the stems with the rest.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Docker Engine and the runtime images: run by .ci/run"]
async fn a_stem_container_is_taken_by_one_first_call_refilled_and_removed_on_drain() {
    let dir = tempdir();
    let invoker_id = id("dk-stem");
    let stem = "[[pool.prewarm]]\nkind = \"python:3\"\nmemory_mb = 128\ncount = 1\n";
    let inv = start(dir.path(), &invoker_id, None, stem).await;
    let docker = engine().await;
    let first_stem = support::eventually(Duration::from_secs(60), "a stem ready", || inv.ready_stems()).await;
    let code = "import os\ndef main(a):\n    return {'pid': os.getpid()}\n";
    let mut action = python(code);
    action["limits"] = json!({"memory": 128});
    for name in ["a", "b"] {
        inv.put_action(name, action.clone()).await;
    }
    inv.first_calls_at_one_stem(&first_stem, ["a", "b"]).await;
    let refilled = support::eventually(Duration::from_secs(60), "the stem refilled", || inv.ready_stems()).await;
    assert_eq!(refilled.len(), 1);
    assert_ne!(refilled, first_stem, "a new container");
    // Two action containers and the new stem: the engine holds each once.
    assert_eq!(containers_of(&docker, &invoker_id).await.len(), 3);
    stop(inv, &docker, &invoker_id).await;
}
