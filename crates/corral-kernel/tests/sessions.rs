//! Sessions inside real sandboxes (host image): state, rich results, streaming, interrupts,
//! limits, isolation, for kernels started directly and for sessions forked from a zygote.

use std::time::{Duration, Instant};

use base64::Engine as _;
use corral_kernel::{End, Event, KernelError, Language, Session, SessionOptions, Stopper};
use corral_sandbox::{ExecutionResult, Status};

mod support;
use support::{full_pool, python_sessions, run, strings, zygote, SECOND};

#[test]
fn workspace_modules_are_importable() {
    for (how, mut s) in python_sessions() {
        let write = run(
            &mut s,
            "open('/workspace/helper.py', 'w').write('VALUE = 42')",
        );
        assert_eq!(write.status, Status::Success, "{how}: {write:?}");
        let r = run(&mut s, "import helper\nhelper.VALUE");
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        assert_eq!(r.results[0].text.as_deref(), Some("42"), "{how}: {r:?}");
    }
}

#[test]
fn state_persists_across_executions() {
    for (how, mut s) in python_sessions() {
        assert_eq!(run(&mut s, "x = 40").status, Status::Success, "{how}");
        let r = run(&mut s, "x + 2");
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        let main = r
            .results
            .iter()
            .find(|r| r.is_main_result)
            .expect("a main result");
        assert_eq!(main.text.as_deref(), Some("42"), "{how}");
    }
}

#[test]
fn dataframe_gives_html_and_a_plot_gives_a_png() {
    for (how, mut s) in python_sessions() {
        let r = run(
            &mut s,
            "import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'salary': [61000, 25000]})",
        );
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        let r = run(&mut s, "df.describe()");
        let main = r
            .results
            .iter()
            .find(|r| r.is_main_result)
            .expect("a main result");
        assert!(
            main.html.as_deref().unwrap_or("").contains("<table"),
            "{how}: {main:?}"
        );
        assert!(main.text.is_some(), "{how}");
        let r = run(
            &mut s,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()",
        );
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        let png = r
            .results
            .iter()
            .find_map(|r| r.png.clone())
            .expect("a PNG result");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png)
            .unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{how}: not a PNG");
        assert!(bytes.len() > 1000, "{how}: a plot is more than a header");
        // Figures are closed after being shown: the next cell produces no image.
        let r = run(&mut s, "1");
        assert!(r.results.iter().all(|r| r.png.is_none()), "{how}");
    }
}

#[test]
fn every_mime_type_round_trips() {
    for (how, mut s) in python_sessions() {
        let r = run(
            &mut s,
            "from IPython.display import display, HTML, Markdown, SVG, JSON\n\
             display(HTML('<b>bold</b>'))\n\
             display(Markdown('*em*'))\n\
             display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"></svg>'))\n\
             display(JSON({'a': [1, 2]}))",
        );
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        let all = &r.results;
        assert!(
            all.iter().any(|r| r.html.as_deref() == Some("<b>bold</b>")),
            "{how}: {all:?}"
        );
        assert!(
            all.iter().any(|r| r.markdown.as_deref() == Some("*em*")),
            "{how}"
        );
        assert!(
            all.iter()
                .any(|r| r.svg.as_deref().is_some_and(|s| s.contains("<svg"))),
            "{how}"
        );
        assert!(
            all.iter()
                .any(|r| r.json == Some(serde_json::json!({"a": [1, 2]}))),
            "{how}: {all:?}"
        );
        assert!(
            all.iter().all(|r| !r.is_main_result),
            "{how}: display() is not the main result"
        );
    }
}

#[test]
fn exceptions_give_name_value_and_a_readable_traceback() {
    for (how, mut s) in python_sessions() {
        let r = run(&mut s, "def f(x):\n    return 1 / x\nf(0)");
        assert_eq!(r.status, Status::Error, "{how}");
        let e = r.error.expect("an error");
        assert_eq!(e.name, "ZeroDivisionError", "{how}");
        assert_eq!(e.value, "division by zero", "{how}");
        assert!(
            e.traceback.contains("return 1 / x"),
            "{how}: {}",
            e.traceback
        );
        assert!(
            !e.traceback.contains('\u{1b}'),
            "{how}: ANSI colours in the traceback"
        );
        assert!(
            !e.traceback.contains("corral_kernel"),
            "{how}: kernel frames leak"
        );
        // The session survives its errors.
        assert_eq!(run(&mut s, "2").status, Status::Success, "{how}");
    }
}

