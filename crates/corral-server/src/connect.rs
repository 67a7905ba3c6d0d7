//! The envelope framing of the Connect protocol's streaming calls
//! (<https://connectrpc.com/docs/protocol#streaming-rpcs>): each message is
//! `[flags u8][length u32 big-endian][payload]`. Flag `0x01` marks a compressed payload (never
//! accepted here: Corral announces only `identity`), flag `0x02` the end-of-stream message.
//! Also the protocol's error codes (<https://connectrpc.com/docs/protocol#error-codes>).

use axum::http::StatusCode;
use bytes::{BufMut, Bytes, BytesMut};

/// Flag bit of a compressed payload.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit of the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;
const HEADER_LEN: usize = 5;

/// One framed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("a message of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("compressed messages are not accepted (send connect-content-encoding: identity)")]
    Compressed,
    #[error("the stream ends inside a message ({pending} bytes left over)")]
    Truncated { pending: usize },
}

/// Splits a byte stream, given in chunks of any size, into envelopes. After an error the
/// decoder stays failed with that error.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    max_len: usize,
    failed: Option<EnvelopeError>,
}

impl Decoder {
    /// A decoder refusing messages longer than `max_len` bytes (checked on the header, before
    /// the payload is buffered).
    pub fn new(max_len: usize) -> Decoder {
        Decoder {
            buf: Vec::new(),
            max_len,
            failed: None,
        }
    }

    /// Adds `chunk`; every envelope it completes is appended to `out`, even when a later one
    /// is refused.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Envelope>) -> Result<(), EnvelopeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        let outcome = loop {
            let rest = &self.buf[start..];
            if rest.len() < HEADER_LEN {
                break Ok(());
            }
            let flags = rest[0];
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            if flags & FLAG_COMPRESSED != 0 {
                break Err(EnvelopeError::Compressed);
            }
            if len > self.max_len {
                break Err(EnvelopeError::TooLarge {
                    len,
                    max: self.max_len,
                });
            }
            if rest.len() - HEADER_LEN < len {
                break Ok(());
            }
            out.push(Envelope {
                flags,
                payload: rest[HEADER_LEN..HEADER_LEN + len].to_vec(),
            });
            start += HEADER_LEN + len;
        };
        self.buf.drain(..start);
        if let Err(e) = &outcome {
            self.buf.clear();
            self.failed = Some(e.clone());
        }
        outcome
    }

    /// The end of the stream: bytes of an unfinished envelope are an error.
    pub fn finish(self) -> Result<(), EnvelopeError> {
        match self.failed {
            Some(e) => Err(e),
            None if self.buf.is_empty() => Ok(()),
            None => Err(EnvelopeError::Truncated {
                pending: self.buf.len(),
            }),
        }
    }
}

/// The Connect error codes Corral answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    PermissionDenied,
    ResourceExhausted,
    DeadlineExceeded,
    Unimplemented,
    Internal,
    Unavailable,
}

impl Code {
    /// The code as it is written in an error's `code`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
        }
    }

    /// The HTTP status of a unary call that fails with this code.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Frames `payload` as one envelope.
