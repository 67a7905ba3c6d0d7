"""Corral's Python kernel library: the frame protocol, the IPython session and one-shot
result reporting (see the entry points corral_kernel.py, corral_oneshot.py and corral_bash.py, and
docs/kernel-protocol.md).

Importing this module has no side effects; IPython and friends are imported by prepare().
"""

import binascii
import importlib
import io
import json
import os
import signal
import sys
import traceback

_THIS_FILE = sys._getframe().f_code.co_filename  # not user code, for the code policy's hook
MAX_FRAME = 64 << 20
MAX_RESULT = 32 << 20
# The MIME types the host keeps (docs/results.md, rich results); a bundle is trimmed to these.
MIME_TYPES = (
    "text/plain",
    "text/html",
    "text/markdown",
    "image/png",
    "image/svg+xml",
    "application/json",
)
ONESHOT_ID = "oneshot"  # the execution id of one-shot frames
IPYTHON_DIR = "/tmp/corral-ipython"
WORKSPACE = "/workspace"  # where commands run unless told otherwise

# ---------------------------------------------------------------------------------------
# Frames (both modes)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send_frame(fd, payload):
    _write_all(fd, len(payload).to_bytes(4, "big") + payload)


def send_message(fd, message):
    """Sends `message` (a dict) as one frame."""
    _send_frame(fd, _encode(message))


def read_exactly(fd, size):
    """`size` bytes from `fd`, or None at end of file."""
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _encode(message):
    text = json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # Lone surrogates cannot be UTF-8; the host's JSON parser rejects them even escaped.
    return text.encode("utf-8", "replace")


def _mime_bundle(data):
    """`data` (a MIME bundle from a repr or formatter) restricted to the types the host
    keeps, with PNG as base64 text."""
    bundle = {}
    for mime in MIME_TYPES:
        value = data.get(mime)
        if value is None:
            continue
        if mime == "image/png":
            if isinstance(value, (bytes, bytearray)):
                value = binascii.b2a_base64(value, newline=False).decode("ascii")
            elif isinstance(value, str):
                value = value.replace("\n", "")
            else:
                continue
        elif mime != "application/json":
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif not isinstance(value, str):
                continue
        bundle[mime] = value
    return bundle


def _result_frame(exec_id, bundle, is_main_result):
    """The encoded `result` frame for `bundle`, or an `error` frame when it is too large.
    application/json that is not JSON (NaN, objects, too deep) is dropped."""
    message = {"type": "result", "id": exec_id, "is_main_result": is_main_result, "data": bundle}
    try:
        payload = _encode(message)
    except (TypeError, ValueError, RecursionError):
        bundle.pop("application/json", None)
        payload = _encode(message)
    if len(payload) <= MAX_RESULT:
        return payload, False
    kinds = ", ".join(bundle)
    value = f"a result of {len(payload)} bytes ({kinds}) exceeds the limit of {MAX_RESULT} bytes"
    error = {"type": "error", "id": exec_id, "name": "ResultTooLarge", "value": value, "traceback": ""}
    return _encode(error), True


def run_command(argv, cwd, env):
    """Runs a `command` frame's program with stdin /dev/null and stdout/stderr on fd 1/2,
    in its own session (so its process group is its own), in `cwd` (relative to the
    workspace), with this process's environment plus `env`. SIGINT kills the group.
    Returns None after exit status 0, else the (name, value) of the error to report."""
    import subprocess  # not at the top: one-shot runs load this module and never need it

    child = None
    interrupted = False

    def kill_group():
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True
        if child is not None:
            kill_group()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                cwd=os.path.join(WORKSPACE, cwd or ""),
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        except OSError as error:
            text = error.strerror or str(error)
            return "CommandError", text if error.filename is None else f"{text}: {error.filename!r}"
        except ValueError as error:  # a NUL byte (the host never sends one)
            return "CommandError", str(error)
        if interrupted:
            kill_group()
        # Wait without reaping: until the child is reaped, its pid cannot name another
        # process group, so an interrupt may still kill the group.
        try:
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass  # the cell's code set SIGCHLD to SIG_IGN: the child reaped itself
    finally:
        signal.signal(signal.SIGINT, previous)
    status = child.wait()
    if interrupted and status == -signal.SIGKILL:
        status = 128 + signal.SIGINT  # a shell's status for an interrupted command
    elif status < 0:
        status = 128 - status  # killed by a signal, as a shell reports it
    return None if status == 0 else ("ExitCode", str(status))


