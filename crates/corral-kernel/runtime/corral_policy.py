"""Corral's code policy for Python, inside the sandbox (docs/code-policy.md).

Two checks, both defence in depth and never a boundary (the code runs in this interpreter and
can undo them; the sandbox is what holds):

- ``precheck()``: before code runs, its syntax tree is searched for the imports the policy
  forbids (``import x``, ``from x import y``, relative imports, and ``__import__('x')``,
  ``importlib.import_module('x')``, ``exec('import x')`` with literal arguments), each with its
  line. Code that does not parse is not judged: running it reports its SyntaxError.
- ``install()``: an import hook for the code while it runs. Imports made by user code are
  checked (``builtins.__import__`` for import statements, ``importlib.import_module``, and a
  ``sys.meta_path`` finder for the rest); the standard library's and the installed packages'
  own imports are not, so an allowed package imports what it needs. User code is code whose
  file is not one of the image's library directories (those of ``sys.path`` when the hook is
  installed, outside the sandbox's writable ones) nor this runtime: the program, cells,
  modules in ``/workspace`` or ``/tmp``, ``exec()`` of strings. An import the interpreter makes
  from C on the code's behalf (``time.strptime`` importing ``_strptime``) counts as library's.

Importing this module has no side effects: a zygote imports it before it forks sessions.
"""

import sys

# Taken when this module is imported, before any user code runs: later changes to builtins
# do not reach the pre-check.
_compile = compile
_type = type
_str = str
_PARSE_FLAGS = 0x400 | 0x2000  # ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_THIS_FILE = sys._getframe().f_code.co_filename

NOT_ALLOWED = "not_allowed"
DENIED = "denied"
RELATIVE = "relative"

# Where the sandbox's code can write, or the program is placed: files there are user code.
_USER_DIRS = ("/workspace/", "/tmp/", "/dev/", "/run/corral/", "/proc/")
# Modules listed in a message, at most.
_LISTED = 20


class PolicyViolation(ModuleNotFoundError):
    """An import the code policy forbids. A ModuleNotFoundError, so that code which falls back
    when an optional module is missing goes on as if it were not installed."""

    __module__ = "builtins"  # shown as `PolicyViolation: ...`, like a built-in exception

    def __init__(self, message, violations):
        super().__init__(message, name=violations[0]["module"] if violations else None)
        self.violations = violations


def _strings(value):
    return _type(value) is list and all(_type(item) is _str for item in value)


def _within(module, names):
    """Whether `module` is one of `names` or a submodule of one."""
    if module in names:
        return True
    dot = module.find(".")
    while dot != -1:
        if module[:dot] in names:
            return True
        dot = module.find(".", dot + 1)
    return False


def _listing(names):
    shown = sorted(names)
    if not shown:
        return "none"
    more = len(shown) - _LISTED
    return ", ".join(shown[:_LISTED]) + (f" and {more} more" if more > 0 else "")


class Policy:
    """The module rules of a code policy: `allowed` (None: any module) and `denied` names,
    each covering its submodules; denied wins."""

    def __init__(self, allowed, denied):
        self.allowed = None if allowed is None else frozenset(allowed)
        self.denied = frozenset(denied)

    @classmethod
    def from_message(cls, message):
        """The rules of a host frame's `allowed_modules` and `denied_modules`; ValueError when
        they are not lists of strings."""
        allowed = message.get("allowed_modules")
        denied = message.get("denied_modules", [])
        if not ((allowed is None or _strings(allowed)) and _strings(denied)):
            raise ValueError("allowed_modules and denied_modules must be lists of strings")
        return cls(allowed, denied)

    def rule(self, module):
        """The rule an import of `module` (absolute, dotted) breaks, or None."""
        if self.denied and _within(module, self.denied):
            return DENIED
        if self.allowed is not None and not _within(module, self.allowed):
            return NOT_ALLOWED
        return None

    def describe(self, violations):
        """The message for `violations`, for a person or a model to act on."""
        parts = []
        for v in violations:
            where = f"line {v['line']}: " if v["line"] is not None else ""
            if v["rule"] == RELATIVE:
                parts.append(
                    f"{where}relative import of '{v['module']}' is not allowed (the code is not "
                    "part of a package: import modules by their full names)"
                )
            elif v["rule"] == DENIED:
                parts.append(f"{where}import of '{v['module']}' is denied")
            else:
                parts.append(f"{where}import of '{v['module']}' is not allowed")
        notes = []
        rules = {v["rule"] for v in violations}
        if NOT_ALLOWED in rules:
            notes.append(f"allowed modules: {_listing(self.allowed)}")
        if DENIED in rules:
            notes.append(f"denied modules: {_listing(self.denied)}")
        text = "; ".join(parts)
        return f"{text} ({'; '.join(notes)})" if notes else text


