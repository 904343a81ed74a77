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
use std::sync::Arc;

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
            return EncodedRecord { record: Arc::new(record), json, result };
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
        EncodedRecord { record: Arc::new(record), json: JsonParts::whole(json), result }
    }
}

impl EncodedRecord {
    /// A record as another invoker encoded it (`json`, which `record` was read from), passed on
    /// with one annotation more spliced in before the annotations' end, rather than encoded
    /// again: a scheduler adds the invoker it ran on. Bytes not laid out as
    /// [`EncodedRecord::new`] writes them are not spliced into: the record is encoded then.
    pub fn passed_on(mut record: ActivationRecord, json: &Bytes, extra: KeyValue) -> Self {
        let Some((result_at, insert_at)) = layout(&record, json) else {
            record.annotations.push(extra);
            return EncodedRecord::new(record);
        };
        let mut added = Vec::with_capacity(64);
        if !record.annotations.is_empty() {
            added.push(b',');
        }
        annotation(&mut added, &extra);
        record.annotations.push(extra);
        record.response.size = Some(result_at.len() as u64);
        if result_at.len() >= SHARED_RESULT {
            let result = json.slice(result_at.clone());
            let mut tail = Vec::with_capacity(json.len() - result_at.end + added.len());
            tail.extend_from_slice(&json[result_at.end..insert_at]);
            tail.extend_from_slice(&added);
            tail.extend_from_slice(&json[insert_at..]);
            record.response.result = ResultJson::within_record(result.clone());
            let json = JsonParts::split(json.slice(..result_at.start), result.clone(), tail.into());
            return EncodedRecord { record: Arc::new(record), json, result };
        }
        let mut whole = Vec::with_capacity(json.len() + added.len());
        whole.extend_from_slice(&json[..insert_at]);
        whole.extend_from_slice(&added);
        whole.extend_from_slice(&json[insert_at..]);
        let whole = Bytes::from(whole);
        let result = whole.slice(result_at);
        record.response.result = ResultJson::within_record(result.clone());
        EncodedRecord { record: Arc::new(record), json: JsonParts::whole(whole), result }
    }
}

/// Where `record`'s result lies in `json`, and where its annotations' array ends, if `json` is
/// laid out as [`EncodedRecord::new`] writes it: the result where the head ends, its size after
/// it, and the annotations last but for `publish`.
fn layout(record: &ActivationRecord, json: &[u8]) -> Option<(std::ops::Range<usize>, usize)> {
    const RESULT_KEY: &[u8] = b",\"result\":";
    let result = record.response.result.as_bytes();
    // The head's strings are JSON strings, in which a quote is escaped: the first `,"result":`
    // is the response's.
    let at = memchr::memmem::find(json, RESULT_KEY)? + RESULT_KEY.len();
    let result_at = at..at + result.len();
    if json.get(result_at.clone())? != result || !json[result_at.end..].starts_with(b",\"size\":") {
        return None;
    }
    let ending: &[u8] = if record.publish { b"],\"publish\":true}" } else { b"],\"publish\":false}" };
    let insert_at = json.len().checked_sub(ending.len()).filter(|_| json.ends_with(ending))?;
    // The array is empty exactly when the byte before its end opens it.
    if insert_at <= result_at.end || record.annotations.is_empty() != (json[insert_at - 1] == b'[') {
        return None;
    }
    Some((result_at, insert_at))
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
fn annotation(out: &mut Vec<u8>, KeyValue { key, value }: &KeyValue) {
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
mod tests {
    use super::*;
    use crate::model::ActivationResponse;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9/_.-]{0,12}",
            any::<String>(),
            Just("quote \" backslash \\ tab \t nul \u{0} del \u{7f} é ✓".to_string()),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(Value::String),
            any::<u32>().prop_map(|n| json!(n)),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
            Just(json!({"concurrency": 1, "memory": 256, "timeout": 60000, "x": [1.5, "y", null]})),
            (text(), any::<i64>()).prop_map(|(k, n)| json!({ k: n })),
        ]
    }

    fn record() -> impl Strategy<Value = ActivationRecord> {
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
                prop_assert_eq!(encoded.json.parts()[1].as_ptr(), encoded.record.response.result.as_bytes().as_ptr());
            }
        }

        /// A record passed on (a scheduler's, with the invoker it ran on) is byte for byte the
        /// one encoded again with that annotation, and its result is where its JSON holds it.
        #[test]
        fn a_record_passed_on_is_the_one_encoded_with_its_annotation(
            record in record(), large in any::<bool>(), (key, value) in (text(), value()),
        ) {
            let mut record = record;
            if large {
                record.response.result = json!({"s": "x".repeat(SHARED_RESULT)}).into();
            }
            let sent = EncodedRecord::new(record).json.to_bytes();
            let read: ActivationRecord = serde_json::from_slice(&sent).unwrap();
            let extra = KeyValue { key, value };
            prop_assert!(layout(&read, &sent).is_some(), "laid out as written");
            let passed = EncodedRecord::passed_on(read.clone(), &sent, extra.clone());
            let mut again = read;
            again.annotations.push(extra);
            let again = EncodedRecord::new(again);
            let (passed_json, again_json) = (passed.json.to_bytes(), again.json.to_bytes());
            prop_assert_eq!(String::from_utf8_lossy(&passed_json), String::from_utf8_lossy(&again_json));
            prop_assert_eq!(&passed.record.annotations, &again.record.annotations);
            prop_assert_eq!(&passed.result_json()[..], &again.result_json()[..]);
            prop_assert_eq!(passed.result_json().as_ptr(), passed.record.response.result.as_bytes().as_ptr());
            prop_assert_eq!(passed.json.parts()[1].is_empty(), !large);
        }
    }

    /// Bytes laid out otherwise (another writer's order, a result not where it is said to be)
    /// are not spliced into: the record is encoded, with the annotation.
    #[test]
    fn a_record_laid_out_otherwise_is_encoded_again() {
        let record: ActivationRecord = serde_json::from_value(json!({
            "namespace": "guest", "name": "a", "version": "0.0.1", "subject": "guest",
            "activationId": "0123456789abcdef0123456789abcdef", "start": 1, "end": 2, "duration": 1,
            "statusCode": 0, "response": {"status": "success", "statusCode": 0, "success": true, "result": {"x": 1}},
            "logs": [], "annotations": [{"key": "path", "value": "guest/a"}], "publish": false
        }))
        .unwrap();
        let extra = KeyValue { key: "invoker".into(), value: json!("invoker0") };
        let mut with_extra = record.clone();
        with_extra.annotations.push(extra.clone());
        let expected = EncodedRecord::new(with_extra).json.to_bytes();
        let written = String::from_utf8(EncodedRecord::new(record.clone()).json.to_bytes().to_vec()).unwrap();
        let publish_first = written
            .replacen("{\"namespace\"", "{\"publish\":false,\"namespace\"", 1)
            .replace(",\"publish\":false}", "}");
        let spaced_result = written.replace("{\"x\":1}", "{\"x\": 1}");
        for (json, laid_out) in [(written, true), (publish_first, false), (spaced_result, false)] {
            let json = Bytes::from(json);
            assert_eq!(layout(&record, &json).is_some(), laid_out, "{json:?}");
            let passed = EncodedRecord::passed_on(record.clone(), &json, extra.clone());
            assert_eq!(passed.json.to_bytes(), expected, "{json:?}");
        }
    }
}
