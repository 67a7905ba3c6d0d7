//! The kernel protocol (docs/kernel-protocol.md): length-prefixed JSON frames.
//!
//! The kernel side is untrusted, so decoding is bounded (frame length, strict shapes) and
//! never panics on any input; the property tests below feed it arbitrary byte streams split
//! at arbitrary points.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The largest frame either side accepts.
pub const MAX_FRAME: usize = 64 << 20;

/// A frame from the kernel.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KernelMessage {
    Ready {
        language: String,
        #[serde(default)]
        version: String,
    },
    Result {
        id: String,
        #[serde(default)]
        is_main_result: bool,
        data: Map<String, Value>,
    },
    Error {
        id: String,
        name: String,
        value: String,
        #[serde(default)]
        traceback: String,
    },
    Done {
        id: String,
        status: DoneStatus,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoneStatus {
    Ok,
    Error,
}

/// A frame to the kernel.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage<'a> {
    Execute {
        id: &'a str,
        code: &'a str,
    },
    /// Run a program beside the interpreter (`cwd` relative to the workspace, `None` for the
    /// workspace itself; `env` on top of the kernel's environment).
    Command {
        id: &'a str,
        argv: &'a [String],
        cwd: Option<&'a str>,
        env: BTreeMap<&'a str, &'a str>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProtocolError {
    #[error("the kernel sent a frame of {0} bytes (limit {MAX_FRAME})")]
    TooLarge(usize),
    #[error("the kernel sent an invalid frame: {0}")]
    Invalid(String),
}

/// Encodes one host message as a frame.
pub fn encode(message: &HostMessage<'_>) -> Vec<u8> {
    let json = serde_json::to_vec(message).expect("host messages serialize");
    let mut frame = Vec::with_capacity(4 + json.len());
    frame.extend_from_slice(&(json.len() as u32).to_be_bytes());
    frame.extend_from_slice(&json);
    frame
}

/// Reassembles frames from bytes as they arrive.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the kernel.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if one has arrived. An error is final: the caller ends the
    /// session (the stream can no longer be trusted to be in sync).
    pub fn next_message(&mut self) -> Result<Option<KernelMessage>, ProtocolError> {
        let Some(header) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(header.try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let parsed = serde_json::from_slice(&self.buf[4..4 + len])
            .map_err(|e| ProtocolError::Invalid(e.to_string()));
        self.buf.drain(..4 + len);
        parsed.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(json: &str) -> Vec<u8> {
        let mut f = (json.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(json.as_bytes());
        f
    }

    #[test]
    fn decodes_each_message_kind() {
        let mut d = Decoder::new();
        d.push(&frame(
            r#"{"type":"ready","language":"python","version":"3.11"}"#,
        ));
        d.push(&frame(
            r#"{"type":"result","id":"1","is_main_result":true,"data":{"text/plain":"2"}}"#,
        ));
        d.push(&frame(
            r#"{"type":"error","id":"1","name":"E","value":"v","traceback":"t"}"#,
        ));
        d.push(&frame(r#"{"type":"done","id":"1","status":"error"}"#));
        assert!(matches!(
            d.next_message(),
            Ok(Some(KernelMessage::Ready { .. }))
        ));
        let Ok(Some(KernelMessage::Result {
            data,
            is_main_result,
            ..
        })) = d.next_message()
        else {
            panic!("expected a result")
        };
        assert!(is_main_result);
        assert_eq!(data["text/plain"], "2");
        assert!(matches!(
            d.next_message(),
            Ok(Some(KernelMessage::Error { .. }))
        ));
        assert_eq!(
            d.next_message(),
            Ok(Some(KernelMessage::Done {
                id: "1".into(),
                status: DoneStatus::Error
            }))
        );
        assert_eq!(d.next_message(), Ok(None));
    }

    #[test]
    fn oversized_and_malformed_frames_are_errors() {
        let mut d = Decoder::new();
        d.push(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert_eq!(
            d.next_message(),
            Err(ProtocolError::TooLarge(MAX_FRAME + 1))
        );
        let mut d = Decoder::new();
        d.push(&frame(r#"{"type":"done","id":7}"#));
        assert!(matches!(d.next_message(), Err(ProtocolError::Invalid(_))));
        let mut d = Decoder::new();
        d.push(&frame(r#"{"type":"shell","cmd":"rm -rf /"}"#));
        assert!(matches!(d.next_message(), Err(ProtocolError::Invalid(_))));
    }

    #[test]
    fn host_frames_round_trip_through_the_length_prefix() {
        let f = encode(&HostMessage::Execute {
            id: "a",
            code: "print('é')",
        });
        let len = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(len, f.len() - 4);
        let v: Value = serde_json::from_slice(&f[4..]).unwrap();
        assert_eq!(v["type"], "execute");
        assert_eq!(v["code"], "print('é')");
    }

    #[test]
    fn command_frames_carry_argv_cwd_and_env() {
        let argv = ["ls".to_string(), "-l".to_string()];
        let f = encode(&HostMessage::Command {
            id: "c",
            argv: &argv,
            cwd: None,
            env: BTreeMap::from([("A", "1")]),
        });
        let v: Value = serde_json::from_slice(&f[4..]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "command", "id": "c", "argv": ["ls", "-l"], "cwd": null, "env": {"A": "1"}})
        );
    }

    proptest! {
        /// Whatever a hostile kernel sends, the decoder returns (never panics, never
        /// allocates beyond the bytes it was given plus one frame limit).
        #[test]
        fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut d = Decoder::new();
            for c in &chunks {
                d.push(c);
                while let Ok(Some(_)) = d.next_message() {}
            }
        }

        /// Valid frames decode identically however the stream is split.
        #[test]
        fn frames_survive_any_split(id in "[a-z0-9]{1,8}", text in ".{0,40}", split in 0usize..200) {
            let json = serde_json::json!({"type":"result","id":id,"is_main_result":false,"data":{"text/plain":text}}).to_string();
            let mut bytes = frame(&json);
            bytes.extend(frame(&serde_json::json!({"type":"done","id":id,"status":"ok"}).to_string()));
            let split = split.min(bytes.len());
            let mut d = Decoder::new();
            d.push(&bytes[..split]);
            let mut got = Vec::new();
            while let Ok(Some(m)) = d.next_message() { got.push(m); }
            d.push(&bytes[split..]);
            while let Ok(Some(m)) = d.next_message() { got.push(m); }
            prop_assert_eq!(got.len(), 2);
            let is_expected = matches!(&got[0], KernelMessage::Result { data, .. } if data["text/plain"] == text);
            prop_assert!(is_expected);
        }
    }
}
