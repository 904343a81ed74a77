//! The v1 scheduler HTTP API on the wire: `POST /api/v1/scheduler` with protobuf bodies. A
//! SUBSCRIBE answers with a RecordIO stream of events and a `Mesos-Stream-Id` that every
//! other call must carry; a master that is not the leader answers 307 with the leader's
//! address in `Location`, which has no scheme.

use super::proto::v1::scheduler::{Call, Event};
use super::recordio::{RecordIo, RecordIoError};
use futures_util::{Stream, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use prost::Message;
use std::pin::Pin;
use std::time::Duration;
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;

const PROTOBUF: &str = "application/x-protobuf";
const STREAM_ID: &str = "Mesos-Stream-Id";
/// Leader changes followed for one request at most.
const MAX_REDIRECTS: usize = 4;
/// An event larger than this is a broken stream (offers for thousands of agents stay far below).
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;
/// Longest error body kept from a master's answer.
const MAX_ERROR_BODY: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum MesosError {
    #[error("mesos master {master}: {source}")]
    Http { master: String, source: reqwest::Error },
    #[error("mesos master {master} answered {status}: {body}")]
    Status { master: String, status: u16, body: String },
    #[error("mesos master {master} redirected to a bad leader address {location:?}")]
    BadRedirect { master: String, location: String },
    #[error("mesos masters redirected more than {MAX_REDIRECTS} times")]
    TooManyRedirects,
    #[error("mesos master {master} answered SUBSCRIBE without a {STREAM_ID}")]
    NoStreamId { master: String },
    #[error("the event stream broke: {0}")]
    Stream(String),
    #[error("an event could not be decoded: {0}")]
    Decode(#[from] prost::DecodeError),
}

impl From<MesosError> for invoker_factory::error::Cause {
    fn from(e: MesosError) -> Self {
        invoker_factory::error::Cause::backend(e)
    }
}

impl From<RecordIoError> for MesosError {
    fn from(e: RecordIoError) -> Self {
        MesosError::Stream(e.to_string())
    }
}

pub type Events = Pin<Box<dyn Stream<Item = Result<Event, MesosError>> + Send>>;

pub struct Subscription {
    pub stream_id: String,
    pub events: Events,
}

/// A client of the leading master, following it when it moves.
pub struct MasterClient {
    /// For calls: bounded by `call_timeout`.
    calls: reqwest::Client,
    /// For the event stream: no total timeout (the stream lasts as long as the subscription).
    streams: reqwest::Client,
    leader: Mutex<String>,
}

impl MasterClient {
    /// `master` is `http://host:port`.
    pub fn new(master: &str, call_timeout: Duration) -> Result<Self, reqwest::Error> {
        let build = |timeout: Option<Duration>| {
            let mut b = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true);
            if let Some(t) = timeout {
                b = b.timeout(t);
            }
            b.build()
        };
        Ok(MasterClient {
            calls: build(Some(call_timeout))?,
            streams: build(None)?,
            leader: Mutex::new(master.trim_end_matches('/').to_string()),
        })
    }

    pub fn leader(&self) -> String {
        self.leader.lock().clone()
    }

    /// Follows a 307: `Location` is `host:port` (upstream), `//host:port/...` or a full URL.
    fn follow(&self, master: &str, response: &reqwest::Response) -> Result<(), MesosError> {
        let location = response.headers().get("location").and_then(|l| l.to_str().ok()).unwrap_or_default();
        let bad = || MesosError::BadRedirect { master: master.to_string(), location: location.to_string() };
        let rest = location.trim_start_matches("//");
        let (scheme, rest) = match rest.split_once("://") {
            Some((scheme, rest)) => (scheme, rest),
            None => ("http", rest),
        };
        let authority = rest.split('/').next().filter(|a| !a.is_empty()).ok_or_else(bad)?;
        if authority.contains(char::is_whitespace) {
            return Err(bad());
        }
        *self.leader.lock() = format!("{scheme}://{authority}");
        Ok(())
    }

    async fn post(
        &self,
        client: &reqwest::Client,
        call: &Call,
        stream_id: Option<&str>,
    ) -> Result<(String, reqwest::Response), MesosError> {
        let body = call.encode_to_vec();
        for _ in 0..=MAX_REDIRECTS {
            let master = self.leader();
            let mut request = client
                .post(format!("{master}/api/v1/scheduler"))
                .header("content-type", PROTOBUF)
                .header("accept", PROTOBUF)
                .body(body.clone());
            if let Some(id) = stream_id {
                request = request.header(STREAM_ID, id);
            }
            let response =
                request.send().await.map_err(|source| MesosError::Http { master: master.clone(), source })?;
            if response.status() == reqwest::StatusCode::TEMPORARY_REDIRECT {
                self.follow(&master, &response)?;
                continue;
            }
            return Ok((master, response));
        }
        Err(MesosError::TooManyRedirects)
    }

    pub async fn subscribe(&self, call: &Call) -> Result<Subscription, MesosError> {
        let (master, response) = self.post(&self.streams, call, None).await?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(status_error(master, response).await);
        }
        let stream_id = response
            .headers()
            .get(STREAM_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 128)
            .ok_or_else(|| MesosError::NoStreamId { master: master.clone() })?
            .to_string();
        let body = response.bytes_stream().map_err(std::io::Error::other);
        let records = FramedRead::new(StreamReader::new(body), RecordIo::new(MAX_EVENT_BYTES));
        let events = records.map(|record| Ok(Event::decode(record?)?));
        Ok(Subscription { stream_id, events: Box::pin(events) })
    }

    /// Sends a call on the subscription `stream_id`; the master answers 202 Accepted.
    pub async fn call(&self, stream_id: &str, call: &Call) -> Result<(), MesosError> {
        let (master, response) = self.post(&self.calls, call, Some(stream_id)).await?;
        if response.status() != reqwest::StatusCode::ACCEPTED {
            return Err(status_error(master, response).await);
        }
        Ok(())
    }
}

async fn status_error(master: String, response: reqwest::Response) -> MesosError {
    let status = response.status().as_u16();
    let body: String = response.text().await.unwrap_or_default().chars().take(MAX_ERROR_BODY).collect();
    MesosError::Status { master, status, body }
}
