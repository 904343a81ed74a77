//! Streamed answers end to end with the process factory: python and node generators whose
//! values reach a blocking caller as they are yielded (`Accept: application/x-ndjson` or
//! `text/event-stream`), as one JSON array otherwise; a caller that leaves stops the stream and
//! keeps the container; a reader that stops reading holds the action back; the action's
//! timeout covers the whole stream; each record keeps the count, the size and the last value.

mod support;

use futures_util::StreamExt as _;
use serde_json::{json, Value};
use std::time::Duration;
use support::{python, Invoker, GUEST};

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000c0de:the-streaming-tests-controller-secret";

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-stream-").tempdir().unwrap()
}

/// A blocking call of `action` with `params`, asking for `accept`.
async fn call(inv: &Invoker, action: &str, accept: &str, params: Value) -> reqwest::Response {
    let (user, pass) = GUEST.split_once(':').unwrap();
    reqwest::Client::new()
        .post(inv.url(&format!("actions/{action}?blocking=true")))
        .basic_auth(user, Some(pass))
        .header("accept", accept)
        .json(&params)
        .send()
        .await
        .unwrap()
}

fn activation_id(response: &reqwest::Response) -> String {
    response.headers()["x-openwhisk-activation-id"].to_str().unwrap().to_string()
}

fn annotation<'a>(record: &'a Value, key: &str) -> &'a Value {
    let found = record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == key);
    found.map_or(&Value::Null, |a| &a["value"])
}

/// The first value reaches the caller while the generator still runs: it sleeps 30 s after
/// it, and the first line is read well within that (a bound, not a measure). The caller then
/// leaves: the record says so and how much went out, and the next call is warm on the same
/// container (the runtime stopped the generator's process, not itself).
#[tokio::test(flavor = "multi_thread")]
async fn a_generators_first_value_reaches_the_caller_while_it_runs_and_a_caller_that_leaves_stops_it() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "stream-first", "");
    let code = "import time\ndef main(a):\n    yield {'first': a.get('n', 0)}\n    if a.get('wait'):\n        time.sleep(30)\n    yield {'second': True}\n";
    inv.put_action("gen", python(code)).await;
    let response = call(&inv, "gen", "application/x-ndjson", json!({ "n": 7, "wait": true })).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let id = activation_id(&response);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(20), body.next()).await;
    let first = first.expect("the first value came before the generator's next one").unwrap().unwrap();
    assert_eq!(&first[..], b"{\"first\":7}\n");
    drop(body);
    // Stopped as the caller left, not at the generator's next value 30 s on.
    let record = support::eventually(Duration::from_secs(20), "the record of the stream the caller left", || async {
        let (status, body) = inv.get(&format!("activations/{id}")).await;
        if status == 200 {
            Ok(body)
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await;
    assert_eq!(record["response"]["status"], "success", "{record}");
    assert_eq!(
        record["response"]["result"],
        json!({ "values": 1, "bytes": 11, "last": { "first": 7 }, "end": "the caller left" })
    );
    let container = annotation(&record, "containerId").clone();
    let (status, next) = inv.invoke("gen", "blocking=true", json!({})).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["response"]["result"], json!([{ "first": 0 }, { "second": true }]));
    assert_eq!((annotation(&next, "containerId"), annotation(&next, "startKind")), (&container, &json!("warm")));
}

/// Without a streaming `Accept` (and when not blocking), a generator's values are one JSON
/// array, as OpenWhisk's clients expect one JSON; an event stream frames each value as an
/// event; each stream's record keeps its count, size and last value.
#[tokio::test(flavor = "multi_thread")]
async fn values_are_an_array_unasked_events_for_an_event_stream_and_lines_for_ndjson_in_python_and_node() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "stream-formats", "");
    inv.put_action("py", python("def main(a):\n    yield 'a'\n    yield 2\n    yield [3, {'x': None}]\n")).await;
    let node_async = "async function* main(a) { yield 'a'; await new Promise(r => setTimeout(r, 10)); yield 2; yield [3, {x: null}]; }";
    inv.put_action("node-async", json!({ "exec": { "kind": "nodejs:20", "code": node_async } })).await;
    let node_sync = "function* main(a) { yield 'a'; yield 2; yield [3, {x: null}]; }";
    inv.put_action("node-sync", json!({ "exec": { "kind": "nodejs:20", "code": node_sync } })).await;
    for action in ["py", "node-async", "node-sync"] {
        let (status, body) = inv.invoke(action, "blocking=true&result=true", json!({})).await;
        assert_eq!((status, body), (200, json!(["a", 2, [3, { "x": null }]])), "{action}");

        let (status, accepted) = inv.invoke(action, "blocking=false", json!({})).await;
        assert_eq!(status, 202);
        let record = inv.record(accepted["activationId"].as_str().unwrap()).await;
        assert_eq!(record["response"]["result"], json!(["a", 2, [3, { "x": null }]]), "{action}");

        let response = call(&inv, action, "application/x-ndjson", json!({})).await;
        assert_eq!(response.status(), 200, "{action}");
        let id = activation_id(&response);
        assert_eq!(response.text().await.unwrap(), "\"a\"\n2\n[3,{\"x\":null}]\n", "{action}");
        let record = inv.record(&id).await;
        assert_eq!(
            record["response"]["result"],
            json!({ "values": 3, "bytes": 18, "last": [3, { "x": null }], "end": "complete" }),
            "{action}"
        );

        let response = call(&inv, action, "text/html, text/event-stream;q=0.9", json!({})).await;
        assert_eq!(response.headers()["content-type"], "text/event-stream", "{action}");
        assert_eq!(response.text().await.unwrap(), "data: \"a\"\n\ndata: 2\n\ndata: [3,{\"x\":null}]\n\n", "{action}");
    }
    // Asking for a stream of an action that answers one JSON gets that JSON.
    inv.put_action("plain", python("def main(a):\n    return {'one': 1}\n")).await;
    let response = call(&inv, "plain", "application/x-ndjson", json!({})).await;
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.json::<Value>().await.unwrap()["response"]["result"], json!({ "one": 1 }));
}

