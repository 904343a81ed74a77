//! Traces across processes: one activation through a scheduler and an invoker (real binaries,
//! the process factory, a real etcd) is one trace whose spans a test receiver decodes from the
//! OTLP protobuf they are exported in; the action is given the run span's `traceparent`; a
//! sampled-out trace exports nothing; with tracing off the caller's `traceparent` passes on.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::otlp::{Received, Receiver};
use support::{done, eventually, Invoker, GUEST};

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-0000000017ac:the-traces-tests-controller-secret";

/// The action answers with the `traceparent` it was given.
fn traced_action() -> Value {
    let code = "import os\ndef main(a):\n    if a.get('fail'):\n        raise Exception('asked to fail')\n    \
                return {'traceparent': os.environ.get('__OW_TRACEPARENT')}";
    json!({ "exec": { "kind": "python:3", "code": code } })
}

async fn invoke_with(at: &Invoker, action: &str, traceparent: &str, params: Value) -> (u16, Value) {
    let path = format!("/api/v1/namespaces/_/actions/{action}?blocking=true");
    let headers = [("traceparent", traceparent), ("content-type", "application/json")];
    let (status, _, body) = at.send("POST", &path, GUEST, &headers, params.to_string().into_bytes()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn one<'a>(spans: &'a [Received], service: &str, name: &str) -> &'a Received {
    let found: Vec<_> = spans.iter().filter(|s| s.service == service && s.name == name).collect();
    assert_eq!(found.len(), 1, "one {service} span {name} expected: {spans:#?}");
    found[0]
}

/// `child` lies within `parent`, and hangs from it.
fn under(child: &Received, parent: &Received) {
    assert_eq!(child.parent, parent.span_id, "{} is {}'s child: {child:#?} {parent:#?}", child.name, parent.name);
    assert!(
        parent.start_ns <= child.start_ns && child.end_ns <= parent.end_ns,
        "{} within {}: {child:#?} {parent:#?}",
        child.name,
        parent.name
    );
}

