//! Fuzz targets for every parser that reads bytes from outside the invoker, and the mutation
//! engine that drives them on stable Rust (cargo-fuzz needs a nightly toolchain, which cannot be
//! had here). Each target takes arbitrary bytes, must never panic, and checks what its parser
//! promises (a line read back is read back the same, a stream decoded whole or in pieces gives
//! the same records). `tests/fuzz.rs` runs every target on a bounded count of inputs in CI;
//! `FUZZ_INPUTS=1000000` runs a million (see BENCHMARKS.md). The HTTP routes are fuzzed there too,
//! through the whole API on the mock factory.
//!
//! The engine is blind (no coverage feedback): each input is a seed of the target's corpus
//! (valid examples) with one to four mutations stacked: bit flips, bytes set to values parsers
//! trip on, tokens of the formats inserted, spans deleted, duplicated or spliced from another
//! seed, truncation. It is deterministic for a seed, so a failure is replayed by its number.

use crate::proxy::protocol::{Runtime, RuntimeResponse};
use invoker_factory::contract::Transport;
use invoker_factory::peer::Peer;
use std::sync::Arc;

/// One parser under test.
pub struct Target {
    pub name: &'static str,
    /// Valid inputs the mutations start from.
    pub corpus: fn() -> Vec<Vec<u8>>,
    /// Must not panic on any input.
    pub run: fn(&[u8]),
}

/// Every target (the HTTP routes aside: they need the whole API, see `tests/fuzz.rs`).
pub fn targets() -> Vec<Target> {
    vec![
        Target { name: "activation_message", corpus: message_corpus, run: activation_message },
        Target { name: "openwhisk_answer", corpus: answer_corpus, run: openwhisk_answer },
        Target { name: "fn_answer", corpus: fn_answer_corpus, run: fn_answer },
        Target { name: "zip_archive", corpus: zip_corpus, run: zip_archive },
        Target { name: "journal_line", corpus: journal_corpus, run: journal_line },
        Target { name: "invoker_record", corpus: invoker_record_corpus, run: invoker_record },
        #[cfg(feature = "mesos")]
        Target { name: "recordio", corpus: recordio_corpus, run: recordio },
        Target { name: "etcd_watch", corpus: watch_corpus, run: etcd_watch },
        Target { name: "etcd_view", corpus: view_corpus, run: etcd_view },
    ]
}

/// What a run of a target did.
#[derive(Debug, Default)]
pub struct Run {
    pub inputs: u64,
    /// The first input that panicked, with the panic's message.
    pub failure: Option<(Vec<u8>, String)>,
}

/// Runs `target` on `inputs` mutated inputs from `seed`; stops at the first panic.
pub fn run(target: &Target, inputs: u64, seed: u64) -> Run {
    let corpus = (target.corpus)();
    let mut mutator = Mutator::new(seed);
    let mut input = Vec::new();
    for n in 0..inputs {
        mutator.next_input(&corpus, &mut input);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (target.run)(&input)));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Run { inputs: n + 1, failure: Some((input, message)) };
        }
    }
    Run { inputs, failure: None }
}

/// Mutated inputs from a corpus, for targets driven elsewhere (the HTTP routes, which need the
/// whole API).
pub struct Inputs {
    corpus: Vec<Vec<u8>>,
    mutator: Mutator,
}

impl Inputs {
    pub fn new(corpus: Vec<Vec<u8>>, seed: u64) -> Self {
        Inputs { corpus, mutator: Mutator::new(seed) }
    }

    pub fn next_input(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.mutator.next_input(&self.corpus, &mut out);
        out
    }

    /// A number below `n`, from the same sequence (to choose a route, a key).
    pub fn pick(&mut self, n: usize) -> usize {
        self.mutator.below(n)
    }
}

/// Byte strings the formats are made of: a mutation that inserts one reaches deeper into a
/// parser than a random byte does.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"1e999",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"\"\"",
    b"{}",
    b"[]",
    b"\n",
    b"\r\n",
    b"PK\x03\x04",
    b"PK\x01\x02",
    b"PK\x05\x06",
    b"../",
    b"/",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\"activationId\"",
    b"\"error\"",
    b"\"events\"",
    b"\"kv\"",
    b"\"value\"",
    b"\"response\"",
    b"\"annotations\"",
    b"\"rejected\"",
    b"\"result\"",
    b"\"size\"",
    b"],\"publish\":false}",
    b"\"A\"",
    b"\"F\"",
    b"99999999999999999999\n",
];

/// xorshift64*: fast, deterministic, good enough to choose mutations.
struct Mutator {
    state: u64,
}

