//! `corral` as a user drives it from a shell: a reader that goes away, exit codes with and
//! without `--json`, the language a `#!` line names, key commands on a mistaken path. The runs
//! use the `host` image (the host's own /usr, which scripts/setup fills with Python,
//! matplotlib and Node.js), so they need no built image.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

fn corral_bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_corral"));
    cmd.stdin(Stdio::null());
    cmd
}

fn corral() -> Command {
    let mut cmd = corral_bin();
    cmd.args(["run", "--image", "host"]);
    cmd
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `corral run ... --out DIR 2>&1 | head -c 64`: stdout and stderr are one pipe whose reader
/// leaves after a few bytes, while the program is still printing. The run must still end with
/// the program's own exit code and copy every file out (the saved-file notes on stderr are
/// what a closed pipe used to turn into a panic).
#[test]
fn a_reader_that_goes_away_costs_no_file_and_no_exit_code() {
    let out = tempfile::tempdir().unwrap();
    // Close-on-exec: the child must hold only the write end, as under a shell.
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let program = "\
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
for name in ('a.txt', 'b.txt', 'c.txt'):
    open(name, 'w').write(name)
plt.plot([1, 2, 3])
for i in range(200000):
    print('line', i)
raise SystemExit(3)
";
    let mut child = corral()
        .args(["-c", program, "--out"])
        .arg(out.path())
        .stdout(write.try_clone().unwrap())
        .stderr(write)
        .spawn()
        .unwrap();
    let mut reader = std::fs::File::from(read);
    let mut first = [0u8; 64];
    reader.read_exact(&mut first).unwrap();
    drop(reader); // `head` is done
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert_eq!(
        names(out.path()),
        ["a.txt", "b.txt", "c.txt", "result-1.png"],
        "every file is copied out although nobody reads the notes"
    );
}

/// The exit code follows the status by one rule, with `--json` as without: the program's own
/// code for `success` and `error`, 124 for `timeout`, 137 for `memory_limit`, 125 for
/// `sandbox_error`. With `--json`, stdout is the result object in every case.
#[test]
fn exit_codes_follow_the_status_with_and_without_json() {
    let cases: [(&[&str], &str, i32); 5] = [
        (&["-c", "print(1)"], "success", 0),
        (&["-c", "import sys; sys.exit(7)"], "error", 7),
        (&["-c", "1/0"], "error", 1),
        (
            &["--timeout", "1", "-c", "import time; time.sleep(30)"],
            "timeout",
            124,
        ),
        (
            &["--memory", "4G", "--disk", "100G", "-c", "print(1)"],
            "",
            125,
        ),
    ];
    for (args, status, code) in cases {
        let plain = corral().args(args).output().unwrap();
        let json = corral().arg("--json").args(args).output().unwrap();
        assert_eq!(
            plain.status.code(),
            Some(code),
            "{args:?} without --json: {plain:?}"
        );
        assert_eq!(
            json.status.code(),
            Some(code),
            "{args:?} with --json: {json:?}"
        );
        let result: Value = serde_json::from_slice(&json.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: no result object ({e}): {json:?}"));
        if !status.is_empty() {
            assert_eq!(result["status"], status, "{args:?}: {result}");
        } else {
            assert_eq!(result["status"], "sandbox_error", "{args:?}: {result}");
        }
    }
}

/// An extensionless file (or a program on stdin) whose first line is `#!` runs in the
/// language it names; an interpreter Corral does not run is refused by name.
#[test]
fn a_shebang_chooses_the_language() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, expect) in [
        (
            "tool",
            "#!/usr/bin/env node\nconsole.log(typeof process)\n",
            "object\n",
        ),
        (
            "script",
            "#!/bin/bash\necho \"$BASH_VERSION\" | cut -c1\n",
            "5\n",
        ),
        ("plain", "print(2 * 21)\n", "42\n"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = corral().arg("--json").arg(&path).output().unwrap();
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["status"], "success", "{name}: {result}");
        assert_eq!(result["stdout"], expect, "{name}: {result}");
    }
    let ruby = dir.path().join("gem");
    std::fs::write(&ruby, "#!/usr/bin/env ruby\nputs 1\n").unwrap();
    let out = corral().arg(&ruby).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`ruby`") && stderr.contains("--lang"),
        "{stderr}"
    );
    // --lang still wins over the #! line.
    let out = corral()
        .args([
            "--json",
            "--lang",
            "python",
            "-c",
            "#!/usr/bin/env node\nprint('py')",
        ])
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stdout"], "py\n", "{result}");
}

