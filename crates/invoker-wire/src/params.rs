//! A call's parameters as the bytes they came as. The invoker decides nothing on them, so it
//! never decodes them into a tree: a request's body is checked once by a scan (one JSON object)
//! and goes as it is into the runtime's `/run` body, the durable queue's journal line and a
//! scheduler's message to its invoker. An action's default parameters are spliced in front of
//! the caller's, which win (a runtime reads a repeated key's last value, as JSON parsers do);
//! when it has none, nothing is copied again: the parameters are a slice of the request's body.

use crate::json_text::JsonText;
use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// One JSON object, as its text.
#[derive(Clone, Debug)]
pub struct Params(JsonText);

#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("the parameters must be a JSON object")]
    NotAnObject,
}

impl Params {
    /// No parameters: `{}`.
    pub fn empty() -> Self {
        // Static bytes: no allocation (a call's parameters are let go this way after `/run`).
        Params(JsonText::checked(bytes::Bytes::from_static(b"{}")))
    }

    /// A request's body: nothing (or only white space) is no parameters, anything else must be
    /// one JSON object, checked by a scan without building it. The parameters are then a slice
    /// of `body`, not a copy.
    pub fn from_body(body: Bytes) -> Result<Self, ParamsError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::empty());
        }
        Self::object(JsonText::from_bytes(body)?)
    }

    fn object(text: JsonText) -> Result<Self, ParamsError> {
        match text.as_bytes().first() {
            Some(b'{') => Ok(Params(text)),
            _ => Err(ParamsError::NotAnObject),
        }
    }

    /// Parameters made here (a destination's: another call's outcome), encoded once.
    pub fn from_map(map: &Map<String, Value>) -> Self {
        // A map of JSON values encodes without failing, and serde_json's output is JSON.
        let text = serde_json::to_string(map).expect("a JSON map serialises");
        Params(JsonText::from_written(text))
    }

    /// The object's text (checked UTF-8: a scan of its length; to pass it on, [`Self::bytes`]).
    pub fn get(&self) -> &str {
        self.0.as_str()
    }

    /// The object's bytes, shared (the request's, for a call's own parameters).
    pub fn bytes(&self) -> Bytes {
        self.0.bytes()
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Decoded, where something must look inside (tests, a destination's outcome).
    pub fn to_map(&self) -> Map<String, Value> {
        serde_json::from_str(self.get()).unwrap_or_default()
    }

    /// `defaults` (an action's default parameters: key and value) under these: each default
    /// whose key the caller did not give is written in front of the caller's members, which
    /// are copied as they came. Without defaults this is `self`, untouched.
    pub fn merged_under<'a>(self, defaults: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Self {
        let mut defaults = defaults.into_iter().peekable();
        if defaults.peek().is_none() {
            return self;
        }
        let given = top_level_keys(self.get());
        let text = self.get();
        let members = text[1..text.len() - 1].trim();
        let mut out = String::with_capacity(text.len() + 64);
        out.push('{');
        for (key, value) in defaults.filter(|(key, _)| !given.contains(*key)) {
            if out.len() > 1 {
                out.push(',');
            }
            // A string and a JSON value encode without failing.
            out.push_str(&serde_json::to_string(key).expect("a string serialises"));
            out.push(':');
            out.push_str(&serde_json::to_string(value).expect("a JSON value serialises"));
        }
        if !members.is_empty() {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(members);
        }
        out.push('}');
        // Members of two JSON objects joined by a comma inside braces: one JSON object.
        Params(JsonText::from_written(out))
    }
}

/// The keys of a JSON object's top level, read by a scan (their values skipped, not built).
fn top_level_keys(text: &str) -> BTreeSet<String> {
    struct Keys(BTreeSet<String>);
    impl<'de> Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys = BTreeSet::new();
                    while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        keys.insert(key.into_owned());
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    serde_json::from_str::<Keys>(text).map(|k| k.0).unwrap_or_default()
}

impl Default for Params {
    fn default() -> Self {
        Self::empty()
    }
}

impl PartialEq for Params {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Serialize for Params {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Read from a journal line, redb or a scheduler's message: checked to be an object.
impl<'de> Deserialize<'de> for Params {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Params::object(JsonText::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merge(given: Params, defaults: &[(&str, Value)]) -> Params {
        given.merged_under(defaults.iter().map(|(k, v)| (*k, v)))
    }

    #[test]
    fn a_body_is_one_object_or_nothing() {
        assert_eq!(Params::from_body(Bytes::from_static(b"")).unwrap().get(), "{}");
        assert_eq!(Params::from_body(Bytes::from_static(b" \n")).unwrap().get(), "{}");
        assert_eq!(
            Params::from_body(Bytes::from_static(br#" {"a": [1, 2.50, 1e400]} "#)).unwrap().get(),
            r#"{"a": [1, 2.50, 1e400]}"#
        );
        assert!(matches!(Params::from_body(Bytes::from_static(b"[1]")), Err(ParamsError::NotAnObject)));
        assert!(matches!(Params::from_body(Bytes::from_static(b"\"x\"")), Err(ParamsError::NotAnObject)));
        assert!(matches!(Params::from_body(Bytes::from_static(b"{\"a\":")), Err(ParamsError::Json(_))));
        assert!(matches!(Params::from_body(Bytes::from_static(b"{} {}")), Err(ParamsError::Json(_))));
    }

    #[test]
    fn defaults_go_under_the_callers_members_which_keep_their_bytes() {
        let given = Params::from_body(Bytes::from_static(br#"{"name": "you", "n": 12345678901234567890123}"#)).unwrap();
        let merged = merge(given, &[("name", json!("default")), ("greeting", json!("hi \"there\""))]);
        assert_eq!(merged.get(), r#"{"greeting":"hi \"there\"","name": "you", "n": 12345678901234567890123}"#);
        let map = merged.to_map();
        assert_eq!((map["name"].clone(), map["greeting"].clone()), (json!("you"), json!("hi \"there\"")));
        let none = merge(Params::empty(), &[("a", json!(1))]);
        assert_eq!(none.get(), r#"{"a":1}"#);
        let untouched = merge(Params::from_body(Bytes::from_static(br#"{ "x" : 1 }"#)).unwrap(), &[]);
        assert_eq!(untouched.get(), r#"{ "x" : 1 }"#);
    }

    #[test]
    fn it_reads_and_writes_as_the_object_it_is() {
        let params = Params::from_body(Bytes::from_static(br#"{"a":{"b":[true,null]}}"#)).unwrap();
        let line = serde_json::to_string(&json!({"before": 1})).unwrap();
        assert_eq!(line, r#"{"before":1}"#);
        #[derive(Serialize, Deserialize)]
        struct Holder {
            params: Params,
        }
        let text = serde_json::to_string(&Holder { params: params.clone() }).unwrap();
        assert_eq!(text, r#"{"params":{"a":{"b":[true,null]}}}"#);
        assert_eq!(serde_json::from_str::<Holder>(&text).unwrap().params, params);
        assert!(serde_json::from_str::<Holder>(r#"{"params":[1]}"#).is_err());
        assert_eq!(Params::from_map(&params.to_map()).get(), r#"{"a":{"b":[true,null]}}"#);
    }
}