impl Mutator {
    fn new(seed: u64) -> Self {
        Mutator { state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1 }
    }

    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A seed of `corpus` with one to four mutations stacked, into `out`.
    fn next_input(&mut self, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
        out.clear();
        if let Some(seed) = corpus.get(self.below(corpus.len())) {
            out.extend_from_slice(seed);
        }
        for _ in 0..=self.below(4) {
            self.mutate(corpus, out);
        }
    }

    fn mutate(&mut self, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
        let at = self.below(out.len() + 1);
        match self.below(8) {
            0 if !out.is_empty() => {
                let i = self.below(out.len());
                out[i] ^= 1 << self.below(8);
            }
            1 if !out.is_empty() => {
                let i = self.below(out.len());
                out[i] = [0u8, 0xff, b'"', b'\\', b'{', b'}', b'0', b'\n', 0x80, b'9'][self.below(10)];
            }
            2 | 3 => {
                let token = TOKENS[self.below(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
            4 if !out.is_empty() => {
                let len = self.below(out.len() - at.min(out.len()) + 1).min(64);
                out.drain(at.min(out.len())..(at + len).min(out.len()));
            }
            5 if !out.is_empty() => {
                let from = self.below(out.len());
                let len = self.below(out.len() - from).min(256) + 1;
                let span: Vec<u8> = out[from..(from + len).min(out.len())].to_vec();
                out.splice(at..at, span);
            }
            6 => {
                if let Some(other) = corpus.get(self.below(corpus.len())) {
                    let from = self.below(other.len() + 1);
                    out.truncate(at);
                    out.extend_from_slice(&other[from..]);
                }
            }
            _ => out.truncate(at),
        }
        // Bounded: a parser's cost grows with its input, not the count of runs.
        out.truncate(1 << 16);
    }
}

fn message_corpus() -> Vec<Vec<u8>> {
    vec![
        br#"{"transid":["t",1],"action":{"path":"guest","name":"echo"},"user":{"subject":"guest","namespace":{"name":"guest"},"authkey":{"api_key":"a:b"}},"activationId":"0123456789abcdef0123456789abcdef","blocking":true,"content":{"x":1}}"#.to_vec(),
        br#"{"transid":["t",1],"action":{"path":"guest","name":"echo","version":"0.0.1"},"revision":"9223372036854775808","rootControllerIndex":{"asString":"s0","instanceType":"controller"},"user":{"subject":"guest","namespace":{"name":"guest","uuid":"u"}},"activationId":"0123456789abcdef0123456789abcdef","blocking":false,"request":{"method":"POST","headers":{"x":"y"},"body":"aGVsbG8="},"initArgs":[],"lockedArgs":{}}"#.to_vec(),
    ]
}

/// The shim's reading of an `ActivationMessage` body.
fn activation_message(bytes: &[u8]) {
    let _ = crate::api::shim::read_message(bytes, 1 << 20);
}

/// A runtime of `protocol` no connection is ever made to: interpreting an answer needs none.
fn runtime(protocol: invoker_factory::kinds::RuntimeProtocol) -> Runtime {
    let nowhere = Transport::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 9)));
    Runtime::new(protocol, &nowhere, Arc::new(Peer::default()), 1 << 20)
}

fn answer_corpus() -> Vec<Vec<u8>> {
    vec![
        b"\x00\xc8{\"ok\":true}".to_vec(),
        b"\x00\xc8{\"error\":\"boom\"}".to_vec(),
        b"\x01\xf6{\"error\":\"The action did not initialize or run\"}".to_vec(),
        b"\x00\xc8[1,2,{\"a\":\"\xc3\xa9\"}]".to_vec(),
    ]
}

/// The first two bytes a status, the rest the body: an OpenWhisk runtime's answer as `/run`
/// and `/init` read it.
fn openwhisk_answer(bytes: &[u8]) {
    let status = u16::from_be_bytes([bytes.first().copied().unwrap_or(0), bytes.get(1).copied().unwrap_or(0)]);
    let body = bytes.get(2..).unwrap_or_default().to_vec();
    let runtime = runtime(invoker_factory::kinds::RuntimeProtocol::OpenWhisk);
    for oom in [false, true] {
        let answer =
            Ok(RuntimeResponse { status, headers: Default::default(), body: body.clone().into(), streamed: None });
        let _ = runtime.within_protocol(&answer);
        let read = runtime.interpret(answer, 1000, oom, 1 << 20);
        assert!(
            read.outcome != invoker_wire::model::Outcome::Success || read.reusable,
            "a success keeps its container"
        );
    }
}

fn fn_answer_corpus() -> Vec<Vec<u8>> {
    vec![
        b"\x00\xc8Content-Type: application/json\nFn-Http-Status: 201\nX-Made: yes\n\n{\"hello\":\"you\"}".to_vec(),
        b"\x01\xf6Content-Type: application/json\n\n{\"message\":\"function failed\"}".to_vec(),
        b"\x01\xf8\n\n".to_vec(),
    ]
}