/// A python generator's strings go from the launcher to the runtime as their bytes, unescaped
/// (`string_frame.rs`): each reaches the caller as the JSON string it is, whatever it holds
/// (quotes, backslashes, newlines, control characters, non-ASCII, nothing, a large one); one
/// that cannot be UTF-8 (a lone surrogate) ends the stream with an error, no frame half
/// written: the values before it arrive whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_generators_strings_arrive_as_the_json_strings_they_are() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "stream-strings", "");
    let code = "def main(a):\n    yield 'say \"hi\"'\n    yield 'back\\\\slash'\n    yield 'two\\nlines\\t\\x00'\n    yield '\\u00e9\\u2603\\U0001F600'\n    yield ''\n    yield 'x' * 300000 + '\"'\n    yield {'after': 'strings'}\n    if a.get('bad'):\n        yield 'ok'\n        yield '\\ud800'\n";
    inv.put_action("strings", python(code)).await;
    let expected = json!([
        "say \"hi\"",
        "back\\slash",
        "two\nlines\t\u{0}",
        "\u{e9}\u{2603}\u{1F600}",
        "",
        "x".repeat(300_000) + "\"",
        { "after": "strings" }
    ]);
    let response = call(&inv, "strings", "application/x-ndjson", json!({})).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(Value::Array(lines), expected);
    let (status, body) = inv.invoke("strings", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, body), (200, expected));

    let response = call(&inv, "strings", "application/x-ndjson", json!({ "bad": true })).await;
    let id = activation_id(&response);
    let mut body = response.bytes_stream();
    let mut read = Vec::new();
    while let Some(Ok(part)) = body.next().await {
        read.extend_from_slice(&part);
    }
    let text = String::from_utf8(read).unwrap();
    assert_eq!(text.lines().last(), Some("\"ok\""), "every value before the bad one arrives whole");
    let record = inv.record(&id).await;
    assert_eq!(record["response"]["result"]["end"], "failed", "{record}");
    assert_eq!(record["response"]["result"]["values"], 8, "{record}");
    let error = record["response"]["result"]["error"].as_str().unwrap();
    assert!(error.contains("surrogate"), "{error}");
}

/// A generator that fails after some values: the event stream's caller gets an `error` event,
/// the NDJSON caller a body cut short; one that fails before any value is answered as any
/// failed call (502 with its error). The record says how far it went.
#[tokio::test(flavor = "multi_thread")]
async fn a_generator_that_fails_tells_the_caller_as_its_format_can_and_its_record_says_how_far_it_went() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "stream-fails", "");
    let code = "def main(a):\n    for i in range(a['n']):\n        yield i\n    raise ValueError('no more')\n";
    inv.put_action("fails", python(code)).await;
    let response = call(&inv, "fails", "text/event-stream", json!({ "n": 2 })).await;
    let id = activation_id(&response);
    assert_eq!(response.text().await.unwrap(), "data: 0\n\ndata: 1\n\nevent: error\ndata: {\"error\":\"no more\"}\n\n");
    let record = inv.record(&id).await;
    assert_eq!(record["response"]["status"], "application error");
    assert_eq!(
        record["response"]["result"],
        json!({ "values": 2, "bytes": 2, "last": 1, "end": "failed", "error": "no more" })
    );

    let response = call(&inv, "fails", "application/x-ndjson", json!({ "n": 2 })).await;
    let mut body = response.bytes_stream();
    let mut read = Vec::new();
    let cut = loop {
        match body.next().await {
            Some(Ok(part)) => read.extend_from_slice(&part),
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert_eq!((read.as_slice(), cut), (&b"0\n1\n"[..], true), "the body is cut short, not whole");

    let response = call(&inv, "fails", "application/x-ndjson", json!({ "n": 0 })).await;
    assert_eq!(response.status(), 502);
    let record: Value = response.json().await.unwrap();
    assert_eq!(record["response"]["result"]["error"], "no more", "{record}");
}

/// A reader that stops reading holds the generator back: of 1,000 values of 256 KiB, only what
/// the bounded buffers on the way hold (a few megabytes of socket buffers) was made when the
/// caller left, not the 250 MiB it would have made unchecked.
#[tokio::test(flavor = "multi_thread")]
async fn a_reader_that_stops_reading_holds_the_generator_back() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "stream-slow", "");
    let code = "def main(a):\n    chunk = 'x' * (256 * 1024)\n    for i in range(1000):\n        yield chunk\n";
    inv.put_action("big", json!({ "exec": { "kind": "python:3", "code": code }, "limits": { "memory": 256 } })).await;
    let response = call(&inv, "big", "application/x-ndjson", json!({})).await;
    let id = activation_id(&response);
    let mut body = response.bytes_stream();
    body.next().await.unwrap().unwrap();
    // Time for an unchecked generator to run far ahead (not a measure: the count below is).
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(body);
    let record = inv.record(&id).await;
    let result = &record["response"]["result"];
    assert_eq!(result["end"], "the caller left", "{result}");
    let values = result["values"].as_u64().unwrap();
    eprintln!("{values} values of 256 KiB went out before the caller left");
    assert!(values < 200, "{values} values of 256 KiB went out to a caller that read one");
    assert_eq!(result["bytes"].as_u64().unwrap(), values * (256 * 1024 + 2));
}