pub fn encode(flags: u8, payload: &[u8]) -> Bytes {
    let len = u32::try_from(payload.len()).expect("a Connect message fits in 4 GiB");
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_u8(flags);
    out.put_u32(len);
    out.put_slice(payload);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Decodes `chunks` in order: the envelopes and how the stream ended.
    fn decode_chunks<'a>(
        chunks: impl IntoIterator<Item = &'a [u8]>,
        max_len: usize,
    ) -> (Vec<Envelope>, Result<(), EnvelopeError>) {
        let mut decoder = Decoder::new(max_len);
        let mut out = Vec::new();
        for chunk in chunks {
            if let Err(e) = decoder.push(chunk, &mut out) {
                return (out, Err(e));
            }
        }
        (out, decoder.finish())
    }

    #[test]
    fn codes_have_the_protocol_names_and_statuses() {
        assert_eq!(Code::Unimplemented.as_str(), "unimplemented");
        assert_eq!(
            Code::Unimplemented.http_status(),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(Code::NotFound.as_str(), "not_found");
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(
            Code::FailedPrecondition.http_status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(Code::DeadlineExceeded.as_str(), "deadline_exceeded");
    }

    #[test]
    fn one_request_message() {
        let body = br#"{"process":{"cmd":"/bin/bash"}}"#;
        let framed = encode(0, body);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, body.len() as u8]);
        let (frames, end) = decode_chunks([&framed[..]], 1024);
        assert_eq!(end, Ok(()));
        assert_eq!(
            frames,
            vec![Envelope {
                flags: 0,
                payload: body.to_vec()
            }]
        );
    }

    #[test]
    fn several_messages_byte_by_byte_and_end_of_stream() {
        let mut stream = encode(0, b"{}").to_vec();
        stream.extend_from_slice(&encode(0, b"[1]"));
        stream.extend_from_slice(&encode(FLAG_END_STREAM, b""));
        let (frames, end) = decode_chunks(stream.chunks(1), 16);
        assert_eq!(end, Ok(()));
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[1].payload, b"[1]");
        assert_eq!(frames[2].flags, FLAG_END_STREAM);
        assert!(frames[2].payload.is_empty());
    }

    #[test]
    fn refuses_compressed_oversized_and_truncated() {
        let (_, end) = decode_chunks([&encode(FLAG_COMPRESSED, b"x")[..]], 16);
        assert_eq!(end, Err(EnvelopeError::Compressed));

        // Refused from the header alone: the 4 GiB payload is never awaited.
        let (_, end) = decode_chunks([&[0u8, 0xff, 0xff, 0xff, 0xff][..]], 16);
        assert_eq!(
            end,
            Err(EnvelopeError::TooLarge {
                len: u32::MAX as usize,
                max: 16
            })
        );

        let framed = encode(0, b"{\"a\":1}");
        let (frames, end) = decode_chunks([&framed[..framed.len() - 1]], 16);
        assert!(frames.is_empty());
        assert_eq!(end, Err(EnvelopeError::Truncated { pending: 11 }));
        let (_, end) = decode_chunks([&[0u8, 0][..]], 16);
        assert_eq!(end, Err(EnvelopeError::Truncated { pending: 2 }));
    }

    #[test]
    fn envelopes_before_a_refused_one_are_kept_and_the_error_sticks() {
        let mut stream = encode(0, b"ok").to_vec();
        stream.extend_from_slice(&encode(0, b"far too long"));
        let mut decoder = Decoder::new(4);
        let mut out = Vec::new();
        let err = decoder.push(&stream, &mut out).unwrap_err();
        assert_eq!(out.len(), 1);
        assert_eq!(decoder.push(&encode(0, b"ok"), &mut out), Err(err.clone()));
        assert_eq!(out.len(), 1);
        assert_eq!(decoder.finish(), Err(err));
    }

    /// Cuts `bytes` at `cuts` (positions taken modulo its length, in any order).
    fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut points: Vec<usize> = cuts
            .iter()
            .map(|c| {
                if bytes.is_empty() {
                    0
                } else {
                    c % (bytes.len() + 1)
                }
            })
            .collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points
            .windows(2)
            .map(|w| bytes[w[0]..w[1]].to_vec())
            .collect()
    }

    /// Byte streams that are mostly well-formed: envelopes, some with odd flags or lengths,
    /// possibly followed by junk.
    fn streams() -> impl Strategy<Value = Vec<u8>> {
        let envelope = (
            prop_oneof![Just(0u8), Just(FLAG_END_STREAM), any::<u8>()],
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(flags, payload)| encode(flags, &payload).to_vec());
        (
            proptest::collection::vec(envelope, 0..6),
            proptest::collection::vec(any::<u8>(), 0..8),
        )
            .prop_map(|(envelopes, junk)| {
                let mut bytes = envelopes.concat();
                bytes.extend(junk);
                bytes
            })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            max_len in 0usize..64,
        ) {
            let chunks = split(&bytes, &cuts);
            let (frames, _) = decode_chunks(chunks.iter().map(Vec::as_slice), max_len);
            prop_assert!(frames.iter().all(|f| f.payload.len() <= max_len));
            prop_assert!(frames.iter().all(|f| f.flags & FLAG_COMPRESSED == 0));
        }

        #[test]
        fn chunking_does_not_change_the_result(
            bytes in streams(),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
            max_len in 0usize..48,
        ) {
            let whole = decode_chunks([bytes.as_slice()], max_len);
            let chunks = split(&bytes, &cuts);
            let chunked = decode_chunks(chunks.iter().map(Vec::as_slice), max_len);
            prop_assert_eq!(whole, chunked);
        }

        #[test]
        fn encode_then_decode_round_trips(
            messages in proptest::collection::vec(
                (0u8..=0xff, proptest::collection::vec(any::<u8>(), 0..64)), 0..6),
        ) {
            let messages: Vec<(u8, Vec<u8>)> = messages
                .into_iter()
                .map(|(flags, payload)| (flags & !FLAG_COMPRESSED, payload))
                .collect();
            let bytes: Vec<u8> = messages
                .iter()
                .flat_map(|(flags, payload)| encode(*flags, payload).to_vec())
                .collect();
            let (frames, end) = decode_chunks([bytes.as_slice()], 64);
            prop_assert_eq!(end, Ok(()));
            let decoded: Vec<(u8, Vec<u8>)> =
                frames.into_iter().map(|f| (f.flags, f.payload)).collect();
            prop_assert_eq!(decoded, messages);
        }

        #[test]
        fn over_limit_lengths_are_refused(len in 1usize..1 << 20, max_len in 0usize..1 << 16) {
            prop_assume!(len > max_len);
            let mut header = vec![0u8];
            header.extend_from_slice(&(len as u32).to_be_bytes());
            // The header alone is enough to refuse it.
            let (frames, end) = decode_chunks([header.as_slice()], max_len);
            prop_assert!(frames.is_empty());
            prop_assert_eq!(end, Err(EnvelopeError::TooLarge { len, max: max_len }));
        }
    }
}