# ---------------------------------------------------------------------------------------
# Session mode

_shell = None


def _ignore_sigint(signum, frame):
    """SIGINT while idle: the execution it was meant for has already finished."""


class _Kernel:
    """The session loop: reads `execute` frames, runs them in the shell, answers.

    SIGINT is Python's KeyboardInterrupt (the C handler, so no kernel frame shows in the
    traceback) only while a cell runs; it is ignored while idle, and deferred while a
    frame is being written, since a half-written frame would desync the stream."""

    def __init__(self, shell, sock_fd):
        self.shell = shell
        self.sock_fd = sock_fd
        self.exec_id = None
        self.failed = False
        self.interrupt_deferred = False
        self.policy = None  # the code policy's rules (corral_policy.Policy), once the host sent them

    def _defer_sigint(self, signum, frame):
        self.interrupt_deferred = True

    def send(self, payload):
        previous = signal.signal(signal.SIGINT, self._defer_sigint)
        try:
            _send_frame(self.sock_fd, payload)
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.interrupt_deferred:
            self.interrupt_deferred = False
            if previous is signal.default_int_handler:
                raise KeyboardInterrupt

    def send_result(self, data, is_main_result):
        bundle = _mime_bundle(data)
        if not bundle or self.exec_id is None:
            return
        payload, too_large = _result_frame(self.exec_id, bundle, is_main_result)
        self.failed |= too_large
        self.send(payload)

    def send_error(self, name, value, traceback, extra=None):
        self.failed = True
        if self.exec_id is not None:
            message = {"type": "error", "id": self.exec_id, "name": name, "value": value}
            self.send(_encode({**message, "traceback": traceback, **(extra or {})}))

    def set_policy(self, rules):
        """Checks every execution against the code policy `rules` (a `policy` frame's) from now
        on, and installs its import hook (docs/code-policy.md). Only the first one counts."""
        if self.policy is not None:
            log("ignoring a second policy frame")
            return
        import corral_policy

        self.policy = corral_policy.Policy.from_message(rules)
        # Kept here: a cell that replaces them in the module does not change the next check.
        self.precheck, self.refusal = corral_policy.precheck, corral_policy.refusal
        corral_policy.install(self.policy, (_THIS_FILE,))

    def refused(self, code):
        """The refusal of the cell `code` by the code policy's pre-check, if it breaks it."""
        try:
            source = self.shell.transform_cell(code)  # magics become calls, `!cmd` too
        except Exception:
            source = code
        violations = self.precheck(self.policy, source, "<cell>")
        return self.refusal(self.policy, violations) if violations else None

    def execute(self, exec_id, code, env=None):
        """Runs the cell `code`; with `env`, those variables are set for this execution only
        (in `os.environ`, so its subprocesses see them too) and put back as they were after."""
        if not env:
            return self._execute(exec_id, code)
        saved = {name: os.environ.get(name) for name in env}
        _set_environment(env)
        try:
            return self._execute(exec_id, code)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def _execute(self, exec_id, code):
        self.exec_id, self.failed = exec_id, False
        refusal = None if self.policy is None else self.refused(code)
        if refusal is not None:
            value = str(refusal)
            extra = {"violations": refusal.violations}
            self.send_error("PolicyViolation", value, f"PolicyViolation: {value}", extra)
            self.send(_encode({"type": "done", "id": exec_id, "status": "error"}))
            self.exec_id = None
            return
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                outcome = self.shell.run_cell(code, store_history=True)
                self.failed |= not outcome.success  # not in one line: run_cell sets it too
            finally:
                signal.signal(signal.SIGINT, _ignore_sigint)
        except KeyboardInterrupt:
            # It landed in IPython's own code around the cell, or between the two.
            signal.signal(signal.SIGINT, _ignore_sigint)
            self.send_error("KeyboardInterrupt", "", "KeyboardInterrupt")
        sys.stdout.flush()
        sys.stderr.flush()
        status = "error" if self.failed else "ok"
        self.send(_encode({"type": "done", "id": exec_id, "status": status}))
        self.exec_id = None

    def warm_up(self, exec_id, code):
        """Executes `code` as a client's cell (stored in the history, as the first cell is),
        then puts the history back as it was: the copy-on-write faults of a first execution
        are paid, and nothing of it is left (execution count, `In`, `_i`…)."""
        shell, history = self.shell, self.shell.history_manager
        unders = ("_i", "_ii", "_iii")
        count = shell.execution_count
        kept = (
            list(history.input_hist_parsed),
            list(history.input_hist_raw),
            [getattr(history, name) for name in (*unders, "_i00")],
            {name: shell.user_ns.get(name) for name in unders},
            list(history.db_input_cache),
            shell.last_execution_succeeded,
            shell.last_execution_result,
        )
        self.execute(exec_id, code)
        parsed, raw, attributes, values, cache, succeeded, result = kept
        shell.execution_count = count
        history.input_hist_parsed[:] = parsed  # the lists `In` and `_ih` are
        history.input_hist_raw[:] = raw
        for name, value in zip((*unders, "_i00"), attributes):
            setattr(history, name, value)
        shell.user_ns.update(values)
        for namespace in (shell.user_ns, shell.user_ns_hidden):
            namespace.pop(f"_i{count}", None)
        history.db_input_cache[:] = cache
        shell.last_execution_succeeded, shell.last_execution_result = succeeded, result

    def command(self, exec_id, argv, cwd, env):
        """Runs a command beside the shell: no cell, no history, no change to its state."""
        failure = run_command(argv, cwd, env)
        if failure is not None:
            name, value = failure
            self.send(_encode({"type": "error", "id": exec_id, "name": name, "value": value, "traceback": ""}))
        status = "ok" if failure is None else "error"
        self.send(_encode({"type": "done", "id": exec_id, "status": status}))

    def run(self):
        """Serves until the host closes the socket or the code calls exit()."""
        while True:
            header = read_exactly(self.sock_fd, 4)
            if header is None:
                return
            size = int.from_bytes(header, "big")
            if size > MAX_FRAME:
                log(f"the host sent a frame of {size} bytes")
                raise SystemExit(2)
            payload = read_exactly(self.sock_fd, size)
            if payload is None:
                return
            message = _decode_host_frame(payload)
            if message is None:
                continue
            if message["type"] == "environment":
                _set_environment(message["env"])
                continue
            if message["type"] == "policy":
                self.set_policy(message)
                continue
            if message["type"] == "command":
                self.command(message["id"], message["argv"], message.get("cwd"), message.get("env"))
                continue
            if message["type"] == "warm_up":
                self.warm_up(message["id"], message["code"])
                continue
            self.execute(message["id"], message["code"], message.get("env"))
            if self.shell.exit_now:
                return


