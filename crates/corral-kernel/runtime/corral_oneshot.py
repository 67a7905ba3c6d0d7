"""Corral's one-shot Python runner; it runs inside the sandbox (docs/kernel-protocol.md).

``python3 corral_oneshot.py [--policy FILE] PROGRAM [ARGS...]``, or the same with this file's
precompiled bytecode as the script: runs PROGRAM like ``python3 PROGRAM``; when fd 3 is a
socket it also reports the final expression's value, open matplotlib figures and an uncaught
exception as frames, then ``done``. With ``--policy``, under the code policy in FILE
(corral_policy.py, docs/code-policy.md).

A ``print(1)`` pays for every line here, so this file holds only the one-shot path: result
formatting and the frame protocol live in corral_kernel_lib.py, imported only when there is
something to report. Run from its bytecode, it costs neither a compile nor an import.
"""

import _imp
import os
import sys

# importlib.machinery's SourceFileLoader, from the module Python loads while starting:
# importing importlib.machinery itself would cost every run about 50 us.
from _frozen_importlib_external import SourceFileLoader

_WORKSPACE = "/workspace"


def _runtime(name):
    """The runtime module `name` (corral_kernel_lib, corral_policy), from beside this file."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.basename(here) == "__pycache__":  # run from the bytecode
        here = os.path.dirname(here)
    if here not in sys.path:
        sys.path.insert(0, here)
    return __import__(name)


def _library():
    return _runtime("corral_kernel_lib")


def _load_policy(path):
    """The code policy in the file the host placed at `path` (its module rules)."""
    import json

    with open(path, "rb") as rules:
        return _runtime("corral_policy").Policy.from_message(json.load(rules))


def _frames_fd():
    """3 when the host gave us a socket there, else None (run without frames)."""
    import stat

    try:
        if not stat.S_ISSOCK(os.fstat(3).st_mode):
            return None
    except OSError:
        return None
    os.set_inheritable(3, False)  # the program's children (os.system) must not get it
    return 3


def _compile(source, path, mode):
    """compile(source, path, mode, dont_inherit=True), without its cost on a first call.

    The first compile() in a process sets up the AST module's ~120 classes (it checks whether
    `source` is an AST), about 2 ms: more than the rest of this runner together. exec() and
    eval() of a string compile in C without that check, but name the code "<string>" and run
    it. So they are stopped by a profile hook at the code's first event, before it executes
    anything, and the code object is taken from its frame and renamed to `path` (what the
    import system does with bytecode from a moved file). Nothing else can reach the hook: the
    parser runs no Python code except a codec a coding cookie names, which is not "<string>".
    The hook stops the code with a builtin exception (a class of this module's own would cost
    every run 14 us to create); nothing runs between its raise and the `except` here."""
    caller = sys._getframe()
    code = None

    def hook(frame, event, arg):
        nonlocal code
        if event == "call" and frame.f_back is caller and frame.f_code.co_filename == "<string>":
            code = frame.f_code
            raise StopIteration

    sys.setprofile(hook)
    try:
        (exec if mode == "exec" else eval)(source, {})
    except StopIteration:
        if code is None:  # the coding cookie's codec raised it
            raise
    except SyntaxError as error:
        error.filename = path
        raise
    finally:
        sys.setprofile(None)
    if code is None:  # not seen (never expected): the plain way
        return compile(source, path, mode, dont_inherit=True)
    _imp._fix_co_filename(code, path)
    return code


def _compile_program(source, path, split_final_expression):
    """The program's code and, when asked, its final expression statement compiled apart
    (None if it has none) so that its value can be reported.

    The split is textual, without the AST module (its set-up alone would cost every run more
    than 2 ms). The last top-level statement starts on a line that begins in column 0; going
    up from the last such line, the first tail that compiles is that statement (lines of an
    unfinished bracket or string do not compile on their own). It is the final expression
    when it compiles as one and the lines before it as a module (no module, None, when it is
    the whole program)."""
    def whole():
        return _compile(source, path, "exec"), None

    if not split_final_expression:
        return whole()
    # Bytes, as read from the file, so that a coding cookie keeps working.
    lines = source.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i][:1] in (b"", b" ", b"\t", b"#", b"\n", b"\r", b"\f"):
            continue
        # Blank lines keep the tail's line numbers those of the file.
        tail = b"\n" * i + b"".join(lines[i:])
        try:
            final = _compile(tail, path, "eval")
        except SyntaxError:
            try:
                _compile(tail, path, "exec")
            except SyntaxError:
                continue  # part of a longer statement: look further up
            return whole()  # a complete statement that is not an expression
        if i == 0:  # the program is one expression: nothing to run before it
            return None, final
        try:
            head = _compile(b"".join(lines[:i]), path, "exec")
        except SyntaxError:
            return whole()
        return head, final
    return whole()


def _run_program(namespace, source, path, split_final_expression):
    """Runs the program; returns (value of its final expression, exception raised)."""
    try:
        code, final_expression = _compile_program(source, path, split_final_expression)
    except (SyntaxError, ValueError) as error:
        return None, error.with_traceback(None)  # shown without a traceback, like Python
    try:
        if code is not None:
            exec(code, namespace)
        return (None if final_expression is None else eval(final_expression, namespace)), None
    except BaseException as error:
        # Drop this function's frame: the traceback starts in the program.
        return None, error.with_traceback(error.__traceback__.tb_next)


def run(path, args, policy=None):
    """Runs the program at `path` as `__main__`; returns its exit status. Under a code
    `policy` (corral_policy.Policy), a program that imports what the policy forbids is
    refused before any of it runs (docs/code-policy.md), and the rest runs under the policy's
    import hook."""
    filename = os.path.abspath(path)
    try:
        with open(filename, "rb") as program:
            source = program.read()
    except OSError as error:
        message = f"can't open file {filename!r}: [Errno {error.errno}] {error.strerror}"
        sys.stderr.write(f"{sys.executable}: {message}\n")
        return 2
    sys.argv = [path, *args]
    # As Python's own sys.path[0], without resolving links: Corral writes PROGRAM itself,
    # never through one, and realpath would cost three lstat calls in the sandbox.
    sys.path[0] = os.path.dirname(filename)
    # The workspace's modules are importable. Not through PYTHONPATH: every Python start-up,
    # the program's children included, would search it first (0.12-0.15 ms each).
    if _WORKSPACE not in sys.path:
        sys.path.insert(1, _WORKSPACE)
    sys.stdout.reconfigure(line_buffering=True)  # stream lines as printed, not 8 KiB blocks
    main = type(sys)("__main__")
    main.__file__ = filename
    main.__loader__ = SourceFileLoader("__main__", filename)
    sys.modules["__main__"] = main

    frames_fd = _frames_fd()
    if policy is not None:
        checker = _runtime("corral_policy")
        violations = checker.precheck(policy, source, filename)
        if violations:
            refusal = checker.refusal(policy, violations)
            sys.stderr.write(f"PolicyViolation: {refusal}\n")
            sys.stderr.flush()
            if frames_fd is not None:
                _library().report_oneshot(frames_fd, None, refusal)
            return 1
        checker.install(policy, (run.__code__.co_filename,))
    value, error = _run_program(main.__dict__, source, filename, frames_fd is not None)
    if error is not None and not isinstance(error, SystemExit):
        sys.excepthook(type(error), error, error.__traceback__)
    sys.stdout.flush()
    sys.stderr.flush()
    if frames_fd is not None:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if value is None and error is None and not (pyplot and pyplot.get_fignums()):
            done = b'{"type":"done","id":"oneshot","status":"ok"}'
            os.write(frames_fd, len(done).to_bytes(4, "big") + done)
        else:
            _library().report_oneshot(frames_fd, value, error)
    if isinstance(error, SystemExit):
        raise error
    return 0 if error is None else 1


def _exit_status(error):
    """The exit status of an interpreter whose main program raised `error` (a SystemExit),
    which it prints first when it is not a number, as Python does."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def _ready_frame():
    """The `ready` frame a forked kernel sends, made before the fork (as bytes, by the zygote)
    so that no run has to encode it."""
    version = "%d.%d.%d" % sys.version_info[:3]
    payload = _library()._encode({"type": "ready", "language": "python", "version": version})
    return len(payload).to_bytes(4, "big") + payload


