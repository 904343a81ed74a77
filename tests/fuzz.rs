//! Every parser that reads untrusted bytes, fed mutated inputs (`invoker::fuzz`): the bodies and
//! headers of every route through the whole API on the mock factory, `ActivationMessage`,
//! OpenWhisk's and Fn's runtime answers, zip archives, journal lines, an invoker's record as a
//! scheduler reads it, Mesos RecordIO and etcd's watch stream and keys. None may panic, and no
//! route may answer 500. CI runs 20,000 inputs a target (2,000 for the routes);
//! `FUZZ_INPUTS=1000000` runs a million each (BENCHMARKS.md).

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use invoker::app::InvokerApp;
use invoker::config::Config;
use invoker::factory::mock::{MockConfig, MockFactory};
use invoker::factory::Factory;
use invoker::fuzz::{run, targets, Inputs};
use invoker_factory::contract::Epoch;
use std::time::Instant;

const GUEST: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";
const OTHER: &str = "11111111-2222-3333-4444-555555555555:other-secret-key";
const ADMIN: &str = "aaaaaaaa-0000-0000-0000-000000000000:admin-secret";
const CONTROLLER: &str = "cccccccc-0000-0000-0000-000000000000:controller-secret";

/// Inputs a target: `FUZZ_INPUTS`, or `default`.
fn inputs(default: u64) -> u64 {
    std::env::var("FUZZ_INPUTS").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

fn seed() -> u64 {
    std::env::var("FUZZ_SEED").ok().and_then(|n| n.parse().ok()).unwrap_or(43)
}

#[test]
fn no_parser_panics_on_arbitrary_bytes() {
    let count = inputs(20_000);
    for target in targets() {
        let began = Instant::now();
        let run = run(&target, count, seed());
        let elapsed = began.elapsed();
        if let Some((input, message)) = &run.failure {
            panic!(
                "{} panicked on input {} of seed {}: {message}\ninput (hex): {}",
                target.name,
                run.inputs,
                seed(),
                input.iter().map(|b| format!("{b:02x}")).collect::<String>()
            );
        }
        eprintln!(
            "fuzz {:<20} {:>9} inputs in {:>7.1} s ({:>8.0}/s)",
            target.name,
            run.inputs,
            elapsed.as_secs_f64(),
            run.inputs as f64 / elapsed.as_secs_f64().max(1e-9)
        );
    }
}

/// The routes, each with the methods it serves and a body it takes.
fn routes() -> Vec<(&'static str, &'static str, &'static [u8])> {
    vec![
        ("PUT", "/api/v1/namespaces/_/actions/echo?overwrite=true", br#"{"exec":{"kind":"python:3","code":"def main(a): return a","main":"main"},"limits":{"memory":256,"timeout":1000,"logs":1,"concurrency":1,"disk":64},"parameters":[{"key":"k","value":1}],"annotations":[{"key":"provide-api-key","value":true}]}"#),
        ("POST", "/api/v1/namespaces/_/actions/echo?blocking=true&result=false&timeout=100", br#"{"x":[1,{"y":"z"}]}"#),
        ("GET", "/api/v1/namespaces/_/actions/echo", b""),
        ("GET", "/api/v1/namespaces/_/actions?limit=5&skip=1", b""),
        ("DELETE", "/api/v1/namespaces/_/actions/gone", b""),
        ("GET", "/api/v1/namespaces/_/activations?limit=3&name=echo", b""),
        ("GET", "/api/v1/namespaces/_/activations/0123456789abcdef0123456789abcdef/logs", b""),
        ("POST", "/v1/activations", br#"{"transid":["t",1],"action":{"path":"guest","name":"echo"},"user":{"subject":"guest","namespace":{"name":"guest"}},"activationId":"0123456789abcdef0123456789abcdef","blocking":true,"content":{"x":1}}"#),
        ("POST", "/v2/apps", br#"{"name":"app1","config":{"A":"b"},"annotations":{"x":"y"}}"#),
        ("POST", "/v2/fns", br#"{"name":"f1","app_id":"nope","image":"fn:python","code":"def handler(ctx, data=None): return 'x'","memory":128,"timeout":5,"idle_timeout":30,"config":{"K":"v"}}"#),
        ("POST", "/v2/triggers", br#"{"name":"t1","app_id":"nope","fn_id":"nope","type":"http","source":"/hello"}"#),
        ("PUT", "/v2/apps/nope", br#"{"config":{"A":""}}"#),
        ("POST", "/invoke/nope", b"raw body"),
        ("POST", "/t/app1/hello", b"{}"),
        ("GET", "/v1/pool", b""),
        ("GET", "/health", b""),
        ("GET", "/metrics", b""),
        ("POST", "/v1/invokers/inv0/drain", b""),
        ("GET", "/v1/internal/actions/guest/echo?revision=1", b""),
        ("DELETE", "/v1/internal/actions/guest/echo?keep=1", b""),
        ("POST", "/v1/internal/records", br#"{"activation_ids":["0123456789abcdef0123456789abcdef"]}"#),
    ]
}

#[actix_rt::test]
async fn no_route_answers_500_or_panics_on_arbitrary_bodies_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config { listen: "127.0.0.1:0".parse().unwrap(), data_dir: dir.path().join("data"), ..Config::default() };
    config.factory.kind = invoker::config::FactoryKind::Mock;
    config.namespaces.insert("other".into(), OTHER.into());
    config.admin.key = Some(ADMIN.into());
    config.admin.controller_keys = vec![CONTROLLER.into()];
    config.limits.payload_max_bytes = 64 * 1024;
    config.validate().unwrap();
    let factory = Factory::Mock(MockFactory::new(MockConfig::default(), Epoch(Instant::now())));
    let app = InvokerApp::start_on(config, Some(factory)).await.unwrap();
    let state = app.state().clone();

    let routes = routes();
    let corpus: Vec<Vec<u8>> = routes.iter().map(|(_, _, body)| body.to_vec()).collect();
    let mut bodies = Inputs::new(corpus, seed());
    let mut headers =
        Inputs::new(vec![b"application/json".to_vec(), b"text/plain; charset=utf-8".to_vec()], seed() + 1);
    let keys = [Some(GUEST), Some(OTHER), Some(ADMIN), Some(CONTROLLER), None];
    let count = inputs(2_000);
    let began = Instant::now();
    for n in 0..count {
        let (method, uri, _) = routes[bodies.pick(routes.len())];
        let mut request = hyper::Request::builder().method(method).uri(uri);
        if let Some(key) = keys[bodies.pick(keys.len())] {
            request = request
                .header("authorization", format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(key)));
        }
        for name in ["content-type", "x-custom", "fn-intent"] {
            if let Ok(value) = hyper::header::HeaderValue::from_bytes(&headers.next_input()) {
                request = request.header(name, value);
            }
        }
        let body = bodies.next_input();
        let request = request.body(Full::new(Bytes::from(body.clone()))).unwrap();
        let status = state.handle(request).await.status().as_u16();
        assert!(
            status < 500 || status == 503 || status == 502 || status == 504,
            "input {n}: {method} {uri} answered {status} to {:?}",
            String::from_utf8_lossy(&body)
        );
    }
    eprintln!("fuzz {:<20} {:>9} inputs in {:>7.1} s", "http_routes", count, began.elapsed().as_secs_f64());
    app.stop().await.unwrap();
}
