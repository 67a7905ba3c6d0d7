//! Network isolation: the sandbox has its own network namespace with only
//! a loopback interface. Host listeners must receive nothing.

use crate::harness::*;
use crate::host::*;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener};

const REFUSED: &[&str] = &["ECONNREFUSED"];
const UNREACHABLE: &[&str] = &["ENETUNREACH", "EHOSTUNREACH"];
const RESOLVER_FAILED: &[&str] = &["EAI-2", "EAI-3", "EAI-5", "EAI-8", "EAI-11"];

fn tcp_listener(addr: &str) -> TcpListener {
    let l = TcpListener::bind(addr).expect("bind host listener");
    l.set_nonblocking(true).unwrap();
    l
}

/// The host listener never saw a connection.
fn assert_no_tcp_connection(l: &TcpListener) {
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("SANDBOX HOLE: host TCP listener got a connection from {peer}"),
        Err(e) => panic!("listener error {e}"),
    }
}

fn assert_no_datagram(u: &UdpSocket) {
    let mut buf = [0u8; 2048];
    match u.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((n, peer)) => panic!(
            "SANDBOX HOLE: host UDP socket got {:?} from {peer}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => panic!("udp error {e}"),
    }
}

fn udp_socket(addr: &str) -> UdpSocket {
    let u = UdpSocket::bind(addr).expect("bind host udp");
    u.set_nonblocking(true).unwrap();
    u
}

#[test]
fn tcp_to_host_loopback_listener() {
    let _g = shared();
    let l = tcp_listener("127.0.0.1:0");
    let mark = marker("tcp");
    let o = Run::python(include_str!("attacks/net_tcp_loopback.py"))
        .env("PORT", l.local_addr().unwrap().port().to_string())
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("tcp-127.0.0.1", REFUSED);
    o.assert_blocked("tcp-127.0.0.2", REFUSED);
    o.assert_blocked(
        "tcp-localhost",
        &["ECONNREFUSED", "EAI-2", "EAI-3", "EAI-5"],
    );
    assert!(o.has_line("OWN-LOOPBACK ok"), "{}", o.dump());
    assert_no_tcp_connection(&l);
}

#[test]
fn udp_to_host_loopback_listener() {
    let _g = shared();
    let u = udp_socket("127.0.0.1:0");
    let mark = marker("udp");
    let o = Run::python(include_str!("attacks/net_udp_loopback.py"))
        .env("PORT", u.local_addr().unwrap().port().to_string())
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("udp-reply", &["ECONNREFUSED", "TIMEOUT"]);
    // Give any stray datagram time to arrive before concluding.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_no_datagram(&u);
}

#[test]
fn dns_to_host_resolver_and_public_resolvers() {
    let _g = shared();
    let u = udp_socket("127.0.0.1:0");
    let port = u.local_addr().unwrap().port();
    // A TCP listener on the same port number for DNS-over-TCP.
    let t = TcpListener::bind(("127.0.0.1", port))
        .inspect(|l| l.set_nonblocking(true).unwrap())
        .ok();
    let mark = marker("dns");
    let o = Run::python(include_str!("attacks/net_dns.py"))
        .env("PORT", port.to_string())
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("dns-udp-reply", &["ECONNREFUSED", "TIMEOUT"]);
    o.assert_blocked("dns-tcp", REFUSED);
    o.assert_blocked("dns-public-8888", UNREACHABLE);
    o.assert_blocked("dns-public-1111", UNREACHABLE);
    o.assert_blocked("getaddrinfo", RESOLVER_FAILED);
    o.assert_blocked("getaddrinfo-public", RESOLVER_FAILED);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_no_datagram(&u);
    if let Some(t) = t {
        assert_no_tcp_connection(&t);
    }
}

/// The host's primary (non-loopback) address, found without sending.
pub fn host_ip() -> Option<IpAddr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_unspecified() && !ip.is_loopback()).then_some(ip)
}

#[test]
fn host_external_address_and_internet_unreachable() {
    let _g = shared();
    let l = tcp_listener("0.0.0.0:0");
    let u = udp_socket("0.0.0.0:0");
    let port = l.local_addr().unwrap().port();
    // The UDP socket on the same port number when possible.
    let u = UdpSocket::bind(("0.0.0.0", port))
        .inspect(|s| s.set_nonblocking(true).unwrap())
        .unwrap_or(u);
    let ip = host_ip().unwrap_or(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    let mark = marker("ext");
    let o = Run::python(include_str!("attacks/net_external.py"))
        .env("HOST_IP", ip.to_string())
        .env("PORT", port.to_string())
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("tcp-host-ip", UNREACHABLE);
    o.assert_blocked("tcp-internet", UNREACHABLE);
    o.assert_blocked("tcp-metadata", UNREACHABLE);
    o.assert_blocked(
        "tcp6-internet",
        &[
            "ENETUNREACH",
            "EHOSTUNREACH",
            "EADDRNOTAVAIL",
            "EAFNOSUPPORT",
        ],
    );
    o.assert_blocked("udp-host-ip", UNREACHABLE);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_no_tcp_connection(&l);
    assert_no_datagram(&u);
}

#[test]
fn only_loopback_interface() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/net_interfaces.py")).run();
    o.assert_completed();
    assert_eq!(o.values("IFACE"), vec!["lo"], "{}", o.dump());
    // The sandbox's init is in the sandbox's network namespace too, not the host's.
    let init = o.values("INIT-IFACE");
    assert!(
        init == vec!["lo"] || !o.values("INIT-IFACE-FAIL").is_empty(),
        "{}",
        o.dump()
    );
    let idx = o.values("IFINDEX");
    assert!(idx.is_empty() || idx == vec!["lo"], "{}", o.dump());
    assert_eq!(o.value("ROUTES"), "0", "routes exist\n{}", o.dump());
}

