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

use corral_egress::share::{RESOLVER_SLOTS, RESOLVER_THREADS};
use corral_egress::{EgressPools, FixedResolver, Resolve};
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

/// Opens `COUNT` connections through the sandbox's proxy one after the other, each a plain
/// request to `ok.test:PORT` (whose server answers and keeps the connection), and holds them
/// all: the status of each answer, and how long the whole took.
const OPEN: &str = r#"
import os, socket, time
port, count = int(os.environ["PORT"]), int(os.environ["COUNT"])
t = time.monotonic()
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"GET http://ok.test:{port}/ HTTP/1.1\r\nHost: ok.test:{port}\r\n\r\n".encode())
    print("STATUS", s.recv(64).split(b" ")[1].decode(), flush=True)
    held.append(s)
print("SECONDS", round(time.monotonic() - t, 2), flush=True)
print("DONE")
"#;

/// A server on loopback that answers every request 200 and keeps its connections open until
/// the test ends: its port.
fn answering_server() -> u16 {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        for mut conn in server.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            kept.push(conn);
        }
    });
    port
}

/// This process's resident memory, for the record.
fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?")
        .to_string()
}

/// The connections open at once through a process's proxies are a pool that keys share
/// (corral-share): a key's share, a total, and a floor every key keeps out of a reserve. Here
/// a pool of 8 with a share of 4 and a floor of 2 (the process's is 1024, 512 and 64). Keys A
/// and B each hold their full share of silent connections, which fills the pool: A's other
/// sandboxes are refused at once (503, its share), and key C still opens its floor's
/// connections (and no more: 503, the pool). Before the floor, two keys holding 512 silent
/// connections each left every other key's connections 503. When the holders end, their
/// places come back.
#[test]
fn egress_two_keys_holding_their_shares_of_connections_leave_a_third_its_floor() {
    let _g = shared();
    // The server A and B hold connections to: it completes handshakes and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let pools = EgressPools::new(
        corral_share::Limits::new(8, 4, 2, 2),
        corral_egress::share::RESOLVER_SLOTS,
        corral_egress::share::RESOLVER_THREADS,
    );
    let of_key = |key: &str, port: u16| {
        let mut egress = ok_test(port);
        egress.share = pools.share(key);
        egress
    };
    let holders: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|key| {
            let holding = of_key(key, port);
            std::thread::spawn(move || {
                Run::python(HOLD)
                    .env("PORT", port.to_string())
                    .env("COUNT", "4")
                    .env("HOLD_S", "15")
                    .timeout(40)
                    .engine_egress(holding, Limits::default())
                    .run()
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    while pools.connections.held() < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "the holders did not open their connections"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = Run::python(PROBE)
        .engine_egress(of_key("a", port), Limits::default())
        .run();
    o.assert_completed();
    assert_eq!(o.value("STATUS"), "503", "a's share is full: {}", o.dump());

    let answering = answering_server();
    let started = std::time::Instant::now();
    let o = Run::python(OPEN)
        .env("PORT", answering.to_string())
        .env("COUNT", "3")
        .timeout(30)
        .engine_egress(of_key("c", answering), Limits::default())
        .run();
    let took = started.elapsed();
    o.assert_completed();
    assert_eq!(
        o.values("STATUS"),
        ["200", "200", "503"],
        "c opens its floor of 2, and no more: {}",
        o.dump()
    );
    eprintln!(
        "key c's 3 connections took {} s in its sandbox, {took:?} with the sandbox; {}",
        o.value("SECONDS"),
        rss()
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert_eq!(pools.connections.held_by("c"), 0, "c's places came back");
    for holder in holders {
        let o = holder.join().unwrap();
        o.assert_completed();
        assert!(o.has_line("HELD 4"), "{}", o.dump());
    }
    assert_eq!(pools.connections.held(), 0, "the holders' places came back");
}

/// Keeps up to `COUNT` look-ups of names under `hang.test` asked of the proxy at once for
/// `FOR_S` seconds: each thread asks again as soon as it has an answer (a refusal, 403).
const LOOKUPS: &str = r#"
import os, socket, threading, time
count, until = int(os.environ["COUNT"]), time.monotonic() + float(os.environ["FOR_S"])
answers = []
def ask(i):
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=15)
            s.sendall(f"CONNECT n{i}-{n}.hang.test:443 HTTP/1.1\r\n\r\n".encode())
            answers.append(s.recv(64).split(b" ")[1].decode())
            s.close()
        except OSError as e:
            answers.append(type(e).__name__)
# Small stacks: rootless without cgroups, memory is RLIMIT_DATA, which stacks count against.
threading.stack_size(256 * 1024)
threads = [threading.Thread(target=ask, args=(i,)) for i in range(count)]
for t in threads: t.start()
print("ASKING", count, flush=True)
for t in threads: t.join()
print("ANSWERS", len(answers), "BUSY", answers.count("403"), flush=True)
print("DONE")
"#;

/// A resolver for which names under `hang.test` take as long as a name server that never
/// answers does for the host's resolver (10.6 s, then no address), and other names are those
/// of a table.
#[derive(Debug)]
struct Hanging(FixedResolver);

impl Resolve for Hanging {
    fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
        if name.ends_with(".hang.test") {
            std::thread::sleep(Duration::from_millis(10_600));
            return Err(std::io::Error::new(ErrorKind::TimedOut, "no answer"));
        }
        self.0.resolve(name)
    }
}

/// Names being resolved are a pool that keys share (the process's own: 64 look-ups, 16 per
/// key, a floor of 4): one key's sandbox that keeps 64 look-ups of names that never resolve
/// in flight holds its share of them, and two other keys resolve an allowed name and connect
/// to its server within seconds, again and again. Before the share, the flood took all 64
/// slots of the process, for 10.6 s each (a slot was freed when the look-up's thread
/// returned, not at the proxy's 5 s timeout), and every other key got `403 ... 64 names are
/// being resolved already`.
#[test]
fn egress_one_keys_look_ups_that_never_answer_leave_other_keys_resolving() {
    let _g = shared();
    let answering = answering_server();
    let run = marker("resolve");
    let key = |k: &str| format!("{run}-{k}");
    let of_key = |k: &str| {
        let (mut egress, _) = egress(
            &[format!("ok.test:{answering}"), "*.hang.test:443".into()],
            &["ok.test"],
            &[],
        );
        egress.resolver = Arc::new(Hanging(FixedResolver(HashMap::from([(
            "ok.test".to_string(),
            vec![ip("127.0.0.1")],
        )]))));
        egress.share = EgressPools::process().share(&key(k));
        egress
    };
    let pools = EgressPools::process();
    let flooding = of_key("a");
    let flood = std::thread::spawn(move || {
        Run::python(LOOKUPS)
            .env("COUNT", "64")
            .env("FOR_S", "14")
            .timeout(60)
            .engine_egress(flooding, Limits::default())
            .run()
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    while pools.resolver_slots.held_by(&key("a")) < RESOLVER_SLOTS.per_key {
        assert!(
            std::time::Instant::now() < deadline,
            "the flood did not take its share"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let victims: Vec<_> = ["b", "c"]
        .into_iter()
        .map(|k| {
            let egress = of_key(k);
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let o = Run::python(OPEN)
                    .env("PORT", answering.to_string())
                    .env("COUNT", "3")
                    .timeout(30)
                    .engine_egress(egress, Limits::default())
                    .run();
                (o, started.elapsed())
            })
        })
        .collect();
    for victim in victims {
        let (o, took) = victim.join().unwrap();
        o.assert_completed();
        assert_eq!(o.values("STATUS"), ["200", "200", "200"], "{}", o.dump());
        eprintln!(
            "a victim's 3 look-ups and connections took {} s in its sandbox, {took:?} with \
             the sandbox; {}",
            o.value("SECONDS"),
            rss()
        );
        assert!(took < Duration::from_secs(20), "{took:?}");
    }
    assert!(
        pools.resolver_threads.held_by(&key("a")) <= RESOLVER_THREADS.per_key,
        "a's stuck threads stay within its share"
    );
    let o = flood.join().unwrap();
    o.assert_completed();
    let busy: u64 = o.values("ANSWERS")[0]
        .split(' ')
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(busy > 0, "the flood met its share: {}", o.dump());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pools.resolver_threads.held_by(&key("a")) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a's resolver threads did not end"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pools.resolver_slots.held_by(&key("a")), 0);
}

/// The user of `corral run` is the operator of their own run: `--net allow:0.0.0.0/0` holds no
/// internal address (issue 31: it reached the host's loopback), and naming the loopback address
/// alone reaches it.
#[test]
fn network_egress_corral_run_reaches_loopback_only_where_its_user_named_it() {
    let _g = shared();
    let l = HostListener::new();
    let everything = format!("0.0.0.0/0:{0},[::/0]:{0}", l.port);
    let o = contained(attack_net("internal-ranges", l.port, &everything));
    for what in ["loopback", "loopback-v6", "metadata", "private"] {
        o.assert_blocked(&format!("connect-{what}"), &["HTTP403"]);
    }
    assert_denials(&o, Some(4), &["internal_address"]);
    l.assert_nothing();
    let o = attack_net(
        "internal-ranges",
        l.port,
        &format!("127.0.0.1/32:{}", l.port),
    )
    .run();
    assert_eq!(o.status(), "success", "{}", o.dump());
    assert!(
        o.has_line("ALLOWED connect-loopback tunnel opened"),
        "{}",
        o.dump()
    );
    assert_eq!(l.accepted().len(), 1, "{}", o.dump());
}
