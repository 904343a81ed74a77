//! The HTTP surface against the mock factory: OpenWhisk's REST subset, the activation shim,
//! status codes with one meaning each, and a property test that no request gets a 500.

mod support;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use invoker::activation::ActivationService;
use invoker::api::{AppState, Response};
use invoker::app::InvokerApp;
use invoker::config::Config;
use invoker::factory::mock::{MockConfig, MockFactory};
use invoker::factory::Factory;
use invoker_factory::contract::Epoch;
use invoker_wire::model::new_activation_id;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

const GUEST: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";
const OTHER: &str = "11111111-2222-3333-4444-555555555555:other-key";
const ADMIN: &str = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee:admin-key";
const CONTROLLER: &str = "cccccccc-cccc-cccc-cccc-cccccccccccc:controller-key";

struct Harness {
    app: InvokerApp,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn service(&self) -> &ActivationService {
        self.app.service()
    }
}

/// The invoker as `main` builds it (the production store included), on a mock factory, with
/// three more keys: another namespace's, the admin's and a controller's.
async fn harness(tweak: impl FnOnce(&mut Config), mock: MockConfig) -> (Harness, Arc<AppState>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config { listen: "127.0.0.1:0".parse().unwrap(), data_dir: dir.path().join("data"), ..Config::default() };
    config.factory.kind = invoker::config::FactoryKind::Mock;
    config.namespaces.insert("other".into(), OTHER.into());
    config.admin.key = Some(ADMIN.into());
    config.admin.controller_keys = vec![CONTROLLER.into()];
    config.limits.payload_max_bytes = 64 * 1024;
    config.limits.code_max_bytes = 256 * 1024;
    tweak(&mut config);
    config.validate().unwrap();
    let factory = Factory::Mock(MockFactory::new(mock, Epoch(Instant::now())));
    let app = InvokerApp::start_on(config, Some(factory)).await.unwrap();
    let state = app.state().clone();
    (Harness { app, _dir: dir }, state)
}

fn auth(key: &str) -> (&'static str, String) {
    ("authorization", format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(key)))
}

/// A request built as a client would send it, handed to the API in-process.
#[derive(Default)]
struct Req {
    method: &'static str,
    uri: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Req {
    fn method(method: &'static str) -> Req {
        Req { method, ..Req::default() }
    }
    fn get() -> Req {
        Req::method("GET")
    }
    fn put() -> Req {
        Req::method("PUT")
    }
    fn post() -> Req {
        Req::method("POST")
    }
    fn delete() -> Req {
        Req::method("DELETE")
    }
    fn patch() -> Req {
        Req::method("PATCH")
    }
    fn uri(mut self, uri: &str) -> Req {
        self.uri = uri.to_string();
        self
    }
    fn insert_header(mut self, (name, value): (&str, String)) -> Req {
        self.headers.push((name.to_string(), value));
        self
    }
    fn set_json(mut self, body: Value) -> Req {
        self.body = serde_json::to_vec(&body).unwrap();
        self.insert_header(("content-type", "application/json".into()))
    }
    fn set_payload(mut self, body: impl Into<Vec<u8>>) -> Req {
        self.body = body.into();
        self
    }
    fn build(self) -> hyper::Request<Full<Bytes>> {
        let mut request = hyper::Request::builder().method(self.method).uri(self.uri);
        for (name, value) in self.headers {
            request = request.header(name, value);
        }
        request.body(Full::new(Bytes::from(self.body))).unwrap()
    }
}

async fn call(app: &AppState, req: Req) -> Response {
    app.handle(req.build()).await
}

async fn read_json(response: Response) -> Value {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

async fn send(app: &AppState, req: Req) -> (u16, Value, Option<String>) {
    let response = call(app, req).await;
    let status = response.status().as_u16();
    let id = response.headers().get("x-openwhisk-activation-id").map(|v| v.to_str().unwrap().to_string());
    (status, read_json(response).await, id)
}

/// The record at `path` once it is stored (within 10 s).
async fn stored(app: &AppState, path: &str) -> Value {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (s, record, _) = send(app, get(path)).await;
        if s == 200 {
            return record;
        }
        assert!(Instant::now() < deadline, "the record was never stored");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn put(path: &str, body: Value) -> Req {
    Req::put().uri(path).insert_header(auth(GUEST)).set_json(body)
}

fn post(path: &str, body: Value) -> Req {
    Req::post().uri(path).insert_header(auth(GUEST)).set_json(body)
}

fn get(path: &str) -> Req {
    Req::get().uri(path).insert_header(auth(GUEST))
}

fn echo_action() -> Value {
    json!({"exec": {"kind": "python:3", "code": "def main(a): return a"}, "limits": {"memory": 256}})
}

#[actix_rt::test]
async fn actions_are_created_read_listed_and_deleted() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    let (s, body, _) = send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!((body["namespace"].as_str(), body["version"].as_str()), (Some("guest"), Some("0.0.1")));
    let (s, body, _) = send(&app, put("/api/v1/namespaces/guest/actions/echo", echo_action())).await;
    assert_eq!(s, 409, "{body}");
    let (s, body, _) = send(&app, put("/api/v1/namespaces/_/actions/echo?overwrite=true", echo_action())).await;
    assert_eq!((s, body["version"].as_str()), (200, Some("0.0.2")));
    let (s, body, _) = send(&app, get("/api/v1/namespaces/_/actions/echo")).await;
    assert_eq!((s, body["name"].as_str()), (200, Some("echo")));
    let (s, body, _) = send(&app, get("/api/v1/namespaces/_/actions")).await;
    assert_eq!((s, body.as_array().map(Vec::len)), (200, Some(1)));
    let delete = Req::delete().uri("/api/v1/namespaces/_/actions/echo").insert_header(auth(GUEST));
    assert_eq!(send(&app, delete).await.0, 200);
    assert_eq!(send(&app, get("/api/v1/namespaces/_/actions/echo")).await.0, 404);
    let patch = Req::patch().uri("/api/v1/namespaces/_/actions/echo").insert_header(auth(GUEST));
    let (s, body, _) = send(&app, patch).await;
    assert_eq!(s, 405, "{body}");
    assert!(body["error"].as_str().unwrap().contains("PATCH"), "{body}");
}

#[actix_rt::test]
async fn auth_and_namespaces() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    let no_auth = Req::get().uri("/api/v1/namespaces/_/actions");
    assert_eq!(send(&app, no_auth).await.0, 401);
    let wrong = Req::get().uri("/api/v1/namespaces/_/actions").insert_header(auth("a:b"));
    assert_eq!(send(&app, wrong).await.0, 401);
    let garbage = Req::get().uri("/api/v1/namespaces/_/actions").insert_header(("authorization", "Basic !!!".into()));
    assert_eq!(send(&app, garbage).await.0, 401);
    let (s, body, _) = send(&app, get("/api/v1/namespaces/other/actions")).await;
    assert_eq!(s, 403, "{body}");
    // A body too large for any route is refused as unauthorized, not read, without a key.
    let stranger = Req::put().uri("/api/v1/namespaces/_/actions/a").set_payload(vec![b'x'; 512 * 1024]);
    assert_eq!(send(&app, stranger).await.0, 401);
    let keyed = Req::put().uri("/api/v1/namespaces/_/actions/a").insert_header(auth(GUEST));
    assert_eq!(send(&app, keyed.set_payload(vec![b'x'; 512 * 1024])).await.0, 413);
    assert_eq!(send(&app, Req::get().uri("/ping")).await.0, 200);
    let (s, body, _) = send(&app, admin_get("/health")).await;
    assert_eq!((s, body["status"].as_str(), body["can_launch"].as_bool()), (200, Some("healthy"), Some(true)));
    let (s, _, _) = send(&app, admin_get("/v1/pool")).await;
    assert_eq!(s, 200);
}

fn admin_get(path: &str) -> Req {
    Req::get().uri(path).insert_header(auth(ADMIN))
}

/// A scrape brings the container gauges up to date from the pool's own counts.
#[actix_rt::test]
async fn a_metrics_scrape_counts_the_containers_by_state() {
    let (_h, app) = harness(|_| {}, MockConfig::default()).await;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let (s, body, _) = send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({}))).await;
    assert_eq!(s, 200, "{body}");
    let response = call(&app, admin_get("/metrics")).await;
    assert_eq!(response.status(), 200);
    let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("invoker_containers{state=\"idle\"} 1"), "{text}");
    assert!(text.contains("invoker_containers{state=\"busy\"} 0"), "{text}");
}

