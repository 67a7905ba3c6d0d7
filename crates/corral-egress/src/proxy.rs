//! The host side of a sandbox's egress: accepts on the listening socket the sandbox's init
//! handed over, and for each connection reads the request head, decides, resolves, vets,
//! connects to the vetted address and moves bytes both ways, within fixed bounds. Blocking code
//! on threads: one accepting, one per connection (bounded per sandbox and per process).
//! Stopping closes the endpoint and every connection and joins every thread.

use parking_lot::Mutex;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, Shutdown, SockFlag, SockaddrStorage};

use crate::address::{canonical, host_addresses, vet_literal, vet_resolved};
use crate::head::{self, Host, Request, MAX_HEAD};
use crate::hello::{Hello, HelloReader};
use crate::policy::NameRefusal;
use crate::resolve::{resolve_within, ResolveError};
use crate::{check_listener, Decision, Denial, Egress, NetworkReport, Reason, Verdict};
use corral_share::show_bytes;

/// Connections open at once through one sandbox's proxy; more are answered 503, as are those
/// past its key's share of the process's ([`EgressShare`](crate::EgressShare)).
pub const MAX_CONCURRENT: usize = 64;
/// How long a client has to send its request head, and a tunnel's ClientHello.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to a server may take, all its vetted addresses together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that moves no byte either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// One sandbox's proxy. Dropping it stops it.
pub struct EgressProxy {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("policy", &self.shared.egress.policy)
            .finish()
    }
}

struct Shared {
    egress: Egress,
    /// The sandbox's endpoint; shut down (no longer listening: connections are refused) when
    /// the proxy stops, closed with the last reference.
    listener: TcpListener,
    net_bytes: u64,
    net_connections: u64,
    /// Readable (hung up) once the proxy is to stop: every thread polls it.
    stop_r: OwnedFd,
    stop_w: Mutex<Option<OwnedFd>>,
    stopped: AtomicBool,
    /// Bytes moved either way, against `net_bytes`.
    bytes: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    report: NetworkReport,
    accepted: u64,
    active: usize,
    threads: Vec<JoinHandle<()>>,
}

/// What one sandbox's proxy may move and open, over the sandbox's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Bytes relayed either way.
    pub net_bytes: u64,
    /// Connections accepted.
    pub net_connections: u64,
}

impl EgressProxy {
    /// Serves `listener` (checked to be the sandbox's endpoint) with `egress`'s policy, within
    /// `limits`.
    pub fn start(
        listener: OwnedFd,
        egress: Egress,
        limits: ProxyLimits,
    ) -> io::Result<EgressProxy> {
        check_listener(&listener)?;
        let listener = TcpListener::from(listener);
        listener.set_nonblocking(true)?;
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let shared = Arc::new(Shared {
            egress,
            listener,
            net_bytes: limits.net_bytes,
            net_connections: limits.net_connections,
            stop_r,
            stop_w: Mutex::new(Some(stop_w)),
            stopped: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        });
        let accepting = shared.clone();
        let accept = std::thread::Builder::new()
            .name("corral-egress".into())
            .stack_size(256 << 10)
            .spawn(move || accept_loop(&accepting))?;
        Ok(EgressProxy {
            shared,
            accept: Some(accept),
        })
    }

    /// What the proxy has done so far.
    pub fn report(&self) -> NetworkReport {
        self.shared.report()
    }

    /// A handle that reads the report from anywhere, as long as it is kept (also once the
    /// proxy has stopped: then its last report).
    pub fn monitor(&self) -> EgressMonitor {
        EgressMonitor(self.shared.clone())
    }

    /// Closes the endpoint and every connection, waits for every thread, and reports.
    pub fn stop(&mut self) -> NetworkReport {
        self.shared.cut(None);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let threads = std::mem::take(&mut self.shared.state.lock().threads);
        for t in threads {
            let _ = t.join();
        }
        self.shared.report()
    }
}

