//! An activation record's JSON, and an acceptance's ([`ActivationMeta`], the journal's line
//! for each activation), written field by field, byte for byte what `serde_json` writes for
//! them (property tests hold them to that). Every activation encodes its
//! record once, on the invoker's one thread: through serde that was 14,000 instructions for 600
//! bytes, a call into the writer for each brace, colon, comma and quote and a byte loop with a
//! table for each of the record's 47 strings. Here the fixed parts are one copy each, numbers
//! go through `itoa`, and a string with nothing to escape (the ids, names, kinds, every key) is
//! one copy between quotes; JSON values (the result, the annotations' values) and any string
//! that needs escaping still go through `serde_json`, which defines the bytes.

use crate::json_parts::JsonParts;
use crate::model::{ActivationMeta, ActivationRecord, EncodedRecord, KeyValue, SHARED_RESULT};
use crate::result_json::ResultJson;
use bytes::Bytes;

impl EncodedRecord {
    /// Encodes `record`, its result once (which also gives its `size`).
    pub fn new(mut record: ActivationRecord) -> Self {
        // The result as its bytes came (a runtime's answer, or the invoker's own, encoded once).
        let result = record.response.result.bytes();
        record.response.size = Some(result.len() as u64);
        let logs: usize = record.logs.iter().map(|l| l.len() + 3).sum();
        if result.len() >= SHARED_RESULT {
            let mut head = Vec::with_capacity(320);
            encode_head(&record, &mut head);
            let mut tail = Vec::with_capacity(192 + logs);
            encode_tail(&record, &mut tail);
            let json = JsonParts::split(head.into(), result.clone(), tail.into());
            return EncodedRecord::encoded(record, json, result);
        }
        let mut json = Vec::with_capacity(512 + result.len() + logs);
        encode_head(&record, &mut json);
        let at = json.len()..json.len() + result.len();
        json.extend_from_slice(&result);
        encode_tail(&record, &mut json);
        let json = Bytes::from(json);
        // From here the record's result is where its JSON holds it: held once, not once there
        // and once as it came.
        let result = json.slice(at);
        record.response.result = ResultJson::within_record(result.clone());
        EncodedRecord::encoded(record, JsonParts::whole(json), result)
    }
}

/// The record's JSON up to its result (`..."result":`).
fn encode_head(record: &ActivationRecord, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"namespace\":");
    string(out, &record.namespace);
    out.extend_from_slice(b",\"name\":");
    string(out, &record.name);
    out.extend_from_slice(b",\"version\":");
    string(out, &record.version);
    out.extend_from_slice(b",\"subject\":");
    string(out, &record.subject);
    out.extend_from_slice(b",\"activationId\":");
    string(out, &record.activation_id);
    out.extend_from_slice(b",\"start\":");
    number(out, record.start);
    out.extend_from_slice(b",\"end\":");
    number(out, record.end);
    out.extend_from_slice(b",\"duration\":");
    number(out, record.duration);
    out.extend_from_slice(b",\"statusCode\":");
    number(out, u64::from(record.status_code));
    let response = &record.response;
    out.extend_from_slice(b",\"response\":{\"status\":");
    string(out, &response.status);
    out.extend_from_slice(b",\"statusCode\":");
    number(out, u64::from(response.status_code));
    out.extend_from_slice(if response.success { b",\"success\":true" } else { b",\"success\":false" });
    out.extend_from_slice(b",\"result\":");
}

/// One annotation's JSON object.
pub(crate) fn annotation(out: &mut Vec<u8>, KeyValue { key, value }: &KeyValue) {
    out.extend_from_slice(b"{\"key\":");
    string(out, key);
    out.extend_from_slice(b",\"value\":");
    match value {
        serde_json::Value::String(s) => string(out, s),
        // Numbers, booleans and the limits' object: strings, numbers and JSON values, which
        // encode without failing.
        other => serde_json::to_writer(&mut *out, other).expect("a JSON value serialises"),
    }
    out.push(b'}');
}

/// The record's JSON after its result.
fn encode_tail(record: &ActivationRecord, out: &mut Vec<u8>) {
    if let Some(size) = record.response.size {
        out.extend_from_slice(b",\"size\":");
        number(out, size);
    }
    out.extend_from_slice(b"},\"logs\":[");
    for (n, line) in record.logs.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        string(out, line);
    }
    out.extend_from_slice(b"],\"annotations\":[");
    for (n, kv) in record.annotations.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        annotation(out, kv);
    }
    out.extend_from_slice(if record.publish { b"],\"publish\":true}" } else { b"],\"publish\":false}" });
}

