//! A streamed string as the python launcher sends it: `$`, its UTF-8 length in bytes and a
//! newline, then its bytes as they are, unescaped. A generator yielding large strings is then
//! not held to python's pace at checking or escaping them: here `str.isprintable()` and
//! `json.dumps` each take ~5 ms for a 1 MiB string (the whole of a 200 MB/s stream's time),
//! `str.encode` ~50 µs. The runtime makes the value's line (`>` and its JSON) from the bytes:
//! the bytes between quotes when nothing in them needs escaping (one scan), serde_json's
//! escaping otherwise. The invoker sees the same lines as before.

/// The first byte of a string value's frame (the launcher's, never sent on to the invoker).
pub const STRING_VALUE: u8 = b'$';

/// What may precede a frame's bytes in the line [`value_line`] makes of them: the value's mark
/// and the string's opening quote.
pub const LINE_HEAD: &[u8] = b">\"";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("a streamed string's frame does not say its length")]
    NoLength,
    #[error("a streamed string is not UTF-8")]
    NotUtf8,
}

/// The byte length a frame's head (`$` and the digits, without the newline) announces.
pub fn length(head: &[u8]) -> Result<u64, FrameError> {
    let digits = head.strip_prefix(&[STRING_VALUE]).ok_or(FrameError::NoLength)?;
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(FrameError::NoLength);
    }
    Ok(digits.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The value's line from `line`, which holds [`LINE_HEAD`] then the string's bytes: the same
/// vector with the closing quote when nothing needs escaping, an escaped one otherwise.
pub fn value_line(mut line: Vec<u8>) -> Result<Vec<u8>, FrameError> {
    let bytes = line.get(LINE_HEAD.len()..).unwrap_or_default();
    let text = std::str::from_utf8(bytes).map_err(|_| FrameError::NotUtf8)?;
    if !needs_escape(bytes) {
        line.push(b'"');
        return Ok(line);
    }
    let mut escaped = Vec::with_capacity(bytes.len() + bytes.len() / 8 + 4);
    escaped.push(b'>');
    serde_json::to_writer(&mut escaped, text).map_err(|_| FrameError::NotUtf8)?;
    Ok(escaped)
}

/// Whether JSON needs any of these bytes escaped in a string: a control character, a quote or
/// a backslash. In blocks without an early exit inside, which the compiler vectorizes.
fn needs_escape(bytes: &[u8]) -> bool {
    bytes.chunks(64).any(|block| block.iter().fold(false, |bad, &b| bad | (b < 0x20) | (b == b'"') | (b == b'\\')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &[u8]) -> Vec<u8> {
        [LINE_HEAD, text].concat()
    }

    #[test]
    fn a_length_is_digits_after_the_mark() {
        assert_eq!(length(b"$1048576"), Ok(1_048_576));
        assert_eq!(length(b"$0"), Ok(0));
        for bad in [&b"$"[..], b"$-1", b"$12a", b">12", b"", b"$99999999999999999999"] {
            assert_eq!(length(bad), Err(FrameError::NoLength), "{bad:?}");
        }
    }

    #[test]
    fn a_string_with_nothing_to_escape_is_its_bytes_between_quotes() {
        let text = "x".repeat(1000) + "é ☃ plain";
        let made = value_line(line(text.as_bytes())).unwrap();
        assert_eq!(made, [&b">"[..], serde_json::to_string(&text).unwrap().as_bytes()].concat());
    }

    #[test]
    fn a_string_that_needs_escaping_is_escaped_as_json_would() {
        for text in ["a\"b", "back\\slash", "new\nline", "\u{0}", &("y".repeat(200) + "\t")] {
            let made = value_line(line(text.as_bytes())).unwrap();
            assert_eq!(made[0], b'>');
            assert_eq!(serde_json::from_slice::<String>(&made[1..]).unwrap(), text);
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused() {
        assert_eq!(value_line(line(b"ok \xff")), Err(FrameError::NotUtf8));
        assert_eq!(value_line(line(b"\xed\xa0\x80")), Err(FrameError::NotUtf8));
    }

    #[test]
    fn the_empty_string_is_two_quotes() {
        assert_eq!(value_line(line(b"")).unwrap(), b">\"\"");
    }
}