/// The caller's parameters reach the runtime as the bytes they came as, over the action's
/// defaults (a default the caller also gives is the caller's); a body that is not one JSON
/// object is a 400 naming the body, and nothing runs.
#[actix_rt::test]
async fn the_callers_parameters_go_over_the_actions_defaults_as_they_came() {
    let (_h, app) = harness(|_| {}, MockConfig::default()).await;
    let url = "/api/v1/namespaces/_/actions/defaults";
    let defaults = json!([{"key": "name", "value": "default"}, {"key": "greeting", "value": "hi \"you\""}]);
    let action = json!({"exec": {"kind": "python:3", "code": "def main(a): return a"}, "parameters": defaults});
    assert_eq!(send(&app, put(url, action)).await.0, 200);
    let given = json!({"name": "caller", "n": [1, {"x": null}]});
    let (s, body, _) = send(&app, post(&format!("{url}?blocking=true&result=true"), given)).await;
    assert_eq!(s, 200, "{body}");
    let expected = json!({"greeting": "hi \"you\"", "name": "caller", "n": [1, {"x": null}]});
    assert_eq!(body["echo"], expected);
    for empty in ["", " \n", "{}", " { } "] {
        let req = Req::post().uri(&format!("{url}?blocking=true&result=true")).insert_header(auth(GUEST));
        let (s, body, _) = send(&app, req.set_payload(empty)).await;
        assert_eq!((s, &body["echo"]), (200, &json!({"greeting": "hi \"you\"", "name": "default"})), "{empty:?}");
    }
    for bad in ["[1]", "\"x\"", "{\"a\":", "{} {}", "{\"a\" 1}"] {
        let req = Req::post().uri(&format!("{url}?blocking=true")).insert_header(auth(GUEST));
        let (s, answer, _) = send(&app, req.set_payload(bad)).await;
        assert_eq!(s, 400, "{bad}: {answer}");
        assert!(answer["error"].as_str().unwrap().contains("request body"), "{bad}: {answer}");
    }
}

#[actix_rt::test]
async fn admin_routes_need_the_admin_key() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/secret-name", echo_action())).await;
    for path in ["/v1/pool", "/metrics"] {
        for key in [GUEST, OTHER, CONTROLLER] {
            let (s, body, _) = send(&app, Req::get().uri(path).insert_header(auth(key))).await;
            assert_eq!(s, 403, "{path} with a non-admin key: {body}");
            assert!(!body.to_string().contains("secret-name"), "{body}");
        }
        assert_eq!(send(&app, Req::get().uri(path)).await.0, 401, "{path} without a key");
        assert_eq!(send(&app, admin_get(path)).await.0, 200, "{path} with the admin key");
    }
    // /health: the state word for anyone, the details for the admin only.
    for req in [Req::get().uri("/health"), get("/health")] {
        let (s, body, _) = send(&app, req).await;
        assert_eq!((s, body), (200, json!({"status": "healthy"})));
    }
    let (s, body, _) = send(&app, admin_get("/health")).await;
    assert!(s == 200 && body["nodes"].is_array(), "{body}");
    // The admin and controller keys own no namespace.
    for key in [ADMIN, CONTROLLER] {
        let req = Req::get().uri("/api/v1/namespaces/_/actions").insert_header(auth(key));
        assert_eq!(send(&app, req).await.0, 403);
    }
    let head = call(&app, Req::method("HEAD").uri("/ping")).await;
    assert_eq!(head.status(), 200, "HEAD is served wherever GET is");
}

#[actix_rt::test]
async fn bad_input_gets_a_4xx_naming_the_field() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    let url = "/api/v1/namespaces/_/actions/a";
    let cases = [
        (json!({"exec": {"kind": "cobol", "code": "x"}}), "exec.kind"),
        (json!({"exec": {"kind": "python:3", "code": ""}}), "exec.code"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "limits": {"memory": 1}}), "limits.memory"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "limits": {"timeout": 0}}), "limits.timeout"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "limits": {"disk": 1}}), "limits.disk"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "limits": {"disk": 1 << 20}}), "limits.disk"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "limits": {"disk": -1}}), "disk"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "limits": {"memory": "big"}}), "memory"),
        (json!({"exec": {"kind": "python:3", "code": "x"}, "bogus": 1}), "bogus"),
        (json!({}), "exec"),
        // A main that names no function of the kind's language.
        (json!({"exec": {"kind": "python:3", "code": "x", "main": "a;b"}}), "exec.main"),
        (json!({"exec": {"kind": "python:3", "code": "x", "main": "$main"}}), "exec.main"),
        (json!({"exec": {"kind": "nodejs:20", "code": "x", "main": "9lives"}}), "exec.main"),
        (json!({"exec": {"kind": "nodejs:20", "code": "x", "main": "a.b"}}), "exec.main"),
        (json!({"exec": {"kind": "native", "code": "x", "main": "line\nbreak"}}), "exec.main"),
        (json!({"exec": {"kind": "python:3", "code": "x", "main": ""}}), "exec.main"),
    ];
    for (body, field) in cases {
        let (s, answer, _) = send(&app, put(url, body.clone())).await;
        let message = answer["error"].as_str().unwrap_or_default();
        assert_eq!(s, 400, "{body} -> {answer}");
        assert!(message.contains(field), "{body}: '{message}' does not name {field}");
    }
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/-bad", echo_action())).await;
    assert_eq!(s, 400, "{answer}");
    let malformed = Req::put().uri(url).insert_header(auth(GUEST)).set_payload("{\"exec\":");
    let (s, answer, _) = send(&app, malformed).await;
    assert_eq!(s, 400);
    assert!(answer["error"].as_str().unwrap().contains("request body"), "{answer}");
    let huge = "x".repeat(300 * 1024);
    let (s, _, _) = send(&app, put(url, json!({"exec": {"kind": "python:3", "code": huge}}))).await;
    assert_eq!(s, 413);
    send(&app, put(url, echo_action())).await;
    let (s, answer, _) = send(&app, post(&format!("{url}?blocking=maybe"), json!({}))).await;
    assert!(s == 400 && answer["error"].as_str().unwrap().contains("blocking"), "{answer}");
    let (s, answer, _) = send(&app, post(url, json!([1, 2]))).await;
    assert!(s == 400 && answer["error"].as_str().unwrap().contains("request body"), "{answer}");
    let (s, _, _) = send(&app, post(url, json!({"big": "y".repeat(70 * 1024)}))).await;
    assert_eq!(s, 413);
    let (s, _, _) = send(&app, get("/api/v1/namespaces/_/activations/nothex")).await;
    assert_eq!(s, 400);
    let (s, _, _) = send(&app, get("/api/v1/namespaces/_/activations?limit=-1")).await;
    assert_eq!(s, 400);
    let trailing = Req::put()
        .uri("/api/v1/namespaces/_/actions/t")
        .insert_header(auth(GUEST))
        .set_payload(r#"{"exec":{"kind":"python:3","code":"def main(a): return a"}}xyz"#);
    let (s, answer, _) = send(&app, trailing).await;
    assert!(s == 400 && answer["error"].as_str().unwrap().contains("trailing characters"), "{answer}");
    let not_base64 = json!({"exec": {"kind": "python:3", "code": "not base64!", "binary": true}});
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/b", not_base64)).await;
    assert!(s == 400 && answer["error"].as_str().unwrap().contains("exec.code"), "{answer}");
    assert_eq!(send(&app, get("/api/v1/namespaces/_/actions/b")).await.0, 404, "nothing was stored");
    for main in ["handler", "_h1"] {
        let body = json!({"exec": {"kind": "python:3", "code": "def handler(a): return a", "main": main}});
        let (s, answer, _) = send(&app, put(&format!("{url}?overwrite=true"), body)).await;
        assert_eq!(s, 200, "{main}: {answer}");
    }
    let (s, answer, _) = send(
        &app,
        put(&format!("{url}?overwrite=true"), json!({"exec": {"kind": "nodejs:20", "code": "x", "main": "$h"}})),
    )
    .await;
    assert_eq!(s, 200, "{answer}");
}

