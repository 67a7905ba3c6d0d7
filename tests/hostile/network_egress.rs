//! Egress through the host's proxy (docs/network.md): attacks from a sandbox that has a
//! network policy. Each asserts that nothing left the sandbox: a listener of the host's (on
//! every address, and loopback) saw no connection, no datagram, and where the engine runs in
//! this process with a resolver of the test's, that no name off the list was ever looked up.
//! The runs through `corral run` use names that need no resolver, or `localhost`.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_sandbox::egress::{ConnectionShare, FixedResolver, Resolve};
use corral_sandbox::{Egress, Limits, NetworkPolicy};

use crate::harness::*;
use crate::network::host_ip;

/// A TCP listener on every IPv4 address of the host (and IPv6, where it can have the same
/// port) that must see nothing, or only a test's control connection.
struct HostListener {
    v4: TcpListener,
    v6: Option<TcpListener>,
    port: u16,
}

impl HostListener {
    fn new() -> HostListener {
        let v4 = TcpListener::bind("0.0.0.0:0").unwrap();
        v4.set_nonblocking(true).unwrap();
        let port = v4.local_addr().unwrap().port();
        let v6 = TcpListener::bind(("::", port)).ok();
        if let Some(l) = &v6 {
            l.set_nonblocking(true).unwrap();
        }
        HostListener { v4, v6, port }
    }

    /// The connections that arrived, with the first bytes each sent.
    fn accepted(&self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(100));
        let mut got = Vec::new();
        for l in std::iter::once(&self.v4).chain(&self.v6) {
            loop {
                match l.accept() {
                    Ok((mut c, _)) => {
                        c.set_read_timeout(Some(Duration::from_millis(500)))
                            .unwrap();
                        let mut buf = vec![0u8; 4096];
                        let n = c.read(&mut buf).unwrap_or(0);
                        got.push(buf[..n].to_vec());
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => panic!("listener: {e}"),
                }
            }
        }
        got
    }

    fn assert_nothing(&self) {
        let got = self.accepted();
        assert!(
            got.is_empty(),
            "SANDBOX HOLE: the host listener got {} connection(s): {got:?}",
            got.len()
        );
    }
}

/// A resolver of fixed names that records every name it was asked for.
#[derive(Debug)]
struct Recording {
    table: FixedResolver,
    asked: Mutex<Vec<String>>,
}

