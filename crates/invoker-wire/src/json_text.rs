//! One JSON value as the bytes it came in, shared rather than copied: a call's parameters are a
//! slice of the request's body, a record's result a slice of the record's own JSON once it is
//! encoded. Checked once, by a scan that builds nothing, where the bytes come in; after that
//! they are only passed on (written into a body, a journal line, an answer) or, where something
//! must look inside, scanned again.

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// The text of one JSON value, without the white space around it.
#[derive(Clone, Debug)]
pub(crate) struct JsonText(Bytes);

impl JsonText {
    /// `bytes` checked to be one JSON value; the text is a slice of them (no copy).
    pub(crate) fn from_bytes(bytes: Bytes) -> Result<Self, serde_json::Error> {
        let raw: &RawValue = serde_json::from_slice(&bytes)?;
        Ok(JsonText(bytes.slice_ref(raw.get().as_bytes())))
    }

    /// Bytes already checked where they lie (a result within the record's JSON it was
    /// written into).
    pub(crate) fn checked(bytes: Bytes) -> Self {
        JsonText(bytes)
    }

    /// Text this process wrote (serde_json's output), taken as it is.
    pub(crate) fn from_written(text: String) -> Self {
        JsonText(Bytes::from(text))
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, shared.
    pub(crate) fn bytes(&self) -> Bytes {
        self.0.clone()
    }

    /// As text: checked UTF-8 (JSON text is), a scan of its length; for what reads it, not
    /// for what passes it on.
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("null")
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

/// Written as the value it is: scanned as a borrowed raw value (no copy) and passed through.
impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue = serde_json::from_slice(&self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

/// Read from a journal line, redb or a peer's message: the value's text, once copied out of
/// what held it.
impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Ok(JsonText(Bytes::from(raw.get().to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_a_slice_of_the_bytes_it_came_in_without_the_space_around() {
        let body = Bytes::from_static(b"  {\"a\": [1, 2.50]} \n");
        let text = JsonText::from_bytes(body.clone()).unwrap();
        assert_eq!(text.as_bytes(), b"{\"a\": [1, 2.50]}");
        assert_eq!(text.as_bytes().as_ptr(), body[2..].as_ptr(), "not copied");
        assert!(JsonText::from_bytes(Bytes::from_static(b"{} {}")).is_err());
        assert_eq!(serde_json::to_string(&text).unwrap(), "{\"a\": [1, 2.50]}");
        let back: JsonText = serde_json::from_str("[ true ]").unwrap();
        assert_eq!(back.as_str(), "[ true ]");
    }
}