#[actix_rt::test]
async fn invoke_blocking_non_blocking_and_read_the_records() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let (s, body, id) = send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({"x": 1}))).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(id.as_deref(), body["activationId"].as_str());
    assert_eq!(body["response"]["result"]["echo"]["x"], 1);
    let (s, body, _) =
        send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true&result=true", json!({"x": 2}))).await;
    assert_eq!((s, &body["echo"]["x"]), (200, &json!(2)));
    let (s, body, id) = send(&app, post("/api/v1/namespaces/_/actions/echo", json!({"x": 3}))).await;
    assert_eq!(s, 202);
    let id = id.unwrap();
    assert_eq!(body["activationId"].as_str(), Some(id.as_str()));
    let mut record = Value::Null;
    for _ in 0..500 {
        let (s, body, _) = send(&app, get(&format!("/api/v1/namespaces/_/activations/{id}"))).await;
        if s == 200 {
            record = body;
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(record["response"]["result"]["echo"]["x"], 3, "{record}");
    let (s, logs, _) = send(&app, get(&format!("/api/v1/namespaces/_/activations/{id}/logs"))).await;
    assert!(s == 200 && logs["logs"].as_array().is_some_and(|l| !l.is_empty()), "{logs}");
    let (s, result, _) = send(&app, get(&format!("/api/v1/namespaces/_/activations/{id}/result"))).await;
    assert_eq!((s, &result["result"]["echo"]["x"]), (200, &json!(3)));
    let (s, list, _) = send(&app, get("/api/v1/namespaces/_/activations?name=echo&limit=2")).await;
    assert_eq!((s, list.as_array().map(Vec::len)), (200, Some(2)));
    let (s, _, _) = send(&app, get(&format!("/api/v1/namespaces/_/activations/{}", new_activation_id()))).await;
    assert_eq!(s, 404);
    let (s, body, id) =
        send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({"error": "nope"}))).await;
    assert_eq!((s, &body["response"]["statusCode"]), (502, &json!(1)));
    assert!(id.is_some());
    let (s, _, _) = send(&app, post("/api/v1/namespaces/_/actions/missing?blocking=true", json!({}))).await;
    assert_eq!(s, 404);
}

#[actix_rt::test]
async fn never_fits_is_400_and_a_namespace_over_its_limit_is_429() {
    let (_h, state) = harness(
        |c| {
            c.limits.memory_max_mb = 4096;
            c.limits.namespace_concurrent = 1;
        },
        MockConfig { nodes: vec![("n".into(), 1024)], ..MockConfig::default() },
    )
    .await;
    let app = state;
    let mut huge = echo_action();
    huge["limits"]["memory"] = json!(2048);
    send(&app, put("/api/v1/namespaces/_/actions/huge", huge)).await;
    let (s, body, id) = send(&app, post("/api/v1/namespaces/_/actions/huge?blocking=true", json!({}))).await;
    assert_eq!(s, 400, "{body}");
    assert!(id.is_some());
    assert!(body["response"]["result"]["error"].as_str().unwrap().contains("limits.memory"), "{body}");
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    // A blocking call whose caller stopped waiting still runs, and holds the namespace's slot.
    let slow = post("/api/v1/namespaces/_/actions/echo?blocking=true&timeout=50", json!({"sleep_ms": 2000}));
    let (s, _, _) = send(&app, slow).await;
    assert_eq!(s, 202);
    let (s, body, _) = send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({}))).await;
    assert_eq!(s, 429, "{body}");
    // An asynchronous call is not refused for the slots: it waits in the queue instead.
    let (s, body, _) = send(&app, post("/api/v1/namespaces/_/actions/echo", json!({}))).await;
    assert_eq!(s, 202, "{body}");
}

#[actix_rt::test]
async fn nothing_ran_is_503_with_retry_after_and_a_status_3_record() {
    let (_h, state) = harness(|_| {}, MockConfig { fail_creates: true, ..MockConfig::default() }).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let response = call(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({}))).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body = read_json(response).await;
    assert_eq!(body["response"]["statusCode"], 3);
    assert_eq!(body["response"]["status"], "whisk internal error");
    for _ in 0..2 {
        send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({}))).await;
    }
    let (s, health, _) = send(&app, admin_get("/health")).await;
    assert_eq!((s, health["status"].as_str()), (200, Some("unhealthy")), "{health}");
    assert!(health["nodes"][0]["reserved_mb"].is_u64() && health["nodes"][0]["used_mb"].is_u64(), "{health}");
}

fn activation_message(id: &str, blocking: bool) -> Value {
    json!({
        "transid": ["tid-1", 1712345678901u64],
        "action": {"path": "guest", "name": "echo", "version": "0.0.1"},
        "revision": "1-abc",
        "user": {"subject": "guest", "namespace": {"name": "guest", "uuid": "u"},
                 "authkey": {"api_key": GUEST}, "rights": ["READ", "PUT", "DELETE", "ACTIVATE"], "limits": {}},
        "activationId": id,
        "rootControllerIndex": {"asString": "0", "instanceType": "controller"},
        "blocking": blocking,
        "content": {"x": 7},
        "initArgs": [],
        "lockedArgs": {},
    })
}

