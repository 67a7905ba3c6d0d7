"""Corral's zygotes: a Python with the heavy libraries already imported that forks sessions
(``corral_zygote.py``, the full zygote), and a lean one that forks one-shot runs only
(``corral_zygote.py lean``: the one-shot runner and a few light standard modules, no IPython,
no data stack), whose forks copy and tear down far less memory.

It runs inside a sandbox of the "zygote" role and never runs untrusted code. It never sees a
session's data either: a fork request from the host (a SEQPACKET message on fd 3) carries
only the session's descriptors. The zygote hands them to `corral_session_fork` of
libcorral_session.so, the engine's own lockdown built from Rust (crates/corral-sandbox,
src/session.rs), which forks a child that reads the session's plan from the session's own
control socket, enters the session's cgroup, uid, namespaces and filesystems, forks the
session's init and returns in the kernel process, locked down, with the session's
environment. No Python runs in that child or in init: the kernel process is the first to
return to the interpreter, and only then does any of the session's code run. The same fork
serves one-shot runs (`POST /v1/run`): the plan then carries the program, which init places at
/run/corral/main.py, and the kernel runs it as corral_oneshot.py would in a fresh interpreter
instead of serving a session.
"""

import atexit  # noqa: F401 (every run forked from a zygote runs the exit functions)
import ctypes
import errno
import gc
import json
import os
import signal
import socket
import sys


_HUGE_PAGE = 2 << 20
_MADV_COLLAPSE = 25


def _collapse_into_huge_pages():
    """Backs the zygote's anonymous memory with huge pages where the kernel can
    (MADV_COLLAPSE, Linux 6.1): a fork then copies one page-table entry per 2 MiB of it instead
    of 512, and a forked child's exit tears as few down. A child that writes to such a page
    gets a 4 KiB copy as before. Nothing new is allocated in huge pages."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        name = fields[5] if len(fields) > 5 else ""
        if not fields[1].startswith("rw") or name not in ("", "[heap]"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start = (start + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
        end &= ~(_HUGE_PAGE - 1)
        # Best effort: a kernel without it, or without a free huge page, leaves it as it is.
        for _ in range(2):
            if end <= start or libc.madvise(start, end - start, _MADV_COLLAPSE) == 0:
                break
            if ctypes.get_errno() != errno.EAGAIN:
                break


# What the lean zygote imports besides the one-shot runner: standard modules that one-shot
# programs often import, that cost a run up to 5 ms each to import and the zygote little
# memory (0.7 MiB together). Every 4 KiB of the zygote's own memory costs each run about half
# a microsecond (its page-table entries are copied by three forks and torn down by three
# exits), so modules as large as dataclasses, hashlib or pathlib (0.2 to 0.4 MiB each) are left
# to the runs that use them (docs/benchmarks.md, issue 18, third round). Their state set at
# import is per process only where a fresh interpreter's is too: `random` is reseeded in
# every child, the others keep none that differs between processes.
LEAN_PRELOAD = (
    "__future__",
    "base64",
    "bisect",
    "copy",
    "csv",
    "datetime",
    "decimal",
    "fractions",
    "heapq",
    "pickle",
    "random",
    "string",
    "typing",
    "zlib",
)


def main(lean=False):
    # The fork is made in the library, with the GIL held and around it what os.fork() does
    # around its own (PyOS_BeforeFork, then PyOS_AfterFork_Parent or _Child).
    session = ctypes.PyDLL("/run/corral/libcorral_session.so")
    fork = session.corral_session_fork
    fork.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_size_t]
    fork.restype = ctypes.c_char_p
    before_fork = ctypes.pythonapi.PyOS_BeforeFork
    after_fork_in_parent = ctypes.pythonapi.PyOS_AfterFork_Parent
    after_fork_in_child = ctypes.pythonapi.PyOS_AfterFork_Child
    for function in (before_fork, after_fork_in_parent, after_fork_in_child):
        function.argtypes = []
        function.restype = None
    import corral_oneshot
    import corral_policy  # noqa: F401 (forked children find it here: their /run/corral is not this one)
    ready_frame = corral_oneshot._ready_frame()
    if lean:
        corral_kernel = None
        for name in LEAN_PRELOAD:
            try:
                __import__(name)
            except ImportError:
                pass
        preloaded = []
    else:
        import corral_kernel
        corral_kernel.prepare()
        preloaded = [m for m in ("IPython", "numpy", "pandas", "matplotlib.pyplot") if m in sys.modules]
    ready = {"type": "ready", "preloaded": preloaded}
    if lean:
        # What the host routes one-shot runs by: the top-level modules imported here, and which
        # names are the standard library's.
        ready["modules"] = sorted({name.partition(".")[0] for name in sys.modules})
        ready["stdlib"] = sorted(sys.stdlib_module_names)
    gc.collect()
    gc.freeze()  # keep the collector from touching (and so copying) the shared heap
    _collapse_into_huge_pages()
    ctl = socket.socket(fileno=3)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the forked children are not ours to reap
    ctl.send(json.dumps(ready).encode())
    del ready
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1, 16)
        except InterruptedError:
            continue
        if not msg:
            return
        before_fork()
        entered = fork((ctypes.c_int * len(fds))(*fds), len(fds))
        if entered is None:  # the zygote
            after_fork_in_parent()
            for fd in fds:
                os.close(fd)
            continue
        # The session's kernel process, locked down.
        try:
            after_fork_in_child()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            ctl.detach()  # fd 3 is the kernel's protocol socket now
            entered = json.loads(entered.decode())
            if entered["program"] is not None:
                corral_oneshot.run_forked(entered["program"], entered["env"], ready_frame)
            if corral_kernel is not None:  # the lean zygote serves no session
                os.environ.update(entered["env"])
                corral_kernel.reseed()
                corral_kernel.serve(3)
        finally:
            os._exit(0)


if __name__ == "__main__":
    main(lean=sys.argv[1:] == ["lean"])