impl Resolve for Recording {
    fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
        self.asked.lock().unwrap().push(name.to_string());
        self.table.resolve(name)
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The engine's egress with these policy items, opted-in names and name table.
fn egress(
    items: &[String],
    private: &[&str],
    table: &[(&str, Vec<IpAddr>)],
) -> (Egress, Arc<Recording>) {
    let private: Vec<String> = private.iter().map(|s| s.to_string()).collect();
    let policy = NetworkPolicy::from_items(items, &private).unwrap();
    let resolver = Arc::new(Recording {
        table: FixedResolver(
            table
                .iter()
                .map(|(name, addrs)| (name.to_string(), addrs.clone()))
                .collect::<HashMap<_, _>>(),
        ),
        asked: Mutex::new(Vec::new()),
    });
    let egress = Egress {
        policy,
        resolver: resolver.clone(),
        observer: None,
        share: Default::default(),
    };
    (egress, resolver)
}

/// The engine's egress that allows `ok.test:PORT` alone: a name the operator opted in that
/// resolves to 127.0.0.1, where a test's listener on the host waits.
fn ok_test(port: u16) -> Egress {
    egress(
        &[format!("ok.test:{port}")],
        &["ok.test"],
        &[("ok.test", vec![ip("127.0.0.1")])],
    )
    .0
}

/// The attack script's `name` attack, aimed at `port`, with `corral run --net allow:ITEMS`.
fn attack_net(name: &str, port: u16, items: &str) -> Run {
    attack(name, port)
        .arg("--net")
        .arg(format!("allow:{items}"))
}

/// Runs `run`; it completed and nothing escaped its sandbox.
fn contained(run: Run) -> Outcome {
    let o = run.run();
    o.assert_completed();
    o.assert_no_escape();
    o
}

/// Every refusal of `o`'s report was for one of `reasons`; there were `count` of them.
fn assert_denials(o: &Outcome, count: Option<usize>, reasons: &[&str]) {
    let d = denials(o);
    if let Some(count) = count {
        assert_eq!(d.len(), count, "{}", o.dump());
    }
    assert!(
        d.iter().all(|(_, r)| reasons.contains(&r.as_str())),
        "{}",
        o.dump()
    );
}

fn attack(name: &str, port: u16) -> Run {
    let host = host_ip().unwrap_or(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    Run::python(include_str!("attacks/net_egress.py"))
        .env("ATTACK", name)
        .env("PORT", port.to_string())
        .env("HOST_IP", host.to_string())
        .env("MARK", marker("egress"))
}

fn denials(o: &Outcome) -> Vec<(String, String)> {
    o.j()["network"]["denials"]
        .as_array()
        .unwrap_or_else(|| panic!("no network report\n{}", o.dump()))
        .iter()
        .map(|d| {
            (
                d["host"].as_str().unwrap_or("").to_string(),
                d["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn egress_dns_has_no_resolver_and_names_off_the_list_are_never_looked_up() {
    let _g = shared();
    let l = HostListener::new();
    let (egress, resolver) = egress(&["ok.test".into()], &[], &[]);
    let o = contained(attack("dns", l.port).engine_egress(egress, Limits::default()));
    let eai = &["EAI-2", "EAI-3", "EAI-5", "EAI-8", "EAI-11"];
    o.assert_blocked("getaddrinfo-listed", eai);
    o.assert_blocked("getaddrinfo-public", eai);
    assert_eq!(o.value("NAMESERVERS"), "0", "{}", o.dump());
    for what in [
        "connect-off-list",
        "http-off-list",
        "connect-resolver",
        "connect-public-resolver",
    ] {
        o.assert_blocked(what, &["HTTP403"]);
    }
    assert_eq!(
        resolver.asked.lock().unwrap().as_slice(),
        &[] as &[String],
        "SANDBOX HOLE: the proxy looked names up for the sandbox"
    );
    assert_eq!(o.j()["network"]["denied"], 4, "{}", o.dump());
    l.assert_nothing();
}

#[test]
fn egress_address_literals_are_refused_in_every_notation() {
    let _g = shared();
    let l = HostListener::new();
    let o = contained(attack_net(
        "literals",
        l.port,
        &format!("ok.test:{}", l.port),
    ));
    for what in [
        "v4",
        "v4-other",
        "host-ip",
        "v6",
        "mapped",
        "decimal",
        "hex",
        "short",
        "octal",
        "unspecified",
    ] {
        o.assert_blocked(&format!("connect-{what}"), &["HTTP403", "HTTP400"]);
    }
    o.assert_blocked("http-v4", &["HTTP403"]);
    o.assert_blocked("http-v6", &["HTTP403"]);
    assert_denials(&o, None, &["ip_literal", "invalid_request"]);
    l.assert_nothing();
}

#[test]
fn egress_allowed_names_that_resolve_to_internal_addresses_are_refused() {
    let _g = shared();
    let l = HostListener::new();
    let own = host_ip().unwrap_or(ip("127.0.0.1"));
    let names = [
        "loop.test",
        "own.test",
        "mapped.test",
        "sixtofour.test",
        "mixed.test",
    ];
    let items: Vec<String> = names.iter().map(|n| format!("{n}:{}", l.port)).collect();
    let table = [
        ("loop.test", vec![ip("127.0.0.1")]),
        ("own.test", vec![own]),
        ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
        ("sixtofour.test", vec![ip("2002:7f00:1::")]),
        ("mixed.test", vec![ip("127.0.0.1"), own, ip("::1")]),
    ];
    let (egress, _) = egress(&items, &[], &table);
    let o = contained(attack("internal", l.port).engine_egress(egress, Limits::default()));
    for name in names {
        o.assert_blocked(&format!("connect-{name}"), &["HTTP403"]);
        o.assert_blocked(&format!("http-{name}"), &["HTTP403"]);
    }
    assert_denials(&o, Some(10), &["internal_address"]);
    l.assert_nothing();

    // The same through `corral run` and the host's own resolver: localhost.
    let o = contained(attack_net(
        "localhost",
        l.port,
        &format!("localhost:{}", l.port),
    ));
    o.assert_blocked("connect-localhost", &["HTTP403"]);
    o.assert_blocked("http-localhost", &["HTTP403"]);
    assert!(
        o.stdout().contains("resolves only to internal addresses"),
        "{}",
        o.dump()
    );
    l.assert_nothing();
}

#[test]
fn egress_a_tls_server_name_other_than_the_allowed_one_is_refused() {
    let _g = shared();
    let l = HostListener::new();
    let o = contained(attack("fronting", l.port).engine_egress(ok_test(l.port), Limits::default()));
    for what in ["sni-other", "sni-none", "sni-suffix", "sni-address"] {
        o.assert_blocked(what, &["TLS-ALERT"]);
    }
    assert!(o.has_line("CONTROL sni-right through"), "{}", o.dump());
    // Only the control reached the host, and it carried the allowed name.
    let got = l.accepted();
    assert_eq!(got.len(), 1, "SANDBOX HOLE: {got:?}\n{}", o.dump());
    assert_eq!(got[0].first(), Some(&0x16), "{got:?}");
    assert_denials(&o, Some(4), &["tls_server_name"]);
}

#[test]
fn egress_other_protocols_and_ports_are_refused() {
    let _g = shared();
    let l = HostListener::new();
    let o =
        contained(attack("protocols", l.port).engine_egress(ok_test(l.port), Limits::default()));
    o.assert_blocked("port-not-allowed", &["HTTP403"]);
    for what in [
        "ssh-in-tunnel",
        "http-in-tunnel",
        "smtp-in-tunnel",
        "not-a-hello",
    ] {
        o.assert_blocked(what, &["TLS-ALERT"]);
    }
    o.assert_blocked("https-absolute", &["HTTP501"]);
    o.assert_blocked("host-mismatch", &["HTTP400"]);
    l.assert_nothing();
}

#[test]
fn egress_a_range_rule_carries_any_protocol_to_its_addresses_only() {
    let _g = shared();
    let l = HostListener::new();
    let o = contained(attack_net(
        "range",
        l.port,
        &format!("127.0.0.1/32:{}", l.port),
    ));
    assert!(o.has_line("CONTROL raw-to-rule through"), "{}", o.dump());
    o.assert_blocked("raw-next-door", &["HTTP403"]);
    o.assert_blocked("raw-other-port", &["HTTP403"]);
    let got = l.accepted();
    assert_eq!(got.len(), 1, "SANDBOX HOLE: {got:?}\n{}", o.dump());
    assert!(got[0].starts_with(b"SSH-2.0"), "{got:?}");
}

#[test]
fn egress_udp_goes_nowhere() {
    let _g = shared();
    let u = UdpSocket::bind("0.0.0.0:0").unwrap();
    u.set_nonblocking(true).unwrap();
    let port = u.local_addr().unwrap().port();
    let o = contained(attack_net("udp", port, "ok.test"));
    o.assert_blocked("udp-loopback", &["ECONNREFUSED", "TIMEOUT"]);
    o.assert_blocked("udp-host-ip", &["ENETUNREACH", "EHOSTUNREACH"]);
    o.assert_blocked("udp-proxy-port", &["ECONNREFUSED", "TIMEOUT"]);
    o.assert_blocked("udp-dns", &["ENETUNREACH", "EHOSTUNREACH"]);
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = [0u8; 256];
    match u.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("SANDBOX HOLE: the host UDP socket got {other:?}"),
    }
}

#[test]
fn egress_ipv6_goes_nowhere() {
    let _g = shared();
    let l = HostListener::new();
    let o = contained(attack_net("ipv6", l.port, "ok.test"));
    let unreachable = &[
        "ECONNREFUSED",
        "ENETUNREACH",
        "EHOSTUNREACH",
        "EADDRNOTAVAIL",
        "EAFNOSUPPORT",
    ];
    o.assert_blocked("direct-v6-loopback", unreachable);
    o.assert_blocked("direct-v6-public", unreachable);
    o.assert_blocked("direct-v6-mapped", unreachable);
    o.assert_blocked("connect-v6-loopback", &["HTTP403"]);
    o.assert_blocked("connect-v6-public", &["HTTP403"]);
    l.assert_nothing();
}

#[test]
fn egress_a_program_that_ignores_the_proxy_reaches_nothing_and_cannot_take_its_port() {
    let _g = shared();
    let l = HostListener::new();
    let o = contained(attack_net("direct", l.port, &format!("ok.test:{}", l.port)));
    o.assert_blocked("direct-loopback", &["ECONNREFUSED"]);
    o.assert_blocked("direct-host-ip", &["ENETUNREACH", "EHOSTUNREACH"]);
    o.assert_blocked("direct-public", &["ENETUNREACH", "EHOSTUNREACH"]);
    o.assert_blocked("resolve", &["EAI-2", "EAI-3", "EAI-5", "EAI-8", "EAI-11"]);
    for what in [
        "bind-proxy-port",
        "bind-proxy-port-reuse",
        "bind-any-proxy-port",
    ] {
        o.assert_blocked(what, &["EADDRINUSE"]);
    }
    l.assert_nothing();
}

#[test]
fn egress_the_endpoint_is_each_sandboxs_own() {
    let _g = shared();
    let l = HostListener::new();
    // A sandbox with a policy, alive while another without one looks for a proxy.
    let holder = Run::bash("echo START; sleep 4; echo DONE")
        .arg("--net")
        .arg(format!("allow:ok.test:{}", l.port))
        .spawn();
    std::thread::sleep(Duration::from_millis(1500));
    let o = contained(attack("other-sandbox", l.port));
    o.assert_blocked("proxy-port", &["ECONNREFUSED"]);
    assert_eq!(o.j()["network"], serde_json::Value::Null, "{}", o.dump());
    let held = holder.wait();
    assert_eq!(held.status(), "success", "{}", held.dump());
    let network = &held.j()["network"];
    assert_eq!(network["connections"], 0, "{}", held.dump());
    assert_eq!(network["denied"], 0, "{}", held.dump());
    l.assert_nothing();
}

#[test]
fn egress_a_flood_of_connections_stops_at_the_limit() {
    let _g = shared();
    let o = attack_net("flood", 1, "ok.test")
        .env("COUNT", "12")
        .arg("--net-connections")
        .arg("5")
        .run();
    o.assert_completed();
    assert!(o.has_line("FLOOD HTTP403 5"), "{}", o.dump());
    assert!(o.has_line("FLOOD HTTP403 limit 1"), "{}", o.dump());
    // Then the endpoint is gone: refused, or reset when the connection was still waiting in
    // the closed endpoint's queue.
    let after: u64 = ["ECONNREFUSED", "ECONNRESET"]
        .iter()
        .filter_map(|e| {
            o.values("FLOOD")
                .into_iter()
                .find_map(|v| v.strip_prefix(&format!("{e} ")))
        })
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(after, 6, "{}", o.dump());
    let network = &o.j()["network"];
    assert_eq!(network["denied"], 6, "{}", o.dump());
    assert!(
        network["limit_reached"]
            .as_str()
            .is_some_and(|s| s.contains("limit of 5 connections")),
        "{}",
        o.dump()
    );
    assert!(
        o.warnings().iter().any(|w| w.starts_with("egress: ")),
        "{}",
        o.dump()
    );
}

#[test]
fn egress_bytes_stop_at_the_limit() {
    let _g = shared();
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let size = 4 << 20;
    let serving = std::thread::spawn(move || {
        server.set_nonblocking(false).unwrap();
        if let Ok((mut c, _)) = server.accept() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(c, "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
            let _ = c.write_all(&vec![b'x'; size]);
        }
    });
    let limits = Limits {
        net_bytes: 1 << 20,
        ..Limits::default()
    };
    let o = attack("bytes", port)
        .engine_egress(ok_test(port), limits)
        .run();
    o.assert_completed();
    let received: u64 = o.value("RECEIVED").parse().unwrap();
    assert!(received > 0 && received <= 1 << 20, "{}", o.dump());
    o.assert_blocked("after-limit", &["ECONNREFUSED"]);
    let network = &o.j()["network"];
    assert!(
        network["bytes_up"].as_u64().unwrap() + network["bytes_down"].as_u64().unwrap() <= 1 << 20,
        "{}",
        o.dump()
    );
    assert!(
        network["limit_reached"]
            .as_str()
            .is_some_and(|s| s.contains("egress limit of 1 MiB")),
        "{}",
        o.dump()
    );
    drop(o);
    let _ = serving.join();
}

/// Holds `COUNT` connections open through the sandbox's proxy for `HOLD_S` seconds: plain
/// requests to `ok.test:PORT`, whose server (the test's listener) never answers, so each is
/// relayed and idle, as long as the proxy lets an idle connection be.
const HOLD: &str = r#"
import os, socket, time
port, count = int(os.environ["PORT"]), int(os.environ["COUNT"])
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(f"GET http://ok.test:{port}/ HTTP/1.1\r\nHost: ok.test:{port}\r\n\r\n".encode())
    held.append(s)
print("HELD", len(held), flush=True)
time.sleep(float(os.environ["HOLD_S"]))
print("DONE")
"#;

/// One request through the proxy to a name off the list: the status its answer starts with.
const PROBE: &str = r#"
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"GET http://off.test/ HTTP/1.1\r\nHost: off.test\r\n\r\n")
print("STATUS", s.recv(64).split(b" ")[1].decode(), flush=True)
print("DONE")
"#;

/// A key's sandboxes share a bound on the connections open at once through their proxies (a
/// server gives each key half of the process's places): a sandbox that holds every place of
/// its share leaves its share's other sandboxes none (503 at once), and a sandbox of another
/// share (another key) is served as ever (here: refused for its name, 403). Before the share,
/// sixteen sandboxes of one key holding 64 idle connections each took the process's 1024
/// places and every other key's connections were refused. When the holder ends, its places
/// come back.
#[test]
fn egress_one_shares_connections_leave_another_shares_sandboxes_served() {
    let _g = shared();
    // The server of `ok.test`: it completes handshakes (its backlog) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let with_share = |share: &Arc<ConnectionShare>| {
        let mut egress = ok_test(port);
        egress.share = Some(share.clone());
        egress
    };
    let share = Arc::new(ConnectionShare::new(4, "a test key's sandboxes"));
    let other = Arc::new(ConnectionShare::new(4, "another key's sandboxes"));
    let holding = with_share(&share);
    let holder = std::thread::spawn(move || {
        Run::python(HOLD)
            .env("PORT", port.to_string())
            .env("COUNT", "4")
            .env("HOLD_S", "12")
            .timeout(30)
            .engine_egress(holding, Limits::default())
            .run()
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while share.open() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the holder did not open its connections"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let probe = |egress: Egress| {
        let o = Run::python(PROBE)
            .engine_egress(egress, Limits::default())
            .run();
        o.assert_completed();
        o.value("STATUS").to_string()
    };
    assert_eq!(probe(with_share(&share)), "503", "the share is full");
    assert_eq!(probe(with_share(&other)), "403", "another share is served");
    assert_eq!(other.open(), 0);
    let o = holder.join().unwrap();
    o.assert_completed();
    assert!(o.has_line("HELD 4"), "{}", o.dump());
    assert_eq!(share.open(), 0, "the holder's places came back");
}
