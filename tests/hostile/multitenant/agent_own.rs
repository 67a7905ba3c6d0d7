//! The process agent of a sandbox of its own (issue 22): a JavaScript session, which is never
//! forked from a zygote, has an agent locked down exactly as a forked session's is (the same
//! seccomp filters, capabilities, `no_new_privs`, uid and rlimits as its kernel's; the same as
//! the forked agent's, whose zygote's filters come on top), which the session's code cannot reach into, whose programs cannot trace
//! the kernel, live in the sandbox's cgroup and die with the sandbox, and which another tenant
//! cannot reach; nothing is left on the host after.

use super::*;

/// The lockdown lines of `/proc/<pid>/status` and the whole `/proc/<pid>/limits`, read from
/// a program the agent started (`$PPID` is the agent).
const LOCKDOWN: &str = "for p in $PPID $KERNEL; do \
    grep -E '^(Uid|Gid|Groups|NoNewPrivs|Seccomp|Seccomp_filters|Cap(Inh|Prm|Eff|Bnd|Amb)):' \
    /proc/$p/status; cat /proc/$p/limits; echo ===; done";

/// The host pids of the processes whose command line holds `marker`.
fn host_pids_with(marker: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[test]
fn the_agent_of_a_sandbox_of_its_own_is_locked_down_as_a_forked_ones() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let forked = s.session(&key_a, &json!({}));
    let own = s.session(&key_a, &json!({"language": "javascript"}));
    let kernel_pid = |id: &str, code: &str| -> String {
        let o = s.exec(&key_a, id, code);
        o.stdout().trim().to_string()
    };
    let forked_kernel = kernel_pid(&forked, "import os; print(os.getpid())");
    let own_kernel = kernel_pid(&own, "console.log(process.pid)");

    // The same lockdown: the own agent's is its kernel's, and the forked agent's.
    let own_lockdown = s.agent_output(&key_a, &own, &format!("KERNEL={own_kernel}; {LOCKDOWN}"));
    let forked_lockdown = s.agent_output(
        &key_a,
        &forked,
        &format!("KERNEL={forked_kernel}; {LOCKDOWN}"),
    );
    let parts: Vec<&str> = own_lockdown.split("===\n").collect();
    assert_eq!(parts.len(), 3, "{own_lockdown}");
    assert!(parts[0].contains("NoNewPrivs:\t1"), "{own_lockdown}");
    assert!(
        parts[0].contains("CapEff:\t0000000000000000"),
        "{own_lockdown}"
    );
    assert!(parts[0].contains("Seccomp:\t2"), "{own_lockdown}");
    assert!(parts[0].contains("Max processes"), "{own_lockdown}");
    assert_eq!(
        parts[0], parts[1],
        "the own agent is locked down as its kernel"
    );
    // A forked session also carries its zygote's filters below the workload's: all but the
    // count of filters is the same.
    let without_count = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.starts_with("Seccomp_filters:"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    assert!(parts[0].contains("Seccomp_filters:\t2\n"), "{own_lockdown}");
    assert_eq!(
        without_count(parts[0]),
        without_count(forked_lockdown.split("===\n").next().unwrap()),
        "the own agent is locked down as a forked session's"
    );

    // The session's code cannot reach into the agent (not dumpable).
    let agent_pid = s.agent_output(&key_a, &own, "echo $PPID");
    let agent_pid = agent_pid.trim();
    let o = s.exec(
        &key_a,
        &own,
        &format!(
            "const fs = require('fs'); const r = [];\n\
             for (const f of ['mem', 'environ', 'fd']) {{\n\
               try {{ f === 'fd' ? fs.readdirSync(`/proc/{agent_pid}/fd`) : fs.readFileSync(`/proc/{agent_pid}/${{f}}`); r.push(f + ':READ'); }}\n\
               catch (e) {{ r.push(f + ':' + e.code); }}\n\
             }}\n\
             console.log(r.join(' '))"
        ),
    );
    assert_eq!(
        o.stdout().trim(),
        "mem:EACCES environ:EACCES fd:EACCES",
        "{}",
        o.dump()
    );
    // The agent's programs cannot trace the kernel (seccomp: EPERM).
    let traced = s.agent_output(
        &key_a,
        &own,
        &format!(
            "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); \
             print(libc.ptrace(16, {own_kernel}, 0, 0), ctypes.get_errno())'"
        ),
    );
    assert_eq!(
        traced.trim(),
        "-1 1",
        "PTRACE_ATTACH on the kernel: {traced}"
    );

    // Another tenant cannot reach the own sandbox's programs.
    let (pid, _stream) = s.start_process(
        &key_a,
        &own,
        &json!({"cmd": "sleep", "args": ["600"], "tag": "victim"}),
    );
    for (method, path, body) in [
        ("GET", format!("/v1/sandboxes/{own}/processes"), None),
        (
            "POST",
            format!("/v1/sandboxes/{own}/processes/{pid}/signal"),
            Some(json!({"signal": "SIGKILL"})),
        ),
        (
            "POST",
            format!("/v1/sandboxes/{own}/processes"),
            Some(json!({"cmd": "true"})),
        ),
    ] {
        let (status, answer) = s.call(method, &path, &key_b, body.as_ref());
        assert_eq!(status, 404, "B: {method} {path}: {answer}");
    }
    assert_eq!(s.processes(&key_a, &own), vec![pid]);

    // The agent's programs live in the sandbox's cgroup, as the session's own do, and die
    // with the sandbox.
    let (by_agent, by_code) = (marker("agent"), marker("code"));
    let _daemon = s.start_process(
        &key_a,
        &own,
        &json!({"cmd": "bash", "args": ["-c", format!("exec -a {by_agent} sleep 600")]}),
    );
    let o = s.exec(
        &key_a,
        &own,
        &format!(
            "require('child_process').spawn('bash', ['-c', 'exec -a {by_code} sleep 600'], \
             {{detached: true, stdio: 'ignore'}}).unref(); console.log('spawned')"
        ),
    );
    assert_eq!(o.stdout().trim(), "spawned", "{}", o.dump());
    assert!(wait_until(Duration::from_secs(10), || {
        host_pids_with(&by_agent).len() == 1 && host_pids_with(&by_code).len() == 1
    }));
    let cgroup = |m: &str| fs::read_to_string(format!("/proc/{}/cgroup", host_pids_with(m)[0]));
    let (agent_cgroup, code_cgroup) = (cgroup(&by_agent).unwrap(), cgroup(&by_code).unwrap());
    assert_eq!(agent_cgroup, code_cgroup);
    if cgroups_of(s.pid()).is_empty() {
        // The rlimit fallback (rootless without a delegated cgroup, docs/threat-model.md): no
        // sandbox has a cgroup; as root with a cgroup layout that is not allowed.
        assert!(
            !running_as_root() || corral_sandbox::cgroup_layout().is_none(),
            "as root the sandbox has a cgroup of its own"
        );
    } else {
        assert_ne!(
            agent_cgroup,
            fs::read_to_string(format!("/proc/{}/cgroup", s.pid())).unwrap(),
            "the sandbox's cgroup is not the server's"
        );
    }
    s.delete(&key_a, &own);
    assert!(
        wait_until(Duration::from_secs(10), || host_pids_with(&by_agent)
            .is_empty()
            && host_pids_with(&by_code).is_empty()),
        "SANDBOX HOLE: the agent's program outlived its sandbox"
    );
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