#[test]
fn output_streams_before_the_execution_ends() {
    for (how, mut s) in python_sessions() {
        let start = Instant::now();
        let mut first_stdout = None;
        let mut end = None;
        s.execute(
            "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')",
            20 * SECOND,
            &mut |e| match e {
                Event::Stdout { text } if text.contains("first") && first_stdout.is_none() => {
                    first_stdout = Some(start.elapsed())
                }
                Event::End(_) => end = Some(start.elapsed()),
                _ => {}
            },
        );
        let (first, end) = (first_stdout.expect("stdout event"), end.expect("end event"));
        assert!(
            end - first >= Duration::from_millis(1000),
            "{how}: first {first:?}, end {end:?}"
        );
    }
}

#[test]
fn interrupt_and_timeout_keep_the_state() {
    for (how, mut s) in python_sessions() {
        run(&mut s, "kept = 7");
        let interrupter = s.interrupter();
        let t = std::thread::spawn(move || {
            std::thread::sleep(SECOND);
            interrupter.interrupt();
        });
        let r = run(&mut s, "import time\ntime.sleep(30)");
        t.join().unwrap();
        assert_eq!(r.status, Status::Error, "{how}: {r:?}");
        assert_eq!(
            r.error.as_ref().map(|e| e.name.as_str()),
            Some("KeyboardInterrupt"),
            "{how}"
        );
        let r = s.execute("while True: pass", SECOND, &mut |_| {});
        assert_eq!(r.status, Status::Timeout, "{how}: {r:?}");
        assert!(s.is_alive(), "{how}: a timeout keeps the session");
        let r = run(&mut s, "kept");
        assert_eq!(r.results[0].text.as_deref(), Some("7"), "{how}: {r:?}");
        // An interrupt sent while idle does not stop the next execution.
        s.interrupter().interrupt();
        let r = run(&mut s, "import time\ntime.sleep(0.5)\nkept");
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
    }
}

#[test]
fn memory_kill_ends_the_session_with_memory_limit() {
    let mut options = SessionOptions::new(Language::Python);
    options.limits.memory_bytes = 256 << 20;
    let sessions = [
        ("direct", Session::create(&options).unwrap()),
        ("zygote", zygote().fork_session(&options).unwrap()),
    ];
    for (how, mut s) in sessions {
        let r = run(
            &mut s,
            "hog = bytearray(1 << 30)\nhog[::4096] = b'x' * len(hog[::4096])",
        );
        if corral_sandbox::cgroup_layout().is_some() && nix::unistd::geteuid().is_root() {
            assert_eq!(r.status, Status::MemoryLimit, "{how}: {r:?}");
            assert!(!s.is_alive(), "{how}");
            assert_eq!(
                run(&mut s, "1").status,
                Status::SandboxError,
                "{how}: dead sessions refuse"
            );
        } else {
            // Rlimit fallback: the allocation fails inside the kernel, which survives.
            assert_eq!(
                r.error.as_ref().map(|e| e.name.as_str()),
                Some("MemoryError"),
                "{how}: {r:?}"
            );
        }
    }
}

#[test]
fn restart_clears_state_and_keeps_files() {
    let mut s = Session::create(&SessionOptions::new(Language::Python)).unwrap();
    run(
        &mut s,
        "x = 1\nopen('kept.txt', 'w').write('file survives')",
    );
    s.restart().unwrap();
    let r = run(&mut s, "x");
    assert_eq!(r.error.map(|e| e.name), Some("NameError".to_string()));
    let r = run(&mut s, "open('kept.txt').read()");
    assert!(
        r.results[0]
            .text
            .as_deref()
            .unwrap_or("")
            .contains("file survives"),
        "{r:?}"
    );
}

#[test]
fn sessions_cannot_see_each_other() {
    let options = SessionOptions::new(Language::Python);
    let mut a = zygote().fork_session(&options).unwrap();
    let mut b = zygote().fork_session(&options).unwrap();
    let mut c = Session::create(&options).unwrap();
    run(&mut a, "secret = 'a-only'\nopen('/workspace/a.txt', 'w').write('a')\nopen('/tmp/a.tmp', 'w').write('a')\nimport subprocess\np = subprocess.Popen(['sleep', '60'])");
    for (name, other) in [("forked sibling", &mut b), ("direct", &mut c)] {
        let r = run(
            other,
            "import os\n\
             print('secret' in globals())\n\
             print(os.path.exists('/workspace/a.txt'), os.path.exists('/tmp/a.tmp'))\n\
             print(sum(1 for p in os.listdir('/proc') if p.isdigit() and 'sleep' in open(f'/proc/{p}/cmdline').read()))",
        );
        assert_eq!(r.stdout, "False\nFalse False\n0\n", "{name}: {r:?}");
    }
    // Sessions forked from one zygote draw different random numbers.
    let ra = run(
        &mut a,
        "import random, numpy\nprint(random.random(), numpy.random.random())",
    );
    let rb = run(
        &mut b,
        "import random, numpy\nprint(random.random(), numpy.random.random())",
    );
    assert_ne!(ra.stdout, rb.stdout);
}

