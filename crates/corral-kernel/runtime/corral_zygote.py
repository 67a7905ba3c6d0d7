"""Corral's zygote: a Python with the heavy libraries already imported that forks sessions.

It runs inside a sandbox of the "zygote" role (no capabilities, no_new_privs, the zygote
seccomp profile, no Landlock) and never runs untrusted code. For each request from the host
(a SEQPACKET message on fd 3 carrying the session's descriptors) it forks a child that:

  1. joins the session's cgroup (the host passes the opened membership files),
  2. enters a nested user namespace (uid 1000 -> 1000) and fresh mount, pid, net, ipc, uts
     and cgroup namespaces,
  3. forks the session's init (pid 1 of the new pid namespace), which mounts a fresh /proc
     (host-wide files masked, /proc/sys read-only), /tmp, /workspace, /dev/shm and devpts,
     brings loopback up, hands the host a descriptor of /workspace, then
  4. forks the kernel, which applies rlimits, Landlock, drops every capability, installs the
     workload seccomp filters and only then serves executions.

The host verifies the result (capabilities, no_new_privs, seccomp, namespaces) through
/proc before it hands the session to anyone. Nothing of one session reaches another: each
child keeps only its own descriptors, and no state flows back to the zygote.
"""

import ctypes
import errno
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys

sys.path.insert(0, "/run/corral")

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_PDEATHSIG = 22, 2, 1
SIOCSIFFLAGS, IFF_UP, IFF_RUNNING = 0x8914, 0x1, 0x40
SANDBOX_UID = 1000
PROC_MASKED = ("timer_list", "sched_debug", "kcore", "keys")
NR = {"x86_64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446, "capset": 126},
      "aarch64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446, "capset": 91}}[os.uname().machine]


class SetupError(Exception):
    pass


def check(result, what):
    if result < 0:
        e = ctypes.get_errno()
        raise SetupError("%s: %s" % (what, os.strerror(e)))
    return result


def close_all_except(keep):
    """Closes every descriptor above 2 that is not in `keep` (close_range: no upper bound)."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 2**31 - 1)


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(LIBC.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount %s" % target)


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# ---- session child ---------------------------------------------------------------------

def enter_namespaces(cgroup_fds):
    for fd in cgroup_fds:
        # Moving ourselves through v1 `tasks` (or v2 `cgroup.procs`) with "0".
        os.write(fd, b"0")
        os.close(fd)
    check(LIBC.unshare(CLONE_NEWUSER), "unshare(user)")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", "%d %d 1" % (SANDBOX_UID, SANDBOX_UID))
    write_file("/proc/self/gid_map", "%d %d 1" % (SANDBOX_UID, SANDBOX_UID))
    check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP),
          "unshare(mount, pid, net, ipc, uts, cgroup)")


def build_session_filesystems(disk_bytes):
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    for target, mode, extra in (("/tmp", "1777", 0), ("/workspace", "755", 0), ("/dev/shm", "1777", MS_NOEXEC)):
        mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | extra,
              "size=%d,mode=%s,nr_inodes=65536" % (disk_bytes, mode))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_MASKED:
        if os.path.exists("/proc/" + name):
            mount("/dev/null", "/proc/" + name, None, MS_BIND)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,max=64")
    socket.sethostname("corral")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", IFF_UP | IFF_RUNNING))
    os.chdir("/workspace")


def landlock():
    abi = LIBC.syscall(NR["landlock_create_ruleset"], None, 0, 1)
    if abi < 1:
        raise SetupError("the kernel has no Landlock")
    # Access rights per ABI (include/uapi/linux/landlock.h).
    execute, write_file_, read_file, read_dir = 1 << 0, 1 << 1, 1 << 2, 1 << 3
    fs_all = (1 << 13) - 1                 # ABI 1: up to MAKE_SYM
    if abi >= 2:
        fs_all |= 1 << 13                  # REFER
    if abi >= 3:
        fs_all |= 1 << 14                  # TRUNCATE
    if abi >= 5:
        fs_all |= 1 << 15                  # IOCTL_DEV
    scoped = 0x3 if abi >= 6 else 0        # abstract unix sockets, signals
    if abi >= 6:
        attr = struct.pack("QQQ", fs_all, 0, scoped)
    else:
        attr = struct.pack("Q", fs_all)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = check(LIBC.syscall(NR["landlock_create_ruleset"], buf, len(attr), 0), "landlock_create_ruleset")
    read = execute | read_file | read_dir
    device = execute | write_file_ | read_file | read_dir | (fs_all & ((1 << 14) | (1 << 15)))
    try:
        for path, access in (("/", read), ("/dev", device), ("/workspace", fs_all), ("/tmp", fs_all), ("/dev/shm", fs_all)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access & fs_all, fd), 12)
                check(LIBC.syscall(NR["landlock_add_rule"], ruleset, 1, rule, 0), "landlock_add_rule " + path)
            finally:
                os.close(fd)
        check(LIBC.syscall(NR["landlock_restrict_self"], ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def drop_capabilities():
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        check(LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "dropping capability %d" % cap)
    check(LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)
    data = ctypes.create_string_buffer(bytes(24), 24)
    check(LIBC.syscall(NR["capset"], header, data), "capset")


def install_seccomp(programs):
    for program in programs:
        filt = ctypes.create_string_buffer(program, len(program))
        fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(filt)), 16)
        check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog, 0, 0), "installing seccomp")


def load_programs():
    """The workload filters, as the host wrote them: [u32 count] then per program [u32 len][len*8 bytes]."""
    with open("/run/corral/workload.bpf", "rb") as f:
        blob = f.read()
    count, = struct.unpack_from("<I", blob, 0)
    offset, programs = 4, []
    for _ in range(count):
        n, = struct.unpack_from("<I", blob, offset)
        offset += 4
        programs.append(blob[offset:offset + 8 * n])
        offset += 8 * n
    return programs


def become_kernel(request, proto, stdout, stderr, programs):
    """The session's kernel process: every restriction applies before any code runs."""
    import corral_kernel
    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    for src, dst in ((null, 0), (stdout, 1), (stderr, 2), (proto, 3)):
        os.dup2(src, dst)
    close_all_except([3])
    for name, value in request.get("rlimits", []):
        resource.setrlimit(getattr(resource, name), (value, value))
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    landlock()
    drop_capabilities()
    install_seccomp(programs)
    os.environ.update(request.get("env", {}))
    corral_kernel.reseed()
    corral_kernel.serve(3)
    os._exit(0)


def supervise(ctl, kernel_pid):
    """The session's init: relays interrupts, reaps, and kills everything once the kernel is
    gone or the host hung up. Reports the kernel's wait status as b'X' + i32."""
    # As pid 1 it ignores signals left at their default, but Python installed a handler for
    # SIGINT: without this, the kernel could stop its own init where Landlock cannot scope
    # signals (ABI < 6).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status, host_gone = None, False
    while True:
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                ctl.send(b"X" + struct.pack("<i", status if status is not None else 0))
                os._exit(0)
            if pid == 0:
                break
            if pid == kernel_pid:
                status = raw
        if status is not None or host_gone:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        watched = [wake_r] if host_gone else [wake_r, ctl]
        try:
            ready, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if ctl in ready:
            data = ctl.recv(64)
            if not data:
                host_gone = True
            elif b"i" in data and status is None:
                os.kill(kernel_pid, signal.SIGINT)


def session_child(request, fds):
    proto, ctl_fd, stdout, stderr = fds[:4]
    ctl = socket.socket(fileno=ctl_fd)
    try:
        programs = load_programs()
        enter_namespaces(fds[4:])
        if os.fork():
            os._exit(0)   # the session's init is pid 1 of the new pid namespace
        build_session_filesystems(request["disk_bytes"])
        workspace = os.open("/workspace", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
        ctl.sendmsg([b"R"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", workspace)),
                             (socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
        os.close(workspace)
        kernel_pid = os.fork()
        if kernel_pid == 0:
            ctl.close()
            become_kernel(request, proto, stdout, stderr, programs)
        for fd in (proto, stdout, stderr):
            os.close(fd)
        # Tell the host the kernel's pid, translated into its pid namespace by the kernel.
        kernel_creds = struct.pack("3i", kernel_pid, SANDBOX_UID, SANDBOX_UID)
        ctl.sendmsg([b"K"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, kernel_creds)])
        supervise(ctl, kernel_pid)
    except BaseException as e:  # report, never fall through into the zygote's loop
        try:
            ctl.send(("E%s: %s" % (type(e).__name__, e)).encode()[:4000])
        finally:
            os._exit(1)


# ---- the zygote --------------------------------------------------------------------------

def main():
    import corral_kernel
    corral_kernel.prepare()
    preloaded = [m for m in ("IPython", "numpy", "pandas", "matplotlib.pyplot") if m in sys.modules]
    gc.collect()
    gc.freeze()  # keep the collector from touching (and so copying) the shared heap
    ctl = socket.socket(fileno=3)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # intermediate children are reaped by the kernel
    ctl.send(json.dumps({"type": "ready", "preloaded": preloaded}).encode())
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 65536, 16)
        except InterruptedError:
            continue
        if not msg:
            return
        request = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            ctl.detach()  # closed below by number; the object must not close a reused fd 3
            close_all_except(fds)
            session_child(request, fds)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main()