/// Issue 57: a run whose lines come after its answer (as an engine's log stream brings them)
/// is answered with its result at once, and its record stored once whole: a blocking invoke
/// answers with the record as the result made it (no logs yet, as OpenWhisk's does), `GET`
/// shows the record once whole, and the shim answers a caller that takes two parts with the
/// `ResultMessage` then the whole record.
#[actix_rt::test]
async fn the_answer_goes_out_with_the_result_and_the_record_once_its_lines_came() {
    let (_h, app) = harness(|_| {}, MockConfig::default()).await;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let late = json!({"logs_after_ms": 300});
    let (s, answer, id) = send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", late.clone())).await;
    assert_eq!((s, &answer["logs"]), (200, &json!([])), "{answer}");
    assert_eq!(answer["response"]["result"]["echo"], late);
    let path = format!("/api/v1/namespaces/_/activations/{}", id.unwrap());
    assert_eq!(send(&app, get(&path)).await.0, 404, "not whole yet: not shown");
    let record = stored(&app, &path).await;
    assert!(record["logs"].to_string().contains("mock run in container"), "whole: {record}");
    assert_eq!(record["response"], answer["response"]);

    let (s, result, _) =
        send(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true&result=true", late.clone())).await;
    assert_eq!((s, &result["echo"]), (200, &late));

    let mut message = activation_message(&new_activation_id(), true);
    message["content"] = late.clone();
    let asks = post("/v1/activations", message).insert_header(("accept", "application/x-ndjson".into()));
    let response = call(&app, asks).await;
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let follows = response.extensions().get::<invoker_http::Follows>().cloned().expect("a second part follows");
    let body = follows.into_body().collect().await.unwrap().to_bytes();
    let parts: Vec<Value> =
        body.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert_eq!(parts[0]["response"]["logs"], json!([]), "the result message first");
    assert!(parts[0].get("instance").is_none(), "a ResultMessage: {}", parts[0]);
    assert!(parts[1]["response"]["logs"].to_string().contains("mock run"), "then the whole record");
    assert_eq!(parts[1]["instance"]["instanceType"], "invoker");
    // A caller that takes one message gets it as soon as the result is known.
    let mut message = activation_message(&new_activation_id(), true);
    message["content"] = late;
    let response = call(&app, post("/v1/activations", message)).await;
    assert!(response.extensions().get::<invoker_http::Follows>().is_none());
    let ack = read_json(response).await;
    assert_eq!(ack["response"]["logs"], json!([]), "{ack}");
}

/// `POST /v1/activations` as a scheduler sends a queued call it keeps until it starts, on a
/// connection of its own: the request's bytes.
fn queued_call_request(id: &str) -> Vec<u8> {
    let body = activation_message(id, true).to_string();
    let key = base64::engine::general_purpose::STANDARD.encode(CONTROLLER);
    format!(
        "POST /v1/activations HTTP/1.1\r\nhost: invoker\r\nauthorization: Basic {key}\r\n\
         content-type: application/json\r\naccept: application/x-ndjson\r\n{}: 1\r\n\
         content-length: {}\r\n\r\n{body}",
        invoker_wire::cluster::REPORT_START,
        body.len()
    )
    .into_bytes()
}

/// Issue 58: a queued call a scheduler keeps until an invoker starts it is told of its start
/// on a line of its own, ahead of its record; and one whose scheduler went away before a
/// container took it (its connection closed while the container started) never runs: its
/// record says nothing ran, for the scheduler runs it elsewhere.
#[actix_rt::test]
async fn a_queued_call_is_reported_started_and_never_starts_once_its_scheduler_left() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let slow_start = MockConfig { start_latency: std::time::Duration::from_millis(800), ..MockConfig::default() };
    let (h, app) = harness(|_| {}, slow_start).await;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let bound = std::time::Duration::from_secs(10);

    // Gone while its container starts (a cold one: 800 ms).
    let gone_id = new_activation_id();
    let mut gone = tokio::net::TcpStream::connect(h.app.addr()).await.unwrap();
    gone.write_all(&queued_call_request(&gone_id)).await.unwrap();
    // The call is in: its container is starting (800 ms) when the caller goes.
    let pool = h.app.pool().clone();
    support::eventually(bound, "the call's container starting", || async {
        support::done(pool.status().await.is_some_and(|s| s.starting == 1))
    })
    .await;
    drop(gone);
    let record = stored(&app, &format!("/api/v1/namespaces/_/activations/{gone_id}")).await;
    let rejected = record["annotations"].as_array().unwrap().iter().find(|a| a["key"] == "rejected");
    assert_eq!(rejected.map(|a| &a["value"]), Some(&json!("caller_gone")), "{record}");
    assert_eq!(record["response"]["statusCode"], 3, "{record}");

    // Kept: the container it left behind takes the next.
    let kept_id = new_activation_id();
    let mut kept = tokio::net::TcpStream::connect(h.app.addr()).await.unwrap();
    kept.write_all(&queued_call_request(&kept_id)).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    while !answer.ends_with(b"\r\n0\r\n\r\n") {
        let n = tokio::time::timeout(bound, kept.read(&mut chunk)).await.expect("an answer").unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
    let answer = String::from_utf8_lossy(&answer).to_string();
    let started = answer.find(invoker_wire::cluster::STARTED_LINE).expect("the started line");
    let record = answer.find("\"statusCode\":0").expect("then the record");
    assert!(started < record, "{answer}");
}

/// A scheduler's queued call that an earlier delivery ended unrun (here: its container could not
/// be created) is run by the next delivery of the same id, not answered with the refusal: the
/// scheduler keeps it until an invoker starts it, and it could never run here again otherwise.
/// The activation keeps one record, the last.
#[actix_rt::test]
async fn a_queued_call_refused_unrun_runs_again_when_its_scheduler_sends_it_again() {
    let failing = MockConfig { fail_creates: true, ..MockConfig::default() };
    let (h, app) = harness(|_| {}, failing).await;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let id = new_activation_id();
    let deliver = || async {
        let http = reqwest::Client::new();
        let key = base64::engine::general_purpose::STANDARD.encode(CONTROLLER);
        let answer = http
            .post(format!("http://{}/v1/activations", h.app.addr()))
            .header("authorization", format!("Basic {key}"))
            .header("accept", "application/x-ndjson")
            .header(invoker_wire::cluster::REPORT_START, "1")
            .json(&activation_message(&id, true))
            .send()
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        answer["response"].clone()
    };
    let first = deliver().await;
    // Records' times are whole milliseconds: the second attempt ends visibly later.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let second = deliver().await;
    let rejected = |r: &Value| r["annotations"].as_array().unwrap().iter().any(|a| a["value"] == "create_failed");
    assert!(rejected(&first) && rejected(&second), "{first} {second}");
    assert!(second["end"].as_u64() > first["end"].as_u64(), "tried again, not the first answer replayed: {second}");
    let (_, listed, _) = send(&app, get("/api/v1/namespaces/_/activations?name=echo&limit=50")).await;
    let mine = listed.as_array().unwrap().iter().filter(|r| r["activationId"] == id.as_str()).count();
    assert_eq!(mine, 1, "{listed}");
}

#[actix_rt::test]
async fn the_activation_shim_answers_with_the_combined_message_and_never_runs_twice() {
    let (h, state) = harness(|c| c.invoker_id = "invoker3".into(), MockConfig::default()).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let id = new_activation_id();
    let (s, ack, _) = send(&app, post("/v1/activations", activation_message(&id, true))).await;
    assert_eq!(s, 200, "{ack}");
    assert_eq!(ack["transid"], json!(["tid-1", 1712345678901u64]));
    assert_eq!(ack["isSystemError"], false);
    assert_eq!(ack["instance"]["instance"], 3);
    assert_eq!(ack["instance"]["uniqueName"], "invoker3");
    assert_eq!(ack["instance"]["instanceType"], "invoker");
    assert_eq!(ack["instance"]["userMemory"], "2048 MB", "the mock cluster's one node");
    assert_eq!(ack["response"]["activationId"].as_str(), Some(id.as_str()));
    assert_eq!(ack["response"]["response"]["result"]["echo"]["x"], 7);
    let (s, again, _) = send(&app, post("/v1/activations", activation_message(&id, true))).await;
    assert_eq!(s, 200);
    assert_eq!(again["response"], ack["response"], "the repeat is answered from the first");
    let metrics = h.service().metrics().render();
    assert!(metrics.contains("invoker_activations_total{status=\"success\"} 1"), "{metrics}");

    let (s, body, _) = send(&app, post("/v1/activations", activation_message(&new_activation_id(), false))).await;
    assert_eq!(s, 202, "{body}");
    let mut missing = activation_message(&new_activation_id(), true);
    missing["action"]["name"] = json!("nope");
    assert_eq!(send(&app, post("/v1/activations", missing)).await.0, 404);
    let mut foreign = activation_message(&new_activation_id(), true);
    foreign["action"]["path"] = json!("other");
    assert_eq!(send(&app, post("/v1/activations", foreign)).await.0, 403);
    for (field, value, named) in [
        ("activationId", json!("xyz"), "activationId"),
        ("blocking", json!("yes"), "blocking"),
        ("transid", json!("tid"), "transid"),
        ("content", json!([1]), "content"),
        ("action", json!({"path": "guest"}), "action"),
    ] {
        let mut msg = activation_message(&new_activation_id(), true);
        msg[field] = value;
        let (s, body, _) = send(&app, post("/v1/activations", msg)).await;
        assert_eq!(s, 400, "{field}: {body}");
        assert!(body["error"].as_str().unwrap().contains(named), "{field}: {body}");
    }
    let mut no_id = activation_message(&new_activation_id(), true);
    no_id.as_object_mut().unwrap().remove("activationId");
    let (s, body, _) = send(&app, post("/v1/activations", no_id)).await;
    assert!(s == 400 && body["error"].as_str().unwrap().contains("activationId"), "{body}");
}

/// `activation_message` with `key`'s namespace `ns` throughout.
fn message_as(ns: &str, key: &str, id: &str, blocking: bool) -> Value {
    let mut msg = activation_message(id, blocking);
    msg["action"]["path"] = json!(ns);
    msg["user"]["subject"] = json!(ns);
    msg["user"]["namespace"]["name"] = json!(ns);
    msg["user"]["authkey"]["api_key"] = json!(key);
    msg
}

fn shim_post(key: &str, body: Value) -> Req {
    Req::post().uri("/v1/activations").insert_header(auth(key)).set_json(body)
}

#[actix_rt::test]
async fn the_shim_never_answers_from_another_namespaces_record() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let other_put = Req::put().uri("/api/v1/namespaces/_/actions/echo").insert_header(auth(OTHER));
    assert_eq!(send(&app, other_put.set_json(echo_action())).await.0, 200);
    // guest's activation, finished, with a secret in its result.
    let id = new_activation_id();
    let mut secret = message_as("guest", GUEST, &id, true);
    secret["content"] = json!({"password": "hunter2"});
    let (s, first, _) = send(&app, shim_post(GUEST, secret)).await;
    assert_eq!(s, 200, "{first}");
    // other replays guest's id for its own action, blocking and not.
    for blocking in [true, false] {
        let (s, body, _) = send(&app, shim_post(OTHER, message_as("other", OTHER, &id, blocking))).await;
        assert_eq!(s, 409, "blocking={blocking}: {body}");
        assert!(!body.to_string().contains("hunter2"), "{body}");
        assert!(body["error"].as_str().unwrap().contains("activationId"), "{body}");
    }
    // While guest's is still running (pending), too.
    let running = new_activation_id();
    let mut slow = message_as("guest", GUEST, &running, false);
    slow["content"] = json!({"sleep_ms": 1500, "password": "hunter3"});
    assert_eq!(send(&app, shim_post(GUEST, slow)).await.0, 202);
    let (s, body, _) = send(&app, shim_post(OTHER, message_as("other", OTHER, &running, true))).await;
    assert_eq!(s, 409, "{body}");
    assert!(!body.to_string().contains("hunter3"), "{body}");
    // guest's own repeat is still answered from its first.
    let (s, again, _) = send(&app, shim_post(GUEST, message_as("guest", GUEST, &id, true))).await;
    assert_eq!((s, &again["response"]["response"]["result"]["echo"]["password"]), (200, &json!("hunter2")));
    // and other's record of guest's id does not exist.
    let other_get = Req::get().uri(&format!("/api/v1/namespaces/_/activations/{id}")).insert_header(auth(OTHER));
    assert_eq!(send(&app, other_get).await.0, 404);
}