def is_command(message):
    """True when `message` has the fields of a `command` frame, well typed."""
    argv, cwd, env = message.get("argv"), message.get("cwd"), message.get("env")
    return (
        isinstance(message.get("id"), str)
        and isinstance(argv, list)
        and len(argv) > 0
        and all(isinstance(arg, str) for arg in argv)
        and (cwd is None or isinstance(cwd, str))
        and (env is None or isinstance(env, dict) and all(isinstance(v, str) for v in env.values()))
    )


def _set_environment(env):
    """Sets `env` (an `environment` frame's) in this process's environment."""
    for name, value in env.items():
        try:
            os.environ[name] = value
        except ValueError as error:  # a NUL byte or `=` (the host never sends one)
            log(f"ignoring the environment variable {name!r}: {error}")


def _names(value):
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def _decode_host_frame(payload):
    """The well-formed host frame in `payload`, or None (logged) for anything else."""
    try:
        message = json.loads(payload)
    except ValueError as error:
        log(f"ignoring a frame that is not JSON: {error}")
        return None
    kind = message.get("type") if isinstance(message, dict) else type(message).__name__
    if kind in ("execute", "warm_up"):
        env = message.get("env")
        if (
            isinstance(message.get("id"), str)
            and isinstance(message.get("code"), str)
            and (env is None or isinstance(env, dict) and all(isinstance(v, str) for v in env.values()))
        ):
            return message
        log(f"ignoring a frame of type {kind!r} without a string id and code (and env of strings)")
    elif kind == "command":
        if is_command(message):
            return message
        log("ignoring a command frame without a string id, argv, cwd and env")
    elif kind == "environment":
        env = message.get("env")
        if isinstance(env, dict) and all(isinstance(v, str) for v in env.values()):
            return message
        log("ignoring an environment frame without an env of strings")
    elif kind == "policy":
        allowed = message.get("allowed_modules")
        if (allowed is None or _names(allowed)) and _names(message.get("denied_modules", [])):
            return message
        log("ignoring a policy frame without lists of module names")
    else:
        log(f"ignoring a frame of unknown type {kind!r}")
    return None


