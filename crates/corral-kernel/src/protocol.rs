//! The kernel protocol (docs/kernel-protocol.md): length-prefixed JSON frames.
//!
//! The kernel side is untrusted, so decoding is bounded (frame length, strict shapes, and per
//! execution the bytes buffered and the results kept) and never panics on any input; the
//! property tests below feed it arbitrary byte streams split at arbitrary points.

use std::collections::BTreeMap;

use corral_sandbox::Limits;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The largest frame either side accepts; a longer one from the kernel is a protocol error.
pub const MAX_FRAME: usize = 64 << 20;
/// The largest frame from a kernel the host buffers at all, whatever is left of the budget:
/// the kernels' own limit on a result frame (docs/kernel-protocol.md). Longer frames, up to
/// [`MAX_FRAME`], are discarded unread.
pub const MAX_RESULT_FRAME: usize = 32 << 20;
/// Frames up to this size are decoded even when the execution's byte budget is spent, so that
/// `done` and a small error always get through; a result among them is still dropped.
pub const SMALL_FRAME: usize = 64 << 10;

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
    /// Execute `code` as a cell, then leave no trace of it (the history and the execution
    /// count put back): a pooled session's warm-up, so that it has paid the copy-on-write
    /// faults of a first execution before it is handed out.
    WarmUp {
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
    /// Set these variables in the kernel's environment (no answer): a session taken from the
    /// warm pool gets its client's `env` this way, before its first execution.
    Environment {
        env: BTreeMap<&'a str, &'a str>,
    },
    /// Run the program now: a one-shot run forked from a zygote, whose kernel reported
    /// `ready` and was verified.
    Run,
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

/// What the host takes from a kernel in one execution: at most `bytes` of frames buffered
/// (frames of up to [`SMALL_FRAME`] aside) and at most `count` results kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLimits {
    pub bytes: usize,
    pub count: usize,
}

impl ResultLimits {
    pub fn of(limits: &Limits) -> Self {
        ResultLimits {
            bytes: limits.result_bytes,
            count: limits.result_count,
        }
    }
}

impl Default for ResultLimits {
    fn default() -> Self {
        ResultLimits::of(&Limits::default())
    }
}

/// What the decoder dropped in the current execution: frames discarded unread (too large for
/// what was left of the budget) and results decoded but over the limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    pub frames: usize,
    pub bytes: u64,
}

impl Dropped {
    /// The sentence for a result's `warnings`, when anything was dropped.
    pub fn warning(&self, limits: ResultLimits) -> Option<String> {
        (self.frames > 0).then(|| {
            format!(
                "rich results over the {} / {} results limit were dropped ({} {} of {} in all)",
                size(limits.bytes as u64),
                limits.count,
                self.frames,
                if self.frames == 1 { "frame" } else { "frames" },
                size(self.bytes),
            )
        })
    }
}

/// `n` bytes for a message: in MiB from 1 MiB on.
fn size(n: u64) -> String {
    match n {
        n if n.is_multiple_of(1 << 20) && n > 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n => format!("{n} bytes"),
    }
}

/// Reassembles frames from bytes as they arrive, within an execution's [`ResultLimits`]:
/// a frame whose declared length exceeds what is left of the byte budget (or
/// [`MAX_RESULT_FRAME`]) is never buffered; its bytes are discarded as they arrive and the
/// stream stays in sync. Results beyond the count are decoded (they are small by then) and
/// dropped. Either way [`Decoder::dropped`] counts them.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes of a discarded frame that have not arrived yet.
    skip: usize,
    limits: ResultLimits,
    /// Bytes that may still be buffered in this execution.
    bytes_left: usize,
    /// Results that may still be kept in this execution.
    results_left: usize,
    dropped: Dropped,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::with_limits(ResultLimits::default())
    }
}

