//! Programs run by a session's process agent (host image): beside executions, with stdin,
//! with a terminal, listed, connected to, signalled, and bounded.

use std::time::{Duration, Instant};

use corral_kernel::agent::{
    AgentError, AgentRefusal, OutputStream, ProcessEvent, ProcessExit, ProcessSpec, PtySize,
    Subscription, MAX_PENDING_INPUT, MAX_PROCESSES,
};
use corral_kernel::{Language, Session, SessionOptions};

mod support;
use support::{run, strings, zygote, SECOND};

fn session() -> Session {
    zygote()
        .fork_session(&SessionOptions::new(Language::Python))
        .expect("a forked session starts")
}

/// A share of a pool of output bytes larger than any test's output.
fn output() -> corral_share::Share {
    corral_share::Pool::new(
        "output",
        "bytes",
        corral_share::Limits::new(1 << 30, 1 << 30, 0, 0),
    )
    .share("k")
}

fn spec(argv: &[&str]) -> ProcessSpec {
    ProcessSpec {
        argv: strings(argv),
        ..ProcessSpec::default()
    }
}

/// Everything a subscription receives until the end (within `limit`): output by stream,
/// and the end.
fn collect(sub: &Subscription, limit: Duration) -> (Vec<u8>, Vec<u8>, Option<ProcessExit>) {
    let deadline = Instant::now() + limit;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match sub.next(left) {
            Some(ProcessEvent::Output { stream, data }) => match stream {
                OutputStream::Stderr => err.extend(data),
                _ => out.extend(data),
            },
            Some(ProcessEvent::Lost { bytes }) => panic!("{bytes} bytes lost"),
            Some(ProcessEvent::End(exit)) => return (out, err, exit),
            None => panic!(
                "no end within {limit:?}; so far: {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// Output until `needle` appears (within `limit`).
fn read_until(sub: &Subscription, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match sub.next(left) {
            Some(ProcessEvent::Output { data, .. }) => seen.extend(data),
            other => panic!(
                "waiting for {needle:?}: {other:?}; so far {:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[test]
fn programs_run_in_the_session_beside_its_executions() {
    let mut session = session();
    let agent = session.agent().expect("a forked session has an agent");
    // A program started while a cell runs ends before the cell does.
    let started = Instant::now();
    let handle = std::thread::spawn(move || {
        let sub = agent
            .start(
                spec(&["/bin/sh", "-c", "sleep 0.2; echo from-$0; pwd; id -u"]),
                &output(),
            )
            .expect("starts");
        collect(&sub, 10 * SECOND)
    });
    let result = session.execute(
        "import time; time.sleep(3); open('/workspace/cell.txt','w').write('x')",
        20 * SECOND,
        &mut |_| {},
    );
    let (out, err, exit) = handle.join().unwrap();
    assert!(result.error.is_none(), "{result:?}");
    assert!(started.elapsed() >= 3 * SECOND);
    assert_eq!(
        String::from_utf8_lossy(&out),
        "from-/bin/sh\n/workspace\n1000\n",
        "stderr: {}",
        String::from_utf8_lossy(&err)
    );
    assert_eq!(
        exit,
        Some(ProcessExit {
            exit_code: Some(0),
            signal: None
        })
    );
    // Same workspace as the cell's.
    let agent = session.agent().unwrap();
    let sub = agent.start(spec(&["cat", "cell.txt"]), &output()).unwrap();
    assert_eq!(collect(&sub, 10 * SECOND).0, b"x");
}

#[test]
fn stdin_is_sent_and_closed_and_exit_codes_and_signals_are_reported() {
    let session = session();
    let agent = session.agent().unwrap();
    let mut cat = spec(&["cat"]);
    cat.stdin = true;
    let sub = agent.start(cat, &output()).unwrap();
    agent.send_input(sub.pid(), b"hello ").unwrap();
    agent.send_input(sub.pid(), b"world").unwrap();
    agent.close_stdin(sub.pid()).unwrap();
    let (out, _, exit) = collect(&sub, 10 * SECOND);
    assert_eq!(out, b"hello world");
    assert_eq!(exit.unwrap().exit_code, Some(0));

    let sub = agent
        .start(spec(&["sh", "-c", "echo err >&2; exit 7"]), &output())
        .unwrap();
    let (_, err, exit) = collect(&sub, 10 * SECOND);
    assert_eq!(err, b"err\n");
    assert_eq!(exit.unwrap().exit_code, Some(7));

    // A signal goes to the program's whole group: the shell's child dies with it.
    let sub = agent
        .start(spec(&["sh", "-c", "sleep 300 & wait"]), &output())
        .unwrap();
    agent.signal(sub.pid(), libc::SIGTERM).unwrap();
    let (_, _, exit) = collect(&sub, 10 * SECOND);
    assert_eq!(exit.unwrap().signal, Some(libc::SIGTERM));
    assert!(agent.list().is_empty(), "{:?}", agent.list());

    // Without stdin, input is refused, and a program that is not found says so.
    let sub = agent.start(spec(&["sleep", "300"]), &output()).unwrap();
    assert!(matches!(
        agent.send_input(sub.pid(), b"x"),
        Err(AgentError::Refused(AgentRefusal::NoStdin(_)))
    ));
    agent.signal(sub.pid(), libc::SIGKILL).unwrap();
    assert_eq!(collect(&sub, 10 * SECOND).2.unwrap().signal, Some(9));
    let missing = agent
        .start(spec(&["no-such-program"]), &output())
        .err()
        .unwrap();
    assert!(missing.to_string().contains("no-such-program"), "{missing}");
}

#[test]
fn a_terminal_takes_input_resizes_and_is_killed() {
    let session = session();
    let agent = session.agent().unwrap();
    let mut bash = spec(&["bash", "--noprofile", "--norc", "-i"]);
    bash.pty = Some(PtySize { rows: 24, cols: 80 });
    let sub = agent.start(bash, &output()).unwrap();
    agent.send_input(sub.pid(), b"tty; stty size\n").unwrap();
    let seen = read_until(&sub, "24 80", 10 * SECOND);
    assert!(seen.contains("/dev/pts/"), "{seen}");
    agent
        .resize(
            sub.pid(),
            PtySize {
                rows: 40,
                cols: 100,
            },
        )
        .unwrap();
    agent.send_input(sub.pid(), b"stty size\n").unwrap();
    read_until(&sub, "40 100", 10 * SECOND);
    assert!(matches!(
        agent.close_stdin(sub.pid()),
        Err(AgentError::Refused(AgentRefusal::NoStdin(_)))
    ));
    agent.signal(sub.pid(), libc::SIGKILL).unwrap();
    let (_, _, exit) = collect(&sub, 10 * SECOND);
    assert_eq!(exit.unwrap().signal, Some(9));
}

#[test]
fn programs_are_listed_and_connected_to_from_now_on() {
    let session = session();
    let agent = session.agent().unwrap();
    let mut ticker = spec(&[
        "sh",
        "-c",
        "i=0; while true; do i=$((i+1)); echo t$i; sleep 0.1; done",
    ]);
    ticker.tag = Some("ticker".into());
    ticker.env = vec![("CORRAL_TEST".into(), "1".into())];
    let first = agent.start(ticker.clone(), &output()).unwrap();
    read_until(&first, "t3", 10 * SECOND);
    let listed = agent.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].pid, first.pid());
    assert_eq!(listed[0].spec, ticker);
    assert_eq!(agent.find_tag("ticker"), Some(first.pid()));
    drop(first);
    // A later subscriber sees what comes from now on.
    let second = agent.subscribe(listed[0].pid, &output()).unwrap();
    let seen = read_until(&second, "\n", 10 * SECOND);
    assert!(!seen.starts_with("t1\n"), "{seen}");
    agent.signal(listed[0].pid, libc::SIGKILL).unwrap();
    assert_eq!(collect(&second, 10 * SECOND).2.unwrap().signal, Some(9));
    assert!(matches!(
        agent.subscribe(listed[0].pid, &output()),
        Err(AgentError::Refused(AgentRefusal::NoSuchProcess(_)))
    ));
}

#[test]
fn process_count_and_unread_input_are_bounded() {
    let session = session();
    let agent = session.agent().unwrap();
    let mut held = Vec::new();
    for _ in 0..MAX_PROCESSES {
        held.push(agent.start(spec(&["sleep", "300"]), &output()).unwrap());
    }
    assert!(matches!(
        agent.start(spec(&["sleep", "300"]), &output()),
        Err(AgentError::Refused(AgentRefusal::TooManyProcesses))
    ));
    for sub in &held {
        agent.signal(sub.pid(), libc::SIGKILL).unwrap();
    }
    for sub in &held {
        collect(sub, 10 * SECOND);
    }
    // A program that never reads its input: the agent holds at most MAX_PENDING_INPUT of it
    // (plus what the pipe takes) and refuses the rest.
    let mut sleeper = spec(&["sleep", "300"]);
    sleeper.stdin = true;
    let sub = agent.start(sleeper, &output()).unwrap();
    let chunk = vec![b'x'; 16 << 10];
    let mut accepted = 0;
    let refused = loop {
        match agent.send_input(sub.pid(), &chunk) {
            Ok(()) => accepted += chunk.len(),
            Err(e) => break e,
        }
        assert!(accepted <= MAX_PENDING_INPUT + (1 << 20), "never refused");
    };
    assert!(
        matches!(refused, AgentError::Refused(AgentRefusal::InputFull(_))),
        "{refused}"
    );
    assert!(accepted >= MAX_PENDING_INPUT);
    agent.signal(sub.pid(), libc::SIGKILL).unwrap();
    collect(&sub, 10 * SECOND);
}

#[test]
fn code_contexts_are_other_interpreters_on_the_same_files() {
    let mut main = session();
    let agent = main.agent().unwrap();
    let context = |language| {
        Session::start_context(
            agent.clone(),
            SessionOptions::new(language),
            main.workspace().clone(),
            None,
            vec![],
        )
        .expect("a context starts")
    };
    let mut js = context(Language::Javascript);
    let mut python = context(Language::Python);
    let mut bash = context(Language::Bash);
    assert!(run(
        &mut main,
        "x = 1; open('shared.txt', 'w').write('from main')"
    )
    .error
    .is_none());
    let r = run(
        &mut js,
        "require('fs').readFileSync('/workspace/shared.txt', 'utf8') + ' ' + (6 * 7)",
    );
    assert_eq!(
        r.results[0].text.as_deref(),
        Some("'from main 42'"),
        "{r:?}"
    );
    // A separate interpreter: no `x` there, and its own state kept.
    let r = run(&mut python, "x");
    assert_eq!(r.error.map(|e| e.name).as_deref(), Some("NameError"));
    run(&mut python, "y = 5");
    assert_eq!(
        run(&mut python, "y * 2").results[0].text.as_deref(),
        Some("10")
    );
    assert_eq!(run(&mut bash, "cat shared.txt").stdout, "from main");
    // A timeout interrupts the context and keeps it.
    let r = python.execute("import time; time.sleep(60)", SECOND, &mut |_| {});
    assert_eq!(r.status, corral_sandbox::Status::Timeout, "{r:?}");
    assert_eq!(run(&mut python, "y").results[0].text.as_deref(), Some("5"));
    // A restart loses the state, keeps the files; the contexts are no processes.
    python.restart().unwrap();
    assert_eq!(
        run(&mut python, "y").error.map(|e| e.name).as_deref(),
        Some("NameError")
    );
    assert!(agent.list().is_empty(), "{:?}", agent.list());
    // A context that exits is dead, and its session goes on.
    let r = run(&mut js, "process.exit(3)");
    assert!(!js.is_alive(), "{r:?}");
    assert_eq!(run(&mut main, "x").results[0].text.as_deref(), Some("1"));
}

#[test]
fn the_sessions_code_cannot_reach_into_the_agent() {
    let mut session = session();
    let agent = session.agent().unwrap();
    let sub = agent
        .start(
            spec(&[
                "sh",
                "-c",
                "echo $PPID; ls -l /proc/self/fd/ | grep -c zygote; sleep 30",
            ]),
            &output(),
        )
        .unwrap();
    let seen = read_until(&sub, "\n", 10 * SECOND);
    let agent_pid: i32 = seen.lines().next().unwrap().trim().parse().unwrap();
    let code = format!(
        "import os\ntry:\n    open('/proc/{agent_pid}/mem', 'rb').read(1)\n    print('READ')\n\
         except OSError as e:\n    print(type(e).__name__)\n\
         print(sorted(os.listdir('/proc/{agent_pid}/fd')) if os.access('/proc/{agent_pid}/fd', os.R_OK) else 'no fds')"
    );
    let r = run(&mut session, &code);
    assert!(!r.stdout.contains("READ"), "{r:?}");
    assert!(r.stdout.contains("PermissionError"), "{r:?}");
    assert!(r.stdout.contains("no fds"), "{r:?}");
    agent.signal(sub.pid(), libc::SIGKILL).unwrap();
}

/// Sessions whose kernel runs in a sandbox of its own (never forked: every JavaScript and
/// bash session, a Python session without a zygote, any session after a restart) have an
/// agent too: its programs run in the session's sandbox, on its files, with its environment,
/// and the session's code cannot reach into it.
#[test]
fn sessions_in_a_sandbox_of_their_own_have_an_agent() {
    for (language, write, probe) in [
        (
            Language::Python,
            "open('k.txt', 'w').write('kernel')",
            "import os\ntry:\n    open('/proc/{pid}/mem', 'rb').read(1)\n    print('READ')\n\
             except OSError as e:\n    print(type(e).__name__)",
        ),
        (
            Language::Javascript,
            "require('fs').writeFileSync('k.txt', 'kernel')",
            "try { require('fs').readFileSync('/proc/{pid}/mem'); console.log('READ') } \
             catch (e) { console.log(e.code) }",
        ),
        (
            Language::Bash,
            "printf kernel > k.txt",
            "cat /proc/{pid}/mem >/dev/null 2>&1 && echo READ || echo denied",
        ),
    ] {
        let mut options = SessionOptions::new(language);
        options.env = vec![("OWN_ENV".into(), "yes".into())];
        let mut session = Session::create(&options).expect("a session starts");
        let r = run(&mut session, write);
        assert!(r.error.is_none(), "{language:?}: {r:?}");
        for round in ["created", "restarted"] {
            let agent = session
                .agent()
                .unwrap_or_else(|e| panic!("{language:?} {round}: {e}"));
            let sub = agent
                .start(
                    spec(&["sh", "-c", "echo $OWN_ENV $PPID; cat k.txt"]),
                    &output(),
                )
                .unwrap();
            let (out, _, exit) = collect(&sub, 10 * SECOND);
            assert_eq!(
                exit.and_then(|e| e.exit_code),
                Some(0),
                "{language:?} {round}"
            );
            let out = String::from_utf8(out).unwrap();
            let (first, rest) = out.split_once('\n').unwrap();
            assert_eq!(rest, "kernel", "{language:?} {round}: {out}");
            let (env, agent_pid) = first.split_once(' ').unwrap();
            assert_eq!(env, "yes", "{language:?} {round}: {out}");
            let r = run(&mut session, &probe.replace("{pid}", agent_pid));
            assert!(!r.stdout.contains("READ"), "{language:?} {round}: {r:?}");
            assert!(
                ["PermissionError", "EACCES", "denied"]
                    .iter()
                    .any(|d| r.stdout.contains(d)),
                "{language:?} {round}: {r:?}"
            );
            if round == "created" {
                session.restart().expect("a restart");
            }
        }
    }
}