/// Reads a proxy's report without holding the proxy ([`EgressProxy::monitor`]).
#[derive(Clone)]
pub struct EgressMonitor(Arc<Shared>);

impl EgressMonitor {
    pub fn report(&self) -> NetworkReport {
        self.0.report()
    }
}

impl std::fmt::Debug for EgressMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EgressMonitor").finish()
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn report(&self) -> NetworkReport {
        let mut report = self.state.lock().report.clone();
        report.bytes_up = self.bytes_up.load(Ordering::SeqCst);
        report.bytes_down = self.bytes_down.load(Ordering::SeqCst);
        report
    }

    /// Stops everything: the endpoint closes, every connection ends. With `limit`, a limit did
    /// it, which the report says.
    fn cut(&self, limit: Option<String>) {
        if let Some(why) = limit {
            let mut state = self.state.lock();
            state.report.limit_reached.get_or_insert(why);
        }
        self.stopped.store(true, Ordering::SeqCst);
        // At once: a connection made after this is refused, whatever the threads are doing.
        let _ = socket::shutdown(self.listener.as_raw_fd(), Shutdown::Both);
        drop(self.stop_w.lock().take());
    }

    fn stop_fd(&self) -> BorrowedFd<'_> {
        self.stop_r.as_fd()
    }

    /// Records `decision` (and tells the observer).
    fn decide(&self, decision: Decision) {
        {
            let mut state = self.state.lock();
            let r = &mut state.report;
            match decision.verdict {
                Verdict::Allowed => r.connections += 1,
                Verdict::Denied(_) => r.denied += 1,
                Verdict::Failed(_) => r.failed += 1,
            }
            if let Some(reason) = decision.verdict.reason() {
                r.record(Denial {
                    host: decision.host.clone(),
                    port: decision.port,
                    reason,
                    message: decision.message.clone(),
                });
            }
        }
        if let Some(observer) = &self.egress.observer {
            observer.decision(&decision);
        }
    }

    /// Takes room for `n` more bytes from the sandbox's egress limit: how many of them may
    /// move (fewer once the limit is reached, which cuts all egress).
    fn charge(&self, n: usize, up: bool) -> usize {
        let n = n as u64;
        let mut used = self.bytes.load(Ordering::SeqCst);
        let granted = loop {
            let granted = n.min(self.net_bytes.saturating_sub(used));
            match self.bytes.compare_exchange(
                used,
                used + granted,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break granted,
                Err(now) => used = now,
            }
        };
        let counter = if up { &self.bytes_up } else { &self.bytes_down };
        counter.fetch_add(granted, Ordering::SeqCst);
        if granted < n {
            self.cut(Some(format!(
                "the sandbox reached its egress limit of {} (net_bytes): every connection \
                 through the proxy was closed",
                show_bytes(self.net_bytes)
            )));
        }
        granted as usize
    }
}

fn accept_loop(shared: &Arc<Shared>) {
    let listener = &shared.listener;
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(shared.stop_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return,
        }
        if shared.stopped.load(Ordering::SeqCst) || ready(&fds[1]) {
            return;
        }
        // std's accept is accept4 with SOCK_CLOEXEC.
        let accepted = listener
            .accept()
            .and_then(|(conn, _)| conn.set_nonblocking(true).map(|()| OwnedFd::from(conn)));
        let conn = match accepted {
            Ok(fd) => fd,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(_) => {
                // Out of descriptors, say: wait a little rather than spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let mut state = shared.state.lock();
        state.threads.retain(|t| !t.is_finished());
        state.accepted += 1;
        if state.accepted > shared.net_connections {
            drop(state);
            let why = format!(
                "the sandbox reached its limit of {} connections (net_connections)",
                shared.net_connections
            );
            refuse_at_once(shared, &conn, Reason::ConnectionLimit, 403, &why);
            shared.cut(Some(format!("{why}: the proxy closed its endpoint")));
            return;
        }
        let place = if state.active >= MAX_CONCURRENT {
            Err(format!(
                "too many connections at once: at most {MAX_CONCURRENT} per sandbox"
            ))
        } else {
            shared
                .egress
                .share
                .connections
                .take(1)
                .map_err(|refusal| format!("too many connections at once: {refusal}"))
        };
        let place = match place {
            Ok(place) => place,
            Err(why) => {
                drop(state);
                refuse_at_once(shared, &conn, Reason::Busy, 503, &why);
                continue;
            }
        };
        state.active += 1;
        let serving = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("corral-egress-conn".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let _place = place;
                serve(&serving, conn);
                serving.state.lock().active -= 1;
            });
        match spawned {
            Ok(t) => state.threads.push(t),
            Err(_) => state.active -= 1,
        }
    }
}