#[actix_rt::test]
async fn the_shim_takes_the_keys_own_namespace_and_subject_unless_it_is_a_controllers() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    let other_put = Req::put().uri("/api/v1/namespaces/_/actions/echo").insert_header(auth(OTHER));
    assert_eq!(send(&app, other_put.set_json(echo_action())).await.0, 200);
    let mut spoofed = message_as("other", OTHER, &new_activation_id(), true);
    spoofed["user"]["subject"] = json!("guest");
    let (s, body, _) = send(&app, shim_post(OTHER, spoofed.clone())).await;
    assert_eq!(s, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("subject"), "{body}");
    let mut foreign_ns = message_as("other", OTHER, &new_activation_id(), true);
    foreign_ns["user"]["namespace"]["name"] = json!("guest");
    assert_eq!(send(&app, shim_post(OTHER, foreign_ns)).await.0, 403);
    assert_eq!(send(&app, shim_post(ADMIN, message_as("other", OTHER, &new_activation_id(), true))).await.0, 403);
    // A controller key submits for any namespace, with the subject it says.
    let (s, body, _) = send(&app, shim_post(CONTROLLER, spoofed)).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["response"]["subject"], "guest");
    assert_eq!(body["response"]["namespace"], "other");
}

/// `POST /v1/internal/records`: a scheduler asks for the records of activations it wrote
/// guesses for. The controller key only; every id checked; ids without a record are left out.
#[actix_rt::test]
async fn an_invoker_gives_a_controller_the_records_it_holds_and_no_one_else() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    let ran = new_activation_id();
    let (s, body, _) = send(&app, shim_post(CONTROLLER, message_as("guest", GUEST, &ran, true))).await;
    assert_eq!(s, 200, "{body}");
    let ask = |key: &str, ids: Value| {
        Req::post().uri("/v1/internal/records").insert_header(auth(key)).set_json(json!({ "activation_ids": ids }))
    };
    let (s, body, _) = send(&app, ask(CONTROLLER, json!([ran, new_activation_id()]))).await;
    assert_eq!(s, 200, "{body}");
    let records = body["records"].as_array().unwrap();
    assert_eq!((records.len(), &records[0]["activationId"]), (1, &json!(ran)), "{body}");
    assert_eq!(records[0]["response"]["statusCode"], 0);
    for key in [GUEST, OTHER, ADMIN] {
        assert_eq!(send(&app, ask(key, json!([ran]))).await.0, 403, "{key}");
    }
    let (s, body, _) = send(&app, ask(CONTROLLER, json!(["../etc"]))).await;
    assert!(s == 400 && body["error"].as_str().unwrap().contains("activation_ids"), "{body}");
    let too_many: Vec<String> = (0..1001).map(|_| new_activation_id()).collect();
    assert_eq!(send(&app, ask(CONTROLLER, json!(too_many))).await.0, 400);
    let bad = Req::post().uri("/v1/internal/records").insert_header(auth(CONTROLLER)).set_payload("nope");
    assert_eq!(send(&app, bad).await.0, 400);
}

/// The assembly checks the config it is given, whoever made it: a test or an embedding that
/// skips `validate()` gets the same refusal as the command line.
#[actix_rt::test]
async fn the_assembly_refuses_a_config_that_does_not_hold_together() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config { listen: "127.0.0.1:0".parse().unwrap(), data_dir: dir.path().join("data"), ..Config::default() };
    config.factory.kind = invoker::config::FactoryKind::Mock;
    config.invoker_id = "not an id!".into();
    let factory = Factory::Mock(MockFactory::new(MockConfig::default(), Epoch(Instant::now())));
    let refused = InvokerApp::start_on(config, Some(factory)).await.err().expect("refused");
    assert!(refused.to_string().contains("invoker_id"), "{refused}");
    assert!(!dir.path().join("data").exists(), "refused before anything was written");
}

#[actix_rt::test]
async fn draining_refuses_new_work_with_503() {
    let (h, state) = harness(|_| {}, MockConfig::default()).await;
    let app = state;
    send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
    h.service().set_draining();
    let response = call(&app, post("/api/v1/namespaces/_/actions/echo?blocking=true", json!({}))).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let (s, body, _) = send(&app, get("/health")).await;
    assert_eq!((s, body["status"].as_str()), (200, Some("draining")));
}

/// Writes `request` to a real API server and reads its answer until the connection closes.
async fn over_tcp(addr: std::net::SocketAddr, request: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(&request).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer to {:?}", String::from_utf8_lossy(&request[..request.len().min(40)]));
    String::from_utf8_lossy(&answer).into_owned()
}

