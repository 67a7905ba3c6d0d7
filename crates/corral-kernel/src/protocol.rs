//! The kernel protocol (docs/kernel-protocol.md): length-prefixed JSON frames.
//!
//! The kernel side is untrusted, so decoding is bounded (frame length, strict shapes, and per
//! execution the bytes buffered and the results kept) and never panics on any input; the
//! property tests below feed it arbitrary byte streams split at arbitrary points.

use std::collections::BTreeMap;
use std::sync::Arc;

use corral_sandbox::{Limits, Reservation, ResultBudget, Violation};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::policy::ModuleRules;

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
        /// What a code policy refused, in a `PolicyViolation` (docs/code-policy.md).
        #[serde(default)]
        violations: Vec<Violation>,
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
    /// Run `code` as a cell; `env`, when not empty, is set for this execution only.
    Execute {
        id: &'a str,
        code: &'a str,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<&'a str, &'a str>,
    },
    /// Execute `code` as a cell, then leave no trace of it (the history and the execution
    /// count put back): a pooled session's warm-up, so that it has paid the copy-on-write
    /// faults of a first execution before it is handed out.
    WarmUp { id: &'a str, code: &'a str },
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
    Environment { env: BTreeMap<&'a str, &'a str> },
    /// Check every execution against these module rules from now on (docs/code-policy.md);
    /// no answer. Sent once, before the first execution, when the session has a code policy.
    Policy(ModuleRules<'a>),
    /// Run the program now: a one-shot run forked from a zygote, whose kernel reported
    /// `ready` and was verified; under `policy`, when the run has module rules.
    Run {
        #[serde(skip_serializing_if = "Option::is_none")]
        policy: Option<ModuleRules<'a>>,
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
    fn count(&mut self, len: usize) {
        self.frames += 1;
        self.bytes += len as u64;
    }

    /// "N frames of SIZE in all".
    fn tally(&self) -> String {
        format!(
            "{} {} of {} in all",
            self.frames,
            if self.frames == 1 { "frame" } else { "frames" },
            size(self.bytes),
        )
    }

    /// The sentence for a result's `warnings`, when anything was dropped.
    pub fn warning(&self, limits: ResultLimits) -> Option<String> {
        (self.frames > 0).then(|| {
            format!(
                "rich results over the {} / {} results limit were dropped ({})",
                size(limits.bytes as u64),
                limits.count,
                self.tally(),
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

/// How many times its length a kept frame costs in a [`ResultBudget`]: the host holds it at
/// most twice at once, as it is decoded (the frame and the value parsed from it) and as it is
/// answered (the result and the JSON made of it).
pub const HELD_COPIES: usize = 2;

/// Bytes a parsed JSON value may take beyond its strings, per structural token of its text
/// (`[`, `{`, `,`, `:` outside strings): a `serde_json::Value`, and the slack of the vector or
/// map holding it.
pub const NODE_BYTES: usize = 2 * std::mem::size_of::<Value>();

/// What the values of a frame take once parsed, beyond its strings (which are no longer
/// than the frame): [`NODE_BYTES`] per structural token, counted without parsing.
fn tree_bytes(json: &[u8]) -> usize {
    let (mut tokens, mut in_string, mut escaped) = (1usize, false, false);
    for &b in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' | b':' => tokens += 1,
                _ => {}
            }
        }
    }
    tokens.saturating_mul(NODE_BYTES)
}

/// Whether a frame is a result, read without allocating its values.
fn is_result(json: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    serde_json::from_slice::<Kind>(json).is_ok_and(|k| k.kind == "result")
}

/// The room in the shared budget of the frame whose header has been read.
#[derive(Debug)]
enum Room {
    /// Reserved (an empty reservation without a budget).
    Reserved(Reservation),
    /// The budget (named) had no room for this small frame: it is decoded, but a result among
    /// them is dropped.
    Short(String),
}

/// Reassembles frames from bytes as they arrive, within an execution's [`ResultLimits`] and
/// the host's shared [`ResultBudget`], if any: a frame whose declared length exceeds what is
/// left of the execution's byte budget (or [`MAX_RESULT_FRAME`]), or whose room the shared
/// budget does not have, is never buffered; its bytes are discarded as they arrive and the
/// stream stays in sync. Results beyond the count are decoded (they are small by then) and
/// dropped. Either way [`Decoder::warnings`] says so. The room of the results and errors it
/// returns is held until [`Decoder::take_held`].
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
    /// The host's budget of results held at once, shared with other decoders.
    budget: Option<Arc<ResultBudget>>,
    /// The room of the frame whose header has been read, until the frame is complete.
    frame: Option<Room>,
    /// The room of the results and errors returned.
    held: Reservation,
    /// Frames dropped because the shared budget had no room, and the last budget that had none.
    short: Dropped,
    short_of: Option<String>,
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
            budget: None,
            frame: None,
            held: Reservation::default(),
            short: Dropped::default(),
            short_of: None,
        }
    }

    /// The same, taking the room of what it keeps from `budget` as well.
    pub fn with_budget(mut self, budget: Option<Arc<ResultBudget>>) -> Self {
        self.set_budget(budget);
        self
    }

    /// Takes the room of the frames from now on from `budget`.
    pub fn set_budget(&mut self, budget: Option<Arc<ResultBudget>>) {
        self.budget = budget;
    }

    pub fn limits(&self) -> ResultLimits {
        self.limits
    }

    /// Starts a new execution: the whole budget again, nothing dropped yet.
    pub fn begin_execution(&mut self) {
        self.bytes_left = self.limits.bytes;
        self.results_left = self.limits.count;
        self.dropped = Dropped::default();
        self.short = Dropped::default();
        self.short_of = None;
    }

    /// What was dropped over the execution's limits since it began.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }

    /// The sentences for the execution's `warnings`: what was dropped over its limits, and
    /// what the shared budget had no room for.
    pub fn warnings(&self) -> Vec<String> {
        let short = self.short_of.as_ref().map(|budget| {
            format!(
                "rich results were dropped: {budget} was full ({}); results are held until \
                 their answers have been read",
                self.short.tally()
            )
        });
        self.dropped
            .warning(self.limits)
            .into_iter()
            .chain(short)
            .collect()
    }

    /// The room of the results and errors returned since the last call, to be held as long
    /// as they are.
    pub fn take_held(&mut self) -> Reservation {
        std::mem::take(&mut self.held)
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

    /// Discards the frame of `len` bytes whose header starts the buffer: what has arrived
    /// goes now, the rest as it arrives.
    fn discard(&mut self, len: usize) {
        let have = self.buf.len() - 4;
        if have >= len {
            self.consume(4 + len);
        } else {
            self.skip = len - have;
            self.buf = Vec::new();
        }
    }

    /// Removes the first `end` bytes; a large buffer's memory is given back.
    fn consume(&mut self, end: usize) {
        if self.buf.capacity() > 2 * SMALL_FRAME {
            self.buf = self.buf.split_off(end);
        } else {
            self.buf.drain(..end);
        }
    }

    /// The room of a frame of `len` bytes in the shared budget; `None` when it is to be
    /// discarded unread (counted).
    fn room(&mut self, len: usize) -> Option<Room> {
        if len > SMALL_FRAME && (len > MAX_RESULT_FRAME || len > self.bytes_left) {
            self.dropped.count(len);
            return None;
        }
        let Some(budget) = &self.budget else {
            return Some(Room::Reserved(Reservation::default()));
        };
        match budget.try_reserve(len.saturating_mul(HELD_COPIES)) {
            Ok(reservation) => Some(Room::Reserved(reservation)),
            Err(full) if len > SMALL_FRAME => {
                self.short_of = Some(full.to_string());
                self.short.count(len);
                None
            }
            Err(full) => Some(Room::Short(full.to_string())),
        }
    }

    /// The room of a complete result frame of `len` bytes whose parsed values take up to
    /// `tree` more (and which costs the execution's budget `over` what is left), with `tree`
    /// more of the shared budget; `None` (counted) when it is to be dropped.
    fn keep_result(
        &mut self,
        len: usize,
        tree: usize,
        over: bool,
        room: Room,
    ) -> Option<Reservation> {
        if over || self.results_left == 0 {
            self.dropped.count(len);
            return None;
        }
        let short_of = match (room, &self.budget) {
            (Room::Short(budget), _) => budget,
            (Room::Reserved(reservation), None) => {
                self.results_left -= 1;
                return Some(reservation);
            }
            (Room::Reserved(mut reservation), Some(budget)) => match budget.try_reserve(tree) {
                Ok(more) => {
                    reservation.absorb(more);
                    self.results_left -= 1;
                    return Some(reservation);
                }
                Err(full) => full.to_string(),
            },
        };
        self.short_of = Some(short_of);
        self.short.count(len);
        None
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
            let room = match self.frame.take() {
                Some(room) => room,
                None => match self.room(len) {
                    Some(room) => room,
                    None => {
                        // Never buffered.
                        self.discard(len);
                        continue;
                    }
                },
            };
            if self.buf.len() < 4 + len {
                // Room for exactly this frame, not twice it as doubling would give.
                self.buf.reserve_exact(4 + len - self.buf.len());
                self.frame = Some(room);
                return Ok(None);
            }
            // A result's values can take far more memory parsed than as text (`[0,0,…]`): it
            // costs its length and what its parsed tree may take, and one that is dropped is
            // never parsed.
            let text = &self.buf[4..4 + len];
            let result = is_result(text);
            let tree = if result { tree_bytes(text) } else { 0 };
            let cost = len.saturating_add(tree);
            let over = cost > self.bytes_left;
            self.bytes_left = self.bytes_left.saturating_sub(cost);
            let kept = if result {
                match self.keep_result(len, tree, over, room) {
                    Some(reservation) => Some(reservation),
                    None => {
                        self.consume(4 + len);
                        continue;
                    }
                }
            } else {
                match room {
                    Room::Reserved(reservation) => Some(reservation),
                    Room::Short(_) => None,
                }
            };
            let parsed = serde_json::from_slice(&self.buf[4..4 + len])
                .map_err(|e| ProtocolError::Invalid(e.to_string()));
            self.consume(4 + len);
            let message = parsed?;
            match (&message, kept) {
                // A result the first look did not see as one (it was not costed): dropped.
                (KernelMessage::Result { .. }, _) if !result => {
                    self.dropped.count(len);
                    continue;
                }
                (KernelMessage::Result { .. } | KernelMessage::Error { .. }, Some(room)) => {
                    self.held.absorb(room);
                }
                // `ready`, `done`, or a small error the budget had no room for.
                _ => {}
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

    const WIDE: ResultLimits = ResultLimits {
        bytes: 16 << 20,
        count: 256,
    };

    fn frame_len(bytes: &[u8]) -> usize {
        bytes.len() - 4
    }

    #[test]
    fn a_result_the_shared_budget_has_no_room_for_is_discarded_unbuffered_and_named() {
        let budget = ResultBudget::new(600 << 10, "the server's budget");
        let mut d = Decoder::with_limits(WIDE).with_budget(Some(budget.clone()));
        let first = result_frame("1", 200 << 10); // 400 KiB of room: kept
        let second = result_frame("1", 200 << 10); // 200 KiB left: discarded unread
        let small = result_frame("1", 60 << 10); // 120 KiB of room: kept
        let mut bytes = first.clone();
        bytes.extend(&second);
        bytes.extend(&small);
        bytes.extend(done_frame("1"));
        let (got, peak) = decode_all(&mut d, &bytes, 64 << 10);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(matches!(got[2], KernelMessage::Done { .. }));
        assert!(peak < (200 << 10) + (64 << 10) + 64, "peak buffer {peak}");
        assert_eq!(
            d.dropped(),
            Dropped::default(),
            "within the execution's limits"
        );
        assert_eq!(
            d.warnings(),
            [format!(
                "rich results were dropped: the server's budget was full (1 frame of {} bytes \
                 in all); results are held until their answers have been read",
                frame_len(&second)
            )]
        );
        // What was kept holds twice its length, and what its values take parsed, until it is
        // dropped.
        let kept = HELD_COPIES * (frame_len(&first) + frame_len(&small))
            + tree_bytes(&first[4..])
            + tree_bytes(&small[4..]);
        assert_eq!(budget.used(), kept);
        let held = d.take_held();
        assert_eq!((held.bytes(), budget.used()), (kept, kept));
        assert_eq!(d.take_held().bytes(), 0);
        // Another decoder of the same budget has no room for it meanwhile; once the results
        // are gone it has.
        let mut other = Decoder::with_limits(WIDE).with_budget(Some(budget.clone()));
        let (got, _) = decode_all(&mut other, &first, 4096);
        assert!(got.is_empty());
        drop(held);
        assert_eq!(budget.used(), 0);
        other.begin_execution();
        assert!(other.warnings().is_empty());
        let (got, _) = decode_all(&mut other, &first, 4096);
        assert_eq!(got.len(), 1);
        assert_eq!(
            budget.used(),
            HELD_COPIES * frame_len(&first) + tree_bytes(&first[4..])
        );
    }

    #[test]
    fn with_the_shared_budget_spent_small_results_are_dropped_and_errors_and_done_pass() {
        let budget = ResultBudget::new(1024, "this key's share");
        let mut d = Decoder::with_limits(WIDE).with_budget(Some(budget.clone()));
        let filler = budget.try_reserve(1000).unwrap();
        let mut bytes = result_frame("1", 10);
        bytes.extend(frame(
            r#"{"type":"error","id":"1","name":"E","value":"v","traceback":""}"#,
        ));
        bytes.extend(done_frame("1"));
        let (got, _) = decode_all(&mut d, &bytes, 7);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(got[0], KernelMessage::Error { .. }));
        assert!(matches!(got[1], KernelMessage::Done { .. }));
        let warnings = d.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0]
                .starts_with("rich results were dropped: this key's share was full (1 frame of"),
            "{warnings:?}"
        );
        assert_eq!(d.take_held().bytes(), 0);
        assert_eq!(budget.used(), 1000);
        drop(filler);
        // A result over the execution's limits is named as such, and takes no room.
        let mut d = Decoder::with_limits(LIMITS).with_budget(Some(budget.clone()));
        let (got, _) = decode_all(&mut d, &result_frame("1", 400 << 10), 1 << 20);
        assert!(got.is_empty());
        assert_eq!(d.warnings().len(), 1);
        assert!(d.warnings()[0].starts_with("rich results over the"));
        assert_eq!(budget.used(), 0);
    }

    /// A result whose `data` is a JSON array of `n` zeros (`n` tokens).
    fn array_frame(n: usize) -> Vec<u8> {
        let zeros = vec!["0"; n].join(",");
        frame(&format!(
            r#"{{"type":"result","id":"1","data":{{"application/json":[{zeros}]}}}}"#
        ))
    }

    #[test]
    fn parsed_values_are_costed_by_their_tokens_counted_outside_strings() {
        assert_eq!(tree_bytes(br#"{"a":[0,0]}"#), 5 * NODE_BYTES);
        assert_eq!(tree_bytes(br#"["a,b\",:{[\\",1]"#), 3 * NODE_BYTES);
        assert_eq!(tree_bytes(b""), NODE_BYTES);
        assert!(is_result(&result_frame("1", 10)[4..]));
        assert!(!is_result(&done_frame("1")[4..]));
        assert!(!is_result(b"{\"type\":"));
    }

    #[test]
    fn a_result_whose_parsed_values_would_not_fit_is_dropped_unparsed() {
        // 100 KiB of text, 3.2 MiB once parsed: over the execution's 300 KiB.
        let mut d = Decoder::with_limits(LIMITS);
        let mut bytes = array_frame(50_000);
        bytes.extend(done_frame("1"));
        let (got, _) = decode_all(&mut d, &bytes, 64 << 10);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(matches!(got[0], KernelMessage::Done { .. }));
        assert_eq!(d.dropped().frames, 1);

        // The shared budget takes the tree too: 10,000 tokens fit in 1 MiB, 20,000 do not.
        let budget = ResultBudget::new(1 << 20, "the budget");
        let mut d = Decoder::with_limits(WIDE).with_budget(Some(budget.clone()));
        let fits = array_frame(10_000);
        let (got, _) = decode_all(&mut d, &fits, 4096);
        assert_eq!(got.len(), 1);
        let cost = HELD_COPIES * frame_len(&fits) + tree_bytes(&fits[4..]);
        assert_eq!((d.take_held().bytes(), budget.used()), (cost, cost));
        assert_eq!(budget.used(), 0);
        let held = {
            let (got, _) = decode_all(&mut d, &fits, 4096);
            assert_eq!(got.len(), 1);
            d.take_held()
        };
        let (got, _) = decode_all(&mut d, &array_frame(20_000), 4096);
        assert!(got.is_empty());
        assert!(
            d.warnings()[0].contains("the budget was full"),
            "{:?}",
            d.warnings()
        );
        assert_eq!(budget.used(), held.bytes());
    }

    #[test]
    fn host_frames_round_trip_through_the_length_prefix() {
        let f = encode(&HostMessage::Execute {
            id: "a",
            code: "print('é')",
            env: BTreeMap::new(),
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

        /// With a shared budget too, what is kept does not depend on how the stream is split,
        /// the budget is never overrun, and what it holds is exactly the room of what was
        /// kept, until that is dropped.
        #[test]
        fn the_shared_budget_holds_however_the_stream_is_split(
            sizes in proptest::collection::vec(0usize..(200 << 10), 1..8),
            piece in 1usize..(96 << 10),
            room in 0usize..(1 << 20),
        ) {
            let mut bytes = Vec::new();
            for size in &sizes {
                bytes.extend(result_frame("1", *size));
            }
            bytes.extend(done_frame("1"));
            let decode = |piece: usize| {
                let budget = ResultBudget::new(room, "the budget");
                let mut d = Decoder::with_limits(LIMITS).with_budget(Some(budget.clone()));
                let (got, _) = decode_all(&mut d, &bytes, piece);
                (got, d, budget)
            };
            let (expected, whole, _) = decode(bytes.len());
            let (got, mut split, budget) = decode(piece);
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(split.warnings(), whole.warnings());
            let ends_with_done = matches!(got.last(), Some(KernelMessage::Done { .. }));
            prop_assert!(ends_with_done);
            prop_assert!(budget.used() <= room);
            let held = split.take_held();
            prop_assert_eq!(held.bytes(), budget.used());
            drop(held);
            prop_assert_eq!(budget.used(), 0);
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
