//! Connections from the host to a server listening inside a sandbox (docs/threat-model.md,
//! "the port proxy").
//!
//! A sandbox's network namespace has only a loopback interface, and nothing of the host is
//! visible in it. To reach `127.0.0.1:PORT` there, the host asks the sandbox's init — which
//! lives in that namespace and was made by Corral, not by the sandbox's code — to open the
//! connection: on init's control socket the host sends [`MSG_CONNECT`] with the port and,
//! as SCM_RIGHTS, one end of a fresh socket pair for the answer. init makes a non-blocking
//! TCP socket, starts `connect(127.0.0.1:PORT)` and sends the socket back on that pair
//! ([`REPLY_SOCKET`]), or the errno ([`REPLY_ERROR`]); it never waits for the connection to
//! complete and keeps no copy. The host waits for the connection itself, with its own timeout.
//!
//! Nothing of the host crosses into the sandbox: the socket is made in the sandbox's own
//! namespace, so a port number can name only a listener of the sandbox (never the host's own
//! server on the same port), and the answer pair is a fresh anonymous socket pair.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    getsockopt, socket, socketpair, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
};

use crate::sys;

/// Host → init on the control socket: `c`, the port (big-endian u16) and, as SCM_RIGHTS, the
/// socket to answer on.
pub const MSG_CONNECT: u8 = b'c';
/// init → host on the answer socket: the connecting socket, as SCM_RIGHTS.
pub const REPLY_SOCKET: u8 = b'k';
/// init → host on the answer socket: `e` and the errno (little-endian i32).
pub const REPLY_ERROR: u8 = b'e';

/// Why a connection to a sandbox's port was not made.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The sandbox has ended (its init is gone).
    #[error("the sandbox has ended")]
    Gone,
    /// Nothing listens on the port inside the sandbox.
    #[error("nothing listens on port {0} in the sandbox")]
    Refused(u16),
    /// The sandbox did not answer, or its listener did not accept, within the timeout (a
    /// frozen sandbox, a full accept queue).
    #[error("port {0} of the sandbox did not accept the connection in time")]
    Timeout(u16),
    /// Port 0 names no listener.
    #[error("port 0 is not a port")]
    InvalidPort,
    /// init answered with something that is not a connecting TCP socket.
    #[error("the sandbox's init answered a connection request wrongly")]
    BadReply,
    #[error("connecting to port {port} in the sandbox: {source}")]
    Io {
        port: u16,
        #[source]
        source: io::Error,
    },
}

/// Opens connections to the servers of one sandbox, from any thread, without the lock of the
/// session that owns the sandbox. It holds no reference that keeps the sandbox alive: once
/// the sandbox's control socket is closed, every open fails with [`PortError::Gone`].
#[derive(Debug, Clone)]
pub struct PortOpener(Weak<OwnedFd>);

impl PortOpener {
    /// An opener for the sandbox whose init's control socket is `control`.
    pub fn new(control: &Arc<OwnedFd>) -> PortOpener {
        PortOpener(Arc::downgrade(control))
    }

    /// Connects to `127.0.0.1:port` inside the sandbox; waits at most `timeout` for init's
    /// answer and for the connection. The stream returned is non-blocking.
    pub fn connect(&self, port: u16, timeout: Duration) -> Result<TcpStream, PortError> {
        if port == 0 {
            return Err(PortError::InvalidPort);
        }
        let io = |source| PortError::Io { port, source };
        let deadline = Instant::now() + timeout;
        let (answer_host, answer_init) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| io(e.into()))?;
        {
            let control = self.0.upgrade().ok_or(PortError::Gone)?;
            let [hi, lo] = port.to_be_bytes();
            // The control socket is a SEQPACKET pair with init: one short message never blocks
            // for long (init drains them); EPIPE or ECONNRESET: init is gone.
            sys::send_message(
                control.as_fd(),
                &[MSG_CONNECT, hi, lo],
                Some(answer_init.as_raw_fd()),
            )
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN) => PortError::Gone,
                _ => io(e),
            })?;
        }
        drop(answer_init);
        if !wait_for(answer_host.as_fd(), PollFlags::POLLIN, deadline).map_err(io)? {
            return Err(PortError::Timeout(port));
        }
        let mut buf = [0u8; 8];
        let (n, fd) = sys::recv_message(answer_host.as_fd(), &mut buf).map_err(io)?;
        let socket = match (&buf[..n], fd) {
            ([REPLY_SOCKET], Some(fd)) => fd,
            ([REPLY_ERROR, errno @ ..], None) if errno.len() == 4 => {
                let errno = i32::from_le_bytes(errno.try_into().expect("4 bytes"));
                return Err(match errno {
                    libc::ECONNREFUSED => PortError::Refused(port),
                    _ => io(io::Error::from_raw_os_error(errno)),
                });
            }
            // init hung up without answering: the sandbox is ending.
            ([], None) => return Err(PortError::Gone),
            _ => return Err(PortError::BadReply),
        };
        check_tcp_socket(&socket)?;
        if !wait_for(socket.as_fd(), PollFlags::POLLOUT, deadline).map_err(io)? {
            return Err(PortError::Timeout(port));
        }
        let stream = TcpStream::from(socket);
        match stream.take_error().map_err(io)? {
            None => Ok(stream),
            Some(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                Err(PortError::Refused(port))
            }
            Some(e) => Err(io(e)),
        }
    }
}