#[actix_rt::test]
async fn requests_hyper_refuses_get_a_json_reason_and_http2_gets_505() {
    let (_h, state) = harness(|_| {}, MockConfig::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = actix_rt::spawn(invoker::api::server::serve(listener, state, stop.clone()));
    let many_headers: String = (0..2000).map(|i| format!("x-{i}: a\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (format!("GET /ping HTTP/1.1\r\n{many_headers}\r\n").into_bytes(), 431, "headers"),
        (format!("GET /ping HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(1 << 20)).into_bytes(), 431, "headers"),
        (b"POST /ping HTTP/1.1\r\ncontent-length: -5\r\n\r\n".to_vec(), 400, "HTTP/1.1"),
        (b"GARBAGE\r\n\r\n".to_vec(), 400, "HTTP/1.1"),
        (b"\x01\x02\xff\xfe junk\r\n\r\n".to_vec(), 400, "HTTP/1.1"),
        (b"GET /pi\x00ng HTTP/1.1\r\n\r\n".to_vec(), 400, "HTTP/1.1"),
        (format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(100 * 1024)).into_bytes(), 414, "URI"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(), 505, "HTTP/2"),
    ];
    for (request, status, reason) in cases {
        let answer = over_tcp(addr, request).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {answer:?}"));
        assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{status}: {head}");
        let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{status}: {body:?}: {e}"));
        assert!(body["error"].as_str().unwrap().contains(reason), "{status}: {body}");
    }
    let answer = over_tcp(addr, b"HEAD /ping HTTP/1.1\r\nconnection: close\r\n\r\n".to_vec()).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let answer = over_tcp(addr, b"GET /ping HTTP/1.1\r\nconnection: close\r\n\r\n".to_vec()).await;
    assert!(answer.starts_with("HTTP/1.1 200 ") && answer.ends_with(r#"{"ping":"pong"}"#), "{answer}");
    stop.cancel();
    let _ = server.await;
}

mod router_fuzz {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[derive(Debug, Clone)]
    struct Case {
        method: &'static str,
        path: String,
        query: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("_".to_string()),
            Just("guest".to_string()),
            Just("echo".to_string()),
            Just("actions".to_string()),
            Just("activations".to_string()),
            Just("logs".to_string()),
            "[0-9a-f]{32}",
            "[a-zA-Z0-9_.%-]{0,12}",
            ".{0,8}".prop_map(|s| s.chars().filter(|c| c.is_ascii_graphic() && *c != '?' && *c != '#').collect()),
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        let ns = prop_oneof![3 => Just("_".to_string()), 1 => segment()];
        prop_oneof![
            (ns.clone()).prop_map(|ns| format!("/api/v1/namespaces/{ns}/actions")),
            (ns.clone(), segment()).prop_map(|(ns, n)| format!("/api/v1/namespaces/{ns}/actions/{n}")),
            (ns.clone()).prop_map(|ns| format!("/api/v1/namespaces/{ns}/activations")),
            (ns.clone(), segment()).prop_map(|(ns, id)| format!("/api/v1/namespaces/{ns}/activations/{id}")),
            (ns, segment(), segment()).prop_map(|(ns, id, p)| format!("/api/v1/namespaces/{ns}/activations/{id}/{p}")),
            prop_oneof![Just("/v1/activations"), Just("/health"), Just("/metrics"), Just("/v1/pool"), Just("/ping")]
                .prop_map(str::to_string),
            proptest::collection::vec(segment(), 0..5).prop_map(|s| format!("/{}", s.join("/"))),
        ]
    }

    fn case() -> impl Strategy<Value = Case> {
        let body = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            Just(br#"{"exec":{"kind":"python:3","code":"x"}}"#.to_vec()),
            Just(br#"{"transid":["t",1],"action":{"path":"guest","name":"echo"},"user":{"subject":"guest","namespace":{"name":"guest"}},"activationId":"0123456789abcdef0123456789abcdef","blocking":true}"#.to_vec()),
            any::<String>().prop_map(|s| serde_json::to_vec(&json!({ "exec": s, "limits": {"memory": s.len()} })).unwrap()),
            (any::<String>(), any::<i64>()).prop_map(|(s, n)| serde_json::to_vec(&json!({ "exec": {"kind": s, "code": s}, "limits": {"memory": n, "timeout": n}, "parameters": [{"key": s, "value": n}] })).unwrap()),
            Just(b"[1,2,3]".to_vec()),
            Just(b"null".to_vec()),
        ];
        let valid = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(GUEST));
        let header = prop_oneof![
            6 => Just(("authorization".to_string(), valid)),
            1 => Just(("authorization".to_string(), "Basic".to_string())),
            1 => "[ -~]{0,40}".prop_map(|v| ("authorization".to_string(), v)),
            1 => "[ -~]{0,20}".prop_map(|v| ("content-type".to_string(), v)),
            1 => ("[a-z-]{1,12}", "[ -~]{0,20}"),
        ];
        (
            prop_oneof![Just("GET"), Just("PUT"), Just("POST"), Just("DELETE"), Just("PATCH")],
            path(),
            "[a-z=&0-9%]{0,24}",
            proptest::collection::vec(header, 0..3),
            body,
        )
            .prop_map(|(method, path, query, headers, body)| Case { method, path, query, headers, body })
    }

    #[actix_rt::test]
    async fn no_request_gets_a_500_or_a_panic() {
        let (_h, state) = harness(|_| {}, MockConfig::default()).await;
        let app = state;
        send(&app, put("/api/v1/namespaces/_/actions/echo", echo_action())).await;
        let mut runner = TestRunner::deterministic();
        let strategy = case();
        for _ in 0..1000 {
            let case = strategy.new_tree(&mut runner).unwrap().current();
            let uri = if case.query.is_empty() { case.path.clone() } else { format!("{}?{}", case.path, case.query) };
            if uri.parse::<hyper::Uri>().is_err() {
                continue;
            }
            let mut req = Req::method(case.method).uri(&uri).set_payload(case.body.clone());
            for (k, v) in &case.headers {
                if HeaderValue::from_str(v).is_ok() {
                    req = req.insert_header((k.as_str(), v.clone()));
                }
            }
            let status = call(&app, req).await.status();
            assert!(status.as_u16() < 500 || status.as_u16() == 503, "{case:?} -> {status}");
        }
    }
}

/// A kind that does not run the project's own runtime takes one run at a time unless its
/// config says more; an action asking for more is refused at `PUT`, naming the field and why.
#[actix_rt::test]
async fn a_kind_that_is_not_ours_refuses_a_concurrency_above_its_max_concurrency() {
    use invoker_factory::kinds::KindConfig;
    let (_h, app) = harness(
        |c| {
            let foreign = |max: Option<u32>| {
                let mut k = c.kinds["python:3"].clone();
                k.command = vec!["/opt/runtime/proxy".into(), "--listen".into(), "{listen}".into()];
                k.max_concurrency = max;
                k
            };
            let (one, four): (KindConfig, KindConfig) = (foreign(None), foreign(Some(4)));
            c.kinds.insert("foreign".into(), one);
            c.kinds.insert("foreign4".into(), four);
        },
        MockConfig::default(),
    )
    .await;
    let action = |kind: &str, concurrency: Option<u32>| {
        let mut body = json!({ "exec": { "kind": kind, "code": "x" } });
        if let Some(n) = concurrency {
            body["limits"] = json!({ "concurrency": n });
        }
        body
    };
    let url = "/api/v1/namespaces/_/actions/c";
    let (s, answer, _) = send(&app, put(url, action("foreign", Some(2)))).await;
    assert_eq!(s, 400, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(message.contains("limits.concurrency") && message.contains("max_concurrency"), "{message}");
    let (s, answer, _) = send(&app, put(url, action("foreign", None))).await;
    assert_eq!((s, &answer["limits"]["concurrency"]), (200, &json!(1)), "{answer}");
    let url = "/api/v1/namespaces/_/actions/c4";
    assert_eq!(send(&app, put(url, action("foreign4", Some(4)))).await.0, 200);
    assert_eq!(send(&app, put(url, action("foreign4", Some(5)))).await.0, 400);
    let url = "/api/v1/namespaces/_/actions/ours";
    assert_eq!(send(&app, put(url, action("python:3", Some(50)))).await.0, 200, "our runtime: up to concurrency_max");
}

/// A zip action's archive at `PUT`: an entry outside the action's directory (`..`, an absolute
/// path, a symlink pointing out) or more unpacked than `limits.archive_unpacked_max_mb` is a
/// 400 naming the entry and the reason, and nothing is stored; a sound archive is taken.
#[actix_rt::test]
async fn a_zip_action_is_checked_entry_by_entry_at_put() {
    use std::io::Write as _;
    let (_h, app) = harness(|c| c.limits.archive_unpacked_max_mb = 1, MockConfig::default()).await;
    let zip = |files: &[(&str, &[u8])], links: &[(&str, &str)]| {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in files {
            writer.start_file(*name, options).unwrap();
            writer.write_all(data).unwrap();
        }
        for (name, target) in links {
            writer.add_symlink(*name, *target, options).unwrap();
        }
        base64::engine::general_purpose::STANDARD.encode(writer.finish().unwrap().into_inner())
    };
    let main: &[u8] = b"def main(a):\n    return a\n";
    let zeros = vec![0u8; 2 * 1024 * 1024];
    let cases = [
        (zip(&[("__main__.py", main), ("../escape.py", b"x")], &[]), "'../escape.py': a path that climbs out"),
        (zip(&[("__main__.py", main), ("/etc/cron.d/x", b"x")], &[]), "'/etc/cron.d/x': an absolute path"),
        (zip(&[("__main__.py", main)], &[("data", "../../../etc/shadow")]), "'data': a symlink that points outside"),
        (zip(&[("__main__.py", main), ("zeros", &zeros)], &[]), "more than the 1048576 bytes allowed"),
    ];
    for (i, (code, reason)) in cases.into_iter().enumerate() {
        let url = format!("/api/v1/namespaces/_/actions/zip{i}");
        let body = json!({"exec": {"kind": "python:3", "code": code, "binary": true}});
        let (s, answer, _) = send(&app, put(&url, body)).await;
        let message = answer["error"].as_str().unwrap_or_default();
        assert_eq!(s, 400, "{reason}: {answer}");
        assert!(message.starts_with("exec.code: ") && message.contains(reason), "{reason}: {message}");
        assert_eq!(send(&app, get(&url)).await.0, 404, "nothing was stored");
    }
    let sound = zip(&[("__main__.py", main), ("lib/util.py", b"")], &[("lib/alias.py", "util.py")]);
    let body = json!({"exec": {"kind": "python:3", "code": sound, "binary": true}});
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/sound", body)).await;
    assert_eq!(s, 200, "{answer}");
}

/// `limits.disk` is an action's as memory is: the config's default when unset, within its
/// range, and the bound of what the code unpacks to.
#[actix_rt::test]
async fn the_disk_limit_defaults_from_the_config_and_bounds_a_zip_unpacked() {
    use std::io::Write as _;
    let (_h, app) = harness(
        |c| {
            (c.limits.disk_min_mb, c.limits.disk_default_mb) = (1, 64);
            c.limits.archive_unpacked_max_mb = 8;
            c.limits.code_max_bytes = 4 << 20;
        },
        MockConfig::default(),
    )
    .await;
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/plain", echo_action())).await;
    assert_eq!(s, 200, "{answer}");
    assert_eq!(answer["limits"]["disk"], 64, "the config's default: {answer}");
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    writer.start_file("__main__.py", options).unwrap();
    writer.write_all(b"def main(a):\n    return a\n").unwrap();
    writer.start_file("zeros", options).unwrap();
    writer.write_all(&vec![0u8; 3 << 20]).unwrap();
    let code = base64::engine::general_purpose::STANDARD.encode(writer.finish().unwrap().into_inner());
    let zipped =
        |disk: u32| json!({"exec": {"kind": "python:3", "code": code, "binary": true}, "limits": {"disk": disk}});
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/tight", zipped(2))).await;
    let message = answer["error"].as_str().unwrap_or_default();
    assert_eq!(s, 400, "{answer}");
    assert!(message.starts_with("exec.code: ") && message.contains("limits.disk (2 MB)"), "{message}");
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/roomy", zipped(4))).await;
    assert_eq!(s, 200, "{answer}");
    assert_eq!(answer["limits"]["disk"], 4);
    let text = json!({"exec": {"kind": "python:3", "code": "#".repeat(2 << 20)}, "limits": {"disk": 1}});
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/long", text)).await;
    assert_eq!(s, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("limits.disk (1 MB"), "{answer}");

    // Many empty files: nothing of the disk's bytes, all of its files (one inode per 2 KiB).
    let many = |files: usize, bytes: &[u8]| {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        writer.start_file("__main__.py", options).unwrap();
        writer.write_all(b"def main(a):\n    return a\n").unwrap();
        for i in 0..files {
            writer.start_file(format!("d{}/f{i}", i % 10), options).unwrap();
            writer.write_all(bytes).unwrap();
        }
        let code = base64::engine::general_purpose::STANDARD.encode(writer.finish().unwrap().into_inner());
        json!({"exec": {"kind": "python:3", "code": code, "binary": true}, "limits": {"disk": 4}})
    };
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/inodes", many(3_000, b""))).await;
    let message = answer["error"].as_str().unwrap_or_default();
    assert_eq!(s, 400, "{answer}");
    assert!(message.contains("3011 files and directories") && message.contains("limits.disk (4 MB)"), "{message}");
    // A byte each: every file takes a 4 KiB page.
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/pages", many(1_500, b"x"))).await;
    let message = answer["error"].as_str().unwrap_or_default();
    assert_eq!(s, 400, "{answer}");
    assert!(message.contains("whole 4 KiB pages") && message.contains("limits.disk (4 MB)"), "{message}");
    let (s, answer, _) = send(&app, put("/api/v1/namespaces/_/actions/few", many(100, b"x"))).await;
    assert_eq!(s, 200, "{answer}");
}

/// An action's own policy for its asynchronous calls is checked at `PUT`: a bad value is a 400
/// naming the annotation and its bounds; good ones are kept as given.
#[actix_rt::test]
async fn an_actions_queue_policy_outside_its_bounds_is_refused_naming_it() {
    let (_h, app) = harness(|_| {}, MockConfig::default()).await;
    let with = |key: &str, value: Value| {
        let mut action = echo_action();
        action["annotations"] = json!([{"key": key, "value": value}]);
        action
    };
    for (key, value) in [
        ("max-retry-attempts", json!(3)),
        ("max-retry-attempts", json!("1")),
        ("max-event-age", json!(59)),
        ("max-event-age", json!(21601)),
    ] {
        let (s, body, _) = send(&app, put("/api/v1/namespaces/_/actions/p?overwrite=true", with(key, value))).await;
        assert_eq!(s, 400, "{key}: {body}");
        assert!(body["error"].as_str().unwrap().starts_with(&format!("annotations.{key}: ")), "{body}");
    }
    let (s, body, _) = send(&app, put("/api/v1/namespaces/_/actions/p", with("max-retry-attempts", json!(0)))).await;
    assert_eq!((s, &body["annotations"][0]["value"]), (200, &json!(0)), "{body}");
}

/// A call that exhausts its attempts lands in its namespace's dead-letter list: listed, shown
/// with its last record, never to another namespace; driven again as a new call (the letter
/// goes), or deleted.
#[actix_rt::test]
async fn a_call_out_of_attempts_is_a_dead_letter_shown_redriven_and_deleted_in_its_namespace_only() {
    let (_h, app) = harness(
        |c| {
            c.queue.retry_backoff = std::time::Duration::from_millis(10);
            c.queue.max_retry_attempts = 1;
        },
        MockConfig::default(),
    )
    .await;
    send(&app, put("/api/v1/namespaces/_/actions/flaky", echo_action())).await;
    let (s, accepted, _) = send(&app, post("/api/v1/namespaces/_/actions/flaky", json!({"error": "nope"}))).await;
    assert_eq!(s, 202);
    let first = accepted["activationId"].as_str().unwrap().to_string();
    let letters = || async {
        let (s, list, _) = send(&app, get("/api/v1/namespaces/_/deadletters")).await;
        assert_eq!(s, 200, "{list}");
        list.as_array().unwrap().clone()
    };
    let bound = std::time::Duration::from_secs(30);
    let letter = support::eventually(bound, "a dead letter", || async {
        letters().await.first().cloned().ok_or_else(|| "none".to_string())
    })
    .await;
    assert_eq!((&letter["first_activation_id"], &letter["attempts"]), (&json!(first), &json!(2)), "{letter}");
    assert_eq!((&letter["reason"], &letter["action"]), (&json!("nope"), &json!("guest/flaky")), "{letter}");
    let last = letter["activation_id"].as_str().unwrap().to_string();
    let metrics = call(&app, admin_get("/metrics")).await.into_body().collect().await.unwrap().to_bytes();
    let metrics = String::from_utf8_lossy(&metrics);
    for counted in ["invoker_retries_total 1", "invoker_dead_letters_total 1"] {
        assert!(metrics.lines().any(|l| l == counted), "{counted}: {metrics}");
    }
    let (s, shown, _) = send(&app, get(&format!("/api/v1/namespaces/_/deadletters/{last}"))).await;
    assert_eq!((s, &shown["record"]["response"]["statusCode"]), (200, &json!(1)), "{shown}");
    // Another tenant sees none of it, by its own namespace or by the id.
    let as_other = |uri: &str| Req::get().uri(uri).insert_header(auth(OTHER));
    let (s, theirs, _) = send(&app, as_other("/api/v1/namespaces/_/deadletters")).await;
    assert_eq!((s, theirs), (200, json!([])));
    let (s, _, _) = send(&app, as_other(&format!("/api/v1/namespaces/_/deadletters/{last}"))).await;
    assert_eq!(s, 404);
    let (s, _, _) = send(&app, as_other("/api/v1/namespaces/guest/deadletters")).await;
    assert_eq!(s, 403);
    // Driven again: a new call, and the letter goes.
    let redrive =
        Req::post().uri(&format!("/api/v1/namespaces/_/deadletters/{last}/redrive")).insert_header(auth(GUEST));
    let (s, driven, _) = send(&app, redrive).await;
    assert_eq!((s, &driven["redriven"]), (202, &json!(last)), "{driven}");
    assert_ne!(driven["activationId"], json!(last));
    assert!(!letters().await.iter().any(|l| l["activation_id"] == json!(last)));
    // It fails again (same parameters) and comes back as a letter of its own; deleted, it goes.
    let again = support::eventually(bound, "a second dead letter", || async {
        let first = letters().await.first().cloned().ok_or_else(|| "none".to_string())?;
        Ok(first["activation_id"].as_str().unwrap().to_string())
    })
    .await;
    let delete = Req::delete().uri(&format!("/api/v1/namespaces/_/deadletters/{again}")).insert_header(auth(GUEST));
    assert_eq!(send(&app, delete).await.0, 200);
    assert!(letters().await.is_empty());
}

/// Destinations: an asynchronous call's success goes to its action's `on-success`, a call given
/// up to `on-failure`, each called asynchronously with the record; a destination's own call
/// calls none (here the sink names the caller back: no loop).
#[actix_rt::test]
async fn destinations_get_the_record_of_a_success_and_of_a_call_given_up_and_never_loop() {
    let (_h, app) = harness(|c| c.queue.max_retry_attempts = 0, MockConfig::default()).await;
    let annotated = |pairs: Value| {
        let mut action = echo_action();
        action["annotations"] = pairs;
        action
    };
    let sink = annotated(json!([{"key": "on-success", "value": "ok"}]));
    send(&app, put("/api/v1/namespaces/_/actions/sink", sink)).await;
    send(&app, put("/api/v1/namespaces/_/actions/ok", annotated(json!([{"key": "on-success", "value": "sink"}]))))
        .await;
    send(&app, put("/api/v1/namespaces/_/actions/bad", annotated(json!([{"key": "on-failure", "value": "sink"}]))))
        .await;
    let (_, ok, _) = send(&app, post("/api/v1/namespaces/_/actions/ok", json!({"n": 1}))).await;
    let (_, bad, _) = send(&app, post("/api/v1/namespaces/_/actions/bad", json!({"error": "no"}))).await;
    let bound = std::time::Duration::from_secs(30);
    let sunk = support::eventually(bound, "the sink called twice", || async {
        let (_, list, _) = send(&app, get("/api/v1/namespaces/_/activations?name=sink")).await;
        let list = list.as_array().cloned().unwrap_or_default();
        if list.len() == 2 {
            Ok(list)
        } else {
            Err(format!("{} calls", list.len()))
        }
    })
    .await;
    let mut got: Vec<(String, String)> = sunk
        .iter()
        .map(|r| {
            let echo = &r["response"]["result"]["echo"];
            (
                echo["destination"].as_str().unwrap().to_string(),
                echo["activation"]["activationId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    let mut want = vec![
        ("on-failure".to_string(), bad["activationId"].as_str().unwrap().to_string()),
        ("on-success".to_string(), ok["activationId"].as_str().unwrap().to_string()),
    ];
    want.sort();
    assert_eq!(got, want);
    // A blocking call through the same pool: any call back the sink made was queued before it.
    let (s, _, _) = send(&app, post("/api/v1/namespaces/_/actions/bad?blocking=true", json!({}))).await;
    assert_eq!(s, 200);
    let (_, oks, _) = send(&app, get("/api/v1/namespaces/_/activations?name=ok")).await;
    assert_eq!(oks.as_array().unwrap().len(), 1, "the sink's success did not call ok back: {oks}");
    let bad_name = annotated(json!([{"key": "on-failure", "value": "no/such"}]));
    let (s, body, _) = send(&app, put("/api/v1/namespaces/_/actions/worse", bad_name)).await;
    assert_eq!(s, 400, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("annotations.on-failure"), "{body}");
}

/// Issue 60: `reserved-concurrency` keeps part of a namespace's limit for one action. The
/// reservations of a namespace never add up past its limit (refused at `PUT`, naming the
/// field); while another action fills what is left, the reserved action still runs, and the
/// other is refused at the shared part's end with a 429 that says why.
#[actix_rt::test]
async fn a_reservation_keeps_room_for_its_action_while_another_fills_the_namespace() {
    let (h, app) = harness(|c| c.limits.namespace_concurrent = 4, MockConfig::default()).await;
    let reserving = |r: u32| {
        let mut action = echo_action();
        action["annotations"] = json!([{ "key": "reserved-concurrency", "value": r }]);
        action
    };
    assert_eq!(send(&app, put("/api/v1/namespaces/_/actions/kept", reserving(2))).await.0, 200);
    let (s, refused, _) = send(&app, put("/api/v1/namespaces/_/actions/greedy", reserving(3))).await;
    assert_eq!(s, 400, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("annotations.reserved-concurrency"), "{refused}");
    send(&app, put("/api/v1/namespaces/_/actions/flood", echo_action())).await;

    // The flood takes the shared part (4 less 2 reserved) with two long calls.
    let long = || send(&app, post("/api/v1/namespaces/_/actions/flood?blocking=true", json!({"sleep_ms": 3000})));
    let meanwhile = async {
        let pool = h.app.pool();
        support::eventually(std::time::Duration::from_secs(10), "the flood's two calls running", || async {
            support::done(pool.status().await.is_some_and(|s| s.busy == 2))
        })
        .await;
        let third = send(&app, post("/api/v1/namespaces/_/actions/flood?blocking=true", json!({}))).await;
        let kept = send(&app, post("/api/v1/namespaces/_/actions/kept?blocking=true", json!({}))).await;
        (third, kept)
    };
    let ((s1, ..), (s2, ..), ((s3, third, _), (s4, kept, _))) = tokio::join!(long(), long(), meanwhile);
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(s3, 429, "{third}");
    assert!(third["error"].as_str().unwrap().contains("reserve"), "{third}");
    assert_eq!(s4, 200, "the reserved action runs beside the flood: {kept}");
}
