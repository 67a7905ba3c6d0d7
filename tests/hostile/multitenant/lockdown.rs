//! One lockdown (issue 18 item 5): the sequence that locks a workload down has one
//! implementation, and every way the server makes a workload ends in the same state. A
//! program that reads its own lockdown (`attacks/mt_lockdown.py`: the status lines, how every
//! entry of `/proc` that is not a process is masked, the mounts below `/proc`, and what the
//! filters and Landlock answer to the calls they refuse) gets the same answers in a sandbox of
//! the engine's own (`corral run`), in one-shot runs of the server served from a fork of either
//! zygote and from a fresh interpreter, and in sessions of another key, pooled and freshly
//! forked; and none of those calls is allowed anywhere. (A forked workload mounts its own
//! `/proc` over its zygote's, which it cannot reach: the covered one is not compared, and the
//! visible one must be the workload's own.) Drift between two lockdowns, as the
//! zygote's Python copy once had (Landlock optional in one, another list of masked `/proc`
//! files), fails here whatever `/proc/<pid>/status` says.

use super::*;

/// The lockdown state a workload printed.
fn lockdown_of(label: &str, o: &Outcome) -> Value {
    o.assert_completed();
    serde_json::from_str(o.value("LOCKDOWN"))
        .unwrap_or_else(|e| panic!("{label}: no LOCKDOWN line ({e})\n{}", o.dump()))
}

/// Every difference between two lockdown states, field by field.
fn differences(label: &str, reference: &Value, state: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for part in ["status", "proc", "syscalls"] {
        let (want, got) = (&reference[part], &state[part]);
        let names: std::collections::BTreeSet<&String> = want
            .as_object()
            .into_iter()
            .chain(got.as_object())
            .flat_map(|o| o.keys())
            .collect();
        for name in names {
            if want[name] != got[name] {
                found.push(format!(
                    "{label}: {part} {name} is {} where `corral run` has {}",
                    got[name], want[name]
                ));
            }
        }
    }
    if state["proc_is_own"] != true {
        found.push(format!("{label}: /proc/self is not the workload itself"));
    }
    if reference["proc_mounts"] != state["proc_mounts"] {
        found.push(format!(
            "{label}: the mounts below /proc are {} where `corral run` has {}",
            state["proc_mounts"], reference["proc_mounts"]
        ));
    }
    found
}

#[test]
fn every_workload_of_the_server_is_locked_down_as_a_sandbox_of_its_own() {
    let _g = shared();
    let attack = include_str!("../attacks/mt_lockdown.py");
    // The engine's own sandbox: the reference.
    let reference = Run::python(attack).run();
    let reference = lockdown_of("corral run", &reference);
    let mut found = Vec::new();
    if reference["proc_is_own"] != true || reference["proc_covered"] != 0 {
        found.push(format!(
            "corral run: its /proc is not its own alone: {reference}"
        ));
    }
    // Not a vacuous comparison: the reference is locked down.
    for (line, value) in [
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
        ("CapEff", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("CapAmb", "0000000000000000"),
    ] {
        if reference["status"][line] != value {
            found.push(format!(
                "corral run: {line} is {} (expected {value})",
                reference["status"][line]
            ));
        }
    }
    assert!(
        reference["proc"]["timer_list"]
            .as_str()
            .is_some_and(|m| m.contains("covered"))
            && !reference["proc_mounts"].as_array().unwrap().is_empty(),
        "the reference has no masked /proc: {reference}"
    );

    let s = Server::start(1);
    s.wait_pool(1);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let code = program(attack, &json!({}));
    let mut states = Vec::new();
    // One-shot runs of tenant A: a fork of the lean zygote (the standard library only), of the
    // full one (a module outside it), and a fresh interpreter (an `env` variable the
    // interpreter reads while starting).
    for (label, body) in [
        ("a run forked from the lean zygote", json!({ "code": code })),
        (
            "a run forked from the full zygote",
            json!({ "code": format!("import numpy\n{code}") }),
        ),
        (
            "a run in a fresh interpreter",
            json!({"code": code, "env": {"TZ": "UTC"}}),
        ),
    ] {
        let o = s.run(&key_a, &body);
        states.push((label, lockdown_of(label, &o)));
    }
    // Sessions of tenant B: from the warm pool, and freshly forked.
    for (label, body) in [
        ("a pooled session", json!({})),
        (
            "a freshly forked session",
            json!({"limits": {"memory_mb": 700}}),
        ),
    ] {
        let id = s.session(&key_b, &body);
        let o = s.exec(&key_b, &id, &code);
        states.push((label, lockdown_of(label, &o)));
        s.delete(&key_b, &id);
    }
    let host = s.stop();

    for (label, state) in std::iter::once(&("corral run", reference.clone())).chain(&states) {
        for (call, answer) in state["syscalls"].as_object().unwrap() {
            if answer.as_str().is_some_and(|a| a.starts_with("ret ")) {
                found.push(format!("{label}: {call} was allowed ({answer})"));
            }
        }
    }
    for (label, state) in &states {
        found.extend(differences(label, &reference, state));
    }
    verdict(
        "a workload of the server is locked down otherwise than a sandbox of its own",
        &found,
        &host,
    );
}