/// The largest limits the HTTP API accepts (corral-server's `Limits::validate`) make a working
/// forked session: a 64 GiB workspace once failed before the kernel started.
#[test]
fn forked_sessions_take_the_largest_limits() {
    let mut options = SessionOptions::new(Language::Python);
    options.limits.memory_bytes = 64 << 30;
    options.limits.pids = 32_768;
    options.limits.cpus = 64.0;
    options.limits.timeout = Duration::from_secs(24 * 3600);
    for disk_mb in [1024, 4096, 64 << 10] {
        options.limits.disk_bytes = disk_mb << 20;
        let mut s = zygote()
            .fork_session(&options)
            .unwrap_or_else(|e| panic!("disk {disk_mb} MiB: {e}"));
        let r = run(
            &mut s,
            "import os\nst = os.statvfs('/workspace')\nprint(st.f_blocks * st.f_frsize >> 20)",
        );
        assert_eq!(
            r.stdout,
            format!("{disk_mb}\n"),
            "disk {disk_mb} MiB: {r:?}"
        );
    }
}

#[test]
fn forked_kernels_are_locked_down() {
    let mut s = zygote()
        .fork_session(&SessionOptions::new(Language::Python))
        .unwrap();
    let r = run(
        &mut s,
        "import os, ctypes\n\
         st = open('/proc/self/status').read()\n\
         print([l for l in st.splitlines() if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs', 'Seccomp:'))])\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         print(libc.unshare(0x10000000), ctypes.get_errno())\n\
         print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n\
         print(os.getuid(), open('/etc/hostname').read().strip(), sorted(os.listdir('/sys')) if os.path.exists('/sys') else 'no /sys')\n\
         import resource\n\
         print('LIMITS', resource.getrlimit(resource.RLIMIT_CORE), resource.getrlimit(resource.RLIMIT_NOFILE))\n\
         try:\n    open('/usr/corral-test', 'w')\nexcept OSError as e:\n    print('ro', e.errno)",
    );
    let out = r.stdout;
    assert!(out.contains("'CapEff:\\t0000000000000000'"), "{out}");
    assert!(out.contains("'CapBnd:\\t0000000000000000'"), "{out}");
    assert!(
        out.contains("'NoNewPrivs:\\t1'") && out.contains("'Seccomp:\\t2'"),
        "{out}"
    );
    assert!(
        out.contains("-1 1\n-1 1\n"),
        "unshare and mount must fail with EPERM: {out}"
    );
    assert!(out.contains("1000 corral no /sys"), "{out}");
    // The engine's rlimit set, applied by the forked kernel to itself.
    assert!(out.contains("LIMITS (1, 1) (4096, 4096)"), "{out}");
    assert!(out.contains("ro 30") || out.contains("ro 13"), "{out}");
}

/// A session's `/proc` masks what names the host (boot line, kernel build, hardware, disks),
/// whether the session was forked from the zygote (`rootfs::session_plan`) or started directly.
#[test]
fn sessions_see_nothing_of_the_hosts_boot_and_hardware() {
    let host_cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    for (how, mut s) in python_sessions() {
        let r = run(
            &mut s,
            "import os\n\
             for name in ('cmdline', 'config.gz', 'bootconfig', 'kallsyms', 'partitions', 'iomem', 'sys/kernel/random/boot_id'):\n\
             \x20   try:\n\
             \x20       print(name, len(open('/proc/' + name, 'rb').read()))\n\
             \x20   except OSError as e:\n\
             \x20       print(name, 'errno', e.errno)\n\
             print('bus', sorted(os.listdir('/proc/bus')) if os.path.isdir('/proc/bus') else 'absent')\n\
             print('CMDLINE', open('/proc/cmdline').read())",
        );
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        let out = &r.stdout;
        assert!(out.contains("cmdline 0\n"), "{how}: {out}");
        assert!(out.contains("CMDLINE \n"), "{how}: {out}");
        assert!(
            host_cmdline.trim().is_empty() || !out.contains(host_cmdline.trim()),
            "{how}: the host's boot line is visible: {out}"
        );
        for name in [
            "config.gz",
            "bootconfig",
            "kallsyms",
            "partitions",
            "iomem",
            "sys/kernel/random/boot_id",
        ] {
            assert!(
                out.contains(&format!("{name} 0\n")) || out.contains(&format!("{name} errno")),
                "{how}: /proc/{name} is readable: {out}"
            );
        }
        assert!(
            out.contains("bus []") || out.contains("bus absent"),
            "{how}: {out}"
        );
    }
}

