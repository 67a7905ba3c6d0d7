//! Execution events (docs/results.md#events) and the mapping from kernel MIME bundles to results.

use base64::Engine as _;
use corral_sandbox::{ExecutionResult, LanguageError, NetworkReport, RichResult, Status};
use serde::Serialize;
use serde_json::{Map, Value};

/// One event of an execution's stream; `End` is always last.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Stdout { text: String },
    Stderr { text: String },
    Result(RichResult),
    Error(LanguageError),
    End(End),
}

/// How a run ended: the last event of every stream, the one every face forwards
/// (docs/results.md#events). It is made from the run's final result by [`End::of`] and
/// [`End::of_command`], nowhere else.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct End {
    pub status: Status,
    pub execution_time_ms: u64,
    pub cpu_time_ms: u64,
    pub peak_memory_bytes: u64,
    /// Commands only: the command's exit status (`null` when it has none: killed, never run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// The result's `warnings`: weaker protections, and what was dropped over the
    /// per-execution bounds, as in the folded result object.
    pub warnings: Vec<String>,
    /// What the sandbox's egress proxy did during the run, as in the result object; `null`
    /// without a network policy.
    pub network: Option<NetworkReport>,
}

impl End {
    /// The end of an execution of code (or of a one-shot run) whose final result is `result`.
    pub fn of(result: &ExecutionResult) -> End {
        End {
            status: result.status,
            execution_time_ms: result.execution_time_ms,
            cpu_time_ms: result.cpu_time_ms,
            peak_memory_bytes: result.peak_memory_bytes,
            exit_code: None,
            error_message: result.error_message.clone(),
            warnings: result.warnings.clone(),
            network: result.network.clone(),
        }
    }

    /// The end of a command: [`End::of`] with the command's exit status.
    pub fn of_command(result: &ExecutionResult) -> End {
        End {
            exit_code: Some(result.exit_code),
            ..End::of(result)
        }
    }
}

/// A kernel's MIME bundle as a result; unknown types and malformed values are dropped (the
/// kernel is untrusted), and a PNG that is not valid base64 is not passed on.
pub fn rich_result(is_main_result: bool, data: &Map<String, Value>) -> RichResult {
    into_rich_result(is_main_result, data.clone())
}

/// [`rich_result`] of a bundle the caller gives up: its values are moved, not copied, so a
/// result costs the host its size once.
pub fn into_rich_result(is_main_result: bool, mut data: Map<String, Value>) -> RichResult {
    let mut text = |key: &str| match data.remove(key) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    };
    let png = text("image/png")
        .map(|mut p| {
            if p.bytes().any(|b| b.is_ascii_whitespace()) {
                p.retain(|c| !c.is_ascii_whitespace());
            }
            p
        })
        .filter(|p| is_base64(p.as_bytes()));
    RichResult {
        is_main_result,
        text: text("text/plain"),
        html: text("text/html"),
        png,
        svg: text("image/svg+xml"),
        markdown: text("text/markdown"),
        json: data.remove("application/json"),
    }
}

/// Whether `text` is standard, padded base64, checked piecewise without decoding it whole.
fn is_base64(text: &[u8]) -> bool {
    // Whole quads, so each piece but the last is valid exactly when its part of the whole is,
    // padding aside: a piece may end with it, the whole only at its very end.
    const PIECE: usize = 16 << 10;
    let mut out = [0u8; PIECE / 4 * 3];
    let last = text.len().saturating_sub(1) / PIECE;
    text.chunks(PIECE).enumerate().all(|(i, piece)| {
        (i == last || !piece.ends_with(b"="))
            && base64::engine::general_purpose::STANDARD
                .decode_slice(piece, &mut out)
                .is_ok()
    })
}

/// Turns a byte stream into text without splitting a UTF-8 sequence across events.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Text for `bytes`, holding back an incomplete trailing sequence for the next call.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let complete = complete_prefix_len(&self.pending);
        let text = String::from_utf8_lossy(&self.pending[..complete]).into_owned();
        self.pending.drain(..complete);
        text
    }

    /// Whatever is held back, at the end of an execution.
    pub fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// How many leading bytes can be decoded now: all but an unfinished sequence at the very end.
