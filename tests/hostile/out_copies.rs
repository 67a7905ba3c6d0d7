//! What `--out` and `result-N.png` write on the host: only new files, created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` beneath the output directory, never through a name that is
//! already there (a file, a hard link, a FIFO, a symlink), and no more bytes than the cap
//! (the workspace size), however sparse files and hard links inflate the workspace.

use crate::harness::*;
use crate::host::*;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Host disk used below `dir`, as `du` counts it: allocated blocks, not sizes.
fn allocated_bytes(dir: &Path) -> u64 {
    walk(dir).iter().map(|(_, md)| md.blocks() * 512).sum()
}

fn apparent_bytes(dir: &Path) -> u64 {
    walk(dir)
        .iter()
        .filter(|(_, md)| md.is_file())
        .map(|(_, md)| md.len())
        .sum()
}

/// A temp dir with an empty `out` directory in it.
fn out_dir() -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::Builder::new().prefix("hx-").tempdir().unwrap();
    let out = base.path().join("out");
    fs::create_dir(&out).unwrap();
    (base, out)
}

/// A warning of the result names `name`, and corral said so on stderr.
fn assert_reported(o: &Outcome, name: &str) {
    assert!(
        o.warnings().iter().any(|w| w.contains(name)),
        "no warning names {name}\n{}",
        o.dump()
    );
    assert!(
        o.raw_stderr.lines().any(|l| l.contains(name)),
        "no line on stderr names {name}\n{}",
        o.dump()
    );
}

/// The program's ordinary files (sorted before and after the colliding names) were copied:
/// a collision skips one file, not the rest of the copy.
fn assert_others_copied(o: &Outcome, out: &Path, mark: &str) {
    for name in [format!("aaa-{mark}.txt"), format!("zzz-{mark}.txt")] {
        assert_eq!(
            fs::read_to_string(out.join(&name)).ok().as_deref(),
            Some(format!("OK-{mark}").as_str()),
            "{name} was not copied out\n{}",
            o.dump()
        );
    }
}

/// (size, mode, inode, link count, digest) of a file, without following a link.
fn fingerprint(path: &Path) -> (u64, u32, u64, u64, Option<(u64, u64)>) {
    let md = fs::symlink_metadata(path).unwrap();
    (md.len(), md.mode(), md.ino(), md.nlink(), digest(path))
}

fn collisions(names: &[&str]) -> Run {
    Run::python(include_str!("attacks/out_collisions.py")).env("NAMES", names.join(","))
}

#[test]
fn sparse_files_and_hard_links_do_not_amplify_the_copy() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let (base, out) = out_dir();
    let mark = marker("outsparse");
    // 2 sparse files of 15 MiB and 24 hard links: 0 bytes in a 16 MiB workspace, 390 MiB
    // of apparent size.
    let o = Run::python(include_str!("attacks/out_sparse_links.py"))
        .env("MARK", &mark)
        .env("SPARSE_BYTES", (15 * MIB).to_string())
        .env("LINKS", "24")
        .disk("16M")
        .timeout(20)
        .out(&out)
        .run();
    o.assert_completed();
    assert_eq!(o.value("LINKED"), "24", "{}", o.dump());
    assert_eq!(o.values("SPARSE").len(), 2, "{}", o.dump());
    let cap = 16 * MIB;
    let (allocated, apparent) = (allocated_bytes(&out), apparent_bytes(&out));
    // Slack for the block rounding of the small file and of directories.
    assert!(
        allocated <= cap + MIB,
        "AMPLIFIED: the copy used {allocated} bytes of host disk (cap {cap})\n{}",
        o.dump()
    );
    assert!(apparent <= cap, "copied {apparent} bytes (cap {cap})");
    // Non-vacuous: the copy works up to the cap, and says what it skipped.
    assert_eq!(
        fs::read_to_string(out.join(format!("ok-{mark}.txt"))).ok(),
        Some(format!("OK-{mark}")),
        "{}",
        o.dump()
    );
    let big = walk(&out)
        .iter()
        .filter(|(_, md)| md.is_file() && md.len() == 15 * MIB)
        .count();
    assert_eq!(big, 1, "one 15 MiB file fits the cap\n{}", o.dump());
    assert!(
        o.warnings().iter().any(|w| w.contains("cap")),
        "no warning about the cap\n{}",
        o.dump()
    );
    assert_eq!(list_names(base.path()), vec!["out"]);
    snap.assert_nothing_left();
}

