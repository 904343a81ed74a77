//! RecordIO, the framing of the Mesos event stream: each record is its length in ASCII
//! decimal, a line feed, then that many bytes (`docs/recordio.md` upstream).
//!
//! Sans-IO: a `tokio_util` codec, so the same code frames a chunked HTTP body and a test's
//! byte slices, split anywhere.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// Longest length prefix accepted (u64::MAX has 20 digits).
const MAX_DIGITS: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum RecordIoError {
    #[error("a record's length is not a decimal number followed by a line feed: {0:?}")]
    BadLength(String),
    #[error("a record of {size} bytes is larger than the {max} allowed")]
    TooLarge { size: u64, max: usize },
    #[error("the stream ended inside a record")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[derive(Debug)]
pub struct RecordIo {
    max_record: usize,
    /// The length of the record being read, once its prefix has been parsed.
    pending: Option<usize>,
}

impl RecordIo {
    pub fn new(max_record: usize) -> Self {
        RecordIo { max_record, pending: None }
    }
}

impl Decoder for RecordIo {
    type Item = Bytes;
    type Error = RecordIoError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordIoError> {
        let size = match self.pending {
            Some(size) => size,
            None => {
                let Some(lf) = src.iter().take(MAX_DIGITS + 1).position(|&b| b == b'\n') else {
                    if src.len() > MAX_DIGITS {
                        return Err(RecordIoError::BadLength(String::from_utf8_lossy(&src[..MAX_DIGITS]).into()));
                    }
                    return Ok(None);
                };
                let digits = &src[..lf];
                let text =
                    std::str::from_utf8(digits).ok().filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()));
                let size: u64 = text
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| RecordIoError::BadLength(String::from_utf8_lossy(digits).into()))?;
                if size > self.max_record as u64 {
                    return Err(RecordIoError::TooLarge { size, max: self.max_record });
                }
                src.advance(lf + 1);
                size as usize
            }
        };
        if src.len() < size {
            self.pending = Some(size);
            src.reserve(size - src.len());
            return Ok(None);
        }
        self.pending = None;
        Ok(Some(src.split_to(size).freeze()))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordIoError> {
        match self.decode(src)? {
            Some(record) => Ok(Some(record)),
            None if src.is_empty() && self.pending.is_none() => Ok(None),
            None => Err(RecordIoError::Truncated),
        }
    }
}

/// One record, framed (for a master's stream or a test).
pub fn frame(record: &[u8]) -> Vec<u8> {
    let mut out = format!("{}\n", record.len()).into_bytes();
    out.extend_from_slice(record);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(chunks: &[&[u8]]) -> Result<Vec<Bytes>, RecordIoError> {
        let mut codec = RecordIo::new(1024);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(record) = codec.decode(&mut buf)? {
                out.push(record);
            }
        }
        while let Some(record) = codec.decode_eof(&mut buf)? {
            out.push(record);
        }
        Ok(out)
    }

    #[test]
    fn records_split_anywhere_come_out_whole() {
        let stream = b"5\nhello0\n3\nabc";
        let whole = decode_all(&[stream]).unwrap();
        assert_eq!(whole, vec![Bytes::from("hello"), Bytes::new(), Bytes::from("abc")]);
        let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(decode_all(&bytewise).unwrap(), whole);
    }

    #[test]
    fn bad_streams_are_errors_naming_the_problem() {
        assert!(matches!(decode_all(&[b"x\nabc"]), Err(RecordIoError::BadLength(_))));
        assert!(matches!(decode_all(&[b"\nabc"]), Err(RecordIoError::BadLength(_))));
        assert!(matches!(decode_all(&[b"-1\n"]), Err(RecordIoError::BadLength(_))));
        assert!(matches!(decode_all(&[b"123456789012345678901234"]), Err(RecordIoError::BadLength(_))));
        assert!(matches!(decode_all(&[b"2000\n"]), Err(RecordIoError::TooLarge { size: 2000, .. })));
        assert!(matches!(decode_all(&[b"5\nhel"]), Err(RecordIoError::Truncated)));
        assert!(matches!(decode_all(&[b"12"]), Err(RecordIoError::Truncated)));
    }

    proptest! {
        #[test]
        fn what_is_framed_decodes_back_at_any_split(
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cut in 1usize..64,
        ) {
            let mut stream = Vec::new();
            for r in &records {
                stream.extend(frame(r));
            }
            let chunks: Vec<&[u8]> = stream.chunks(cut).collect();
            let decoded = decode_all(&chunks).unwrap();
            prop_assert_eq!(decoded.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), records);
        }
    }
}