/// The action's time limit covers the whole stream: a generator that never ends is stopped
/// at it, its caller's body cut short, and its record says it timed out.
#[tokio::test(flavor = "multi_thread")]
async fn the_actions_timeout_covers_the_whole_stream() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "stream-timeout", "");
    let code = "import time\ndef main(a):\n    i = 0\n    while True:\n        yield i\n        i += 1\n        time.sleep(0.05)\n";
    inv.put_action("endless", json!({ "exec": { "kind": "python:3", "code": code }, "limits": { "timeout": 1000 } }))
        .await;
    let response = call(&inv, "endless", "application/x-ndjson", json!({})).await;
    let id = activation_id(&response);
    let mut body = response.bytes_stream();
    let mut cut = false;
    while let Some(part) = tokio::time::timeout(Duration::from_secs(30), body.next()).await.unwrap() {
        if part.is_err() {
            cut = true;
            break;
        }
    }
    assert!(cut, "the body of a stream stopped at its timeout is cut short");
    let record = inv.record(&id).await;
    assert_eq!(annotation(&record, "timeout"), &json!(true), "{record}");
    assert_eq!(record["response"]["status"], "action developer error");
}

/// Through a scheduler: the invoker's stream passes through it part by part (the first value
/// read while the generator still sleeps), a caller that leaves stops the action on the
/// invoker, and the scheduler's record is the invoker's, with where it ran; a caller that asks
/// for no stream gets the array.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn a_stream_passes_through_a_scheduler_and_its_record_is_the_invokers() {
    let Some(etcd) = support::etcd::EtcdServer::start() else { return };
    let dir = tempdir();
    let (on_invoker, scheduler) =
        Invoker::invoker_and_scheduler(dir.path(), &etcd.url(), CONTROLLER, "stream-inv").await;
    let code = "import time\ndef main(a):\n    yield {'first': True}\n    if a.get('wait'):\n        time.sleep(30)\n    yield {'second': True}\n";
    scheduler.put_action("gen", python(code)).await;

    let response = call(&scheduler, "gen", "application/x-ndjson", json!({ "wait": true })).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let id = activation_id(&response);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(20), body.next()).await;
    assert_eq!(&first.expect("the first value came early").unwrap().unwrap()[..], b"{\"first\":true}\n");
    drop(body);
    let record = scheduler.record(&id).await;
    assert_eq!(record["response"]["result"]["end"], "the caller left", "{record}");
    assert_eq!(annotation(&record, "invoker"), &json!("stream-inv"));

    let response = call(&scheduler, "gen", "text/event-stream", json!({})).await;
    let id = activation_id(&response);
    assert_eq!(response.text().await.unwrap(), "data: {\"first\":true}\n\ndata: {\"second\":true}\n\n");
    let record = scheduler.record(&id).await;
    assert_eq!(
        record["response"]["result"],
        json!({ "values": 2, "bytes": 29, "last": { "second": true }, "end": "complete" }),
        "{record}"
    );

    let (status, body) = scheduler.invoke("gen", "blocking=true&result=true", json!({})).await;
    assert_eq!((status, body), (200, json!([{ "first": true }, { "second": true }])));

    // The invoker lost mid-stream: the caller's body is cut short, and the record says so.
    let response = call(&scheduler, "gen", "application/x-ndjson", json!({ "wait": true })).await;
    let id = activation_id(&response);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(20), body.next()).await;
    assert_eq!(&first.expect("the first value came early").unwrap().unwrap()[..], b"{\"first\":true}\n");
    on_invoker.signal(nix::sys::signal::Signal::SIGKILL);
    let rest = tokio::time::timeout(Duration::from_secs(20), body.next()).await.expect("the body ended");
    assert!(matches!(rest, Some(Err(_))), "cut short, not ended: {rest:?}");
    let record = scheduler.record(&id).await;
    let error = record["response"]["result"]["error"].as_str().unwrap_or_default().to_string();
    assert!(error.contains("was lost while it streamed") && error.contains("15 bytes"), "{record}");
}