def _exception_value(error):
    """The text after "Name: " in a traceback's last line. A SyntaxError's str() also
    names the file and line, which its traceback shows anyway."""
    return error.msg if isinstance(error, SyntaxError) and error.msg else str(error)


def _violations(error):
    """The `violations` field of the error frame for `error`: what a code policy refused, when
    it is a PolicyViolation of corral_policy.py (docs/code-policy.md); else nothing."""
    policy = sys.modules.get("corral_policy")
    if policy is not None and isinstance(error, policy.PolicyViolation):
        return {"violations": error.violations}
    return {}


def log(text):
    sys.stderr.write(f"corral kernel: {text}\n")


class _UnbufferedText(io.TextIOWrapper):
    """A text stream that hands every write straight to its file descriptor."""

    def write(self, text):
        written = super().write(text)
        self.flush()
        return written


def _unbuffered_stream(fd):
    raw = io.FileIO(fd, "w", closefd=False)
    return _UnbufferedText(
        io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", write_through=True
    )


def _make_shell():
    from traitlets import Type
    from traitlets.config import Config
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class CorralDisplayHook(DisplayHook):
        """Sends the cell's value as the main result instead of printing `Out[n]`."""

        def write_output_prompt(self):
            pass

        def compute_format_data(self, result):
            # Only the formatters whose MIME types the host keeps (a cell's value is
            # formatted on every execution).
            return self.shell.display_formatter.format(result, include=MIME_TYPES)

        def write_format_data(self, format_dict, md_dict=None):
            self.shell.kernel.send_result(format_dict, is_main_result=True)

    class CorralDisplayPublisher(DisplayPublisher):
        """Sends `display()` output (and inline figures) as results."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            self.shell.kernel.send_result(data, is_main_result=False)

        def clear_output(self, wait=False):
            pass  # the default writes terminal escapes to stdout

    class CorralShell(InteractiveShell):
        displayhook_class = Type(CorralDisplayHook)
        display_pub_class = Type(CorralDisplayPublisher)
        kernel = None  # the _Kernel serving this shell, set by serve()
        # `!cmd` through subprocess, so the command writes to fd 1/2 itself (the default
        # runs it on a pseudo-terminal and merges stderr into stdout).
        system = InteractiveShell.system_raw

        def _showtraceback(self, etype, evalue, stb):
            value = _exception_value(evalue)
            text = self.InteractiveTB.stb2text(stb)
            self.kernel.send_error(etype.__name__, value, text, _violations(evalue))

        def show_usage_error(self, exc):
            self.kernel.send_error("UsageError", str(exc), f"UsageError: {exc}")

        def enable_gui(self, gui=None):
            pass  # the inline backend needs no GUI event loop

        def ask_exit(self):
            self.exit_now = True  # exit() or quit(): the kernel ends after this execution

    config = Config()
    config.InteractiveShell.colors = "NoColor"
    config.DisplayFormatter.active_types = list(MIME_TYPES)  # skip formatters for the rest
    config.HistoryManager.enabled = False
    config.HistoryManager.hist_file = ":memory:"
    return CorralShell.instance(config=config)


# What the zygote's warm-up runs: a first cell's path (compile, execute, print) and, apart, the
# display hook's formatting of a value and its result frame.
_WARM_UP_CELL = "print(1)\n"


def _warm_up(shell):
    """Runs `_WARM_UP_CELL` through the path a client's first cell takes, writing nothing and
    keeping nothing (no history, no `_`, no execution count, no frame sent), then formats a
    value as the display hook would: in a zygote, the lazy imports and first-use set-up of that
    path are done once for every session it forks."""
    kernel = shell.kernel
    shell.kernel = _Kernel(shell, None)  # its exec_id stays None: it sends nothing
    saved = sys.stdout, sys.stderr
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        sys.stdout = _unbuffered_stream(devnull)
        sys.stderr = _unbuffered_stream(devnull)
        shell.run_cell(_WARM_UP_CELL, store_history=False)
        format_dict, _ = shell.displayhook.compute_format_data(1)
        _result_frame("warm-up", _mime_bundle(format_dict), True)
        _encode({"type": "done", "id": "warm-up", "status": "ok"})
    finally:
        sys.stdout, sys.stderr = saved
        os.close(devnull)
        shell.kernel = kernel


# pyplot's module state that enabling a backend sets, and its functions a backend provides.
_PYPLOT_STATE = ("_backend_mod", "_REPL_DISPLAYHOOK", "draw_if_interactive")
_PYPLOT_HOOKS = ("new_figure_manager", "draw_if_interactive", "show")


class _Pristine:
    """What prepare() changes for sessions that a fresh interpreter does not have, as it was
    before: restore() puts it back in a forked child that runs a one-shot program instead."""

    def __init__(self):
        import atexit
        import builtins

        self.path = list(sys.path)
        self.environ = dict(os.environ)
        self.builtins = set(vars(builtins))
        self.matplotlib = None
        # The exit functions the imports register, recorded until prepare() ends.
        self.exit_functions = []
        self.register = atexit.register

        def register(function, *args, **kwargs):
            self.exit_functions.append((function, args, kwargs))
            return self.register(function, *args, **kwargs)

        atexit.register = register

    def end_recording(self):
        import atexit

        atexit.register = self.register

    def keep_matplotlib(self):
        """Before the inline backend is enabled: pyplot's state that enabling it changes."""
        import matplotlib
        import matplotlib.backends
        import matplotlib.pyplot as pyplot

        self.matplotlib = {
            "rc": matplotlib.rcParams.copy(),
            "default_backend": dict.__getitem__(matplotlib.rcParamsDefault, "backend"),
            "backends": dict(vars(matplotlib.backends)),
            "pyplot": {name: getattr(pyplot, name) for name in _PYPLOT_STATE if hasattr(pyplot, name)},
            # switch_backend() sets attributes of these functions.
            "functions": {name: dict(vars(getattr(pyplot, name))) for name in _PYPLOT_HOOKS},
        }

    def restore(self, shell):
        import atexit
        import builtins
        import types

        # The exit functions of the imported libraries, as a fresh interpreter that imported
        # them would have; not IPython's (its shell's, the files it opened), which belong to the
        # zygote's session set-up and to descriptors this child no longer has.
        atexit._clear()
        for function, args, kwargs in self.exit_functions:
            if isinstance(function, types.FunctionType | types.MethodType) and not (
                getattr(function, "__module__", None) or ""
            ).startswith("IPython"):
                atexit.register(function, *args, **kwargs)
        # get_ipython() answers None, as in an interpreter where IPython was only imported.
        type(shell).clear_instance()
        for name in set(vars(builtins)) - self.builtins:  # display, __IPYTHON__
            delattr(builtins, name)
        sys.path[:] = self.path
        for name in set(os.environ) - set(self.environ):  # IPYTHONDIR
            del os.environ[name]
        os.environ.update(self.environ)
        if self.matplotlib is not None:
            import matplotlib
            import matplotlib.backends
            import matplotlib.pyplot as pyplot

            kept = self.matplotlib
            pyplot.close("all")
            for key, value in kept["rc"].items():
                dict.__setitem__(matplotlib.rcParams, key, value)
            dict.__setitem__(matplotlib.rcParamsDefault, "backend", kept["default_backend"])
            backends = vars(matplotlib.backends)
            backends.clear()
            backends.update(kept["backends"])
            # The backend is chosen again at the first figure, as in a fresh interpreter.
            for name, value in kept["pyplot"].items():
                setattr(pyplot, name, value)
            for name, attributes in kept["functions"].items():
                function = vars(getattr(pyplot, name))
                function.clear()
                function.update(attributes)