/// Two bytes of status, header lines up to a blank one, then the body: an Fn function's answer
/// as the http-stream contract reads it (headers included).
fn fn_answer(bytes: &[u8]) {
    let status = u16::from_be_bytes([bytes.first().copied().unwrap_or(0), bytes.get(1).copied().unwrap_or(0)]);
    let rest = bytes.get(2..).unwrap_or_default();
    let split = rest.windows(2).position(|w| w == b"\n\n").unwrap_or(rest.len());
    let mut headers = hyper::HeaderMap::new();
    for line in rest[..split].split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) =
            (hyper::header::HeaderName::from_bytes(name), hyper::header::HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    let body = rest.get(split + 2..).unwrap_or_default().to_vec();
    let runtime = runtime(invoker_factory::kinds::RuntimeProtocol::Fn);
    let answer = Ok(RuntimeResponse { status, headers, body: body.into(), streamed: None });
    let _ = runtime.within_protocol(&answer);
    let _ = runtime.interpret(answer, 1000, false, 1 << 20);
}

fn zip_corpus() -> Vec<Vec<u8>> {
    use std::io::Write as _;
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    writer.start_file("__main__.py", options).expect("a zip in memory");
    writer.write_all(b"def main(a):\n    return a\n").expect("a zip in memory");
    writer.add_directory("lib/", options).expect("a zip in memory");
    writer.start_file("lib/util.py", options).expect("a zip in memory");
    writer.add_symlink("lib/alias.py", "util.py", options).expect("a zip in memory");
    let stored = writer.finish().expect("a zip in memory").into_inner();
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let deflated = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    writer.start_file("index.js", deflated).expect("a zip in memory");
    writer.write_all(&[b'x'; 4096]).expect("a zip in memory");
    vec![stored, writer.finish().expect("a zip in memory").into_inner()]
}

/// A zip action's archive as `PUT` checks it.
fn zip_archive(bytes: &[u8]) {
    if let Ok(unpacked) = crate::api::archive::check_zip(bytes, 1 << 20) {
        assert!(unpacked.disk_bytes % 4096 == 0, "whole pages");
    }
}

fn journal_corpus() -> Vec<Vec<u8>> {
    let meta = br#"{"A":{"activation_id":"0123456789abcdef0123456789abcdef","namespace":"guest","name":"echo","version":"0.0.1","subject":"guest","kind":"python:3","limits":{"timeout":60000,"memory":256,"logs":10,"concurrency":1,"disk":256},"accepted_at":1795680000000}}"#;
    let record = br#"{"F":{"namespace":"guest","name":"echo","version":"0.0.1","subject":"guest","activationId":"0123456789abcdef0123456789abcdef","start":1795680000000,"end":1795680000005,"duration":5,"statusCode":0,"response":{"status":"success","statusCode":0,"success":true,"result":{"x":[1,"\u00e9",null]}},"logs":["2026-11-26T00:00:00Z stdout: hi"],"annotations":[{"key":"path","value":"guest/echo"}],"publish":false}}"#;
    vec![meta.to_vec(), record.to_vec()]
}

/// A journal line as a restart reads it: read back and written again, it reads the same.
fn journal_line(bytes: &[u8]) {
    if let Some(again) = invoker_store::journal::lines::reread_line(bytes) {
        let twice = invoker_store::journal::lines::reread_line(&again);
        assert_eq!(twice.as_deref(), Some(again.as_slice()), "a line written by the journal reads back as written");
    }
}

