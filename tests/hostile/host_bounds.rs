//! Host-side bounds on what a sandbox sends back: rich results (kernel protocol frames on
//! fd 3) are limited per execution while they are decoded, so a program cannot make the
//! host keep more than a fixed amount, whatever its own memory limit.

use crate::harness::*;
use crate::host::*;
use std::time::{Duration, Instant};

/// The largest of VmHWM (peak) and VmRSS of a process, in KiB (0 once it is gone).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    ["VmHWM:", "VmRSS:"]
        .iter()
        .filter_map(|key| {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .max()
        .unwrap_or(0)
}

/// 24 result frames of 32 MiB (768 MiB) and 400 small ones: `corral run` keeps at most the
/// per-execution limits (64 MiB, 256 results), never buffers a frame that does not fit, says
/// so in `warnings`, and its memory stays far below what was sent.
#[test]
fn result_frame_flood_is_bounded_on_the_host() {
    let _g = exclusive();
    let before = Snapshot::take();
    let start = Instant::now();
    let mut run = Run::python(include_str!("attacks/result_flood.py"))
        .timeout(60)
        .spawn();
    let pid = run.pid();
    let mut peak_kib = 0;
    while !run.has_exited() && start.elapsed() < Duration::from_secs(120) {
        peak_kib = peak_kib.max(peak_rss_kib(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = run.wait();
    eprintln!(
        "corral peaked at {} MiB RSS; warnings {:?}",
        peak_kib >> 10,
        o.warnings()
    );
    o.assert_completed();
    // Sent: 768 MiB. Kept: at most 64 MiB, plus the JSON result printed from it.
    assert!(
        peak_kib < 200 * 1024,
        "corral peaked at {} MiB RSS while the sandbox sent 768 MiB of results",
        peak_kib >> 10
    );
    o.assert_no_escape();
    assert!(o.has_line("SENT 24"), "{}", o.dump());
    assert!(o.has_line("SENT small 400"), "{}", o.dump());
    let results = o.j()["results"].as_array().expect("results").clone();
    let kept: usize = results
        .iter()
        .flat_map(|r| ["text", "html", "png", "svg", "markdown"].map(|k| &r[k]))
        .map(|v| v.as_str().map_or(0, str::len))
        .sum();
    assert!(
        results.len() <= 256,
        "{} results kept (limit 256)",
        results.len()
    );
    assert!(
        kept <= 64 << 20,
        "{kept} bytes of results kept (limit 64 MiB)"
    );
    let dropped: Vec<String> = o
        .warnings()
        .into_iter()
        .filter(|w| w.contains("rich results") && w.contains("dropped"))
        .collect();
    assert_eq!(dropped.len(), 1, "no truncation warning\n{}", o.dump());
    assert!(
        dropped[0].contains("64 MiB") && dropped[0].contains("256"),
        "the warning names the limits: {}",
        dropped[0]
    );
    assert_host_can_fork();
    before.assert_nothing_left();
}