#[test]
fn javascript_session_keeps_state_and_awaits() {
    let mut s = Session::create(&SessionOptions::new(Language::Javascript)).unwrap();
    assert_eq!(
        run(&mut s, "let a = 40; const b = 2;").status,
        Status::Success
    );
    let r = run(&mut s, "a + b");
    assert_eq!(r.results[0].text.as_deref(), Some("42"), "{r:?}");
    let r = run(&mut s, "await new Promise(r => setTimeout(() => r(5), 10))");
    assert_eq!(r.results[0].text.as_deref(), Some("5"), "{r:?}");
    let r = run(&mut s, "console.log('hi'); null.x");
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(r.error.map(|e| e.name), Some("TypeError".to_string()));
}

#[test]
fn bash_session_keeps_directory_and_variables() {
    let mut s = Session::create(&SessionOptions::new(Language::Bash)).unwrap();
    run(&mut s, "mkdir -p sub && cd sub && X=5");
    let r = run(&mut s, "pwd; echo $X");
    assert_eq!(r.stdout, "/workspace/sub\n5\n", "{r:?}");
    let r = run(&mut s, "false");
    assert_eq!(r.status, Status::Error);
}

#[test]
fn manager_lists_closes_and_expires_idle_sessions() {
    use corral_kernel::{ManagerError, SessionManager};
    let manager = SessionManager::new(Duration::from_secs(3600));
    let options = SessionOptions::new(Language::Bash);
    let kept = manager.create(&options, Duration::from_secs(600)).unwrap();
    let idle = manager
        .create(&options, Duration::from_millis(300))
        .unwrap();
    assert_eq!(manager.list().len(), 2);
    let r = manager
        .execute(&kept.id, "echo hi", &[], 10 * SECOND, &mut |_| {})
        .unwrap();
    assert_eq!(r.stdout, "hi\n");
    assert_eq!(manager.get(&kept.id).unwrap().executions, 1);
    assert!(matches!(
        manager.execute("sbx-nope", "true", &[], SECOND, &mut |_| {}),
        Err(ManagerError::NotFound(_))
    ));
    // The idle reaper runs every second.
    std::thread::sleep(Duration::from_millis(2500));
    let ids: Vec<String> = manager.list().into_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec![kept.id.clone()], "the idle session expired");
    assert!(matches!(
        manager.get(&idle.id),
        Err(ManagerError::NotFound(_))
    ));
    manager.close(&kept.id).unwrap();
    assert!(manager.list().is_empty());
}

/// The zygote path's lockdown is implemented by the zygote itself, so it gets attacks of its
/// own: each must fail, and the host and the session must be unaffected.
#[test]
fn forked_sessions_resist_attacks_on_their_init_and_the_host() {
    let secret = format!("corral-secret-{}", std::process::id());
    let planted = std::env::temp_dir().join(&secret);
    std::fs::write(&planted, &secret).unwrap();
    let mut s = zygote()
        .fork_session(&SessionOptions::new(Language::Python))
        .unwrap();
    let code = format!(
        "import os, ctypes, signal, socket\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def attempt(what, f):\n    try:\n        f(); print('ALLOWED', what)\n    except OSError as e:\n        print('BLOCKED', what, e.errno)\n\
         attempt('environ', lambda: open('/proc/1/environ').read())\n\
         attempt('mem', lambda: open('/proc/1/mem', 'rb').read(1))\n\
         attempt('setuid', lambda: os.setuid(0))\n\
         attempt('kill-init', lambda: os.kill(1, signal.SIGKILL))\n\
         attempt('interrupt-init', lambda: os.kill(1, signal.SIGINT))\n\
         attempt('secret', lambda: open({planted:?}).read())\n\
         print('PTRACE', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n\
         print('IFACES', [n for _, n in socket.if_nameindex()])\n\
         print('PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
        planted = planted.to_str().unwrap(),
    );
    let r = run(&mut s, &code);
    let out = &r.stdout;
    assert!(!out.contains("ALLOWED"), "{out}");
    for what in [
        "environ",
        "mem",
        "setuid",
        "kill-init",
        "interrupt-init",
        "secret",
    ] {
        assert!(
            out.contains(&format!("BLOCKED {what}")),
            "{what} not attempted: {out}"
        );
    }
    assert!(
        out.contains("PTRACE -1 1\n"),
        "ptrace must fail with EPERM: {out}"
    );
    assert!(out.contains("IFACES ['lo']"), "{out}");
    // Only the session's own init (1) and kernel (2) and its children exist in its pid space.
    assert!(out.contains("PIDS [1, 2"), "{out}");
    assert!(!out.contains(&secret), "{out}");
    // The session, its init and the host file are untouched.
    assert_eq!(run(&mut s, "40 + 2").results[0].text.as_deref(), Some("42"));
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), secret);
    std::fs::remove_file(&planted).unwrap();
}