#[test]
fn an_existing_executable_in_out_keeps_its_content_and_mode() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let (base, out) = out_dir();
    let mark = marker("outexec");
    let script = out.join("build.sh");
    fs::write(&script, format!("#!/bin/sh\necho HOST-{mark}\n")).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let before = fingerprint(&script);
    let o = collisions(&["build.sh"]).env("MARK", &mark).out(&out).run();
    o.assert_completed();
    assert_eq!(o.values("WROTE"), vec!["build.sh"], "{}", o.dump());
    assert_eq!(
        fingerprint(&script),
        before,
        "SANDBOX HOLE: the sandbox's build.sh replaced the caller's\n{}",
        o.dump()
    );
    assert_eq!(
        fs::read_to_string(&script).unwrap(),
        format!("#!/bin/sh\necho HOST-{mark}\n")
    );
    assert_reported(&o, "build.sh");
    assert_others_copied(&o, &out, &mark);
    assert_eq!(list_names(base.path()), vec!["out"]);
    snap.assert_nothing_left();
}

#[test]
fn a_file_hard_linked_into_out_is_not_written_through_the_link() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let (base, out) = out_dir();
    let mark = marker("outhardlink");
    let host_file = base.path().join("host-file.txt");
    fs::write(&host_file, format!("HOST-{mark}\n")).unwrap();
    fs::set_permissions(&host_file, fs::Permissions::from_mode(0o600)).unwrap();
    fs::hard_link(&host_file, out.join("data.txt")).unwrap();
    let before = fingerprint(&host_file);
    let o = collisions(&["data.txt"]).env("MARK", &mark).out(&out).run();
    o.assert_completed();
    assert_eq!(
        fingerprint(&host_file),
        before,
        "SANDBOX HOLE: a host file was written through a hard link in --out\n{}",
        o.dump()
    );
    assert_eq!(fingerprint(&out.join("data.txt")), before);
    assert_reported(&o, "data.txt");
    assert_others_copied(&o, &out, &mark);
    assert_eq!(list_names(base.path()), vec!["host-file.txt", "out"]);
    snap.assert_nothing_left();
}

#[test]
fn a_fifo_in_out_neither_hangs_the_copy_nor_is_written() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let (base, out) = out_dir();
    let mark = marker("outfifo");
    let fifo = out.join("pipe.txt");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let before = fs::symlink_metadata(&fifo).unwrap();
    // On a corral that opens the FIFO for writing, the harness gives up after 5 + 45 s.
    let o = collisions(&["pipe.txt"])
        .env("MARK", &mark)
        .timeout(5)
        .out(&out)
        .run();
    o.assert_completed();
    assert!(
        o.wall < Duration::from_secs(30),
        "the copy-out took {:?}",
        o.wall
    );
    let after = fs::symlink_metadata(&fifo).unwrap();
    assert!(after.file_type().is_fifo(), "the FIFO was replaced");
    assert_eq!(
        (after.ino(), after.mode()),
        (before.ino(), before.mode()),
        "{}",
        o.dump()
    );
    assert_reported(&o, "pipe.txt");
    assert_others_copied(&o, &out, &mark);
    assert_eq!(list_names(base.path()), vec!["out"]);
    snap.assert_nothing_left();
}

#[test]
fn symlinks_in_out_are_never_followed() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let (base, out) = out_dir();
    let mark = marker("outsymlink");
    let target = base.path().join("target.txt");
    fs::write(&target, format!("HOST-{mark}\n")).unwrap();
    let target_dir = base.path().join("target-dir");
    fs::create_dir(&target_dir).unwrap();
    let not_there = base.path().join(format!("created-{mark}.txt"));
    let links = [
        ("link.txt", target.clone()),
        ("dangling.txt", not_there.clone()),
        ("sub", target_dir.clone()),
    ];
    for (name, to) in &links {
        std::os::unix::fs::symlink(to, out.join(name)).unwrap();
    }
    let before = fingerprint(&target);
    let o = collisions(&["link.txt", "dangling.txt", "sub/inner.txt"])
        .env("MARK", &mark)
        .out(&out)
        .run();
    o.assert_completed();
    assert_eq!(
        fingerprint(&target),
        before,
        "SANDBOX HOLE: written through a symlink\n{}",
        o.dump()
    );
    assert!(
        !not_there.exists(),
        "SANDBOX HOLE: a dangling symlink in --out created {not_there:?}"
    );
    assert!(
        list_names(&target_dir).is_empty(),
        "SANDBOX HOLE: a file was created through a directory symlink\n{}",
        o.dump()
    );
    for (name, to) in &links {
        assert_eq!(
            fs::read_link(out.join(name)).ok().as_ref(),
            Some(to),
            "{name} changed"
        );
    }
    assert_reported(&o, "link.txt");
    assert_reported(&o, "dangling.txt");
    assert_reported(&o, "inner.txt");
    assert_others_copied(&o, &out, &mark);
    assert_eq!(
        list_names(base.path()),
        vec!["out", "target-dir", "target.txt"]
    );
    snap.assert_nothing_left();
}