impl Decoder {
    /// A decoder with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_limits(limits: ResultLimits) -> Self {
        Decoder {
            buf: Vec::new(),
            skip: 0,
            limits,
            bytes_left: limits.bytes,
            results_left: limits.count,
            dropped: Dropped::default(),
        }
    }

    pub fn limits(&self) -> ResultLimits {
        self.limits
    }

    /// Starts a new execution: the whole budget again, nothing dropped yet.
    pub fn begin_execution(&mut self) {
        self.bytes_left = self.limits.bytes;
        self.results_left = self.limits.count;
        self.dropped = Dropped::default();
    }

    /// What was dropped since the execution began.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }

    /// Adds bytes read from the kernel (those of a frame being discarded are not kept).
    pub fn push(&mut self, mut bytes: &[u8]) {
        let skipped = self.skip.min(bytes.len());
        self.skip -= skipped;
        bytes = &bytes[skipped..];
        // Exactly: a frame's room is reserved when its header arrives, and growing by
        // doubling could give a frame of the budget's size twice that.
        self.buf.reserve_exact(bytes.len());
        self.buf.extend_from_slice(bytes);
    }

    fn drop_frame(&mut self, len: usize) {
        self.dropped.frames += 1;
        self.dropped.bytes += len as u64;
    }

    /// Removes the first `end` bytes; a large buffer's memory is given back.
    fn consume(&mut self, end: usize) {
        if self.buf.capacity() > 2 * SMALL_FRAME {
            self.buf = self.buf.split_off(end);
        } else {
            self.buf.drain(..end);
        }
    }

    /// The next complete frame within the limits, if one has arrived. An error is final: the
    /// caller ends the session (the stream can no longer be trusted to be in sync).
    pub fn next_message(&mut self) -> Result<Option<KernelMessage>, ProtocolError> {
        loop {
            if self.skip > 0 {
                return Ok(None);
            }
            let Some(header) = self.buf.get(..4) else {
                return Ok(None);
            };
            let len = u32::from_be_bytes(header.try_into().expect("4 bytes")) as usize;
            if len > MAX_FRAME {
                return Err(ProtocolError::TooLarge(len));
            }
            if len > SMALL_FRAME && (len > MAX_RESULT_FRAME || len > self.bytes_left) {
                // Never buffered: what has arrived goes now, the rest as it arrives.
                self.drop_frame(len);
                let have = self.buf.len() - 4;
                if have >= len {
                    self.consume(4 + len);
                    continue;
                }
                self.skip = len - have;
                self.buf = Vec::new();
                return Ok(None);
            }
            if self.buf.len() < 4 + len {
                // Room for exactly this frame, not twice it as doubling would give.
                self.buf.reserve_exact(4 + len - self.buf.len());
                return Ok(None);
            }
            let parsed = serde_json::from_slice(&self.buf[4..4 + len])
                .map_err(|e| ProtocolError::Invalid(e.to_string()));
            self.consume(4 + len);
            let over = len > self.bytes_left;
            self.bytes_left = self.bytes_left.saturating_sub(len);
            let message = parsed?;
            if let KernelMessage::Result { .. } = message {
                if over || self.results_left == 0 {
                    self.drop_frame(len);
                    continue;
                }
                self.results_left -= 1;
            }
            return Ok(Some(message));
        }
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

    fn result_frame(id: &str, text_len: usize) -> Vec<u8> {
        frame(
            &serde_json::json!({"type":"result","id":id,"is_main_result":false,
                "data":{"text/plain":"x".repeat(text_len)}})
            .to_string(),
        )
    }

    fn done_frame(id: &str) -> Vec<u8> {
        frame(&serde_json::json!({"type":"done","id":id,"status":"ok"}).to_string())
    }

    /// Every message of `bytes` fed in pieces of `piece` bytes, and the decoder's peak
    /// buffer capacity.
    fn decode_all(d: &mut Decoder, bytes: &[u8], piece: usize) -> (Vec<KernelMessage>, usize) {
        let (mut got, mut peak) = (Vec::new(), 0);
        for chunk in bytes.chunks(piece.max(1)) {
            d.push(chunk);
            peak = peak.max(d.buf.capacity());
            while let Ok(Some(m)) = d.next_message() {
                got.push(m);
            }
            peak = peak.max(d.buf.capacity());
        }
        (got, peak)
    }

    const LIMITS: ResultLimits = ResultLimits {
        bytes: 300 << 10,
        count: 4,
    };

    #[test]
    fn a_frame_over_the_budget_is_discarded_unbuffered_and_the_stream_stays_in_sync() {
        let mut d = Decoder::with_limits(LIMITS);
        let mut bytes = result_frame("1", 200 << 10); // fits
        bytes.extend(result_frame("1", 200 << 10)); // 100 KiB left: discarded
        bytes.extend(result_frame("1", 60 << 10)); // small and within what is left
        bytes.extend(done_frame("1"));
        let (got, peak) = decode_all(&mut d, &bytes, 64 << 10);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(matches!(got[2], KernelMessage::Done { .. }));
        assert_eq!(d.dropped().frames, 1);
        let second_len = result_frame("1", 200 << 10).len() as u64 - 4;
        assert_eq!(d.dropped().bytes, second_len);
        // The first frame was buffered (once, not doubled); the second never was.
        assert!(peak < (200 << 10) + (64 << 10) + 64, "peak buffer {peak}");
        let warning = d.dropped().warning(LIMITS).unwrap();
        assert_eq!(
            warning,
            format!(
                "rich results over the 307200 bytes / 4 results limit were dropped \
                 (1 frame of {second_len} bytes in all)"
            )
        );
        // A new execution has the whole budget again.
        d.begin_execution();
        assert_eq!(d.dropped(), Dropped::default());
        let (got, _) = decode_all(&mut d, &result_frame("2", 200 << 10), 4096);
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn results_over_the_count_are_dropped_and_small_frames_always_pass() {
        let mut d = Decoder::with_limits(LIMITS);
        let mut bytes = Vec::new();
        for _ in 0..6 {
            bytes.extend(result_frame("1", 10));
        }
        bytes.extend(frame(
            r#"{"type":"error","id":"1","name":"E","value":"v","traceback":""}"#,
        ));
        bytes.extend(done_frame("1"));
        let (got, _) = decode_all(&mut d, &bytes, 7);
        let results = got
            .iter()
            .filter(|m| matches!(m, KernelMessage::Result { .. }))
            .count();
        assert_eq!(results, 4);
        assert_eq!(got.len(), 6, "the error and done are kept: {got:?}");
        assert_eq!(d.dropped().frames, 2);

        // With the byte budget spent, a large frame is discarded, a small result dropped,
        // and `done` still arrives.
        let mut d = Decoder::with_limits(LIMITS);
        let mut bytes = result_frame("1", 290 << 10);
        bytes.extend(result_frame("1", 30 << 10));
        bytes.extend(result_frame("1", 100 << 10));
        bytes.extend(done_frame("1"));
        let (got, _) = decode_all(&mut d, &bytes, 1 << 20);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(got[1], KernelMessage::Done { .. }));
        assert_eq!(d.dropped().frames, 2);
    }

    #[test]
    fn frames_over_the_result_frame_limit_are_discarded_and_over_the_protocol_limit_are_errors() {
        let mut d = Decoder::with_limits(ResultLimits {
            bytes: 1 << 30,
            count: 256,
        });
        d.push(&(MAX_RESULT_FRAME as u32 + 1).to_be_bytes());
        assert_eq!(d.next_message(), Ok(None));
        assert_eq!(d.dropped().frames, 1);
        d.push(&vec![b' '; MAX_RESULT_FRAME + 1]);
        assert_eq!(d.buf.capacity(), 0, "nothing of the frame is kept");
        d.push(&done_frame("1"));
        assert!(matches!(
            d.next_message(),
            Ok(Some(KernelMessage::Done { .. }))
        ));
        d.push(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert_eq!(
            d.next_message(),
            Err(ProtocolError::TooLarge(MAX_FRAME + 1))
        );
    }

    #[test]
    fn the_default_limits_keep_what_a_notebook_shows() {
        let limits = ResultLimits::default();
        assert_eq!(limits.bytes, 64 << 20);
        assert_eq!(limits.count, 256);
        assert!(MAX_RESULT_FRAME <= limits.bytes);
        let mut d = Decoder::new();
        // Twenty 1 MiB figures and a 2 MiB HTML table.
        let mut bytes = Vec::new();
        for _ in 0..20 {
            bytes.extend(result_frame("1", 1 << 20));
        }
        bytes.extend(result_frame("1", 2 << 20));
        bytes.extend(done_frame("1"));
        let (got, _) = decode_all(&mut d, &bytes, 64 << 10);
        assert_eq!(got.len(), 22);
        assert_eq!(d.dropped(), Dropped::default());
        assert_eq!(d.dropped().warning(limits), None);
        let dropped = Dropped {
            frames: 22,
            bytes: 738_230_572,
        };
        assert_eq!(
            dropped.warning(limits).unwrap(),
            "rich results over the 64 MiB / 256 results limit were dropped \
             (22 frames of 704.0 MiB in all)"
        );
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
    fn environment_frames_carry_the_variables() {
        let f = encode(&HostMessage::Environment {
            env: BTreeMap::from([("A", "1"), ("B", "")]),
        });
        let v: Value = serde_json::from_slice(&f[4..]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "environment", "env": {"A": "1", "B": ""}})
        );
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

        /// Within limits, what is kept and what is dropped does not depend on how the stream
        /// is split, and the buffer never holds more than one frame that fits.
        #[test]
        fn limits_hold_however_the_stream_is_split(
            sizes in proptest::collection::vec(0usize..(200 << 10), 1..8),
            piece in 1usize..(96 << 10),
        ) {
            let mut bytes = Vec::new();
            for size in &sizes {
                bytes.extend(result_frame("1", *size));
            }
            bytes.extend(done_frame("1"));
            let mut whole = Decoder::with_limits(LIMITS);
            let (expected, _) = decode_all(&mut whole, &bytes, bytes.len());
            let mut split = Decoder::with_limits(LIMITS);
            let (got, peak) = decode_all(&mut split, &bytes, piece);
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(split.dropped(), whole.dropped());
            let ends_with_done = matches!(got.last(), Some(KernelMessage::Done { .. }));
            prop_assert!(ends_with_done);
            let kept: usize = sizes.iter().take(got.len() - 1).count();
            prop_assert!(kept <= LIMITS.count);
            prop_assert!(peak <= LIMITS.bytes + 2 * piece + 8, "peak {}", peak);
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
