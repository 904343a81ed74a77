//! Handing an activation to an invoker: OpenWhisk's `ActivationMessage` to its shim
//! (`POST /v1/activations`, the controller key) over kept-alive connections, one idle stack per
//! invoker. What came back decides what happens next, and the line between "nothing ran" and
//! "it may have run" is drawn here.
//!
//! To an invoker not heard from in the last `HEARD_WITHIN`, the message goes in two steps: the
//! request's head with `Expect: 100-continue`, and the message itself only when the invoker
//! asks for it (hyper's server sends `100 Continue` when the shim starts reading the body). A
//! frozen invoker (SIGSTOP, a stalled disk, a partition) still takes TCP connections and
//! buffers what is written to them, and would run it when it thaws; an invoker that never asked
//! never received the message, so the activation may go to another at once
//! ([`Sent::Unheard`]) and is never run twice. To an invoker that answered within
//! `HEARD_WITHIN` (one under steady load), the message goes with the head, in one write: the
//! round trip of the ask is what a hop costs most at one call at a time. The price is bounded:
//! what goes that way to an invoker that froze since its last answer, in the `HEARD_WITHIN`
//! after it, is its own (as what it held when it froze), answered when it thaws or lost; the
//! first message after that asks again, and finds it frozen. Everything else that ran nothing
//! (a connection refused, a 503 whose record says nothing ran) may go elsewhere too; once the
//! message was released, the activation is the invoker's, whatever happens next.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, SizeHint};
use hyper::client::conn::http1::SendRequest;
use invoker_wire::cluster::{REPORT_START, STARTED_LINE, STREAMED_ANSWER, STREAM_HEADERS, STREAM_TO, TWO_PARTS};
use invoker_wire::model::{ActivationRecord, EncodedRecord, KeyValue, RecordHead};
use invoker_wire::record_head::ReadRecord;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Idle connections kept per invoker at most.
const MAX_IDLE: usize = 64;
/// Largest answer read: a record with its result and logs.
const MAX_ANSWER: usize = 64 * 1024 * 1024;
/// The most a whole record is waited for once the result came (an invoker collects logs for
/// at most `proxy.log_sentinel_wait`).
const WHOLE_WAIT: Duration = Duration::from_secs(60);

/// What became of one hand-over.
#[derive(Debug)]
pub enum Sent {
    /// The invoker ran it (or started it and it ended there): its record.
    Finished(Box<Finished>),
    /// The invoker answered with the result before the record was whole (its logs still on
    /// their way): the record as answered, and the whole one when it comes (`None` if it never
    /// does: the connection broke, or `WHOLE_WAIT` passed).
    Answered { answer: Box<ActivationRecord>, whole: oneshot::Receiver<Option<ActivationRecord>> },
    /// Nothing ran there: another invoker may take it.
    Refused(String),
    /// The invoker did not ask for the message within the hand-over timeout: it never received
    /// it. Another invoker may take it, and this one is stalled.
    Unheard(String),
    /// It may have started, and no record came back: it ends here, never run again.
    Lost(String),
    /// The action streams its answer (asked for with [`STREAM_TO`]): the body, framed as the
    /// caller reads it, as it comes, and a function's own headers when its bytes go as it
    /// wrote them. The record is asked for once it ended.
    Streaming { headers: Option<Vec<(String, String)>>, body: hyper::body::Incoming },
}

/// A record an invoker sent back: read for its head, and its bytes as they came (the record's
/// own JSON within the invoker's answer), so that it is passed on rather than encoded again.
#[derive(Debug)]
pub struct Finished(ReadRecord);

impl Finished {
    /// What is decided on: whether anything ran, and why not.
    pub fn head(&self) -> &RecordHead {
        self.0.head()
    }

    /// The result's `error`, when it has one.
    pub fn error(&self) -> Option<String> {
        self.0.error()
    }

    /// The record with the invoker it ran on among its annotations, as the bytes it came as.
    pub fn ran_on(self, invoker: &str) -> EncodedRecord {
        self.0.passed_on(KeyValue { key: "invoker".into(), value: Value::String(invoker.to_string()) })
    }
}

impl Sent {
    /// Why nothing came back, for the hand-over's span; `None` when a record did.
    pub fn failure(&self) -> Option<&str> {
        match self {
            Sent::Finished(_) | Sent::Answered { .. } | Sent::Streaming { .. } => None,
            Sent::Refused(why) | Sent::Unheard(why) | Sent::Lost(why) => Some(why),
        }
    }
}