#[test]
fn out_naming_an_existing_file_is_refused_before_the_run() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let base = tempfile::Builder::new().prefix("hx-").tempdir().unwrap();
    let mark = marker("outfile");
    let file = base.path().join("results");
    fs::write(&file, format!("HOST-{mark}\n")).unwrap();
    let before = fingerprint(&file);
    let o = collisions(&["results.txt"])
        .env("MARK", &mark)
        .out(&file)
        .run();
    assert_eq!(
        o.exit.and_then(|e| e.code()),
        Some(125),
        "--out naming a file must be an error\n{}",
        o.dump()
    );
    assert_eq!(o.status(), "sandbox_error", "{}", o.dump());
    let message = o.j()["error_message"].as_str().unwrap_or("");
    assert!(
        message.contains("--out") && message.contains("not a directory"),
        "{message}"
    );
    assert!(!o.has_line("START"), "the program ran\n{}", o.dump());
    // The same without --json: exit 125 and a message.
    let plain = collisions(&["results.txt"])
        .env("MARK", &mark)
        .out(&file)
        .without_json()
        .run();
    assert_eq!(
        plain.exit.and_then(|e| e.code()),
        Some(125),
        "{}",
        plain.dump()
    );
    assert!(
        plain.raw_stderr.contains("not a directory"),
        "{}",
        plain.dump()
    );
    assert!(!plain.raw_stdout.contains("START"), "{}", plain.dump());
    assert_eq!(fingerprint(&file), before, "the file was changed");
    assert_eq!(list_names(base.path()), vec!["results"]);
    snap.assert_nothing_left();
}

#[test]
fn result_pngs_take_the_next_free_name_and_are_never_overwritten() {
    let _g = exclusive();
    let snap = Snapshot::take();
    let (base, out) = out_dir();
    let mark = marker("outpng");
    // result-1.png: a FIFO, result-2.png: a dangling symlink out, result-3.png: a hard link to
    // a file elsewhere; the workspace holds result-4.png.
    nix::unistd::mkfifo(
        &out.join("result-1.png"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let not_there = base.path().join(format!("created-{mark}.png"));
    std::os::unix::fs::symlink(&not_there, out.join("result-2.png")).unwrap();
    let host_file = base.path().join("host.png");
    fs::write(&host_file, format!("HOST-{mark}")).unwrap();
    fs::hard_link(&host_file, out.join("result-3.png")).unwrap();
    let before = fingerprint(&host_file);
    let o = Run::python(include_str!("attacks/out_png_result.py"))
        .env("MARK", &mark)
        .env("WORKSPACE_NAME", "result-4.png")
        .out(&out)
        .timeout(10)
        .without_json()
        .run();
    assert_eq!(o.exit.and_then(|e| e.code()), Some(0), "{}", o.dump());
    assert!(o.raw_stdout.contains("DONE"), "{}", o.dump());
    assert!(fs::symlink_metadata(out.join("result-1.png"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(!not_there.exists(), "SANDBOX HOLE: created {not_there:?}");
    assert_eq!(
        fingerprint(&host_file),
        before,
        "SANDBOX HOLE: host.png written"
    );
    assert_eq!(
        fs::read_to_string(out.join("result-4.png")).ok(),
        Some(format!("WORKSPACE-{mark}")),
        "{}",
        o.dump()
    );
    // The figure took the next free name, and neither overwrote nor was overwritten.
    let mut figure = b"\x89PNG\r\n\x1a\n".to_vec();
    figure.extend_from_slice(format!("FIGURE-{mark}").as_bytes());
    assert_eq!(
        fs::read(out.join("result-5.png")).ok(),
        Some(figure),
        "the figure was lost\n{}",
        o.dump()
    );
    assert!(o.raw_stderr.contains("result-5.png"), "{}", o.dump());
    assert_eq!(
        list_names(&out),
        (1..=5)
            .map(|n| format!("result-{n}.png"))
            .collect::<Vec<_>>()
    );
    assert_eq!(list_names(base.path()), vec!["host.png", "out"]);
    snap.assert_nothing_left();
}