fn ready(fd: &PollFd<'_>) -> bool {
    fd.revents().is_some_and(|r| !r.is_empty())
}

/// How long the accepting thread waits for a refused client to finish sending.
const REFUSAL_LINGER: Duration = Duration::from_millis(200);

/// Refuses a connection without parsing its request (from the accepting thread, which waits
/// at most [`REFUSAL_LINGER`]): what the client sends is read and dropped until it is done, so
/// that closing leaves the answer to be read rather than resetting the connection.
fn refuse_at_once(shared: &Shared, conn: &OwnedFd, reason: Reason, status: u16, why: &str) {
    // Recorded before the client can read the answer: what it does next (an execution that
    // ends, its report taken) comes after the record.
    shared.decide(Decision::unreadable(reason, why.to_string()));
    let _ = nix::unistd::write(conn, &http_error(status, why));
    let _ = socket::shutdown(conn.as_raw_fd(), Shutdown::Write);
    let until = Instant::now() + REFUSAL_LINGER;
    let mut buf = [0u8; 4096];
    loop {
        match nix::unistd::read(conn.as_raw_fd(), &mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(_) => break,
        }
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        if left.is_zero()
            || !matches!(poll(&mut fds, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)), Ok(n) if n > 0)
        {
            break;
        }
    }
}

/// An HTTP error answer whose reason phrase carries the explanation: clients (pip's "Tunnel
/// connection failed: 403 ...", curl) show the status line.
fn http_error(status: u16, why: &str) -> Vec<u8> {
    let phrase: String = format!("corral: {why}")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let body = format!("{phrase}\n");
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A TLS alert record, `access_denied` (fatal), for a tunnel refused after its `200`.
const TLS_ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// What waiting for a descriptor came to.
enum Wait {
    Ready,
    TimedOut,
    Stopped,
}

/// Waits until `fd` has `events`, `deadline` passes, or the proxy stops.
fn wait_for(shared: &Shared, fd: BorrowedFd<'_>, events: PollFlags, deadline: Instant) -> Wait {
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            return Wait::Stopped;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Wait::TimedOut;
        }
        let mut fds = [
            PollFd::new(fd, events),
            PollFd::new(shared.stop_fd(), PollFlags::POLLIN),
        ];
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) if ready(&fds[1]) => return Wait::Stopped,
            Ok(_) => return Wait::Ready,
            Err(_) => return Wait::Stopped,
        }
    }
}