/// `corral key ls` and `revoke` on a database that does not exist say so, and create nothing.
#[test]
fn key_commands_on_a_missing_database_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nosuch.db");
    for args in [&["key", "ls"][..], &["key", "revoke", "key-0"][..]] {
        let out = corral_bin()
            .args(args)
            .arg("--db")
            .arg(&db)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("no database at"), "{args:?}: {stderr}");
        assert!(!db.exists(), "{args:?} created {}", db.display());
    }
}

/// A listing whose reader goes away (`corral tools | head -c 1`) ends quietly, as any Unix
/// tool does: no panic, no message.
#[test]
fn a_listing_ends_quietly_when_its_reader_goes_away() {
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    drop(read);
    let out = corral_bin()
        .args(["tools", "--format", "openai"])
        .stdout(write)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(nix::libc::SIGPIPE),
        "{out:?}"
    );
}

/// What is piped into `corral run` reaches the program when the program itself came from `-c`
/// or a file: up to `--disk` bytes, then end of file and a warning.
#[test]
fn stdin_reaches_the_program_within_the_workspace_size() {
    use std::io::Write;
    let run = |args: &[&str], input: Vec<u8>| -> Value {
        let mut child = corral()
            .arg("--json")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        // The program may stop reading early: a closed pipe is no failure of the writer here.
        let writer = std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let echo = "import sys; data = sys.stdin.buffer.read(); print(len(data), data[:5])";
    let r = run(&["-c", echo], b"hello world".to_vec());
    assert_eq!(r["stdout"], "11 b'hello'\n", "{r}");
    assert_eq!(r["warnings"], serde_json::json!([]), "{r}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("count.py");
    std::fs::write(&file, echo).unwrap();
    let r = run(&[file.to_str().unwrap()], vec![b'x'; 100_000]);
    assert_eq!(r["stdout"], "100000 b'xxxxx'\n", "{r}");

    // Over --disk: the program reads exactly that much, and the result says it was cut.
    let r = run(&["--disk", "1M", "-c", echo], vec![b'y'; 3 << 20]);
    assert_eq!(r["stdout"], "1048576 b'yyyyy'\n", "{r}");
    let warnings = r["warnings"].to_string();
    assert!(
        warnings.contains("stdin was cut after 1048576 bytes"),
        "{r}"
    );

    // The program that came from stdin has no other stdin.
    let mut child = corral()
        .args(["--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"import sys; print(repr(sys.stdin.read()))")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["stdout"], "''\n", "{r}");
}

/// Output over the cap (1 MiB a stream) ends, in the stream itself, with a marker that says so.
#[test]
fn a_cut_stream_ends_with_a_marker() {
    let out = corral()
        .args([
            "-c",
            "import sys\nsys.stdout.write('a' * (3 << 20))\nsys.stderr.write('b' * (3 << 20))",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.starts_with("aaaa"), "{}", &stdout[..40]);
    assert!(
        stdout.ends_with("\n[corral: stdout was cut at 1048576 bytes; the rest was dropped]\n"),
        "{}",
        &stdout[stdout.len() - 100..]
    );
    assert_eq!(
        stdout.find('\n'),
        Some(1 << 20),
        "the first MiB, then the marker"
    );
    assert!(
        stderr.ends_with("corral: stderr was cut at 1048576 bytes; the rest was dropped\n"),
        "{}",
        &stderr[stderr.len() - 100..]
    );
}

/// Ctrl-C (SIGINT), `kill` (SIGTERM) or a closed terminal (SIGHUP) while the program runs:
/// Corral tears the sandbox down before it exits, with 128 + the signal's number, and leaves
/// no process or cgroup of its own behind.
#[test]
fn a_stop_signal_tears_the_sandbox_down_before_corral_exits() {
    use std::io::BufRead;
    for signal in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        let mut child = corral()
            .args([
                "-c",
                "import subprocess, time\nsubprocess.Popen(['sleep', '301.7'])\nprint('running', flush=True)\ntime.sleep(300)",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "running");
        let started = std::time::Instant::now();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert_eq!(
            out.status.code(),
            Some(128 + signal as i32),
            "{signal}: {out:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("the sandbox was torn down"),
            "{signal}: {stderr}"
        );
        // Nothing of the run is left: no cgroup named after this corral process, no sleep.
        let left: Vec<String> = corral_sandbox::cgroup::Layout::detect()
            .map(|l| l.sandbox_cgroups())
            .unwrap_or_default()
            .into_iter()
            .filter(|name| name.split('-').next() == Some(pid.to_string().as_str()))
            .collect();
        assert!(left.is_empty(), "{signal}: cgroups left: {left:?}");
        let sleeping = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
            // An argument no other test uses: the kernels' own tests leave `sleep 300` behind.
            .any(|c| c == "sleep\u{0}301.7\u{0}");
        assert!(!sleeping, "{signal}: the program's child outlived the run");
    }
}

/// `--result-count` and `--result-bytes` bound the rich results a run keeps; what they drop is
/// named in `warnings`.
#[test]
fn result_flags_bound_what_a_run_keeps() {
    let plots =
        "import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.figure(); plt.plot([i, 1])";
    for (flags, kept) in [
        (&["--result-count", "1"][..], 1),
        (&["--result-bytes", "0"][..], 0),
        (&[][..], 3),
    ] {
        let out = corral()
            .arg("--json")
            .args(flags)
            .args(["-c", plots])
            .output()
            .unwrap();
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            r["results"].as_array().unwrap().len(),
            kept,
            "{flags:?}: {r}"
        );
        let warned = r["warnings"].to_string().contains("rich results");
        assert_eq!(warned, kept < 3, "{flags:?}: {r}");
    }
}

/// The code policy flags (docs/code-policy.md): a program that imports a module outside
/// `--allow-module` is refused before it starts, with the line; `--max-code-bytes` refuses a
/// longer program before any sandbox exists, and says so; bad values and module rules for bash
/// are refused like any bad flag.
#[test]
fn the_code_policy_flags_refuse_a_program_before_it_starts() {
    let program = "print('started')\nimport json\nimport socket\n";
    for json in [true, false] {
        let mut cmd = corral();
        cmd.args(["-c", program, "--allow-module", "json,math"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "json {json}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message = "line 3: import of 'socket' is not allowed (allowed modules: json, math). \
                       The code was not run.";
        if json {
            let r: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(r["status"], "error", "{r}");
            assert_eq!(r["stdout"], "", "nothing ran: {r}");
            assert_eq!(r["error"]["name"], "PolicyViolation");
            assert_eq!(r["error"]["value"], message);
            assert_eq!(
                r["error"]["violations"],
                serde_json::json!([{"rule": "not_allowed", "line": 3, "module": "socket"}])
            );
        } else {
            assert_eq!(out.stdout, b"", "nothing ran");
            assert_eq!(stderr, format!("PolicyViolation: {message}\n"));
        }
    }
    let ok = corral()
        .args([
            "-c",
            "import json\nprint(json.dumps([1]))",
            "--deny-module",
            "socket",
        ])
        .output()
        .unwrap();
    assert_eq!(
        (ok.status.code(), ok.stdout.as_slice()),
        (Some(0), &b"[1]\n"[..])
    );

    let long = corral()
        .args(["-c", "print(1)\n# padding", "--max-code-bytes", "10"])
        .output()
        .unwrap();
    assert_eq!(long.status.code(), Some(1));
    assert_eq!(long.stdout, b"");
    let stderr = String::from_utf8_lossy(&long.stderr);
    assert!(
        stderr.contains("corral: PolicyViolation: the code is 18 bytes, more than the 10 bytes"),
        "{stderr}"
    );

    for (flags, said) in [
        (
            &["--allow-module", "os/path"][..],
            "--allow-module: \"os/path\" is not a module name",
        ),
        (
            &["--deny-module", ""][..],
            "--deny-module: \"\" is not a module name",
        ),
        (
            &["--max-code-bytes", "0"][..],
            "--max-code-bytes must be between 1 and",
        ),
        (
            &["--lang", "bash", "--deny-module", "socket"][..],
            "bash has no modules",
        ),
    ] {
        let out = corral().args(["-c", "true"]).args(flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
    }
    let bash = corral()
        .args(["--lang", "bash", "-c", "echo ok", "--max-code-bytes", "100"])
        .output()
        .unwrap();
    assert_eq!(bash.stdout, b"ok\n");
}

/// `corral doctor` says whether this host can offer network allow-lists (docs/network.md):
/// an `egress` line, active exactly when the host has a name server its proxy could ask and a
/// route out, and saying why not otherwise.
#[test]
fn doctor_says_whether_egress_can_be_offered() {
    let out = corral_bin().arg("doctor").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("egress"))
        .unwrap_or_else(|| panic!("no egress line:\n{stdout}"));
    let has_name_server = std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().next() == Some("nameserver"));
    let has_route = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9"))
        .is_ok();
    if has_name_server && has_route {
        assert!(line.contains(" active "), "{line}");
        assert!(line.contains("--net allow:... can be offered"), "{line}");
    } else {
        assert!(line.contains(" MISSING "), "{line}");
        assert!(
            line.contains("names no name server") || line.contains("no route out"),
            "{line}"
        );
    }
}
