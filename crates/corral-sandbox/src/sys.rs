//! Thin wrappers for the few system calls the crates we use do not cover.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::mount::{mount, MsFlags};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::sys::statvfs::{statvfs, FsFlags};

use crate::rootfs::cstring;

/// Makes the mount at `path` and every mount below it read-only, nosuid and nodev.
pub fn make_read_only(path: &Path) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let c_path = cstring(path);
    // SAFETY: `c_path` is a valid NUL-terminated string and `attr` a valid mount_attr whose
    // size is passed; the kernel only reads both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENOSYS) {
        return Err(err);
    }
    // <linux/statfs.h>'s ST_RELATIME, which musl's headers (so nix on musl) lack.
    const ST_RELATIME: FsFlags = FsFlags::from_bits_retain(0x1000);
    // Kernels before 5.12: remount the top mount only, keeping the flags the kernel locks
    // for mounts inherited from a more privileged namespace.
    let locked = statvfs(path)?.flags();
    let mut flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    for (fs_flag, ms_flag) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if locked.contains(fs_flag) {
            flags |= ms_flag;
        }
    }
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(io::Error::from)
}

/// Forks the calling (single-threaded) process with extra `clone` flags (`CLONE_PARENT`, new
/// namespaces). Returns 0 in the child and its pid in the caller.
///
/// # Safety
/// The caller must be single-threaded: like `fork`, only the calling thread is copied, and
/// unlike glibc's `fork` nothing makes locks another thread holds usable in the child.
pub unsafe fn clone_process(flags: libc::c_int) -> io::Result<libc::pid_t> {
    // SAFETY: a raw clone with no new stack behaves like fork: the child continues on a copy
    // of the caller's stack. The caller guarantees no other thread holds locks.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_long,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid as libc::pid_t)
    }
}

/// Whether this process has a single thread.
pub fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq that lives for the duration of the call.
    // (The request's type is c_ulong in glibc and c_int in musl.)
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lets a closed pipe end this process the way it ends any Unix tool (SIGPIPE's default
/// action), instead of an `EPIPE` error on every write: for the commands whose output is a
/// listing another program reads (`corral image ls | head`). Rust's runtime ignores SIGPIPE.
pub fn end_quietly_on_closed_pipe() {
    // SAFETY: installs the default action for SIGPIPE; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Sets every signal but SIGKILL and SIGSTOP, real-time ones included, back to its default
/// action (an ignored signal stays ignored across `execve`). Through the raw system call:
/// glibc's `sigaction` refuses the real-time signals it reserves for itself.
pub fn reset_signal_dispositions() {
    // The kernel's `struct sigaction` (handler, flags, restorer, mask: 32 bytes on x86_64
    // and arm64), all zero: SIG_DFL, no flags, an empty mask.
    let default = [0u64; 4];
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `default` is a valid, zeroed kernel sigaction; no old action is asked
        // for; 8 is the kernel's sigset size. Numbers the kernel lacks fail with EINVAL.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            )
        };
    }
}

/// Closes every descriptor >= 3 that is not in `keep`.
pub fn close_all_except(keep: &[RawFd]) {
    let mut keep: Vec<u32> = keep.iter().map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    close_all_except_sorted(&keep);
}

/// [`close_all_except`] for a `keep` sorted in ascending order. It allocates nothing, so a
/// child forked from a multithreaded process may call it.
pub fn close_all_except_sorted(keep: &[u32]) {
    let mut next = 3u32;
    for &fd in keep.iter().filter(|&&fd| fd >= 3) {
        if fd > next {
            close_range(next, fd - 1, 0);
        }
        next = fd + 1;
    }
    close_range(next, u32::MAX, 0);
}

/// Marks every descriptor from `first` on close-on-exec.
pub fn cloexec_from(first: u32) {
    close_range(first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
}

fn close_range(first: u32, last: u32, flags: libc::c_uint) {
    // SAFETY: close_range only affects this process's descriptor table; callers pass ranges
    // that contain no descriptor still in use by Rust objects they later touch.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) };
}

/// Sends one message, optionally carrying a descriptor.
pub fn send_message(sock: BorrowedFd<'_>, bytes: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let iov = [io::IoSlice::new(bytes)];
    let fds = fd.map(|f| [f]);
    let cmsgs: Vec<ControlMessage> = fds.iter().map(|f| ControlMessage::ScmRights(f)).collect();
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// Sends one message, optionally carrying a descriptor, without waiting for room in the
/// socket's buffer (EAGAIN instead).
pub fn send_message_nowait(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<RawFd>,
) -> io::Result<()> {
    let iov = [io::IoSlice::new(bytes)];
    let fds = fd.map(|f| [f]);
    let cmsgs: Vec<ControlMessage> = fds.iter().map(|f| ControlMessage::ScmRights(f)).collect();
    sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        None,
    )?;
    Ok(())
}

/// Receives one message of at most `buf.len()` bytes and the descriptor it carries, if any.
/// `Ok((0, None))` means the peer closed the socket.
pub fn recv_message(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    recv_with_credentials(sock, buf).map(|r| (r.len, r.fd))
}

/// Overwrites this process's argument and environment strings with zeros, so that
/// `/proc/<pid>/cmdline` and `environ` show nothing of the host process it was forked from.
pub fn scrub_args_and_environment() -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let after_comm = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/self/stat"))?;
    let fields: Vec<usize> = after_comm
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // proc(5): arg_start, arg_end, env_start, env_end are fields 48..=51.
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    for (start, end) in [(field(48), field(49)), (field(50), field(51))] {
        if start != 0 && end > start {
            // SAFETY: [start, end) is this process's own argv/environ string area on its
            // initial stack, mapped read-write. Nothing in init reads those strings after
            // this point (lookups of an emptied environment simply find nothing).
            unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
        }
    }
    Ok(())
}

/// Makes sure descriptors 0, 1 and 2 are open (on /dev/null if they were closed), so that
/// descriptors created later never take their numbers and get clobbered by a child's dup2.
pub fn ensure_stdio_open() {
    for fd in 0..3 {
        if nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD) == Err(nix::errno::Errno::EBADF) {
            // Opening takes the lowest free number, which is `fd`.
            let _ = nix::fcntl::open(
                "/dev/null",
                nix::fcntl::OFlag::O_RDWR,
                nix::sys::stat::Mode::empty(),
            );
        }
    }
}

/// A message received with the descriptor and the sender's credentials it carried.
pub struct Received {
    pub len: usize,
    pub fd: Option<OwnedFd>,
    /// The pid the sender vouched for, translated into our pid namespace by the kernel.
    pub pid: Option<i32>,
}

/// Receives one message on a socket that has `SO_PASSCRED` set.
pub fn recv_with_credentials(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(RawFd, nix::sys::socket::UnixCredentials);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received = Received {
        len: msg.bytes,
        fd: None,
        pid: None,
    };
    for cmsg in msg.cmsgs()? {
        match cmsg {
            ControlMessageOwned::ScmRights(fds) => {
                for fd in fds {
                    // SAFETY: SCM_RIGHTS just installed `fd` in our table; we are its only owner.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    received.fd.get_or_insert(owned);
                }
            }
            ControlMessageOwned::ScmCredentials(creds) => received.pid = Some(creds.pid()),
            _ => {}
        }
    }
    Ok(received)
}

/// Sends one message carrying several descriptors.
pub fn send_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let iov = [io::IoSlice::new(bytes)];
    let cmsgs = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}
