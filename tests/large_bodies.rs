//! Large calls with the process factory: a 64 MiB parameter goes into a python action of
//! 512 MB and its 64 MiB result comes back (the runtime's own copies count against the
//! action's memory, so it keeps one), and a body over the payload limit is refused with 413
//! naming the limit before any of it is read.

mod support;

use serde_json::{json, Value};
use support::{Invoker, GUEST};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1024 * 1024;

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("invoker-large-").tempdir().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_64_mib_call_goes_into_a_python_action_of_512_mb_and_its_64_mib_result_comes_back() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "large-round-trip", &format!("[limits]\npayload_max_bytes = {}\n", 128 * MIB));
    let code = "def main(a):\n    s = a['s']\n    return {'n': len(s), 's': s}\n";
    inv.put_action("echo", json!({ "exec": { "kind": "python:3", "code": code }, "limits": { "memory": 512 } })).await;
    let s = "x".repeat(64 * MIB);
    let (user, pass) = GUEST.split_once(':').unwrap();
    let body = serde_json::to_vec(&json!({ "s": s })).unwrap();
    let response = reqwest::Client::new()
        .post(inv.url("actions/echo?blocking=true&result=true"))
        .basic_auth(user, Some(pass))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let answer = response.bytes().await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer[..answer.len().min(500)]));
    let result: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(result["n"], 64 * MIB);
    assert!(result["s"].as_str().unwrap() == s, "the string came back as it went");
}

/// A `Content-Length` over the limit is answered at once: the test sends the head alone and
/// reads the 413 while the body is still to come.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_payload_limit_is_refused_before_it_is_read() {
    let dir = tempdir();
    let inv = Invoker::start(dir.path(), "large-refused", "");
    inv.put_action("a", support::python("def main(a):\n    return {}\n")).await;
    let addr = inv.base.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(GUEST);
    let head = format!(
        "POST /api/v1/namespaces/_/actions/a?blocking=true HTTP/1.1\r\nhost: {addr}\r\nauthorization: Basic {auth}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        MIB + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(20), stream.read(&mut answer)).await;
    let n = read.expect("answered before the body came").unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("1048576 bytes"), "the answer names the limit: {answer}");
}