fn command(session: &mut Session, argv: &[&str], cwd: Option<&str>) -> ExecutionResult {
    session
        .run_command(
            &strings(argv),
            cwd,
            &[],
            20 * SECOND,
            &Stopper::default(),
            &mut |_| {},
        )
        .expect("a valid command")
}

/// Every kind of session, Python both ways.
fn all_sessions() -> Vec<(&'static str, Session)> {
    let mut sessions = python_sessions();
    for language in [Language::Bash, Language::Javascript] {
        let s = Session::create(&SessionOptions::new(language)).expect("a session starts");
        sessions.push((language.name(), s));
    }
    sessions
}

#[test]
fn commands_run_in_the_sandbox_and_report_their_exit_code() {
    for (how, mut s) in all_sessions() {
        let mut events = Vec::new();
        let r = s
            .run_command(
                &strings(&[
                    "sh",
                    "-c",
                    "echo out; echo err >&2; pwd; id -u; echo $GREETING; exit 3",
                ]),
                None,
                &[("GREETING".into(), "hi".into())],
                20 * SECOND,
                &Stopper::default(),
                &mut |e| events.push(e.clone()),
            )
            .unwrap();
        assert_eq!(r.status, Status::Error, "{how}: {r:?}");
        assert_eq!(r.exit_code, Some(3), "{how}");
        assert_eq!(r.error, None, "{how}: an exit status is no language error");
        assert_eq!(
            r.error_message.as_deref(),
            Some("the command exited with status 3")
        );
        assert_eq!(r.stdout, "out\n/workspace\n1000\nhi\n", "{how}");
        assert_eq!(r.stderr, "err\n", "{how}");
        assert!(
            matches!(
                events.last(),
                Some(Event::End(End {
                    status: Status::Error,
                    ..
                }))
            ),
            "{how}: {events:?}"
        );
        assert!(
            events.iter().all(|e| matches!(
                e,
                Event::Stdout { .. } | Event::Stderr { .. } | Event::End(_)
            )),
            "{how}: {events:?}"
        );

        // Same workspace as the interpreter; cwd relative to it or absolute.
        let r = command(
            &mut s,
            &["sh", "-c", "mkdir -p sub && echo kept > sub/f"],
            None,
        );
        assert_eq!(
            (r.status, r.exit_code),
            (Status::Success, Some(0)),
            "{how}: {r:?}"
        );
        assert_eq!(
            command(&mut s, &["cat", "f"], Some("sub")).stdout,
            "kept\n",
            "{how}"
        );
        let r = command(&mut s, &["cat", "f"], Some("/workspace/sub"));
        assert_eq!(r.stdout, "kept\n", "{how}");

        let r = command(&mut s, &["corral-no-such-program"], None);
        assert_eq!(r.status, Status::Error, "{how}");
        assert_eq!(r.exit_code, None, "{how}");
        let e = r.error.expect("a CommandError");
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            (
                "CommandError",
                "No such file or directory: 'corral-no-such-program'"
            ),
            "{how}"
        );
        assert_eq!(s.executions(), 0, "{how}: commands are not executions");
        assert!(s.is_alive(), "{how}");
    }
}

#[test]
fn commands_leave_the_interpreter_state_alone() {
    for (how, mut s) in python_sessions() {
        run(&mut s, "x = 1\nbefore = get_ipython().execution_count");
        assert_eq!(command(&mut s, &["true"], None).status, Status::Success);
        let r = run(&mut s, "(x, get_ipython().execution_count - before)");
        assert_eq!(r.results[0].text.as_deref(), Some("(1, 1)"), "{how}: {r:?}");
        let files = run(&mut s, "open('/workspace/from-python', 'w').write('py')");
        assert_eq!(files.status, Status::Success, "{how}");
        let r = command(&mut s, &["cat", "from-python"], None);
        assert_eq!(r.stdout, "py", "{how}");
        assert_eq!(s.executions(), 3, "{how}");
    }
}