pub struct InvokerClient {
    /// `Basic <base64 of the controller key>`.
    authorization: String,
    /// Invoker address (`host:port`) → idle connections.
    idle: Arc<Mutex<HashMap<String, Vec<SendRequest<HeldMessage>>>>>,
    /// Invoker address → when it last answered (a response's head, or a `100 Continue`).
    heard: Heard,
}

type Heard = Arc<Mutex<HashMap<String, Instant>>>;

/// How recently an invoker must have answered for a message to go with its request's head,
/// without waiting for it to ask (see the module's page).
const HEARD_WITHIN: Duration = Duration::from_millis(20);

/// The message, and the invoker's request for it, until one side takes it: the `100 Continue`
/// callback (it releases the message) or the hand-over timeout (it withdraws it). Whoever takes
/// it first decides, so a message is either sent or provably not.
type Release = Arc<Mutex<Option<Pending>>>;

struct Pending {
    message: Bytes,
    body: oneshot::Sender<Bytes>,
    asked: oneshot::Sender<()>,
}

/// A request body that yields the message once released, and fails (so that hyper drops the
/// connection without sending a byte of it) once withdrawn.
pub struct HeldMessage {
    body: Option<oneshot::Receiver<Bytes>>,
    len: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("the message was withdrawn: the invoker did not ask for it in time")]
pub struct Withdrawn;