# ---------------------------------------------------------------------------------------
# The pre-check


def _literal(node, kinds):
    """The string of `node` when it is a string constant."""
    if _type(node) is kinds["Constant"] and _type(node.value) is _str:
        return node.value
    return None


def _parse(source, filename):
    """The syntax tree of `source`, or None when it does not parse."""
    try:
        return _compile(source, filename, "exec", _PARSE_FLAGS, True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _search(policy, tree, kinds, found, at_line=None, depth=0):
    """Adds to `found` the (line, module, rule) of every forbidden import in `tree`; `at_line`
    is the line of the exec() whose literal code `tree` is."""

    def judge(node, module, names=()):
        line = at_line or node.lineno
        rule = policy.rule(module)
        if rule is None:
            # `from os import path` imports the submodule os.path when there is one.
            for name in names:
                candidate = f"{module}.{name}"
                rule = policy.rule(candidate)
                if rule is not None:
                    module = candidate
                    break
        if rule is not None:
            found.add((line, module, rule))

    stack = [tree]
    while stack:
        node = stack.pop()
        kind = _type(node)
        if kind is kinds["Import"]:
            for alias in node.names:
                judge(node, alias.name)
        elif kind is kinds["ImportFrom"]:
            if node.level:
                found.add((at_line or node.lineno, "." * node.level + (node.module or ""), RELATIVE))
            else:
                judge(node, node.module, [a.name for a in node.names if a.name != "*"])
        elif kind is kinds["Call"] and node.args:
            func = node.func
            name = (
                func.id
                if _type(func) is kinds["Name"]
                else func.attr if _type(func) is kinds["Attribute"] else None
            )
            text = _literal(node.args[0], kinds)
            if text is not None and name in ("__import__", "import_module"):
                if text.startswith("."):
                    found.add((at_line or node.lineno, text, RELATIVE))
                else:
                    judge(node, text)
            elif text is not None and name in ("exec", "eval", "compile") and depth < 8:
                inner = _parse(text, "<string>")
                if inner is not None:
                    _search(policy, inner, kinds, found, at_line or node.lineno, depth + 1)
        for field in kind._fields:
            value = getattr(node, field, None)
            if _type(value) is list:
                stack.extend(item for item in value if isinstance(item, kinds["AST"]))
            elif isinstance(value, kinds["AST"]):
                stack.append(value)


def precheck(policy, source, filename="<code>", _parse=_parse, _search=_search):
    """The forbidden imports of `source` (text or bytes), in the order of their lines, as
    violations (dicts of `line`, `module`, `rule`); none when it does not parse. (Its helpers
    are bound when it is defined: replacing them in this module later changes nothing.)"""
    tree = _parse(source, filename)
    if tree is None:
        return []
    import _ast

    kinds = {name: getattr(_ast, name) for name in ("AST", "Attribute", "Call", "Constant", "Import", "ImportFrom", "Name")}
    found = set()
    _search(policy, tree, kinds, found)
    return [{"line": line, "module": module, "rule": rule} for line, module, rule in sorted(found)]


def refusal(policy, violations):
    """The error that refuses code before it runs."""
    message = f"{policy.describe(violations)}. The code was not run."
    return PolicyViolation(message, violations)


# ---------------------------------------------------------------------------------------
# The import hook

_installed = None


def _library_roots():
    """The image's library directories: those of sys.path outside the sandbox's writable
    ones, as prefixes of file names."""
    roots = []
    for entry in sys.path:
        if _type(entry) is _str and entry.startswith("/"):
            root = entry.rstrip("/") + "/"
            if not root.startswith(_USER_DIRS):
                roots.append(root)
    return tuple(roots)


def install(policy, runtime_files=()):
    """Checks the imports of user code against `policy` from now on, for the rest of the
    process (once: a second call changes nothing). `runtime_files` are the file names of the
    caller's code (the kernel's, the runner's), which is not user code."""
    global _installed
    if _installed is not None:
        return
    _installed = policy
    import builtins
    import importlib
    from importlib import _bootstrap

    roots = _library_roots()
    # This runtime's files (beside this one) and the caller's.
    here = _THIS_FILE.rsplit("/", 1)[0]
    runtime = ("corral_kernel", "corral_kernel_lib", "corral_oneshot", "corral_policy", "corral_zygote")
    ours = frozenset((*(f"{here}/{name}.py" for name in runtime), *runtime_files))
    machinery = (
        "<frozen importlib.",
        "<frozen zipimport>",
        importlib.__file__.rsplit("/", 1)[0] + "/",
    )
    getframe = sys._getframe
    original_import = builtins.__import__
    original_import_module = importlib.import_module
    resolve_name = _bootstrap._resolve_name
    package_of = _bootstrap._calc___package__

    def is_user(filename):
        return not (filename in ours or filename.startswith("<frozen ") or filename.startswith(roots))

    def violation(module, names, line):
        """The PolicyViolation of an import of `module` (and `names` from it), or None."""
        rule = policy.rule(module)
        for name in names:
            if rule is not None:
                break
            if _type(name) is _str and name != "*":
                candidate = f"{module}.{name}"
                rule = policy.rule(candidate)
                if rule is not None:
                    module = candidate
        if rule is None:
            return None
        violations = [{"line": line, "module": module, "rule": rule}]
        return PolicyViolation(policy.describe(violations), violations)

    def absolute(name, globals, level):
        if not level:
            return name
        try:
            return resolve_name(name, package_of(globals or {}), level)
        except Exception:
            return None  # the import itself fails and says why

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        # The interpreter's own imports from C (PyImport_Import: `time.strptime`, pickle)
        # pass a list; import statements None or a tuple.
        if _type(fromlist) is not list and _type(name) is _str:
            caller = getframe(1)
            if is_user(caller.f_code.co_filename):
                module = absolute(name, globals, level)
                refused = module and violation(module, fromlist or (), caller.f_lineno)
                if refused:
                    raise refused
        return original_import(name, globals, locals, fromlist, level)

    def guarded_import_module(name, package=None):
        caller = getframe(1)
        if _type(name) is _str and is_user(caller.f_code.co_filename):
            level = len(name) - len(name.lstrip("."))
            module = absolute(name[level:], {"__package__": package}, level) if level else name
            refused = module and violation(module, (), caller.f_lineno)
            if refused:
                raise refused
        return original_import_module(name, package)

    judged_import, judged_import_module = guarded_import.__code__, guarded_import_module.__code__

    class Finder:
        """Judges the imports that reach the import system without going through the guards
        above (`importlib.__import__`, `importlib.util.find_spec`, imports from C), by the
        code that asked: the first frame outside the import machinery."""

        @staticmethod
        def find_spec(fullname, path=None, target=None):
            frame = getframe(1)
            while frame is not None:
                code = frame.f_code
                if code is judged_import or code is judged_import_module:
                    return None
                if not code.co_filename.startswith(machinery):
                    break
                frame = frame.f_back
            if frame is not None and is_user(frame.f_code.co_filename):
                refused = violation(fullname, (), frame.f_lineno)
                if refused:
                    raise refused
            return None

    builtins.__import__ = guarded_import
    importlib.import_module = guarded_import_module
    sys.meta_path.insert(0, Finder)