def run_forked(path, env, ready_frame, frames_fd=3):
    """Runs the program at `path` in a child forked from a zygote (corral_zygote.py) exactly
    as `python3 corral_oneshot.py PATH` runs it in a fresh interpreter, then ends the process
    as that interpreter would end. Never returns.

    The zygote's session set-up is put back first (corral_kernel_lib.unprepare), then `env` is
    set; the kernel announces itself on `frames_fd` with `ready_frame` (from _ready_frame()) and
    runs the program once the host says so (after it has verified the lockdown and filled the
    workspace), under the code policy that `run` frame carries, if any. A forked process pays
    for every object it writes to, its first time, with a copy of the page (about 1-2 us): this
    path touches as few as it can. At the end, as the interpreter's own exit: non-daemon threads
    are waited for, the exit functions registered since the fork run, the standard streams are
    flushed; the zygote's own exit (its modules torn down one by one) is skipped."""
    import atexit  # imported by the zygote
    import json

    library = _library()
    library.unprepare()
    if env:
        os.environ.update(env)
    library.reseed()
    sys.orig_argv = [sys.orig_argv[0], __file__, path]
    library._write_all(frames_fd, ready_frame)
    go = library.read_exactly(frames_fd, 4)
    go = go and library.read_exactly(frames_fd, int.from_bytes(go, "big"))
    if go is None:
        os._exit(1)  # the host gave up on this run
    rules = json.loads(go).get("policy")
    policy = None if rules is None else _runtime("corral_policy").Policy.from_message(rules)
    try:
        status = run(path, [], policy)
    except SystemExit as error:
        status = _exit_status(error)
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status & 0xFF)


if __name__ == "__main__":
    argv = sys.argv[1:]
    rules = None
    if argv[:1] == ["--policy"] and len(argv) > 2:
        rules, argv = argv[1], argv[2:]
    if not argv or argv[0].startswith("--"):
        sys.stderr.write("usage: corral_oneshot.py [--policy FILE] PROGRAM [ARGS...]\n")
        sys.exit(2)
    sys.exit(run(argv[0], argv[1:], None if rules is None else _load_policy(rules)))
