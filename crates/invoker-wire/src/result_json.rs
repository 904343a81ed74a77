//! An activation's result as the bytes its runtime answered with. The invoker decides only
//! whether an answer is a result (valid JSON, a dictionary or an array, within its bound) and
//! whether it holds an `error`; it checks that by a scan, and the bytes go as they came into
//! the caller's answer, the journal, redb and a scheduler's relay, never decoded into a tree
//! and encoded again. What a reader needs of it (an error's message, an Fn function's
//! response) is read from it where it is needed.

use crate::json_text::JsonText;
use bytes::Bytes;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// One JSON value, as its text: a runtime's answer, or one the invoker wrote (an error).
#[derive(Clone, Debug)]
pub struct ResultJson(JsonText);

impl ResultJson {
    /// An answer's body, checked to be one JSON value by a scan that builds nothing; the
    /// result is a slice of `body`, not a copy.
    pub fn from_bytes(body: Bytes) -> Result<Self, serde_json::Error> {
        JsonText::from_bytes(body).map(ResultJson)
    }

    /// As [`Self::from_bytes`], from bytes it copies.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        Self::from_bytes(Bytes::copy_from_slice(bytes))
    }

    /// The result where a record's JSON holds it (`record_json`): already checked, once.
    pub(crate) fn within_record(bytes: Bytes) -> Self {
        ResultJson(JsonText::checked(bytes))
    }

    /// A result the invoker makes itself (an error, a guess), encoded once.
    pub fn from_value(value: &Value) -> Self {
        // A JSON value encodes without failing, and serde_json's output is JSON.
        let text = serde_json::to_string(value).expect("a JSON value serialises");
        ResultJson(JsonText::from_written(text))
    }

    /// Its text (checked UTF-8: a scan of its length; to pass it on, [`Self::as_bytes`]).
    pub fn get(&self) -> &str {
        self.0.as_str()
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The bytes, shared (a record's JSON holds a large result so, not as a copy).
    pub fn bytes(&self) -> Bytes {
        self.0.bytes()
    }

    /// A dictionary or an array: what OpenWhisk's runtimes may answer as a result.
    pub fn is_dict_or_array(&self) -> bool {
        matches!(self.as_bytes().first(), Some(b'{' | b'['))
    }

    /// The member `key` of a dictionary, decoded alone (the others are skipped by the scan);
    /// `None` for another value or a dictionary without it.
    pub fn field(&self, key: &str) -> Option<Value> {
        if self.as_bytes().first() != Some(&b'{') {
            return None;
        }
        let mut found = None;
        let mut de = serde_json::Deserializer::from_slice(self.as_bytes());
        de.deserialize_map(Member { key, found: &mut found }).ok()?;
        found
    }

    /// The dictionary's `error` as a string, when it is one.
    pub fn error(&self) -> Option<String> {
        match self.field("error")? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Decoded, where something must look inside (an Fn function's response, tests).
    pub fn to_value(&self) -> Value {
        serde_json::from_slice(self.as_bytes()).unwrap_or(Value::Null)
    }
}

/// Finds one top-level member of a dictionary.
struct Member<'k, 'f> {
    key: &'k str,
    found: &'f mut Option<Value>,
}

impl<'de> Visitor<'de> for Member<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == self.key {
                *self.found = Some(map.next_value::<Value>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl From<Value> for ResultJson {
    fn from(value: Value) -> Self {
        ResultJson::from_value(&value)
    }
}

impl PartialEq for ResultJson {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Serialize for ResultJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ResultJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        JsonText::deserialize(d).map(ResultJson)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_keeps_its_bytes_and_is_read_where_needed() {
        let r = ResultJson::from_slice(br#"  {"a": [1, 2.50], "error": "no", "n": 12345678901234567890123}"#).unwrap();
        assert_eq!(r.get(), r#"{"a": [1, 2.50], "error": "no", "n": 12345678901234567890123}"#);
        assert!(r.is_dict_or_array());
        assert_eq!(r.error().as_deref(), Some("no"));
        assert_eq!(r.field("a"), Some(json!([1, 2.5])));
        assert_eq!(r.field("b"), None);
        let not_a_string = ResultJson::from_slice(br#"{"error": {"code": 1}}"#).unwrap();
        assert_eq!((not_a_string.error(), not_a_string.field("error")), (None, Some(json!({"code": 1}))));
        for other in [&b"[1, {\"error\": 1}]"[..], b"5", b"\"error\"", b"null"] {
            let r = ResultJson::from_slice(other).unwrap();
            assert_eq!(r.field("error"), None, "{}", r.get());
        }
        assert!(!ResultJson::from_slice(b"5").unwrap().is_dict_or_array());
        assert!(ResultJson::from_slice(br#"{"a":"#).is_err());
        assert!(ResultJson::from_slice(br#"{} {}"#).is_err());
    }

    #[test]
    fn it_is_written_and_read_as_the_value_it_is() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Holder {
            result: ResultJson,
        }
        let held = Holder { result: ResultJson::from_slice(br#"{"x": [true, null]}"#).unwrap() };
        let text = serde_json::to_string(&held).unwrap();
        assert_eq!(text, r#"{"result":{"x": [true, null]}}"#);
        assert_eq!(serde_json::from_str::<Holder>(&text).unwrap(), held);
        assert_eq!(serde_json::to_value(&held).unwrap(), json!({"result": {"x": [true, null]}}));
        assert_eq!(ResultJson::from(json!({"error": "e"})).get(), r#"{"error":"e"}"#);
    }
}