/// Writes all of `bytes` to a non-blocking socket, within `deadline`.
fn write_all(shared: &Shared, fd: &OwnedFd, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        match nix::sys::socket::send(fd.as_raw_fd(), bytes, socket::MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EAGAIN | Errno::EINTR) => {
                if !matches!(
                    wait_for(shared, fd.as_fd(), PollFlags::POLLOUT, deadline),
                    Wait::Ready
                ) {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads what is there (after waiting for it until `deadline`): `Ok(0)` at the end.
fn read_some(
    shared: &Shared,
    fd: &OwnedFd,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<usize, Reason> {
    loop {
        match nix::unistd::read(fd.as_raw_fd(), buf) {
            Ok(n) => return Ok(n),
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(_) => return Ok(0),
        }
        match wait_for(shared, fd.as_fd(), PollFlags::POLLIN, deadline) {
            Wait::Ready => {}
            Wait::TimedOut => return Err(Reason::Timeout),
            Wait::Stopped => return Ok(0),
        }
    }
}

/// How the proxy answers a connection it refuses.
enum Answer {
    /// An HTTP error with this status, the decision's message as its reason phrase.
    Http(u16),
    /// A TLS `access_denied` alert: the tunnel was already established.
    TlsAlert,
    /// Nothing: the connection is closed.
    Close,
}

/// Refuses a connection: records `decision` (and tells the observer), then answers. Every
/// decision is recorded before the client can read its answer, so what the client does next
/// (an execution that ends, its report taken) comes after the record.
fn refuse(shared: &Shared, client: &OwnedFd, decision: Decision, answer: Answer) {
    let bytes = match answer {
        Answer::Http(status) => http_error(status, &decision.message),
        Answer::TlsAlert => TLS_ACCESS_DENIED.to_vec(),
        Answer::Close => Vec::new(),
    };
    shared.decide(decision);
    let _ = write_all(shared, client, &bytes, Instant::now() + HEAD_TIMEOUT);
}

impl Decision {
    /// A connection to `host`:`port` refused, or failed, for `why`.
    fn refused(host: impl Into<String>, port: u16, verdict: Verdict, why: String) -> Decision {
        Decision {
            host: host.into(),
            port,
            verdict,
            address: None,
            message: why,
        }
    }

    /// A request refused before its target was known.
    fn unreadable(reason: Reason, why: String) -> Decision {
        Decision::refused("?", 0, Verdict::Denied(reason), why)
    }
}

/// One connection, from its request to its end.
fn serve(shared: &Shared, client: OwnedFd) {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; MAX_HEAD];
    let (request, rest) = loop {
        match head::parse(&buf) {
            Ok(Some((request, len))) => break (request, buf.split_off(len)),
            Ok(None) => {}
            Err(e) => {
                let decision = Decision::unreadable(Reason::InvalidRequest, e.to_string());
                return refuse(shared, &client, decision, Answer::Http(e.status()));
            }
        }
        let room = MAX_HEAD - buf.len();
        match read_some(shared, &client, &mut chunk[..room], deadline) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(reason) => {
                let why = format!("no complete request within {} s", HEAD_TIMEOUT.as_secs());
                let decision = Decision::unreadable(reason, why);
                return refuse(shared, &client, decision, Answer::Http(408));
            }
        }
    };
    drop(chunk);
    let (host, port) = request.target();
    let (host, port) = (host.clone(), port);
    let shown = host.to_string();
    let addresses = match vet(shared, &host, port) {
        Ok(addresses) => addresses,
        Err((verdict, why)) => {
            let status = if matches!(verdict, Verdict::Failed(_)) {
                502
            } else {
                403
            };
            let decision = Decision::refused(shown, port, verdict, why);
            return refuse(shared, &client, decision, Answer::Http(status));
        }
    };
    let (first_bytes, body) = match request {
        Request::Connect { .. } => {
            let ok = b"HTTP/1.1 200 Connection established\r\n\r\n";
            if write_all(shared, &client, ok, deadline).is_err() {
                return;
            }
            // A tunnel to an address an explicit range rule allows carries any protocol; one
            // to a name carries TLS naming that name.
            let Host::Name(name) = &host else {
                return connect_and_relay(shared, &client, &addresses, &shown, port, rest, None);
            };
            match read_hello(shared, &client, name, rest, deadline) {
                Ok(hello) => (hello, None),
                Err((reason, why)) => {
                    let decision = Decision::refused(shown, port, Verdict::Denied(reason), why);
                    return refuse(shared, &client, decision, Answer::TlsAlert);
                }
            }
        }
        Request::Http { head, body, .. } => {
            let mut first = head;
            let early = rest.len().min(usize::try_from(body).unwrap_or(usize::MAX));
            first.extend_from_slice(&rest[..early]);
            (first, Some(body - early as u64))
        }
    };
    connect_and_relay(shared, &client, &addresses, &shown, port, first_bytes, body);
}

/// Connects to the first vetted address that answers and relays (see [`relay`]); a plain
/// request whose server cannot be reached is answered 502, a tunnel is closed.
fn connect_and_relay(
    shared: &Shared,
    client: &OwnedFd,
    addresses: &[IpAddr],
    shown: &str,
    port: u16,
    first_bytes: Vec<u8>,
    body: Option<u64>,
) {
    let (upstream, address) = match connect(shared, addresses, port) {
        Ok(connected) => connected,
        Err(why) => {
            let why = format!("could not connect to {shown}:{port}: {why}");
            let verdict = Verdict::Failed(Reason::UpstreamFailed);
            let answer = match body {
                Some(_) => Answer::Http(502),
                None => Answer::Close,
            };
            return refuse(
                shared,
                client,
                Decision::refused(shown, port, verdict, why),
                answer,
            );
        }
    };
    shared.decide(Decision {
        host: shown.to_string(),
        port,
        verdict: Verdict::Allowed,
        address: Some(address),
        message: format!("{shown}:{port} allowed, connected to {address}"),
    });
    let (up, down) = relay(shared, client, &upstream, first_bytes, body);
    if let Some(observer) = &shared.egress.observer {
        observer.closed(up, down);
    }
}

/// Decides on `host`:`port` by the policy, before any resolution; resolves a name on the host;
/// keeps the addresses the proxy may connect to. `Err` says why not.
fn vet(shared: &Shared, host: &Host, port: u16) -> Result<Vec<IpAddr>, (Verdict, String)> {
    let policy = &shared.egress.policy;
    let own = host_addresses();
    match host {
        Host::Address(ip) => {
            let ip = canonical(*ip);
            let rules = policy.cidr_rules_for(ip, port);
            if rules.is_empty() {
                return Err((
                    Verdict::Denied(Reason::IpLiteral),
                    format!(
                        "{host}:{port} is an address no rule of this sandbox's network policy \
                         allows (the allow-list names hosts)"
                    ),
                ));
            }
            // Allowed when one of the rules that hold it admits it; refused with the first
            // rule's reason when none does.
            let opted_in = policy.private_ranges(port);
            let refusals: Option<Vec<_>> = rules
                .iter()
                .map(|r| vet_literal(ip, &r.net, &opted_in, &own).err())
                .collect();
            match refusals.as_deref() {
                Some([refused, ..]) => Err((
                    Verdict::Denied(Reason::InternalAddress),
                    format!(
                        "{host} is a {} address, which no range its operator named holds",
                        refused.0
                    ),
                )),
                _ => Ok(vec![ip]),
            }
        }
        Host::Name(name) => {
            let allow_internal = match policy.check_name(name, port) {
                Ok(internal) => internal,
                Err(NameRefusal::NotListed) => {
                    return Err((
                        Verdict::Denied(Reason::NotAllowed),
                        format!("{name} is not on this sandbox's network allow-list"),
                    ))
                }
                Err(NameRefusal::Port) => {
                    return Err((
                        Verdict::Denied(Reason::PortNotAllowed),
                        format!(
                            "port {port} of {name} is not on this sandbox's network allow-list"
                        ),
                    ))
                }
            };
            let resolved = resolve_within(
                &shared.egress.resolver,
                &shared.egress.share,
                name,
                &shared.stopped,
            )
            .map_err(|e| {
                let reason = match e {
                    ResolveError::Busy(_) => Verdict::Denied(Reason::Busy),
                    _ => Verdict::Failed(Reason::ResolveFailed),
                };
                (reason, format!("{name} did not resolve on the host: {e}"))
            })?;
            let mut kept = Vec::new();
            let mut refused = Vec::new();
            for ip in resolved {
                let ip = canonical(ip);
                match vet_resolved(ip, allow_internal, &own) {
                    Ok(()) if !kept.contains(&ip) => kept.push(ip),
                    Ok(()) => {}
                    Err(r) => refused.push(format!("{ip} ({})", r.0)),
                }
            }
            if kept.is_empty() {
                if refused.is_empty() {
                    return Err((
                        Verdict::Failed(Reason::ResolveFailed),
                        format!("{name} has no address"),
                    ));
                }
                return Err((
                    Verdict::Denied(Reason::InternalAddress),
                    format!(
                        "{name} resolves only to internal addresses: {}; the operator has not \
                         opted this name in",
                        refused.join(", ")
                    ),
                ));
            }
            Ok(kept)
        }
    }
}

/// Reads a tunnel's ClientHello (starting with `early`, what came with the head) and checks
/// that it names `host`: its bytes, to forward as they came.
fn read_hello(
    shared: &Shared,
    client: &OwnedFd,
    name: &str,
    early: Vec<u8>,
    deadline: Instant,
) -> Result<Vec<u8>, (Reason, String)> {
    let mut reader = HelloReader::default();
    let mut verdict = (!early.is_empty()).then(|| reader.push(&early)).flatten();
    let mut chunk = vec![0u8; 16 << 10];
    while verdict.is_none() {
        match read_some(shared, client, &mut chunk, deadline) {
            Ok(0) => {
                return Err((
                    Reason::TlsRequired,
                    "the tunnel closed before a TLS ClientHello".into(),
                ))
            }
            Ok(n) => verdict = reader.push(&chunk[..n]),
            Err(_) => {
                return Err((
                    Reason::Timeout,
                    format!("no TLS ClientHello within {} s", HEAD_TIMEOUT.as_secs()),
                ))
            }
        }
    }
    match verdict.expect("loop ends with one") {
        Hello::ServerName(sni) => {
            let sni = sni.map(|s| s.trim_end_matches('.').to_ascii_lowercase());
            match sni {
                Some(sni) if sni == name => Ok(reader.bytes),
                Some(sni) => Err((
                    Reason::TlsServerName,
                    format!(
                        "the TLS ClientHello names {sni}, not {name}, the host the tunnel was \
                         allowed for"
                    ),
                )),
                None => Err((
                    Reason::TlsServerName,
                    format!("the TLS ClientHello names no server; it must name {name}"),
                )),
            }
        }
        Hello::NotTls(why) => Err((
            Reason::TlsRequired,
            format!("a tunnel must carry TLS, and its first bytes are not a ClientHello ({why})"),
        )),
        Hello::TooLarge => Err((
            Reason::TlsRequired,
            "the TLS ClientHello is longer than the proxy reads".into(),
        )),
    }
}

/// Connects to the first of `addresses` that answers, within [`CONNECT_TIMEOUT`] in all.
fn connect(
    shared: &Shared,
    addresses: &[IpAddr],
    port: u16,
) -> Result<(OwnedFd, SocketAddr), String> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut last = String::from("no address");
    for &ip in addresses {
        let addr = SocketAddr::new(ip, port);
        let family = match ip {
            IpAddr::V4(_) => socket::AddressFamily::Inet,
            IpAddr::V6(_) => socket::AddressFamily::Inet6,
        };
        let fd = socket::socket(
            family,
            socket::SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| e.to_string())?;
        match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
            Ok(()) => return Ok((fd, addr)),
            Err(Errno::EINPROGRESS) => {}
            Err(e) => {
                last = format!("{addr}: {e}");
                continue;
            }
        }
        match wait_for(shared, fd.as_fd(), PollFlags::POLLOUT, deadline) {
            Wait::Ready => match socket::getsockopt(&fd, socket::sockopt::SocketError) {
                Ok(0) => return Ok((fd, addr)),
                Ok(e) => last = format!("{addr}: {}", Errno::from_raw(e)),
                Err(e) => last = format!("{addr}: {e}"),
            },
            Wait::TimedOut => {
                return Err(format!(
                    "{addr}: no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            }
            Wait::Stopped => return Err("the sandbox ended".into()),
        }
    }
    Err(last)
}

/// How many bytes a relay's pipe may hold, each way (asked of the kernel with `F_SETPIPE_SZ`;
/// a smaller pipe, when the user's pipe budget is spent, works too, only slower).
const PIPE_BYTES: usize = 1 << 20;

/// One direction of a relay. The bytes a request's head and ClientHello held (read by the
/// proxy) go first, from `early`; then the source's bytes are spliced into a pipe and from the
/// pipe to the destination, never copied through the proxy's memory (`splice(2)`).
struct Direction {
    early: Vec<u8>,
    early_sent: usize,
    pipe_r: OwnedFd,
    pipe_w: OwnedFd,
    /// What the pipe may hold.
    capacity: usize,
    /// Bytes in the pipe, charged to the sandbox's limit, not yet written.
    pending: usize,
    /// Still reading from the source.
    open: bool,
    /// Bytes the source may still send (a plain request's body); `None`: no bound.
    left: Option<u64>,
    moved: u64,
}

impl Direction {
    fn new(early: Vec<u8>, left: Option<u64>) -> io::Result<Direction> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let (pipe_r, pipe_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let _ = fcntl(
            pipe_w.as_raw_fd(),
            FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32),
        );
        let capacity = fcntl(pipe_w.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)?;
        Ok(Direction {
            moved: early.len() as u64,
            early,
            early_sent: 0,
            pipe_r,
            pipe_w,
            capacity: usize::try_from(capacity).unwrap_or(4096).max(1),
            pending: 0,
            open: left != Some(0),
            left,
        })
    }

    fn waiting(&self) -> bool {
        self.early_sent < self.early.len() || self.pending > 0
    }

    /// Whether to read more from the source: it is open and the pipe has room.
    fn wants(&self) -> bool {
        self.open && self.pending < self.capacity
    }
}

/// Moves bytes between the client and the server until both ends are done, the connection has
/// been idle for [`IDLE_TIMEOUT`], the sandbox's byte limit is reached or the proxy stops.
/// `first` goes to the server first; `body` bounds what else the client may send (a plain
/// request's body). Returns the bytes moved up and down.
fn relay(
    shared: &Shared,
    client: &OwnedFd,
    server: &OwnedFd,
    mut first: Vec<u8>,
    body: Option<u64>,
) -> (u64, u64) {
    let granted = shared.charge(first.len(), true);
    first.truncate(granted);
    let (mut up, mut down) = match (
        Direction::new(first, body),
        Direction::new(Vec::new(), None),
    ) {
        (Ok(up), Ok(down)) => (up, down),
        _ => return (granted as u64, 0),
    };
    let mut idle_since = Instant::now();
    let mut server_write_shut = false;
    let mut client_write_shut = false;
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        // A side whose source has ended and whose bytes are all written is told so.
        if !up.open && !up.waiting() && !server_write_shut && body.is_none() {
            let _ = socket::shutdown(server.as_raw_fd(), Shutdown::Write);
            server_write_shut = true;
        }
        if !down.open && !down.waiting() {
            if !client_write_shut {
                let _ = socket::shutdown(client.as_raw_fd(), Shutdown::Write);
                client_write_shut = true;
            }
            // The server has answered and closed: a plain request is over, and so is a tunnel
            // whose client has stopped sending.
            if body.is_some() || !up.open {
                break;
            }
        }
        let mut client_events = PollFlags::empty();
        let mut server_events = PollFlags::empty();
        if up.wants() {
            client_events |= PollFlags::POLLIN;
        }
        if down.waiting() {
            client_events |= PollFlags::POLLOUT;
        }
        if down.wants() {
            server_events |= PollFlags::POLLIN;
        }
        if up.waiting() {
            server_events |= PollFlags::POLLOUT;
        }
        if client_events.is_empty() && server_events.is_empty() {
            break;
        }
        let left = (idle_since + IDLE_TIMEOUT).saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        // Only the sides there is something to do on: a side that hung up would otherwise
        // wake the poll at once, again and again.
        let mut fds = vec![PollFd::new(shared.stop_fd(), PollFlags::POLLIN)];
        let client_at = (!client_events.is_empty()).then(|| {
            fds.push(PollFd::new(client.as_fd(), client_events));
            fds.len() - 1
        });
        let server_at = (!server_events.is_empty()).then(|| {
            fds.push(PollFd::new(server.as_fd(), server_events));
            fds.len() - 1
        });
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        if ready(&fds[0]) {
            break;
        }
        let events = |at: Option<usize>| {
            at.and_then(|i| fds[i].revents())
                .unwrap_or(PollFlags::empty())
        };
        let (c, s) = (events(client_at), events(server_at));
        let readable = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let mut progressed = false;
        let mut broken = false;
        for (dir, from_events, from, to, is_up) in [
            (&mut up, c, client, server, true),
            (&mut down, s, server, client, false),
        ] {
            if dir.wants() && from_events.intersects(readable) {
                match read_more(shared, from, dir, is_up) {
                    Ok(moved) => progressed |= moved,
                    Err(()) => broken = true,
                }
            }
            // Written at once when the destination has room (it mostly has): one wakeup a
            // chunk instead of two. When it has none, the next poll waits for it.
            if dir.waiting() {
                match write_pending(to, dir) {
                    Ok(moved) => progressed |= moved,
                    Err(()) => broken = true,
                }
            }
        }
        if broken {
            break;
        }
        if progressed {
            idle_since = Instant::now();
        }
    }
    (up.moved, down.moved)
}

/// The flags of every splice: never block (both ends are polled), move pages when it can.
fn splice_flags() -> nix::fcntl::SpliceFFlags {
    nix::fcntl::SpliceFFlags::SPLICE_F_NONBLOCK | nix::fcntl::SpliceFFlags::SPLICE_F_MOVE
}

/// Writes what waits in `dir` to `to`: its early bytes, then its pipe's. `Err` when the
/// connection is broken; `Ok(true)` when bytes moved.
fn write_pending(to: &OwnedFd, dir: &mut Direction) -> Result<bool, ()> {
    let sent = if dir.early_sent < dir.early.len() {
        socket::send(
            to.as_raw_fd(),
            &dir.early[dir.early_sent..],
            socket::MsgFlags::MSG_NOSIGNAL,
        )
        .inspect(|&n| {
            dir.early_sent += n;
            if dir.early_sent == dir.early.len() {
                dir.early = Vec::new();
                dir.early_sent = 0;
            }
        })
    } else {
        nix::fcntl::splice(&dir.pipe_r, None, to, None, dir.pending, splice_flags())
            .inspect(|&n| dir.pending -= n)
    };
    match sent {
        Ok(n) => Ok(n > 0),
        Err(Errno::EAGAIN | Errno::EINTR) => Ok(false),
        Err(_) => Err(()),
    }
}

/// Splices more from `from` into `dir`'s pipe, within the sandbox's byte limit and the body's
/// bound. Bytes past the limit stay in the pipe, never written (the limit cuts all egress).
fn read_more(
    shared: &Shared,
    from: &OwnedFd,
    dir: &mut Direction,
    is_up: bool,
) -> Result<bool, ()> {
    let room = dir.capacity - dir.pending;
    let want = match dir.left {
        Some(left) => room.min(usize::try_from(left).unwrap_or(usize::MAX)),
        None => room,
    };
    match nix::fcntl::splice(from, None, &dir.pipe_w, None, want, splice_flags()) {
        Ok(0) => {
            dir.open = false;
            Ok(false)
        }
        Ok(n) => {
            let granted = shared.charge(n, is_up);
            dir.moved += granted as u64;
            dir.pending += granted;
            if let Some(left) = &mut dir.left {
                *left -= n as u64;
                if *left == 0 {
                    dir.open = false;
                }
            }
            if granted < n {
                dir.open = false;
            }
            Ok(true)
        }
        Err(Errno::EAGAIN | Errno::EINTR) => Ok(false),
        Err(_) => {
            dir.open = false;
            Ok(false)
        }
    }
}