#[test]
fn interrupt_and_timeout_kill_the_command_group_and_keep_the_session() {
    for (how, mut s) in python_sessions() {
        run(&mut s, "kept = 7");
        let interrupter = s.interrupter();
        let t = std::thread::spawn(move || {
            std::thread::sleep(SECOND);
            interrupter.interrupt();
        });
        let r = command(&mut s, &["sh", "-c", "sleep 300 & sleep 300"], None);
        t.join().unwrap();
        assert_eq!(
            (r.status, r.exit_code),
            (Status::Error, Some(130)),
            "{how}: {r:?}"
        );
        let r = s
            .run_command(
                &strings(&["sh", "-c", "sleep 301 & sleep 301"]),
                None,
                &[],
                SECOND,
                &Stopper::default(),
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(r.status, Status::Timeout, "{how}: {r:?}");
        assert_eq!(r.exit_code, Some(130), "{how}");
        assert!(s.is_alive(), "{how}: a timeout keeps the session");
        // Nothing of either group is left, and the state is.
        let r = run(
            &mut s,
            "import os, time\ntime.sleep(0.2)\n\
             print(sum(1 for p in os.listdir('/proc') if p.isdigit() and b'sleep' in open(f'/proc/{p}/cmdline', 'rb').read()), kept)",
        );
        assert_eq!(r.stdout, "0 7\n", "{how}: {r:?}");
    }
}

#[test]
fn invalid_commands_are_refused_before_reaching_the_kernel() {
    use corral_kernel::KernelError;
    let mut s = Session::create(&SessionOptions::new(Language::Bash)).unwrap();
    let env = |k: &str| vec![(k.to_string(), "v".to_string())];
    type Case<'a> = (Vec<String>, Option<&'a str>, Vec<(String, String)>);
    let huge = vec!["echo".to_string(), "x".repeat(65 << 20)];
    let cases: [Case; 7] = [
        (huge, None, vec![]),
        (vec![], None, vec![]),
        (strings(&["echo", "a\0b"]), None, vec![]),
        (strings(&["true"]), Some("sub\0dir"), vec![]),
        (strings(&["true"]), None, env("")),
        (strings(&["true"]), None, env("A=B")),
        (strings(&["true"]), None, env("A\0")),
    ];
    for (argv, cwd, env) in cases {
        let mut events = 0;
        let r = s.run_command(&argv, cwd, &env, SECOND, &Stopper::default(), &mut |_| {
            events += 1
        });
        assert!(
            matches!(r, Err(KernelError::InvalidCommand(_))),
            "{argv:?} {cwd:?} {env:?}: {r:?}"
        );
        assert_eq!(events, 0, "nothing ran");
    }
    assert_eq!(command(&mut s, &["echo", "fine"], None).stdout, "fine\n");
}

