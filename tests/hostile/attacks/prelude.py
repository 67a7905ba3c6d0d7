# Shared helpers prepended to every Python attack (see harness.rs).
# Output protocol, one line each, checked by the Rust side:
#   START                 the program really ran
#   BLOCKED <what> <why>  the attempt failed (why = errno name)
#   ALLOWED <what> ...    the attempt succeeded (a sandbox hole)
#   LEAK <what> ...       data that must stay hidden was read (a hole)
#   DONE                  the program reached its end
import ctypes
import errno
import os
import socket
import struct
import sys
import time

try:
    sys.stdout.reconfigure(line_buffering=True)
except Exception:
    pass

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long

_NR = {
    'x86_64': dict(
        ioctl=16, mknod=133, ptrace=101, syslog=103, setuid=105, setgid=106,
        setgroups=116, setresuid=117, setresgid=119, setfsuid=122, capset=126,
        pivot_root=155, adjtimex=159, chroot=161, settimeofday=164, mount=165,
        umount2=166, swapon=167, reboot=169, sethostname=170,
        setdomainname=171, init_module=175, delete_module=176, clone=56,
        clock_settime=227, kexec_load=246, add_key=248, request_key=249,
        keyctl=250, mknodat=259, unshare=272, perf_event_open=298,
        name_to_handle_at=303, open_by_handle_at=304, clock_adjtime=305,
        setns=308, finit_module=313, kexec_file_load=320, bpf=321,
        userfaultfd=323, io_uring_setup=425, io_uring_enter=426,
        io_uring_register=427, open_tree=428, move_mount=429, fsopen=430,
        fsmount=432, clone3=435),
    'aarch64': dict(
        ioctl=29, ptrace=117, syslog=116, setuid=146, setgid=144,
        setgroups=159, setresuid=147, setresgid=149, setfsuid=151, capset=91,
        pivot_root=41, adjtimex=171, chroot=51, settimeofday=170, mount=40,
        umount2=39, swapon=224, reboot=142, sethostname=161,
        setdomainname=162, init_module=105, delete_module=106, clone=220,
        clock_settime=112, kexec_load=104, add_key=217, request_key=218,
        keyctl=219, mknodat=33, unshare=97, perf_event_open=241,
        name_to_handle_at=264, open_by_handle_at=265, clock_adjtime=266,
        setns=268, finit_module=273, kexec_file_load=294, bpf=280,
        userfaultfd=282, io_uring_setup=425, io_uring_enter=426,
        io_uring_register=427, open_tree=428, move_mount=429, fsopen=430,
        fsmount=432, clone3=435),
}
NR = _NR[os.uname().machine]


def ename(e):
    if isinstance(e, str):
        return e
    if not e:
        return 'TIMEOUT'
    return errno.errorcode.get(e, 'E%d' % e)


def _arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return a


def sys_call(name, *args):
    """Raw syscall by name; returns (ret, errno)."""
    ctypes.set_errno(0)
    r = LIBC.syscall(ctypes.c_long(NR[name]), *[_arg(a) for a in args])
    return r, (ctypes.get_errno() if r < 0 else 0)


def blocked(what, why):
    print('BLOCKED %s %s' % (what, ename(why)), flush=True)


def allowed(what, detail=''):
    print(('ALLOWED %s %s' % (what, detail)).rstrip(), flush=True)


def try_sys(what, name, *args, forks=False):
    """Attempt a syscall that must fail. forks=True: it creates a process."""
    r, e = sys_call(name, *args)
    if r == 0 and forks:
        os._exit(0)  # we are the child of a clone that should not exist
    if r < 0:
        blocked(what, e)
    else:
        allowed(what, 'ret=%d' % r)
        if forks:
            try:
                os.waitpid(r, 0)
            except OSError:
                pass
    return r


def attempt(what, fn):
    """An action that must fail: OSError -> BLOCKED, success -> ALLOWED."""
    try:
        res = fn()
    except socket.gaierror as ex:
        blocked(what, 'EAI%d' % ex.errno)
        return None
    except OSError as ex:
        blocked(what, ex.errno)
        return None
    allowed(what, '' if res is None else repr(res)[:200])
    return res


def probe(what, fn):
    """A read that must fail: OSError -> BLOCKED, success -> LEAK <data>."""
    try:
        res = fn()
    except OSError as ex:
        blocked(what, ex.errno)
        return None
    print('LEAK %s %r' % (what, res if not isinstance(res, (bytes, str)) else res[:300]), flush=True)
    return res


def read_file(path, n=1 << 20):
    with open(path, 'rb') as f:
        return f.read(n)


def spawn(argv, stdin_fd=None, new_session=False):
    """fork+exec a program that shares our stdout/stderr; stdin is set
    with close+dup (no dup2 needed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            if new_session:
                os.setsid()
            if stdin_fd is not None:
                os.close(0)
                os.dup(stdin_fd)  # lowest free descriptor: 0
            os.execv(argv[0], argv)
        except OSError as ex:
            os.write(2, ('exec %s: %s\n' % (argv[0], ex)).encode())
        os._exit(127)
    return pid


def run(argv, stdin_fd=None):
    """Run a program to completion; returns its exit code."""
    _, st = os.waitpid(spawn(argv, stdin_fd), 0)
    return os.waitstatus_to_exitcode(st)


def env(name):
    return os.environ[name]


print('START', flush=True)