impl Body for HeldMessage {
    type Data = Bytes;
    type Error = Withdrawn;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Withdrawn>>> {
        let Some(body) = self.body.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(body).poll(cx);
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(released) => {
                self.body = None;
                Poll::Ready(Some(released.map(Frame::data).map_err(|_| Withdrawn)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

/// Takes the message back if it was not released; true when it was (the invoker has it).
fn withdraw(release: &Release) -> bool {
    release.lock().take().is_none()
}

/// Lets the message go to the invoker, unless it was withdrawn.
fn let_go(release: &Release) {
    if let Some(pending) = release.lock().take() {
        let _ = pending.body.send(pending.message);
        let _ = pending.asked.send(());
    }
}

fn mark_heard(heard: &Heard, authority: &str) {
    let mut heard = heard.lock();
    match heard.get_mut(authority) {
        Some(at) => *at = Instant::now(),
        None => {
            heard.insert(authority.to_string(), Instant::now());
        }
    }
}

impl InvokerClient {
    pub fn new(controller_key: &str) -> Self {
        use base64::Engine as _;
        let authorization = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(controller_key));
        InvokerClient { authorization, idle: Arc::default(), heard: Arc::default() }
    }

    /// `message` to the invoker at `authority`: asked for within `handover`, answered within
    /// `timeout` (both counted from now). With `on_started` (a queued call this scheduler keeps
    /// until it starts), the invoker is asked to say when a container takes the call, and
    /// `on_started` is called as soon as it does, before the record comes. `stream_to`: the
    /// content type a blocking call's caller takes a streamed answer in ([`STREAM_TO`]), should
    /// the action stream ([`Sent::Streaming`]).
    pub async fn send(
        &self,
        authority: &str,
        message: Bytes,
        handover: Duration,
        timeout: Duration,
        on_started: Option<&mut (dyn FnMut() + Send)>,
        stream_to: Option<&'static str>,
    ) -> Sent {
        let (asked_tx, asked) = oneshot::channel();
        let (body_tx, body) = oneshot::channel();
        let len = message.len() as u64;
        let release: Release = Arc::new(Mutex::new(Some(Pending { message, body: body_tx, asked: asked_tx })));
        let reports_start = on_started.is_some();
        let asks = self.heard.lock().get(authority).is_none_or(|at| at.elapsed() >= HEARD_WITHIN);
        let request = match self.request(
            authority,
            HeldMessage { body: Some(body), len },
            &release,
            reports_start,
            asks,
            stream_to,
        ) {
            Ok(request) => request,
            Err(sent) => return sent,
        };
        if !asks {
            let_go(&release);
        }
        let exchange = self.exchange(authority, request, &release, asked, handover, on_started);
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) if !withdraw(&release) => Sent::Unheard(format!("it did not ask for the message in {timeout:?}")),
            Err(_) => Sent::Lost(format!("no answer within {timeout:?}")),
            Ok(Err(sent)) => sent,
            Ok(Ok((status, body, None))) => interpret(status, &body),
            Ok(Ok((status, first, Some(rest)))) => match interpret(status, &first) {
                Sent::Finished(answer) => {
                    let (tx, whole) = oneshot::channel();
                    tokio::spawn(async move {
                        let rest = tokio::time::timeout(WHOLE_WAIT, rest).await.ok().and_then(Result::ok);
                        let record = rest.and_then(|rest| serde_json::from_slice::<WholeMessage>(&rest).ok());
                        let _ = tx.send(record.map(|m| m.response));
                    });
                    match answer.0.decode() {
                        Ok(answer) => Sent::Answered { answer: Box::new(answer), whole },
                        Err(e) => Sent::Lost(format!("its answer's record did not decode: {e}")),
                    }
                }
                sent => sent,
            },
        }
    }

    async fn exchange(
        &self,
        authority: &str,
        request: hyper::Request<HeldMessage>,
        release: &Release,
        mut asked: oneshot::Receiver<()>,
        handover: Duration,
        on_started: Option<&mut (dyn FnMut() + Send)>,
    ) -> Result<(u16, Bytes, Option<oneshot::Receiver<Bytes>>), Sent> {
        let handover = tokio::time::sleep(handover);
        tokio::pin!(handover);
        let mut request = Some(request);
        // A kept-alive connection the invoker closed meanwhile takes nothing: the request goes
        // on the next one, or a new one. A new one that takes nothing either ends the attempt:
        // nothing was sent, so another invoker may take it (looping would only wait for the
        // timeout and then call it lost).
        loop {
            let pooled = self.idle.lock().get_mut(authority).and_then(Vec::pop);
            let is_new = pooled.is_none();
            let mut sender = match pooled {
                Some(sender) => sender,
                None => {
                    invoker_http::connect(authority).await.map_err(|e| Sent::Refused(format!("unreachable: {e}")))?
                }
            };
            let unsent = |reason: String| Sent::Refused(format!("a new connection took nothing: {reason}"));
            if let Err(e) = sender.ready().await {
                if is_new {
                    return Err(unsent(e.to_string()));
                }
                continue;
            }
            let fresh = request.take().expect("a request to send");
            let answer = sender.try_send_request(fresh);
            tokio::pin!(answer);
            // Until the invoker asks for the message, it has nothing.
            let answered = tokio::select! {
                answered = &mut answer => Some(answered),
                _ = &mut asked => None,
                _ = &mut handover, if release.lock().is_some() => {
                    if !withdraw(release) {
                        return Err(Sent::Unheard("it did not ask for the message in time: it never received it".into()));
                    }
                    None
                }
            };
            let answered = match answered {
                Some(answered) => answered,
                None => answer.await,
            };
            let response = match answered {
                Ok(response) => {
                    mark_heard(&self.heard, authority);
                    response
                }
                Err(mut e) => match e.take_message() {
                    Some(_) if is_new => return Err(unsent(e.error().to_string())),
                    Some(unsent) => {
                        request = Some(unsent);
                        continue;
                    }
                    None if !withdraw(release) => {
                        return Err(Sent::Refused(format!(
                            "the connection broke before it asked for the message: {}",
                            e.error()
                        )))
                    }
                    None => return Err(Sent::Lost(format!("the connection broke: {}", e.error()))),
                },
            };
            let status = response.status().as_u16();
            let streamed = response
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes() == STREAMED_ANSWER.as_bytes());
            // A stream holds its connection to its end: not kept for another hand-over. Given
            // back as the `Sent` it is (not an exchange's record), through the early return.
            if streamed {
                withdraw(release);
                let headers = response.headers().get(STREAM_HEADERS).map(|h| serde_json::from_slice(h.as_bytes()));
                return Err(match headers.transpose() {
                    Ok(headers) => Sent::Streaming { headers, body: response.into_body() },
                    // Dropped, the connection stops the action there.
                    Err(e) => Sent::Lost(format!("its streamed answer's {STREAM_HEADERS} are not JSON pairs: {e}")),
                });
            }
            let two_parts = response
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(TWO_PARTS.as_bytes()));
            // Answered without asking for the message (a refusal before the body was read):
            // the connection still waits for a body it will never get.
            let reusable = withdraw(release);
            if two_parts {
                let sender = reusable.then_some(sender);
                return self.two_parts(authority, status, response.into_body(), sender, on_started).await;
            }
            let body = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| Sent::Lost(format!("the answer broke off: {e}")))?
                .to_bytes();
            if reusable {
                keep(&self.idle, authority, sender);
            }
            return Ok((status, body, None));
        }
    }

    /// An answer in two parts, a message on each line: the first read now, the rest by a task
    /// that hands it on and then keeps the connection (`sender`, if it may be used again). A
    /// first line that says the call started (asked for with `on_started`) is followed by the
    /// whole record, read here.
    async fn two_parts(
        &self,
        authority: &str,
        status: u16,
        mut body: hyper::body::Incoming,
        sender: Option<SendRequest<HeldMessage>>,
        on_started: Option<&mut (dyn FnMut() + Send)>,
    ) -> Result<(u16, Bytes, Option<oneshot::Receiver<Bytes>>), Sent> {
        let mut read = bytes::BytesMut::new();
        let first = loop {
            if let Some(end) = read.iter().position(|&b| b == b'\n') {
                break read.split_to(end + 1).freeze();
            }
            if read.len() > MAX_ANSWER {
                return Err(Sent::Lost("the answer's first part is too large".into()));
            }
            match body.frame().await {
                Some(Ok(frame)) => read.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..])),
                Some(Err(e)) => return Err(Sent::Lost(format!("the answer broke off: {e}"))),
                None => return Err(Sent::Lost("the answer ended before its first part".into())),
            }
        };
        if let (Some(on_started), true) = (on_started, first.trim_ascii_end() == STARTED_LINE.as_bytes()) {
            on_started();
            let tail = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| Sent::Lost(format!("the answer broke off after the call started: {e}")))?;
            read.extend_from_slice(&tail.to_bytes());
            if read.trim_ascii().is_empty() {
                return Err(Sent::Lost("it started the call, and its answer ended without the record".into()));
            }
            if let Some(sender) = sender {
                keep(&self.idle, authority, sender);
            }
            return Ok((status, read.freeze(), None));
        }
        let (tx, rest) = oneshot::channel();
        let (idle, authority) = (self.idle.clone(), authority.to_string());
        tokio::spawn(async move {
            let Ok(tail) = Limited::new(body, MAX_ANSWER).collect().await else { return };
            read.extend_from_slice(&tail.to_bytes());
            let _ = tx.send(read.freeze());
            if let Some(sender) = sender {
                keep(&idle, &authority, sender);
            }
        });
        Ok((status, first, Some(rest)))
    }

    fn request(
        &self,
        authority: &str,
        body: HeldMessage,
        release: &Release,
        reports_start: bool,
        asks: bool,
        stream_to: Option<&'static str>,
    ) -> Result<hyper::Request<HeldMessage>, Sent> {
        let mut request = hyper::Request::post("/v1/activations")
            .header(hyper::header::HOST, authority)
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, TWO_PARTS);
        if asks {
            request = request.header(hyper::header::EXPECT, "100-continue");
        }
        if reports_start {
            request = request.header(REPORT_START, "1");
        }
        if let Some(content_type) = stream_to {
            request = request.header(STREAM_TO, content_type);
        }
        let mut request =
            request.body(body).map_err(|e| Sent::Refused(format!("the request could not be made: {e}")))?;
        if asks {
            let (release, heard, authority) = (release.clone(), self.heard.clone(), authority.to_string());
            hyper::ext::on_informational(&mut request, move |response| {
                if response.status() == hyper::StatusCode::CONTINUE {
                    mark_heard(&heard, &authority);
                    let_go(&release);
                }
            });
        }
        Ok(request)
    }

    /// Whether the invoker at `authority` answers `GET /ping` within `timeout` (on a connection
    /// of its own: the kept ones may be stuck behind a hand-over).
    pub async fn ping(&self, authority: &str, timeout: Duration) -> bool {
        one_request(authority, hyper::Method::GET, "/ping", None, timeout).await
    }

    /// `DELETE path` on the invoker at `authority` (an action's retirement, on a connection of
    /// its own); whether it answered with success within `timeout`.
    pub async fn retire(&self, authority: &str, path: &str, timeout: Duration) -> bool {
        one_request(authority, hyper::Method::DELETE, path, Some(&self.authorization), timeout).await
    }

    /// The records the invoker at `authority` holds of `activation_ids` (`POST
    /// /v1/internal/records`, on a connection of its own); `None` when it did not answer them
    /// within `timeout`.
    pub async fn records(
        &self,
        authority: &str,
        activation_ids: &[String],
        timeout: Duration,
    ) -> Option<Vec<ActivationRecord>> {
        #[derive(serde::Deserialize)]
        struct Found {
            records: Vec<ActivationRecord>,
        }
        let body = serde_json::to_vec(&serde_json::json!({ "activation_ids": activation_ids })).ok()?;
        let exchange = async {
            let mut sender = invoker_http::connect::<http_body_util::Full<Bytes>>(authority).await.ok()?;
            let request = hyper::Request::post("/v1/internal/records")
                .header(hyper::header::HOST, authority)
                .header(hyper::header::AUTHORIZATION, &self.authorization)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(http_body_util::Full::new(Bytes::from(body)))
                .ok()?;
            let response = sender.send_request(request).await.ok()?;
            if !response.status().is_success() {
                return None;
            }
            let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await.ok()?.to_bytes();
            serde_json::from_slice::<Found>(&body).ok().map(|f| f.records)
        };
        tokio::time::timeout(timeout, exchange).await.ok().flatten()
    }

    /// Forgets the connections of an invoker that left.
    pub fn forget(&self, authority: &str) {
        self.idle.lock().remove(authority);
    }
}

