//! Host-side bounds on a session's rich results: a kernel that writes oversized or countless
//! result frames to its protocol socket cannot make the host keep (or buffer) more than the
//! per-execution limits, is told so in `warnings`, and the session keeps working.
//!
//! A test binary of its own: the peak memory of this process is what is measured.

use std::time::Duration;

use corral_kernel::{Language, Session, SessionOptions};
use corral_sandbox::{ExecutionResult, Status};

mod support;
use support::python_sessions;

const TIMEOUT: Duration = Duration::from_secs(60);
/// The default per-execution limit on the bytes of rich results (`Limits::result_bytes`).
const RESULT_BYTES: usize = 64 << 20;

/// This process's peak resident memory so far, in KiB.
fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// A cell that writes `count` result frames of `size` bytes, for its own execution, straight
/// to the kernel's protocol socket.
fn flood(count: usize, size: usize) -> String {
    format!(
        "import os\n\
         k = get_ipython().kernel\n\
         head = ('{{\"type\":\"result\",\"id\":\"%s\",\"is_main_result\":false,\"data\":{{\"text/plain\":\"' % k.exec_id).encode()\n\
         tail = b'\"}}}}'\n\
         payload = head + b'x' * ({size} - len(head) - len(tail)) + tail\n\
         frame = len(payload).to_bytes(4, 'big') + payload\n\
         del payload\n\
         for _ in range({count}):\n\
         \x20   view = memoryview(frame)\n\
         \x20   while view:\n\
         \x20       view = view[os.write(k.sock_fd, view):]\n\
         print('sent', {count})\n"
    )
}

/// The bytes of every value the results hold (counted without copying them).
fn kept_bytes(r: &ExecutionResult) -> usize {
    r.results
        .iter()
        .flat_map(|x| [&x.text, &x.html, &x.png, &x.svg, &x.markdown])
        .map(|v| v.as_ref().map_or(0, String::len))
        .sum()
}

fn dropped_warnings(r: &ExecutionResult) -> Vec<&String> {
    r.warnings
        .iter()
        .filter(|w| w.contains("rich results") && w.contains("dropped"))
        .collect()
}

/// 24 frames of 32 MiB (768 MiB) from a session's kernel: the host keeps at most the 64 MiB
/// of an execution, never holds a frame that does not fit, warns, and the session goes on.
#[test]
fn oversized_result_frames_are_bounded_and_the_session_goes_on() {
    let before = vm_hwm_kib();
    for (how, mut s) in python_sessions() {
        let r = s.execute(&flood(24, 32 << 20), TIMEOUT, &mut |_| {});
        let grown_mib = vm_hwm_kib().saturating_sub(before) >> 10;
        eprintln!(
            "{how}: peak memory +{grown_mib} MiB, {} results ({} bytes) kept, warnings {:?}",
            r.results.len(),
            kept_bytes(&r),
            r.warnings
        );
        assert!(
            grown_mib < 200,
            "{how}: the host's peak grew by {grown_mib} MiB while the kernel sent 768 MiB"
        );
        assert_eq!(r.status, Status::Success, "{how}: {:?}", r.error_message);
        assert_eq!(r.stdout, "sent 24\n", "{how}");
        assert!(
            kept_bytes(&r) <= RESULT_BYTES,
            "{how}: kept {} bytes",
            kept_bytes(&r)
        );
        assert!(!r.results.is_empty(), "{how}: what fits is kept");
        let warned = dropped_warnings(&r);
        assert_eq!(warned.len(), 1, "{how}: {:?}", r.warnings);
        assert!(
            warned[0].contains("64 MiB") && warned[0].contains("256"),
            "{how}: {}",
            warned[0]
        );
        // The stream stayed in sync: the next execution works, with a fresh budget.
        let next = s.execute("6 * 7", TIMEOUT, &mut |_| {});
        assert_eq!(next.status, Status::Success, "{how}: {next:?}");
        assert_eq!(next.results.len(), 1, "{how}");
        assert_eq!(next.results[0].text.as_deref(), Some("42"), "{how}");
        assert!(
            dropped_warnings(&next).is_empty(),
            "{how}: {:?}",
            next.warnings
        );
        assert!(s.is_alive(), "{how}");
    }
}

/// More results than an execution may keep: the first 256 are kept in order, the rest are
/// dropped with a warning, and the next execution may again have 256.
#[test]
fn results_beyond_the_count_limit_are_dropped() {
    let options = SessionOptions::new(Language::Python);
    let mut s = Session::create(&options).expect("a session starts");
    let r = s.execute(
        "from IPython.display import display\nfor i in range(300): display(i)",
        TIMEOUT,
        &mut |_| {},
    );
    assert_eq!(r.status, Status::Success, "{:?}", r.error_message);
    assert_eq!(r.results.len(), 256);
    assert_eq!(r.results[255].text.as_deref(), Some("255"));
    assert_eq!(dropped_warnings(&r).len(), 1, "{:?}", r.warnings);
    let r = s.execute("for i in range(3): display(i)", TIMEOUT, &mut |_| {});
    assert_eq!(r.results.len(), 3);
    assert!(dropped_warnings(&r).is_empty(), "{:?}", r.warnings);
}
