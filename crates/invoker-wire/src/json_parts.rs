//! A JSON text held as the parts it was written in, one after another. A record whose result is
//! large holds that result as the bytes its runtime answered, between the few bytes written
//! before and after it: the early answer's record and the record with its logs share it, and
//! the answer, the journal and redb write the parts one after another, never joined into one
//! buffer (a 64 MiB result is held once, not once per record and once per line).

use bytes::Bytes;

/// Up to three parts; a small text is one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JsonParts([Bytes; 3]);

impl JsonParts {
    /// A text in one buffer.
    pub fn whole(json: Bytes) -> Self {
        JsonParts([json, Bytes::new(), Bytes::new()])
    }

    /// `head`, then `middle`, then `tail`.
    pub fn split(head: Bytes, middle: Bytes, tail: Bytes) -> Self {
        JsonParts([head, middle, tail])
    }

    /// The parts, in order (some may be empty).
    pub fn parts(&self) -> &[Bytes; 3] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Bytes::is_empty)
    }

    /// The text in one buffer: the one part as it is (no copy) when there is one, a copy of
    /// the parts joined otherwise. For what needs the text whole; what writes it out writes
    /// the parts.
    pub fn to_bytes(&self) -> Bytes {
        match &self.0 {
            [one, b, c] if b.is_empty() && c.is_empty() => one.clone(),
            parts => {
                let mut joined = Vec::with_capacity(self.len());
                parts.iter().for_each(|part| joined.extend_from_slice(part));
                Bytes::from(joined)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_its_parts_in_order_and_one_part_is_not_copied() {
        let one = Bytes::from_static(b"{\"a\":1}");
        let whole = JsonParts::whole(one.clone());
        assert_eq!(whole.len(), 7);
        assert_eq!(whole.to_bytes().as_ptr(), one.as_ptr(), "one part: the same bytes");
        let split =
            JsonParts::split(Bytes::from_static(b"{\"a\":"), Bytes::from_static(b"[1,2]"), Bytes::from_static(b"}"));
        assert_eq!(split.len(), 11);
        assert_eq!(&split.to_bytes()[..], b"{\"a\":[1,2]}");
        assert!(JsonParts::default().is_empty());
    }
}