fn invoker_record_corpus() -> Vec<Vec<u8>> {
    let record = br#"{"namespace":"guest","name":"echo","version":"0.0.1","subject":"guest","activationId":"0123456789abcdef0123456789abcdef","start":1795680000000,"end":1795680000005,"duration":5,"statusCode":3,"response":{"status":"whisk internal error","statusCode":3,"success":false,"result":{"error":"no \u00e9","x":[1,null]},"size":31},"logs":["2026-11-26T00:00:00Z stdout: hi"],"annotations":[{"key":"path","value":"guest/echo"},{"key":"rejected","value":"capped"},{"key":"startKind","value":"warm"},{"key":"timeout","value":true},{"key":"limits","value":{"memory":256}}],"publish":false}"#;
    let mut answer = br#"{"response":"#.to_vec();
    answer.extend_from_slice(record);
    answer.extend_from_slice(br#","isSystemError":false,"transid":["x",1]}"#);
    vec![record.to_vec(), answer]
}

/// A record as a scheduler reads it from its invoker's answer (for its head alone, the rest
/// checked where it lies) and passes it on with one annotation more: whatever the head read
/// takes decodes as a record, with the same head; passed on, it is that record with the
/// annotation last, and its head says so.
fn invoker_record(bytes: &[u8]) {
    use invoker_wire::model::{ActivationRecord, KeyValue, RecordHead};
    let bytes = bytes::Bytes::copy_from_slice(bytes);
    let after_head = bytes.slice(bytes.len().min(12)..);
    let reads = [
        invoker_wire::record_head::ReadRecord::read(bytes.clone()),
        invoker_wire::record_head::ReadRecord::at_start(&after_head),
    ];
    for read in reads.into_iter().flatten() {
        let mut record: ActivationRecord = read.decode().expect("what the head read takes decodes as a record");
        assert_eq!(read.head(), &RecordHead::of(&record));
        let extra = KeyValue { key: "invoker".into(), value: serde_json::json!("invoker0") };
        let passed = read.passed_on(extra.clone());
        let mut again: ActivationRecord =
            serde_json::from_slice(&passed.json.to_bytes()).expect("a record passed on decodes");
        assert_eq!(passed.head(), &RecordHead::of(&again));
        record.annotations.push(extra);
        // A record laid out otherwise is encoded again, with the size of its result.
        (record.response.size, again.response.size) = (None, None);
        assert_eq!(again, record, "passed on, the record is what came with the annotation");
    }
}

#[cfg(feature = "mesos")]
fn recordio_corpus() -> Vec<Vec<u8>> {
    let mut stream = Vec::new();
    for record in [&b"{\"type\":\"SUBSCRIBED\"}"[..], b"{\"type\":\"HEARTBEAT\"}", b""] {
        stream.extend(invoker_mesos::recordio::frame(record));
    }
    vec![stream]
}

/// Mesos's RecordIO stream, decoded whole and a byte at a time: the same records, the same end.
#[cfg(feature = "mesos")]
fn recordio(bytes: &[u8]) {
    use tokio_util::codec::Decoder as _;
    let decode = |chunks: &mut dyn Iterator<Item = &[u8]>| {
        let mut decoder = invoker_mesos::recordio::RecordIo::new(4096);
        let (mut buffer, mut records) = (bytes::BytesMut::new(), Vec::new());
        for chunk in chunks {
            buffer.extend_from_slice(chunk);
            loop {
                match decoder.decode(&mut buffer) {
                    Ok(Some(record)) => records.push(record),
                    Ok(None) => break,
                    Err(e) => return (records, Some(e.to_string())),
                }
            }
        }
        let end = decoder.decode_eof(&mut buffer).err().map(|e| e.to_string());
        (records, end)
    };
    let whole = decode(&mut std::iter::once(bytes));
    let piecewise = decode(&mut bytes.chunks(1));
    assert_eq!(whole, piecewise, "a stream's records do not depend on how it arrives");
}

fn watch_corpus() -> Vec<Vec<u8>> {
    vec![
        br#"{"result":{"header":{"revision":"7"},"created":true}}{"result":{"events":[{"kv":{"key":"cHJlZml4L2E=","value":"MQ==","mod_revision":"8"}},{"type":"DELETE","kv":{"key":"cHJlZml4L2I="}}]}}"#.to_vec(),
        br#"{"result":{"canceled":true,"compact_revision":"5"}}{"error":{"message":"lost leader"}}"#.to_vec(),
    ]
}

/// The etcd gateway's watch stream: objects one after another, each read as the watch's news.
fn etcd_watch(bytes: &[u8]) {
    let objects = serde_json::Deserializer::from_slice(bytes).into_iter::<serde_json::Value>();
    for object in objects {
        let Ok(object) = object else { break };
        let _ = invoker_etcd::client::watch_news(&object);
    }
}

fn view_corpus() -> Vec<Vec<u8>> {
    let record = r#"{"id":"inv0","api":"http://127.0.0.1:3233","tags":["a"],"health":"healthy","nodes":[{"node":"local","launchable_mb":2048,"idle_mb":0,"capacity_mb":2048}],"boot_id":"b","pid":1}"#;
    let lines = format!(
        "w/invokers/inv0\t{record}\nw/drain/inv1\t{{}}\nw/containers/guest/echo/42/invoker/inv0/container/7\t1\n"
    );
    vec![lines.into_bytes()]
}

/// Keys and values under a cluster's prefix (a line each, a tab between them), as a scheduler
/// builds its view of the cluster from them.
fn etcd_view(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let pairs: Vec<(&str, &str)> = text.lines().map(|l| l.split_once('\t').unwrap_or((l, ""))).collect();
    let mut cache = invoker_scheduler::view::RecordCache::default();
    for _ in 0..2 {
        let _ = invoker_scheduler::view::ClusterView::from_entries("w", pairs.iter().copied(), &mut cache);
    }
}