_pristine = None


def prepare(preload=("numpy", "pandas", "matplotlib.pyplot")):
    """Creates the shell and imports `preload` (those that are installed). Before a fork."""
    global _shell, _pristine
    if _shell is not None:
        return _shell
    _pristine = _Pristine()
    # Cells import the workspace's modules (see corral_oneshot.py for why not PYTHONPATH).
    if WORKSPACE not in sys.path:
        sys.path.insert(1, WORKSPACE)
    # IPython keeps a profile directory; HOME may be read-only inside the sandbox.
    os.environ.setdefault("IPYTHONDIR", IPYTHON_DIR)
    shell = _make_shell()
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if "matplotlib.pyplot" in sys.modules:
        _pristine.keep_matplotlib()
        # The inline backend shows figures as PNG results at plt.show() and cell end.
        shell.enable_matplotlib("inline")
    _warm_up(shell)
    _pristine.end_recording()
    # Nothing may sit in a buffer at the fork: the children would all write it out.
    sys.stdout.flush()
    sys.stderr.flush()
    _shell = shell
    return shell


def unprepare():
    """In a child forked after prepare() that runs a one-shot program instead of serving a
    session: puts back what prepare() set up for sessions and a fresh interpreter lacks (the
    shell's builtins and exit hook, `sys.path`, the environment, pyplot's inline backend and
    its settings). The modules it imported stay imported. Nothing to do in a child of a
    zygote that never called prepare() (the lean zygote of one-shot runs)."""
    if _pristine is not None:
        _pristine.restore(_shell)