#[test]
fn manager_runs_commands_beside_executions() {
    use corral_kernel::{KernelError, ManagerError, SessionManager};
    let manager = SessionManager::new(Duration::from_secs(3600));
    let info = manager
        .create(
            &SessionOptions::new(Language::Python),
            Duration::from_secs(600),
        )
        .unwrap();
    manager
        .execute(&info.id, "x = 5", &[], 10 * SECOND, &mut |_| {})
        .unwrap();
    let r = manager
        .run_command(
            &info.id,
            &strings(&["sh", "-c", "echo $A; exit 4"]),
            None,
            &[("A".into(), "b".into())],
            10 * SECOND,
            &Stopper::default(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!((r.stdout.as_str(), r.exit_code), ("b\n", Some(4)), "{r:?}");
    let got = manager.get(&info.id).unwrap();
    assert_eq!(got.executions, 1, "commands are not executions");
    assert!(got.last_used >= info.last_used && got.death.is_none());
    assert!(matches!(
        manager.run_command(
            &info.id,
            &[],
            None,
            &[],
            SECOND,
            &Stopper::default(),
            &mut |_| {}
        ),
        Err(ManagerError::Kernel(KernelError::InvalidCommand(_)))
    ));
    assert!(matches!(
        manager.run_command(
            "sbx-nope",
            &strings(&["true"]),
            None,
            &[],
            SECOND,
            &Stopper::default(),
            &mut |_| {}
        ),
        Err(ManagerError::NotFound(_))
    ));
    manager.close(&info.id).unwrap();
}

/// A stopper stops its own command, running or still waiting for the session, and no other:
/// not the one running while it waits, not the next one.
#[test]
fn a_stopper_stops_its_command_and_no_other() {
    use corral_kernel::SessionManager;
    use std::sync::mpsc;
    let manager = SessionManager::new(Duration::from_secs(3600));
    let info = manager
        .create(
            &SessionOptions::new(Language::Python),
            Duration::from_secs(600),
        )
        .unwrap();
    let id = info.id.as_str();
    let sh = |script: &str| strings(&["sh", "-c", script]);
    // Runs `script` with `stop`, telling `started` at its first output.
    let run = |script: &str, stop: &Stopper, started: mpsc::Sender<()>| {
        manager.run_command(id, &sh(script), None, &[], 30 * SECOND, stop, &mut |e| {
            if matches!(e, Event::Stdout { .. }) {
                let _ = started.send(());
            }
        })
    };
    let (stop, first_stop, second_stop) =
        (Stopper::default(), Stopper::default(), Stopper::default());
    std::thread::scope(|scope| {
        // Stopped while it runs: killed by SIGKILL, what it printed before is kept.
        let (started_tx, started) = mpsc::channel();
        let running =
            scope.spawn(|| run("echo started; sleep 60; echo finished", &stop, started_tx));
        started.recv().unwrap();
        assert!(stop.stop());
        let r = running.join().unwrap().unwrap();
        assert_eq!(
            (r.status, r.exit_code, r.signal, r.stdout.as_str()),
            (Status::Error, None, Some(9), "started\n"),
            "{r:?}"
        );
        assert!(!stop.stop(), "an ended command is not stopped again");

        // Stopped while it waits for the one that runs: it never starts, the other finishes.
        let (started_tx, started) = mpsc::channel();
        let first = scope.spawn(|| run("echo one; sleep 2; echo two", &first_stop, started_tx));
        started.recv().unwrap();
        let (unused_tx, _) = mpsc::channel();
        let second = scope.spawn(|| run("echo never > never.txt", &second_stop, unused_tx));
        assert!(second_stop.stop());
        let r = first.join().unwrap().unwrap();
        assert_eq!(
            (r.exit_code, r.stdout.as_str()),
            (Some(0), "one\ntwo\n"),
            "{r:?}"
        );
        let r = second.join().unwrap().unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
        assert!(!first_stop.stop() && !second_stop.stop());
    });
    // Nothing of the stops reaches the next command, which never ran the stopped one.
    let r = manager
        .run_command(
            id,
            &sh("ls never.txt"),
            None,
            &[],
            10 * SECOND,
            &Stopper::default(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!((r.status, r.exit_code), (Status::Error, Some(2)), "{r:?}");
    manager.close(id).unwrap();
}

/// A command stopped just as it starts, before its kernel is ready to take the interrupt
/// (the first command of a fresh kernel imports what it needs first), is killed all the same,
/// and its session lives on.
#[test]
fn a_command_stopped_as_it_starts_is_killed_and_its_session_lives() {
    for delay_ms in 0..12u64 {
        let mut s = zygote()
            .fork_session(&SessionOptions::new(Language::Python))
            .expect("a forked session starts");
        let stop = Stopper::default();
        let r = std::thread::scope(|scope| {
            let running = scope.spawn(|| {
                s.run_command(
                    &strings(&["sleep", "30"]),
                    None,
                    &[],
                    20 * SECOND,
                    &stop,
                    &mut |_| {},
                )
            });
            // Stops that land at different points of the command's start.
            std::thread::sleep(Duration::from_millis(delay_ms * 3));
            assert!(stop.stop());
            running.join().unwrap().unwrap()
        });
        assert_eq!(
            (r.exit_code, r.signal),
            (None, Some(9)),
            "{delay_ms}: {r:?}"
        );
        assert!(s.is_alive(), "{delay_ms}: {r:?}");
        assert_eq!(run(&mut s, "print(1)").stdout, "1\n");
    }
}

/// A session taken from the warm pool is a fresh interpreter to its client: the warm-up its
/// kernel ran left no trace (no history entry, no execution count), and the client's `env`
/// reaches it without a fork made for the request.
#[test]
fn pooled_sessions_take_their_env_and_show_nothing_of_the_warm_up() {
    let pool = full_pool(2);
    let mut options = SessionOptions::new(Language::Python);
    options.env = vec![("CORRAL_TENANT_VALUE".into(), "b's value".into())];
    let mut s = pool.acquire(&options).unwrap();
    assert_eq!(pool.ready_count(), 1, "the session came from the pool");
    let r = run(
        &mut s,
        "import os\nprint(os.environ['CORRAL_TENANT_VALUE'])\n\
         print(get_ipython().execution_count, len(In), len(Out))",
    );
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "b's value\n1 2 0\n");
    // The next pooled session never saw it.
    let mut other = pool
        .acquire(&SessionOptions::new(Language::Python))
        .unwrap();
    let r = run(
        &mut other,
        "import os\nprint('CORRAL_TENANT_VALUE' in os.environ)",
    );
    assert_eq!(r.stdout, "False\n", "{r:?}");
    // Variables no environment can hold are refused before any session is taken.
    options.env = vec![("A=B".into(), "1".into())];
    assert!(matches!(
        pool.acquire(&options),
        Err(corral_kernel::KernelError::InvalidCommand(_))
    ));
    pool.shutdown();
}

/// A session with a network policy, direct and forked: its proxy endpoint is its own, each
/// execution's result reports what went through during it, and a name off the list is refused
/// with a reason the code can read. The upstream is a server on the host's loopback, which the
/// policy's operator opt-in lets the allowed name resolve to.
#[test]
fn sessions_with_a_network_policy_reach_their_allowed_names_only() {
    use corral_egress::FixedResolver;
    use corral_sandbox::{Egress, NetworkPolicy};
    use std::io::{Read, Write};

    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in server.incoming().flatten() {
            let mut conn = conn;
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    let item = format!("ok.test:{port}");
    let mut options = SessionOptions::new(Language::Python);
    options.egress = Egress {
        policy: NetworkPolicy::from_items(&[item.as_str()], &["ok.test"]).unwrap(),
        resolver: std::sync::Arc::new(FixedResolver(
            [("ok.test".to_string(), vec!["127.0.0.1".parse().unwrap()])].into(),
        )),
        observer: None,
        share: Default::default(),
    };
    let fetch = format!(
        "import urllib.request\n\
         opener = urllib.request.build_opener(urllib.request.ProxyHandler())\n\
         print(opener.open('http://ok.test:{port}/').read().decode())"
    );
    let refused = "import urllib.request, urllib.error\n\
         try:\n    urllib.request.urlopen('http://example.com/')\n\
         except urllib.error.HTTPError as e:\n    print(e.code, e.reason)";
    for (how, mut s) in [
        ("direct", Session::create(&options).unwrap()),
        ("zygote", zygote().fork_session(&options).unwrap()),
    ] {
        let r = run(&mut s, &fetch);
        assert_eq!(r.status, Status::Success, "{how}: {r:?}");
        assert_eq!(r.stdout, "hello\n", "{how}: {r:?}");
        let network = r.network.as_ref().expect("a network report");
        assert_eq!(
            (network.connections, network.denied),
            (1, 0),
            "{how}: {r:?}"
        );
        let r = run(&mut s, refused);
        assert!(
            r.stdout.starts_with("403 corral: example.com is not on"),
            "{how}: {r:?}"
        );
        let network = r.network.as_ref().expect("a network report");
        assert_eq!(
            (network.connections, network.denied),
            (0, 1),
            "{how}: {r:?}"
        );
        let total = s.network_monitor().expect("a proxy").report();
        assert_eq!((total.connections, total.denied), (1, 1), "{how}");
    }
    // Without a policy: no proxy, no report.
    let mut s = zygote()
        .fork_session(&SessionOptions::new(Language::Python))
        .unwrap();
    let r = run(&mut s, "import os; print(os.environ.get('HTTPS_PROXY'))");
    assert_eq!(r.stdout, "None\n", "{r:?}");
    assert_eq!(r.network, None);
}

#[test]
fn a_per_execution_environment_is_set_for_that_execution_only() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let with = env(&[("CORRAL_ONE", "1"), ("HOME", "/elsewhere")]);
    let cases: Vec<(&str, Session, &str)> = python_sessions()
        .into_iter()
        .map(|(how, s)| {
            (
                how,
                s,
                "import os, subprocess\nprint(os.environ.get('CORRAL_ONE'), os.environ.get('HOME'), \
                 subprocess.run(['sh','-c','echo $CORRAL_ONE'], capture_output=True, text=True).stdout.strip())",
            )
        })
        .chain(std::iter::once((
            "javascript",
            Session::create(&SessionOptions::new(Language::Javascript)).unwrap(),
            "console.log(process.env.CORRAL_ONE, process.env.HOME, \
             require('child_process').execSync('echo $CORRAL_ONE').toString().trim())",
        )))
        .collect();
    for (how, mut s, code) in cases {
        let before = run(&mut s, code).stdout;
        let r = s
            .execute_with_env(code, &with, 20 * SECOND, &mut |_| {})
            .unwrap();
        assert_eq!(r.stdout.trim(), "1 /elsewhere 1", "{how}: {r:?}");
        // Put back as it was: an unset variable unset, a set one restored.
        assert_eq!(run(&mut s, code).stdout, before, "{how}");
        assert!(!before.contains("elsewhere"), "{how}: {before}");
    }
    let mut bash = Session::create(&SessionOptions::new(Language::Bash)).unwrap();
    let refused = bash
        .execute_with_env("echo $CORRAL_ONE", &with, 20 * SECOND, &mut |_| {})
        .unwrap_err();
    assert!(
        matches!(refused, KernelError::InvalidEnvironment(_)),
        "{refused}"
    );
    let mut python = zygote()
        .fork_session(&SessionOptions::new(Language::Python))
        .unwrap();
    for bad in [
        env(&[("", "x")]),
        env(&[("A=B", "x")]),
        env(&[("A", "x\0y")]),
    ] {
        let refused = python
            .execute_with_env("1", &bad, 20 * SECOND, &mut |_| {})
            .unwrap_err();
        assert!(
            matches!(refused, KernelError::InvalidEnvironment(_)),
            "{refused}"
        );
    }
    assert_eq!(python.executions(), 0, "nothing was sent");
}