/// Keeps `sender` for the next hand-over to `authority`, if there is room.
fn keep(
    idle: &Mutex<HashMap<String, Vec<SendRequest<HeldMessage>>>>,
    authority: &str,
    sender: SendRequest<HeldMessage>,
) {
    let mut idle = idle.lock();
    let stack = idle.entry(authority.to_string()).or_default();
    if stack.len() < MAX_IDLE {
        stack.push(sender);
    }
}

/// One bodiless request on a connection of its own; whether it was answered with success
/// within `timeout`.
async fn one_request(
    authority: &str,
    method: hyper::Method,
    path: &str,
    authorization: Option<&str>,
    timeout: Duration,
) -> bool {
    let exchange = async {
        let mut sender = invoker_http::connect::<http_body_util::Empty<Bytes>>(authority).await.ok()?;
        let mut request = hyper::Request::builder().method(method).uri(path).header(hyper::header::HOST, authority);
        if let Some(authorization) = authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization);
        }
        let response = sender.send_request(request.body(http_body_util::Empty::new()).ok()?).await.ok()?;
        Some(response.status().is_success())
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten().unwrap_or(false)
}

/// The whole record of an activation answered before its logs came, which follows the answer.
#[derive(serde::Deserialize)]
struct WholeMessage {
    response: ActivationRecord,
}