def reseed():
    """Fresh random streams (`random`'s and numpy's global state, where they are imported:
    a module imported later seeds itself); sessions and runs forked from one zygote must not
    share them."""
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def serve(sock_fd=3):
    """Announces readiness on `sock_fd` and executes cells until the host hangs up."""
    shell = prepare()
    os.set_inheritable(sock_fd, False)  # commands the cells run (os.system) must not get it
    sys.stdout = sys.__stdout__ = _unbuffered_stream(1)
    sys.stderr = sys.__stderr__ = _unbuffered_stream(2)
    kernel = _Kernel(shell, sock_fd)
    shell.kernel = kernel
    signal.signal(signal.SIGINT, _ignore_sigint)
    version = "%d.%d.%d" % sys.version_info[:3]
    kernel.send(_encode({"type": "ready", "language": "python", "version": version}))
    try:
        kernel.run()
    except BrokenPipeError:
        pass  # the host went away: same as end of file


# ---------------------------------------------------------------------------------------
# One-shot reporting (the entry point runs the program)

# Display-protocol methods for a final value, as IPython's formatters consult them.
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_json_", "application/json"),
)


def _rich_repr(value):
    """The MIME bundle of `value` by the display protocol, without importing IPython."""
    cls = type(value)
    bundle = {}
    if getattr(cls, "_repr_mimebundle_", None) is not None:
        bundle.update(_call_repr(value, "_repr_mimebundle_", include=None, exclude=None) or {})
    for method, mime in _REPR_METHODS:
        if mime not in bundle and getattr(cls, method, None) is not None:
            data = _call_repr(value, method)
            if data is not None:
                bundle[mime] = data
    if "text/plain" not in bundle:
        bundle["text/plain"] = _call_repr(value, "__repr__") or object.__repr__(value)
    return bundle


def _call_repr(value, method, **kwargs):
    try:
        data = getattr(value, method)(**kwargs)
    except Exception as error:
        log(f"{type(value).__name__}.{method} failed: {error!r}")
        return None
    return data[0] if isinstance(data, tuple) else data  # (data, metadata) is allowed


def _open_figures_as_png():
    """PNG bytes of each matplotlib figure left open, if pyplot was used."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    images = []
    for number in pyplot.get_fignums():
        buffer = io.BytesIO()
        try:
            pyplot.figure(number).savefig(buffer, format="png", bbox_inches="tight")
        except Exception as error:
            log(f"figure {number} could not be drawn: {error!r}")
            continue
        images.append(buffer.getvalue())
    return images


def report_oneshot(fd, value, error):
    """Sends a one-shot run's final value, open figures and uncaught exception as frames,
    then `done`: status `error` after an exception or a non-zero `SystemExit`."""
    results = [] if value is None else [(_rich_repr(value), True)]
    results += [({"image/png": png}, False) for png in _open_figures_as_png()]
    failed = False
    for data, is_main_result in results:
        payload, too_large = _result_frame(ONESHOT_ID, _mime_bundle(data), is_main_result)
        failed |= too_large
        _send_frame(fd, payload)
    if isinstance(error, SystemExit):
        failed |= error.code not in (None, 0)
    elif error is not None:
        failed = True
        text = "".join(traceback.format_exception(error))
        message = {"type": "error", "id": ONESHOT_ID, "name": type(error).__name__}
        message.update(_violations(error))
        _send_frame(fd, _encode({**message, "value": _exception_value(error), "traceback": text}))
    status = "error" if failed else "ok"
    _send_frame(fd, _encode({"type": "done", "id": ONESHOT_ID, "status": status}))