/// `later` began once `earlier` had ended.
fn after(later: &Received, earlier: &Received) {
    assert!(earlier.end_ns <= later.start_ns, "{} after {}: {later:#?} {earlier:#?}", later.name, earlier.name);
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn one_activation_through_a_scheduler_is_one_trace_that_shows_where_its_time_went() {
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let receiver = Receiver::start().await;
    let dir = tempfile::Builder::new().prefix("invoker-traces-").tempdir().unwrap();
    let invoker_id = format!("traced-{}", std::process::id());
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let (_invoker, scheduler) =
        Invoker::invoker_and_scheduler_with_env(dir.path(), &etcd.url(), CONTROLLER, &invoker_id, &env).await;
    scheduler.put_action("traced", traced_action()).await;

    let (trace, caller) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let (status, record) = invoke_with(&scheduler, "traced", &format!("00-{trace}-{caller}-01"), json!({})).await;
    assert_eq!(status, 200, "{record}");
    let given = record["response"]["result"]["traceparent"].as_str().unwrap_or_default().to_string();

    let expected = 11;
    let spans = eventually(Duration::from_secs(20), "the activation's spans are exported", || async {
        let spans: Vec<Received> = receiver.spans().into_iter().filter(|s| s.trace_id == trace).collect();
        done(spans.len() >= expected).map(|()| spans.clone()).map_err(|_| format!("{spans:#?}"))
    })
    .await;
    assert!(receiver.bad().is_empty(), "{:?}", receiver.bad());
    assert_eq!(spans.len(), expected, "{spans:#?}");

    // The scheduler: the caller's span is the parent of its activation.
    let s_activation = one(&spans, "invoker-scheduler", "activation");
    assert_eq!(s_activation.parent, caller);
    assert_eq!(s_activation.attributes["activation_id"], record["activationId"].as_str().unwrap());
    assert_eq!(s_activation.attributes["process"], "s1");
    let placement = one(&spans, "invoker-scheduler", "placement");
    let handover = one(&spans, "invoker-scheduler", "handover");
    let s_record = one(&spans, "invoker-scheduler", "record");
    for stage in [placement, handover, s_record] {
        under(stage, s_activation);
    }
    assert_eq!(placement.attributes["invoker"], invoker_id);
    assert_eq!(handover.attributes["invoker"], invoker_id);
    after(handover, placement);
    after(s_record, handover);

    // The invoker: its activation hangs from the hand-over, its stages from it, in order.
    let activation = one(&spans, "invoker", "activation");
    under(activation, handover);
    assert_eq!(activation.attributes["namespace"], "guest");
    assert_eq!(activation.attributes["action"], "traced");
    assert_eq!(activation.attributes["start"], "cold");
    assert_eq!(activation.attributes["outcome"], "success");
    assert_eq!(activation.attributes["process"], invoker_id);
    assert!(activation.attributes.contains_key("container") && activation.attributes.contains_key("node"));
    let queue = one(&spans, "invoker", "queue");
    let create = one(&spans, "invoker", "container.create");
    let init = one(&spans, "invoker", "init");
    let run = one(&spans, "invoker", "run");
    let logs = one(&spans, "invoker", "logs");
    let record_write = one(&spans, "invoker", "record");
    for stage in [queue, create, init, run, logs, record_write] {
        under(stage, activation);
    }
    assert_eq!(create.attributes["factory"], "process");
    assert_eq!(create.attributes["container"], activation.attributes["container"]);
    after(init, create);
    after(init, queue);
    after(run, init);
    after(logs, run);
    after(record_write, logs);
    assert!(spans.iter().all(|s| s.error.is_none()), "{spans:#?}");

    // The action was given the run span's context, sampled.
    assert_eq!(given, format!("00-{trace}-{}-01", run.span_id), "{record}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sampled_out_trace_exports_nothing_and_a_failure_marks_its_spans() {
    let receiver = Receiver::start().await;
    let dir = tempfile::Builder::new().prefix("invoker-traces-").tempdir().unwrap();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let retries = "[queue]\nretry_backoff = \"10ms\"\nmax_retry_attempts = 1\n";
    let invoker = Invoker::start_with_env(dir.path(), &format!("sampled-{}", std::process::id()), retries, &[], &env);
    invoker.put_action("traced", traced_action()).await;

    // The caller's flags say not sampled: the action still gets the trace, unsampled.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let (status, record) =
        invoke_with(&invoker, "traced", &format!("00-{unsampled}-b7ad6b7169203331-00"), json!({})).await;
    assert_eq!(status, 200, "{record}");
    let given = record["response"]["result"]["traceparent"].as_str().unwrap_or_default();
    assert!(given.starts_with(&format!("00-{unsampled}-")) && given.ends_with("-00"), "{record}");

    // A sampled one after it, which fails: its spans come, marked; the unsampled one's never.
    let sampled = "1af7651916cd43dd8448eb211c80319c";
    let (status, record) =
        invoke_with(&invoker, "traced", &format!("00-{sampled}-b7ad6b7169203331-01"), json!({"fail": true})).await;
    assert_eq!(status, 502, "{record}");
    let spans = eventually(Duration::from_secs(20), "the sampled activation's spans are exported", || async {
        let spans: Vec<Received> = receiver.spans().into_iter().filter(|s| s.trace_id == sampled).collect();
        let complete = spans.iter().any(|s| s.name == "activation") && spans.iter().any(|s| s.name == "record");
        done(complete).map(|()| spans.clone()).map_err(|_| format!("{spans:#?}"))
    })
    .await;
    let activation = one(&spans, "invoker", "activation");
    assert_eq!(activation.attributes["start"], "warm", "{spans:#?}");
    assert!(activation.error.as_deref().is_some_and(|e| e.contains("asked to fail")), "{activation:#?}");
    assert!(one(&spans, "invoker", "run").error.is_none(), "an action's own error keeps its container: {spans:#?}");
    let all = receiver.spans();
    assert!(all.iter().all(|s| s.trace_id != unsampled), "{all:#?}");

    // An asynchronous call that fails is retried: the retry's span names the first attempt.
    let (status, accepted) = invoker.invoke("traced", "blocking=false", json!({"fail": true})).await;
    assert_eq!(status, 202, "{accepted}");
    let first = accepted["activationId"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(20), "the retry's span", || async {
        let spans = receiver.spans();
        let retry = spans.iter().find(|s| s.name == "activation" && s.attributes.get("retry_of") == Some(&first));
        let attempt = retry.and_then(|s| s.attributes.get("attempt").cloned());
        done(attempt.as_deref() == Some("2")).map_err(|_| format!("{spans:#?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_tracing_off_the_callers_traceparent_reaches_the_action_as_it_came() {
    let dir = tempfile::Builder::new().prefix("invoker-traces-").tempdir().unwrap();
    let invoker = Invoker::start(dir.path(), &format!("untraced-{}", std::process::id()), "");
    invoker.put_action("traced", traced_action()).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (status, record) = invoke_with(&invoker, "traced", traceparent, json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["response"]["result"]["traceparent"], traceparent, "{record}");
    // An invalid one is ignored: the call runs on the same warm container, and the action is
    // given none (not the last run's).
    let (status, record) = invoke_with(&invoker, "traced", "00-not-a-trace-01", json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["response"]["result"]["traceparent"], "", "{record}");
}

/// An Fn function is given the run span's `traceparent` as a header, in the place of its
/// caller's.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_fdk, ignore = "needs Fn's FDKs (scripts/fdk.sh installs them; run by .ci/run)")]
async fn an_fn_function_is_given_the_run_spans_traceparent_as_a_header() {
    const PY: &str = "import io, json\ndef handler(ctx, data: io.BytesIO = None):\n    \
                      return json.dumps({'traceparent': ctx.Headers().get('traceparent')})\n";
    let receiver = Receiver::start().await;
    let dir = tempfile::Builder::new().prefix("invoker-traces-").tempdir().unwrap();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let invoker = Invoker::start_with_env(dir.path(), &format!("fn-traced-{}", std::process::id()), "", &[], &env);
    let (status, app) = invoker.send_json("POST", "/v2/apps", json!({"name": "traced"})).await;
    assert_eq!(status, 200, "{app}");
    let new_fn = json!({"name": "f", "app_id": app["id"], "image": "fn:python", "code": PY});
    let (status, function) = invoker.send_json("POST", "/v2/fns", new_fn).await;
    assert_eq!(status, 200, "{function}");

    let trace = "5bf92f3577b34da6a3ce929d0e0e4736";
    let headers = [("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let path = format!("/invoke/{}", function["id"].as_str().unwrap());
    let (status, _, body) = invoker.send("POST", &path, GUEST, &headers, Vec::new()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let said: Value = serde_json::from_slice(&body).unwrap();
    // The activation's span ends after its run's (with its record), and may leave in a later
    // batch: both are waited for.
    let spans = eventually(Duration::from_secs(20), "the call's run and activation spans are exported", || async {
        let spans: Vec<Received> = receiver.spans().into_iter().filter(|s| s.trace_id == trace).collect();
        let both = spans.iter().any(|s| s.name == "run") && spans.iter().any(|s| s.name == "activation");
        done(both).map(|()| spans.clone()).map_err(|_| format!("{spans:#?}"))
    })
    .await;
    let run = one(&spans, "invoker", "run");
    assert_eq!(one(&spans, "invoker", "activation").parent, "00f067aa0ba902b7");
    assert_eq!(said["traceparent"], format!("00-{trace}-{}-01", run.span_id), "{said}");
}

/// Issue 60: a call that waited for its action's cap says so on its span (the cap); one that
/// did not, does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_waited_for_its_actions_cap_says_so_on_its_span() {
    let receiver = Receiver::start().await;
    let dir = tempfile::Builder::new().prefix("invoker-traces-").tempdir().unwrap();
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let invoker = Invoker::start_with_env(dir.path(), &format!("capspan-{}", std::process::id()), "", &[], &env);
    let code = "import time\ndef main(a):\n    time.sleep(a.get('sleep', 0))\n    return {}";
    let action = json!({
        "exec": { "kind": "python:3", "code": code },
        "limits": { "memory": 128 },
        "annotations": [{ "key": "max-concurrency", "value": 1 }],
    });
    invoker.put_action("one", action).await;
    let first = invoker.invoke("one", "blocking=true", json!({ "sleep": 2 }));
    let second = async {
        eventually(Duration::from_secs(10), "the first running", || async {
            let (_, pool) = invoker.get_url("/v1/pool").await;
            done(pool["busy"] == 1)
        })
        .await;
        invoker.invoke("one", "blocking=true", json!({})).await
    };
    let ((s1, r1), (s2, r2)) = futures_util::future::join(first, second).await;
    assert_eq!((s1, s2), (200, 200), "{r1} {r2}");
    let waited = r2["activationId"].as_str().unwrap().to_string();
    let ran = r1["activationId"].as_str().unwrap().to_string();
    let spans = eventually(Duration::from_secs(20), "both activations' spans", || async {
        let spans: Vec<Received> = receiver.spans().into_iter().filter(|s| s.name == "activation").collect();
        let of = |id: &str| spans.iter().find(|s| s.attributes.get("activation_id").map(String::as_str) == Some(id));
        done(of(&waited).is_some() && of(&ran).is_some()).map(|()| spans.clone()).map_err(|_| format!("{spans:#?}"))
    })
    .await;
    let of = |id: &str| spans.iter().find(|s| s.attributes.get("activation_id").map(String::as_str) == Some(id));
    assert_eq!(of(&waited).unwrap().attributes.get("capped").map(String::as_str), Some("1"), "{spans:#?}");
    assert!(!of(&ran).unwrap().attributes.contains_key("capped"), "{spans:#?}");
}