#[test]
fn host_unix_socket_by_path() {
    let _g = shared();
    let dir = tempfile::Builder::new().prefix("hx-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("host.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    l.set_nonblocking(true).unwrap();
    let o = Run::python(include_str!("attacks/net_unix_path.py"))
        .env("SOCK_PATH", path.to_str().unwrap())
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("unix-path", NO_FILE);
    o.assert_blocked("unix-path-proc1-root", NO_FILE_OR_ACCESS);
    for what in ["unix-docker", "unix-systemd", "unix-dbus"] {
        o.assert_blocked(what, NO_FILE);
    }
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("SANDBOX HOLE: host unix socket was reached: {other:?}"),
    }
}

#[test]
fn host_abstract_unix_socket() {
    let _g = shared();
    let name = marker("abstract");
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let l = UnixListener::bind_addr(&addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let o = Run::python(include_str!("attacks/net_unix_abstract.py"))
        .env("ABSTRACT_NAME", &name)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("abstract-stream", REFUSED);
    // SOCK_SEQPACKET may be outside the seccomp allow-list altogether.
    o.assert_blocked("abstract-seqpacket", &["ECONNREFUSED", "EPERM"]);
    o.assert_blocked("abstract-x11", REFUSED);
    assert!(o.has_line("OWN-ABSTRACT ok"), "{}", o.dump());
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("SANDBOX HOLE: host abstract socket was reached: {other:?}"),
    }
}

#[test]
fn packet_and_raw_sockets_denied() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/raw_sockets.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    for what in [
        "af-packet-raw",
        "af-packet-dgram",
        "sock-raw-icmp",
        "sock-raw-raw",
        "sock-raw-icmpv6",
    ] {
        o.assert_blocked(what, EPERM);
    }
}

#[test]
fn javascript_secret_and_tcp() {
    let _g = shared();
    let s = HostSecret::plant();
    let l = tcp_listener("127.0.0.1:0");
    let mark = marker("js");
    let o = Run::javascript(include_str!("attacks/node_net_and_secret.js"))
        .env("HOST_SECRET_PATH", s.path_str())
        .env("PORT", l.local_addr().unwrap().port().to_string())
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("js-read", NO_FILE);
    o.assert_blocked("js-proc1-root", NO_FILE_OR_ACCESS);
    o.assert_blocked("js-tcp", REFUSED);
    o.assert_absent(&s.token);
    s.assert_unchanged();
    assert_no_tcp_connection(&l);
}

#[test]
fn bash_dev_tcp_and_cat_secret() {
    let _g = shared();
    let s = HostSecret::plant();
    let l = tcp_listener("127.0.0.1:0");
    let mark = marker("bash");
    let o = Run::bash(include_str!("attacks/bash_dev_tcp.sh"))
        .env("HOST_SECRET_PATH", s.path_str())
        .env("PORT", l.local_addr().unwrap().port().to_string())
        .env("MARK", &mark)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    o.assert_blocked("bash-tcp", &["1"]);
    o.assert_blocked("bash-cat", &["1"]);
    assert!(o.stderr().contains("Connection refused"), "{}", o.dump());
    assert!(
        o.stderr().contains("No such file or directory"),
        "{}",
        o.dump()
    );
    o.assert_absent(&s.token);
    s.assert_unchanged();
    assert_no_tcp_connection(&l);
}

/// Only TCP and UDP: MPTCP, UDP-Lite, SCTP and ping sockets are other kernel protocol
/// modules, and the seccomp filter refuses them whatever the host's kernel has built in.
#[test]
fn inet_sockets_take_tcp_and_udp_only() {
    let _g = shared();
    let o = Run::python(include_str!("attacks/socket_protocols.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    let denied = &["EPERM", "EACCES"];
    for family in ["inet", "inet6"] {
        for what in ["mptcp", "udplite", "sctp", "sctp-seqpacket"] {
            o.assert_blocked(&format!("{what}-{family}"), denied);
        }
        o.assert_blocked(&format!("ping-{family}"), denied);
    }
    o.assert_blocked("mptcp-high-bits", denied);
    for what in o.values("WORKS") {
        let (name, result) = what.split_once(' ').unwrap_or((what, ""));
        // IPv6 may be disabled on the host: its sockets then fail, but never with EPERM.
        let ok = result == "ok"
            || (name.contains("inet6") && ["EADDRNOTAVAIL", "EAFNOSUPPORT"].contains(&result));
        assert!(ok, "{name} over loopback failed: {result}\n{}", o.dump());
    }
    for kind in ["tcp-inet-0", "tcp-inet-6", "udp-inet-0", "udp-inet-17"] {
        assert!(
            o.has_line(&format!("WORKS {kind} ok")),
            "{kind} over loopback must work\n{}",
            o.dump()
        );
    }
    assert_eq!(o.values("WORKS").len(), 8, "{}", o.dump());
}