impl ActivationMeta {
    /// Appends its JSON to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"activation_id\":");
        string(out, &self.activation_id);
        out.extend_from_slice(b",\"namespace\":");
        string(out, &self.namespace);
        out.extend_from_slice(b",\"name\":");
        string(out, &self.name);
        out.extend_from_slice(b",\"version\":");
        string(out, &self.version);
        out.extend_from_slice(b",\"subject\":");
        string(out, &self.subject);
        out.extend_from_slice(b",\"kind\":");
        string(out, &self.kind);
        let limits = &self.limits;
        out.extend_from_slice(b",\"limits\":{\"timeout\":");
        number(out, limits.timeout);
        out.extend_from_slice(b",\"memory\":");
        number(out, u64::from(limits.memory));
        out.extend_from_slice(b",\"logs\":");
        number(out, u64::from(limits.logs));
        out.extend_from_slice(b",\"concurrency\":");
        number(out, u64::from(limits.concurrency));
        out.extend_from_slice(b",\"disk\":");
        number(out, u64::from(limits.disk));
        out.extend_from_slice(b"},\"accepted_at\":");
        number(out, self.accepted_at);
        out.push(b'}');
    }
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `s` as a JSON string: between quotes as it is when nothing in it needs escaping, else as
/// `serde_json` escapes it.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        serde_json::to_writer(out, s).expect("a string serialises");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::ActivationResponse;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    pub(crate) fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9/_.-]{0,12}",
            any::<String>(),
            Just("quote \" backslash \\ tab \t nul \u{0} del \u{7f} é ✓".to_string()),
        ]
    }

    pub(crate) fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(Value::String),
            any::<u32>().prop_map(|n| json!(n)),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
            Just(json!({"concurrency": 1, "memory": 256, "timeout": 60000, "x": [1.5, "y", null]})),
            (text(), any::<i64>()).prop_map(|(k, n)| json!({ k: n })),
        ]
    }

    pub(crate) fn record() -> impl Strategy<Value = ActivationRecord> {
        let names = (text(), text(), text(), text(), text());
        let numbers = (any::<u64>(), any::<u64>(), any::<u64>(), 0u8..4, any::<bool>());
        let response = (text(), 0u8..4, any::<bool>(), value(), proptest::option::of(any::<u64>()));
        let lists = (proptest::collection::vec(text(), 0..4), proptest::collection::vec((text(), value()), 0..5));
        (names, numbers, response, lists).prop_map(
            |(
                (namespace, name, version, subject, activation_id),
                (start, end, duration, status_code, publish),
                r,
                l,
            )| {
                ActivationRecord {
                    namespace,
                    name,
                    version,
                    subject,
                    activation_id,
                    start,
                    end,
                    duration,
                    status_code,
                    response: ActivationResponse {
                        status: r.0,
                        status_code: r.1,
                        success: r.2,
                        result: r.3.into(),
                        size: r.4,
                    },
                    logs: l.0,
                    annotations: l.1.into_iter().map(|(key, value)| KeyValue { key, value }).collect(),
                    publish,
                    rejection: None,
                }
            },
        )
    }

    fn meta() -> impl Strategy<Value = ActivationMeta> {
        let names = (text(), text(), text(), text(), text(), text());
        let limits = (any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>());
        (names, limits, any::<u64>()).prop_map(
            |((activation_id, namespace, name, version, subject, kind), l, accepted_at)| ActivationMeta {
                activation_id,
                namespace,
                name,
                version,
                subject,
                kind,
                limits: crate::model::Limits { timeout: l.0, memory: l.1, logs: l.2, concurrency: l.3, disk: l.4 },
                accepted_at,
            },
        )
    }

    proptest! {
        #[test]
        fn an_acceptances_bytes_are_serde_jsons(meta in meta()) {
            let mut json = Vec::new();
            meta.write_json(&mut json);
            let serde = serde_json::to_vec(&meta).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&json), String::from_utf8_lossy(&serde));
        }

        #[test]
        fn the_bytes_are_serde_jsons(mut record in record(), large in any::<bool>()) {
            if large {
                record.response.result = json!({"s": "x".repeat(SHARED_RESULT)}).into();
            }
            let encoded = EncodedRecord::new(record.clone());
            let result = serde_json::to_vec(&record.response.result).unwrap();
            record.response.size = Some(result.len() as u64);
            let serde = serde_json::to_vec(&record).unwrap();
            let json = encoded.json.to_bytes();
            prop_assert_eq!(String::from_utf8_lossy(&json), String::from_utf8_lossy(&serde));
            prop_assert_eq!(&encoded.result_json()[..], result.as_slice());
            // A large result is a part of its own, the bytes it came as.
            prop_assert_eq!(encoded.json.parts()[1].is_empty(), !large);
            if large {
                prop_assert_eq!(encoded.json.parts()[1].as_ptr(), encoded.record().response.result.as_bytes().as_ptr());
            }
        }
    }
}