/// Invalid bytes before it are decoded too (as U+FFFD), each invalid sequence exactly as
/// `from_utf8_lossy` would delimit it in the whole stream.
fn complete_prefix_len(bytes: &[u8]) -> usize {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(_) => return bytes.len(),
            Err(e) => match e.error_len() {
                Some(invalid) => start += e.valid_up_to() + invalid,
                None => return start + e.valid_up_to(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_as_docs_results_md_says() {
        let e = Event::Result(RichResult {
            is_main_result: true,
            text: Some("2".into()),
            ..RichResult::default()
        });
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"result","is_main_result":true,"text":"2"}"#
        );
        let mut result = ExecutionResult::sandbox_error("gone");
        result.status = Status::Success;
        result.error_message = None;
        (result.execution_time_ms, result.cpu_time_ms) = (3, 1);
        result.peak_memory_bytes = 9;
        result.warnings = vec!["w".into()];
        assert_eq!(
            serde_json::to_string(&Event::End(End::of(&result))).unwrap(),
            r#"{"type":"end","status":"success","execution_time_ms":3,"cpu_time_ms":1,"peak_memory_bytes":9,"warnings":["w"],"network":null}"#
        );
        result.exit_code = None;
        result.error_message = Some("killed".into());
        assert_eq!(
            serde_json::to_value(Event::End(End::of_command(&result))).unwrap()["exit_code"],
            serde_json::Value::Null,
            "a command's end carries its exit code, null when it has none"
        );
        assert!(serde_json::to_value(Event::End(End::of(&result)))
            .unwrap()
            .get("exit_code")
            .is_none());
    }

    #[test]
    fn mime_bundle_maps_to_result_fields() {
        let data: Map<String, Value> = serde_json::from_str(
            r#"{"text/plain":"df","text/html":"<table/>","image/png":"iVBO\nRw0K","application/json":{"a":1},"x/unknown":1}"#,
        )
        .unwrap();
        let r = rich_result(false, &data);
        assert_eq!(r.html.as_deref(), Some("<table/>"));
        assert_eq!(r.png.as_deref(), Some("iVBORw0K"));
        assert_eq!(r.json, Some(serde_json::json!({"a":1})));
        let bad: Map<String, Value> =
            serde_json::from_str(r#"{"image/png":"not base64!"}"#).unwrap();
        assert_eq!(rich_result(false, &bad).png, None);
    }

    #[test]
    fn padding_ends_only_the_whole_text() {
        // The first piece (16 KiB) ends with padding, which is valid there but not in the whole.
        let text = "QUJD".repeat(4094) + "AAAa+Ac=" + "00Aa";
        assert!(!is_base64(text.as_bytes()));
        assert!(is_base64(("QUJD".repeat(4096) + "QQ==").as_bytes()));
    }

    proptest::proptest! {
        /// The piecewise check agrees with decoding the whole text.
        #[test]
        fn base64_is_checked_like_a_whole_decode(
            text in "[A-Za-z0-9+/=]{0,64}",
            repeat in 4000usize..4200,
            tail in "[A-Za-z0-9+/= ]{0,6}",
        ) {
            let text = "QUJD".repeat(repeat) + &text + &tail;
            let whole = base64::engine::general_purpose::STANDARD.decode(&text).is_ok();
            proptest::prop_assert_eq!(is_base64(text.as_bytes()), whole);
        }
    }

    #[test]
    fn utf8_sequences_are_not_split() {
        let mut s = Utf8Stream::default();
        let bytes = "héllo".as_bytes();
        assert_eq!(s.push(&bytes[..2]), "h");
        assert_eq!(s.push(&bytes[2..]), "éllo");
        assert_eq!(s.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(s.push(&[0xe2, 0x82]), "");
        assert_eq!(s.flush(), "\u{fffd}");
    }

    #[test]
    fn a_sequence_begun_after_invalid_bytes_waits_for_its_end() {
        // Found by the `output_text` fuzz target: F0 F0 9F, one byte at a time, is an invalid
        // F0 and then an unfinished F0 9F, two replacement characters, not three.
        let mut s = Utf8Stream::default();
        let text: String = [0xf0, 0xf0, 0x9f].iter().map(|b| s.push(&[*b])).collect();
        assert_eq!(text + &s.flush(), "\u{fffd}\u{fffd}");
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(&[0xff, 0xe2, 0x82]), "\u{fffd}");
        assert_eq!(s.push(&[0xac]), "€");
    }
}
