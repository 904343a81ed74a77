//! The journal's line format: one JSON object a line, keyed by what it says (`A` accepted,
//! `Q` queued, `S` started, `R` answered before its logs, `F` finished), each written from the
//! bytes already encoded for it and read back by [`Line`].

use crate::contract::QueuedCall;
use invoker_wire::json_parts::JsonParts;
#[cfg(any(test, feature = "test-util"))]
use invoker_wire::model::EncodedRecord;
use invoker_wire::model::{ActivationMeta, ActivationRecord};

#[derive(serde::Deserialize)]
pub(super) enum Line {
    A(ActivationMeta),
    F(Box<ActivationRecord>),
    /// Answered before its record was whole (its logs still coming): the record as answered.
    R(Box<ActivationRecord>),
    /// An asynchronous call accepted into the queue, with what it takes to run it.
    Q(Box<QueuedCall>),
    /// A queued call handed to a container, and when (epoch ms).
    S(String, u64),
}

/// A journal line as a restart reads it, written again as the journal writes it: `None` when
/// it does not parse (what the fuzz targets feed with arbitrary bytes).
#[cfg(any(test, feature = "test-util"))]
pub fn reread_line(bytes: &[u8]) -> Option<Vec<u8>> {
    match serde_json::from_slice::<Line>(bytes).ok()? {
        Line::A(meta) => {
            let mut line = accepted_line(&meta);
            line.pop();
            Some(line)
        }
        Line::F(record) => {
            let mut line = record_line(FINISHED, &EncodedRecord::new(*record).json).concat();
            line.pop();
            Some(line)
        }
        Line::R(record) => {
            let mut line = record_line(ANSWERED, &EncodedRecord::new(*record).json).concat();
            line.pop();
            Some(line)
        }
        Line::Q(call) => {
            let mut line = queued_line(&serde_json::to_vec(&call).ok()?);
            line.pop();
            Some(line)
        }
        Line::S(id, at) => serde_json::to_vec(&LineRef::S(&id, at)).ok(),
    }
}

/// What `Line` reads of a start, written without a copy (an acceptance's line is
/// [`accepted_line`], a record's [`record_line`]).
#[derive(serde::Serialize)]
pub(super) enum LineRef<'a> {
    S(&'a str, u64),
}

/// An acceptance's line, newline included: `{"A":<meta>}`, as `Line::A` reads it.
pub(super) fn accepted_line(meta: &ActivationMeta) -> Vec<u8> {
    let mut line = Vec::with_capacity(256);
    line.extend_from_slice(b"{\"A\":");
    meta.write_json(&mut line);
    line.extend_from_slice(b"}\n");
    line
}

/// A queued call's line, newline included: `{"Q":<call>}` around its JSON, encoded once for
/// the journal and redb.
pub(super) fn queued_line(json: &[u8]) -> Vec<u8> {
    wrapped_line(b"{\"Q\":", json)
}

pub(super) fn wrapped_line(head: &[u8], json: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(json.len() + 7);
    line.extend_from_slice(head);
    line.extend_from_slice(json);
    line.extend_from_slice(b"}\n");
    line
}

/// A finished record's line begins so: `{"F":<record>}`.
pub(super) const FINISHED: &[u8] = b"{\"F\":";
/// An answered record's line begins so: `{"R":<record>}`.
pub(super) const ANSWERED: &[u8] = b"{\"R\":";

/// A record's line (`key`: [`FINISHED`] or [`ANSWERED`]), newline included, as the parts to
/// write one after another: the record's JSON as it was encoded, once, and as it is held (a
/// large result as the bytes it came as), never joined into one buffer for its line.
pub(super) fn record_line<'a>(key: &'static [u8], json: &'a JsonParts) -> [&'a [u8]; 5] {
    let [head, middle, tail] = json.parts();
    [key, head, middle, tail, b"}\n"]
}