/// The record of a `CombinedCompletionAndResultMessage`, as its bytes within `body`.
#[derive(serde::Deserialize)]
struct CompletionMessage<'a> {
    #[serde(borrow)]
    response: &'a RawValue,
}

/// The record of a `CombinedCompletionAndResultMessage`, read for its head, its bytes within
/// `body`. A message that begins with it, as an invoker writes it (`{"response":<record>,...`),
/// is read in one pass, which ends where the record does; one laid out otherwise is read whole.
fn finished(body: &Bytes) -> Option<Finished> {
    const HEAD: &[u8] = b"{\"response\":";
    let read = match body.strip_prefix(HEAD) {
        Some(_) => ReadRecord::at_start(&body.slice(HEAD.len()..)),
        None => {
            let message = serde_json::from_slice::<CompletionMessage>(body).ok()?;
            ReadRecord::read(body.slice_ref(message.response.get().as_bytes()))
        }
    };
    read.ok().map(Finished)
}

/// The invoker's answer: a `CombinedCompletionAndResultMessage` with the record, or an error.
fn interpret(status: u16, body: &Bytes) -> Sent {
    let record = finished(body);
    let error = || {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        parsed.as_ref().and_then(|v| v["error"].as_str()).map_or_else(
            || String::from_utf8_lossy(body).chars().take(200).collect::<String>(),
            |e| e.chars().take(500).collect(),
        )
    };
    match (status, record) {
        (_, Some(finished)) => {
            if finished.head().ran_nothing() && matches!(status, 400 | 503) {
                Sent::Refused(finished.error().unwrap_or_else(|| "refused".to_string()))
            } else {
                Sent::Finished(Box::new(finished))
            }
        }
        // Before anything ran: a draining invoker, a namespace at its limit there, a key it
        // does not take, an action it could not fetch.
        (401 | 403 | 404 | 429 | 503, None) => Sent::Refused(format!("answered {status}: {}", error())),
        (202, None) => Sent::Lost("it accepted the activation but did not answer with its end".into()),
        (_, None) => Sent::Lost(format!("answered {status}: {}", error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(annotations: Value) -> Value {
        json!({ "response": {
            "namespace": "guest", "name": "a", "version": "0.0.1", "subject": "guest",
            "activationId": "0123456789abcdef0123456789abcdef", "start": 1, "end": 2, "duration": 1,
            "statusCode": 3, "response": { "status": "whisk internal error", "statusCode": 3, "success": false, "result": { "error": "why" } },
            "logs": [], "annotations": annotations, "publish": false
        }})
    }

    #[test]
    fn only_what_ran_nothing_goes_elsewhere() {
        let body = |v: Value| Bytes::from(v.to_string());
        let refused = body(record(json!([{ "key": "rejected", "value": "create_failed" }])));
        assert!(matches!(interpret(503, &refused), Sent::Refused(m) if m == "why"));
        let lost_container = body(record(json!([{ "key": "rejected", "value": "container_lost" }])));
        assert!(matches!(interpret(503, &lost_container), Sent::Finished(_)), "it ran: its record stands");
        assert!(matches!(interpret(200, &body(record(json!([])))), Sent::Finished(_)));
        let draining = body(json!({ "error": "the invoker is shutting down", "code": "x" }));
        assert!(matches!(interpret(503, &draining), Sent::Refused(m) if m.contains("shutting down")));
        assert!(matches!(interpret(500, &Bytes::from_static(b"oops")), Sent::Lost(_)), "a 500 may have run");
        assert!(matches!(interpret(202, &Bytes::from_static(b"{}")), Sent::Lost(_)));
    }

    /// A message that begins with its record (as an invoker writes it) is read to where the
    /// record ends, one laid out otherwise whole; either way the record's own bytes are passed
    /// on with the invoker spliced in: what encoding it again with that annotation writes.
    #[test]
    fn a_record_is_passed_on_as_its_bytes_came_and_with_the_invoker_it_ran_on() {
        let mut record: ActivationRecord =
            serde_json::from_value(record(json!([{ "key": "path", "value": "guest/a" }]))["response"].clone()).unwrap();
        let json = String::from_utf8(EncodedRecord::new(record.clone()).json.to_bytes().to_vec()).unwrap();
        let as_written = Bytes::from(format!(r#"{{"response":{json},"transid":["x",1],"isSystemError":false}}"#));
        let reordered = Bytes::from(format!(r#"{{"transid":["x",1],"response":{json}}}"#));
        record.annotations.push(KeyValue { key: "invoker".into(), value: json!("invoker7") });
        let expected = EncodedRecord::new(record).json.to_bytes();
        for message in [as_written, reordered] {
            let passed = finished(&message).unwrap();
            assert_eq!(passed.head().activation_id, "0123456789abcdef0123456789abcdef");
            assert_eq!(passed.ran_on("invoker7").json.to_bytes(), expected);
        }
    }

    /// The message's marker: a peer that saw it received the message.
    const MARK: &str = "the-message-itself-0123456789";

    fn message() -> Bytes {
        Bytes::from(format!("{{\"marker\":\"{MARK}\"}}"))
    }

    /// A peer that takes connections and reads what comes, as a frozen process's kernel does,
    /// but answers only as `answer` says: `answer(head_seen)` returns the bytes to write once
    /// the request's head arrived, after `delay`. Everything read is kept.
    async fn peer(answer: &'static [u8], delay: Duration) -> (String, Arc<Mutex<Vec<u8>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = kept.clone();
                tokio::spawn(async move {
                    let mut answered = false;
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = tokio::select! {
                            n = stream.read(&mut buf) => n.unwrap_or(0),
                            _ = tokio::time::sleep(delay), if !answered && seen.lock().windows(4).any(|w| w == b"\r\n\r\n") => {
                                answered = true;
                                let _ = stream.write_all(answer).await;
                                continue;
                            }
                        };
                        if n == 0 {
                            return;
                        }
                        seen.lock().extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        (authority, seen)
    }

    fn received(seen: &Mutex<Vec<u8>>) -> (bool, bool) {
        let text = String::from_utf8_lossy(&seen.lock()).to_lowercase();
        (text.contains("expect: 100-continue"), text.contains(&MARK.to_lowercase()))
    }

    #[tokio::test]
    async fn an_invoker_that_never_asks_never_gets_the_message() {
        let (authority, seen) = peer(b"", Duration::from_secs(3600)).await;
        let client = InvokerClient::new("k:v");
        let sent =
            client.send(&authority, message(), Duration::from_millis(100), Duration::from_secs(30), None, None).await;
        assert!(matches!(sent, Sent::Unheard(_)), "{sent:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(received(&seen), (true, false), "the head went, the message did not");
        assert!(client.idle.lock().get(&authority).is_none_or(Vec::is_empty), "that connection is not kept");
    }

    #[tokio::test]
    async fn a_late_ask_gets_nothing() {
        let (authority, seen) = peer(b"HTTP/1.1 100 Continue\r\n\r\n", Duration::from_millis(300)).await;
        let client = InvokerClient::new("k:v");
        let sent =
            client.send(&authority, message(), Duration::from_millis(100), Duration::from_secs(30), None, None).await;
        assert!(matches!(sent, Sent::Unheard(_)), "{sent:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(received(&seen), (true, false), "asked after the hand-over timeout: withdrawn");
    }

    #[tokio::test]
    async fn once_asked_for_the_activation_is_the_invokers() {
        let (authority, seen) = peer(b"HTTP/1.1 100 Continue\r\n\r\n", Duration::ZERO).await;
        let client = InvokerClient::new("k:v");
        let sent = client
            .send(&authority, message(), Duration::from_millis(100), Duration::from_millis(400), None, None)
            .await;
        assert!(matches!(sent, Sent::Lost(_)), "it has the message and never answered: {sent:?}");
        assert_eq!(received(&seen), (true, true));
    }

    /// The shim's server: hyper's, which asks for the body when the handler reads it.
    async fn server(refuse: bool) -> String {
        server_noting_asks(refuse).await.0
    }

    /// [`server`], and whether each message's request asked to be asked for it, in order.
    async fn server_noting_asks(refuse: bool) -> (String, Arc<Mutex<Vec<bool>>>) {
        use hyper::service::service_fn;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let asks = Arc::new(Mutex::new(Vec::new()));
        let noted = asks.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let asks = noted.clone();
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let asks = asks.clone();
                    async move {
                        if request.uri().path() == "/ping" {
                            return Ok(invoker_http::with_body(hyper::StatusCode::OK, "application/json", "{}"));
                        }
                        if refuse {
                            let answer = json!({ "error": "the invoker is shutting down" }).to_string();
                            return Ok::<_, std::convert::Infallible>(invoker_http::with_body(
                                hyper::StatusCode::SERVICE_UNAVAILABLE,
                                "application/json",
                                answer,
                            ));
                        }
                        asks.lock().push(request.headers().contains_key(hyper::header::EXPECT));
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        assert!(String::from_utf8_lossy(&body).contains(MARK));
                        let answer = record(json!([])).to_string();
                        Ok(invoker_http::with_body(hyper::StatusCode::OK, "application/json", answer))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        (authority, asks)
    }

    /// One round trip less a hop: an invoker that answered within `HEARD_WITHIN` gets the
    /// message with the request's head; one silent for longer is asked first again.
    #[tokio::test]
    async fn an_invoker_heard_from_just_now_gets_the_message_without_asking_for_it() {
        let (authority, asks) = server_noting_asks(false).await;
        let client = InvokerClient::new("k:v");
        for _ in 0..3 {
            let sent =
                client.send(&authority, message(), Duration::from_secs(5), Duration::from_secs(30), None, None).await;
            assert!(matches!(sent, Sent::Finished(_)), "{sent:?}");
        }
        tokio::time::sleep(HEARD_WITHIN * 2).await;
        let sent =
            client.send(&authority, message(), Duration::from_secs(5), Duration::from_secs(30), None, None).await;
        assert!(matches!(sent, Sent::Finished(_)), "{sent:?}");
        assert_eq!(*asks.lock(), [true, false, false, true], "asked first, then heard from, then silent too long");
        assert_eq!(client.idle.lock()[&authority].len(), 1, "one connection all along");
    }

    /// What went with its head to an invoker that froze since its last answer is its own (it
    /// may run it when it thaws): it ends lost, never elsewhere; the next message after
    /// `HEARD_WITHIN` asks, goes unheard, and may go elsewhere.
    #[tokio::test]
    async fn a_message_sent_with_its_head_to_an_invoker_that_froze_is_its_own() {
        let (authority, seen) = peer(b"", Duration::from_secs(3600)).await;
        let client = InvokerClient::new("k:v");
        // As if it had just answered.
        mark_heard(&client.heard, &authority);
        let sent = client
            .send(&authority, message(), Duration::from_millis(100), Duration::from_millis(300), None, None)
            .await;
        assert!(matches!(sent, Sent::Lost(_)), "it has the message: {sent:?}");
        assert_eq!(received(&seen), (false, true), "the message went with the head");
        seen.lock().clear();
        let sent =
            client.send(&authority, message(), Duration::from_millis(100), Duration::from_secs(30), None, None).await;
        assert!(matches!(sent, Sent::Unheard(_)), "{sent:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(received(&seen), (true, false), "asked again, and the message stayed");
    }

    #[tokio::test]
    async fn a_live_invoker_asks_answers_and_keeps_the_connection() {
        let authority = server(false).await;
        let client = InvokerClient::new("k:v");
        for _ in 0..3 {
            let sent =
                client.send(&authority, message(), Duration::from_secs(5), Duration::from_secs(30), None, None).await;
            assert!(matches!(sent, Sent::Finished(_)), "{sent:?}");
            assert_eq!(client.idle.lock()[&authority].len(), 1, "one connection, kept and used again");
        }
        assert!(client.ping(&authority, Duration::from_secs(5)).await);
    }

    /// An invoker whose record is whole only after its answer (its logs come through an
    /// engine): the result in the first part, the whole record in the second, and the
    /// connection kept for the next hand-over once both are read.
    #[tokio::test]
    async fn an_answer_in_two_parts_gives_the_result_then_the_whole_record() {
        use hyper::service::service_fn;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| async move {
                    let asked = request.headers().get(hyper::header::ACCEPT).cloned();
                    assert_eq!(asked.as_ref().and_then(|v| v.to_str().ok()), Some(TWO_PARTS));
                    let _ = request.into_body().collect().await.unwrap();
                    let mut first = record(json!([]));
                    first["transid"] = json!(["t", 1]);
                    let mut whole = record(json!([]));
                    whole["response"]["logs"] = json!(["2026-01-01T00:00:00.000Z stdout: late"]);
                    let rest = async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some(Bytes::from(format!("{whole}\n")))
                    };
                    let body = invoker_http::Follows::new(Bytes::from(format!("{first}\n")), rest).into_body();
                    let mut response = hyper::Response::new(body);
                    response
                        .headers_mut()
                        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(TWO_PARTS));
                    Ok::<_, std::convert::Infallible>(response)
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        let client = InvokerClient::new("k:v");
        for _ in 0..2 {
            let sent =
                client.send(&authority, message(), Duration::from_secs(5), Duration::from_secs(30), None, None).await;
            let Sent::Answered { answer, whole } = sent else { panic!("{sent:?}") };
            assert!(answer.logs.is_empty(), "the result, before the logs: {answer:?}");
            let whole = whole.await.unwrap().expect("the whole record follows");
            assert_eq!(whole.logs.len(), 1, "{whole:?}");
            eventually_kept(&client, &authority).await;
        }
    }

    /// The connection of a two-part answer is kept once its second part is read.
    async fn eventually_kept(client: &InvokerClient, authority: &str) {
        for _ in 0..100 {
            if client.idle.lock().get(authority).is_some_and(|stack| stack.len() == 1) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the connection was not kept");
    }

    #[tokio::test]
    async fn a_refusal_before_asking_goes_elsewhere() {
        let authority = server(true).await;
        let client = InvokerClient::new("k:v");
        let sent =
            client.send(&authority, message(), Duration::from_secs(5), Duration::from_secs(30), None, None).await;
        assert!(matches!(&sent, Sent::Refused(m) if m.contains("shutting down")), "{sent:?}");
        assert!(client.idle.lock().get(&authority).is_none_or(Vec::is_empty), "it waits for a body it never gets");
        let (frozen, _) = peer(b"", Duration::from_secs(3600)).await;
        assert!(!client.ping(&frozen, Duration::from_millis(100)).await);
    }
}