/// Whether `fd` became ready for `events` before `deadline`.
fn wait_for(fd: BorrowedFd<'_>, events: PollFlags, deadline: Instant) -> io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut pfd = [PollFd::new(fd, events)];
        match poll(&mut pfd, PollTimeout::from(ms)) {
            Ok(0) if left.is_zero() => return Ok(false),
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The descriptor init sent is an IPv4 stream socket (what [`open_in_namespace`] makes).
fn check_tcp_socket(fd: &OwnedFd) -> Result<(), PortError> {
    let stream = getsockopt(fd, sockopt::SockType).map_err(|_| PortError::BadReply)?;
    let local = nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(fd.as_raw_fd())
        .map_err(|_| PortError::BadReply)?;
    if stream != SockType::Stream || local.as_sockaddr_in().is_none() {
        return Err(PortError::BadReply);
    }
    Ok(())
}

/// init's side: answers one connection request (`msg` after [`MSG_CONNECT`], with the
/// answer socket it carried). Never blocks: the connection is left in progress, and the
/// answer is sent without waiting (a host that does not read it has only itself to blame).
pub(crate) fn answer(msg: &[u8], reply: Option<OwnedFd>) {
    let Some(reply) = reply else { return };
    let [hi, lo] = msg else { return };
    let port = u16::from_be_bytes([*hi, *lo]);
    match open_in_namespace(port) {
        Ok(socket) => {
            let _ =
                sys::send_message_nowait(reply.as_fd(), &[REPLY_SOCKET], Some(socket.as_raw_fd()));
        }
        Err(errno) => {
            let mut answer = vec![REPLY_ERROR];
            answer.extend_from_slice(&(errno as i32).to_le_bytes());
            let _ = sys::send_message_nowait(reply.as_fd(), &answer, None);
        }
    }
}

/// A non-blocking TCP socket in this process's network namespace, connecting (or connected)
/// to `127.0.0.1:port`.
fn open_in_namespace(port: u16) -> Result<OwnedFd, nix::errno::Errno> {
    let socket = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let address = SockaddrIn::new(127, 0, 0, 1, port);
    match nix::sys::socket::connect(socket.as_raw_fd(), &address) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => Ok(socket),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// init's side answered in this process (the host's namespace): the whole exchange, a
    /// refused port, and an opener whose sandbox is gone.
    #[test]
    fn exchange_connects_refuses_and_notices_a_gone_sandbox() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (host, init) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let control = Arc::new(host);
        let opener = PortOpener::new(&control);
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let mut buf = [0u8; 8];
                let (n, fd) = sys::recv_message(init.as_fd(), &mut buf).unwrap();
                assert_eq!(buf[0], MSG_CONNECT);
                answer(&buf[1..n], fd);
            }
        });
        let mut stream = opener.connect(port, Duration::from_secs(5)).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        accepted.write_all(b"hello").unwrap();
        stream.set_nonblocking(false).unwrap();
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        drop(listener);
        assert!(matches!(
            opener.connect(port, Duration::from_secs(5)),
            Err(PortError::Refused(p)) if p == port
        ));
        server.join().unwrap();
        assert!(matches!(
            opener.connect(0, Duration::from_secs(1)),
            Err(PortError::InvalidPort)
        ));
        drop(control);
        assert!(matches!(
            opener.connect(port, Duration::from_secs(1)),
            Err(PortError::Gone)
        ));
    }

    /// An init that never answers (a frozen sandbox) costs the host the timeout, no more.
    #[test]
    fn a_silent_init_times_out() {
        let (host, _init) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let control = Arc::new(host);
        let started = Instant::now();
        let got = PortOpener::new(&control).connect(8000, Duration::from_millis(200));
        assert!(matches!(got, Err(PortError::Timeout(8000))), "{got:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
