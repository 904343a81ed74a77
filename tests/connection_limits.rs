//! Clients that never read their answers hold no memory without bound: an authenticated client
//! opening hundreds of connections, each sending twenty `GET`s of a 1 MB action ahead and
//! reading nothing, costs the invoker at most `[api] unread_answers_mb` of answers, and its
//! connections are closed once the write timeout passes; the invoker serves others throughout.

mod support;

use base64::Engine as _;
use serde_json::json;
use std::io::Write as _;
use std::time::Duration;
use support::{Invoker, GUEST};

/// The invoker's resident memory in MB.
fn rss_mb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    rss_kb / 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_that_never_read_hold_a_bounded_memory_and_are_closed() {
    let dir = tempfile::Builder::new().prefix("invoker-unread-").tempdir().unwrap();
    let config = "[api]\nwrite_timeout = \"2s\"\nunread_answers_mb = 32\n";
    let inv = Invoker::start(dir.path(), &format!("unread-{}", std::process::id()), config);
    let code = format!("# {}\ndef main(a):\n    return a\n", "x".repeat(1 << 20));
    inv.put_action("big", json!({"exec": {"kind": "python:3", "code": code}})).await;
    let pid = inv.child.id();
    let base_mb = rss_mb(pid);

    let authority = inv.base.strip_prefix("http://").unwrap().to_string();
    let auth = base64::engine::general_purpose::STANDARD.encode(GUEST);
    let request =
        format!("GET /api/v1/namespaces/_/actions/big HTTP/1.1\r\nhost: x\r\nauthorization: Basic {auth}\r\n\r\n");
    let pipelined = request.repeat(20);
    let mut clients = Vec::new();
    for _ in 0..300 {
        let mut stream = std::net::TcpStream::connect(&authority).unwrap();
        stream.write_all(pipelined.as_bytes()).unwrap();
        clients.push(stream);
    }
    let mut peak_mb = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak_mb = peak_mb.max(rss_mb(pid));
    }
    assert!(
        peak_mb < base_mb + 32 + 100,
        "300 connections that never read took the invoker from {base_mb} to {peak_mb} MB (32 MB of answers allowed)"
    );
    // The answers no client read are dropped with their connections past the write timeout:
    // a client that reads gets the action again, and the invoker serves as before.
    let mut got = 0;
    for _ in 0..100 {
        let (status, _) = inv.get("actions/big").await;
        got = status;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(got, 200, "the budget of unread answers never came back");
    let (status, record) = inv.invoke("big", "blocking=true", json!({"still": "served"})).await;
    assert_eq!((status, &record["response"]["result"]["still"]), (200, &json!("served")), "{record}");
    // What the clients were told: some answers, and refusals that say why.
    let mut refused = 0;
    for mut client in clients {
        client.set_nonblocking(true).unwrap();
        let mut seen = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        while let Ok(n) = std::io::Read::read(&mut client, &mut chunk) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&seen);
        refused += text.matches("HTTP/1.1 503").count();
        assert!(
            text.matches("HTTP/1.1 503").count() == text.matches("unread_answers_mb").count(),
            "each refusal says why"
        );
    }
    assert!(refused > 0, "no answer was refused");
}
