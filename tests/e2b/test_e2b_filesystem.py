"""envd's filesystem service (`filesystem.Filesystem/*`) through the unmodified E2B SDK:
files.list, exists, get_info, make_dir, rename, remove and watch_dir (issue 22).

Paths: relative, /home/user/... and /workspace/... all name the workspace; another absolute
path is an InvalidArgumentException, never "not found". Links are reported as links and never
followed by the host. docs/e2b.md §11 says how Corral differs from E2B.
"""

import datetime

import pytest

from e2b import (
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    SandboxException,
)
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def sh(sandbox, cmd):
    return sandbox.commands.run(cmd).stdout


def test_make_dir_makes_parents_and_says_whether_it_made_it(sandbox):
    assert sandbox.files.make_dir("md/a/b") is True
    assert sandbox.files.make_dir("/home/user/md/a/b") is False
    assert sandbox.files.make_dir("/workspace/md/a") is False
    assert sh(sandbox, "test -d /workspace/md/a/b && echo yes").strip() == "yes"
    sandbox.files.write("md/file", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir("md/file")


def test_list_with_depth_and_entry_info(sandbox):
    sandbox.files.make_dir("ls/sub")
    sandbox.files.write("ls/a.txt", "hello")
    sandbox.files.write("ls/sub/b.txt", "hi")
    entries = sandbox.files.list("ls")
    assert [(e.name, e.type) for e in entries] == [
        ("a.txt", FileType.FILE),
        ("sub", FileType.DIR),
    ]
    a = entries[0]
    assert a.path == "/workspace/ls/a.txt"
    assert a.size == 5
    assert a.mode == 0o644
    assert a.permissions == "-rw-r--r--"
    assert a.owner == "user" and a.group == "user"
    assert a.symlink_target is None
    age = datetime.datetime.now(datetime.timezone.utc) - a.modified_time
    assert abs(age.total_seconds()) < 600
    assert entries[1].permissions == "drwxr-xr-x"
    deep = sandbox.files.list("/home/user/ls", depth=2)
    assert [e.path for e in deep] == [
        "/workspace/ls/a.txt",
        "/workspace/ls/sub",
        "/workspace/ls/sub/b.txt",
    ]
    assert [e.path for e in sandbox.files.list("/workspace/ls", depth=100)] == [
        e.path for e in deep
    ]
    assert "ls" in [e.name for e in sandbox.files.list(".")]
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("no-such-dir")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list("ls/a.txt")


def test_exists_and_get_info(sandbox):
    sandbox.files.write("info.txt", "12345")
    assert sandbox.files.exists("info.txt")
    assert sandbox.files.exists("/home/user/info.txt")
    assert not sandbox.files.exists("nothing-here")
    info = sandbox.files.get_info("info.txt")
    assert (info.name, info.type, info.size) == ("info.txt", FileType.FILE, 5)
    assert info.path == "/workspace/info.txt"
    root = sandbox.files.get_info("/home/user")
    assert (root.type, root.path) == (FileType.DIR, "/workspace")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("nothing-here")


def test_links_are_reported_as_links_and_never_followed(sandbox):
    sh(sandbox, "cd /workspace && mkdir -p lk && ln -sfn /etc/passwd lk/passwd && ln -sfn /etc lk/etc")
    info = sandbox.files.get_info("lk/passwd")
    assert info.type == FileType.SYMLINK
    assert info.symlink_target == "/etc/passwd"
    assert {(e.name, e.type) for e in sandbox.files.list("lk", depth=5)} == {
        ("etc", FileType.SYMLINK),
        ("passwd", FileType.SYMLINK),
    }
    # A link on the way is refused, not followed.
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list("lk/etc")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.get_info("lk/etc/passwd")
    # Removing a link removes the link.
    sandbox.files.remove("lk/passwd")
    assert not sandbox.files.exists("lk/passwd")
    sandbox.files.remove("lk")
    assert not sandbox.files.exists("lk")
    assert sh(sandbox, "test -f /etc/passwd && echo kept").strip() == "kept"


def test_rename_moves_and_never_replaces(sandbox):
    sandbox.files.write("mv/a.txt", "a")
    sandbox.files.write("mv/b.txt", "b")
    moved = sandbox.files.rename("mv/a.txt", "/home/user/mv/new/dir/a.txt")
    assert (moved.name, moved.type, moved.path) == (
        "a.txt",
        FileType.FILE,
        "/workspace/mv/new/dir/a.txt",
    )
    assert not sandbox.files.exists("mv/a.txt")
    assert sandbox.files.read("mv/new/dir/a.txt") == "a"
    with pytest.raises(SandboxException) as excinfo:
        sandbox.files.rename("mv/b.txt", "mv/new/dir/a.txt")
    assert "already exists" in str(excinfo.value)
    assert sandbox.files.read("mv/new/dir/a.txt") == "a"
    assert sandbox.files.read("mv/b.txt") == "b"
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename("mv/missing", "mv/elsewhere")


def test_remove_files_and_trees(sandbox):
    sandbox.files.write("rm/tree/deep/f.txt", "x")
    sandbox.files.write("rm/file.txt", "x")
    sandbox.files.remove("rm/file.txt")
    assert not sandbox.files.exists("rm/file.txt")
    sandbox.files.remove("/workspace/rm/tree")
    assert not sandbox.files.exists("rm/tree")
    sandbox.files.remove("rm/never-was")  # as envd: nothing there is nothing to do
    assert sandbox.files.list("rm") == []


OUTSIDE = {
    "list": lambda s: s.files.list("/etc"),
    "read": lambda s: s.files.read("/etc/passwd"),
    "write": lambda s: s.files.write("/tmp/x.txt", "x"),
    "exists": lambda s: s.files.exists("/etc/passwd"),
    "get_info": lambda s: s.files.get_info("/etc/passwd"),
    "make_dir": lambda s: s.files.make_dir("/tmp/x"),
    "remove": lambda s: s.files.remove("/etc/passwd"),
    "rename": lambda s: s.files.rename("/etc/passwd", "stolen"),
    "rename to": lambda s: s.files.rename("info.txt", "/tmp/info.txt"),
    "parent": lambda s: s.files.get_info("../etc/passwd"),
    "watch_dir": lambda s: s.files.watch_dir("/etc"),
}


@pytest.mark.parametrize("call", OUTSIDE.values(), ids=OUTSIDE.keys())
def test_paths_outside_the_workspace_are_invalid(sandbox, call):
    sandbox.files.write("info.txt", "x")
    with pytest.raises(InvalidArgumentException) as excinfo:
        call(sandbox)
    assert "workspace" in str(excinfo.value)


def events(handle):
    return [(e.name, e.type) for e in handle.get_new_events()]


def test_watch_dir_reports_changes_between_polls(sandbox):
    sandbox.files.make_dir("watched/sub")
    handle = sandbox.files.watch_dir("watched")
    assert events(handle) == []
    sandbox.files.write("watched/a.txt", "a")
    assert events(handle) == [("a.txt", FilesystemEventType.CREATE)]
    sandbox.files.write("watched/a.txt", "longer")
    assert events(handle) == [("a.txt", FilesystemEventType.WRITE)]
    sandbox.files.rename("watched/a.txt", "watched/b.txt")
    assert events(handle) == [
        ("a.txt", FilesystemEventType.RENAME),
        ("b.txt", FilesystemEventType.CREATE),
    ]
    sandbox.files.remove("watched/b.txt")
    assert events(handle) == [("b.txt", FilesystemEventType.REMOVE)]
    # Not recursive: what happens in a subdirectory is not seen.
    sandbox.files.write("watched/sub/inner.txt", "x")
    assert events(handle) == []
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()

    recursive = sandbox.files.watch_dir("/home/user/watched", recursive=True)
    sh(sandbox, "cd /workspace/watched && echo more >> sub/inner.txt && mkdir sub/d && touch sub/d/f")
    assert events(recursive) == [
        ("sub/d", FilesystemEventType.CREATE),
        ("sub/d/f", FilesystemEventType.CREATE),
        ("sub/inner.txt", FilesystemEventType.WRITE),
    ]
    recursive.stop()


def test_watchers_are_bounded_and_per_sandbox(sandbox):
    sandbox.files.make_dir("many")
    handles = [sandbox.files.watch_dir("many") for _ in range(8)]
    with pytest.raises(SandboxException) as excinfo:
        sandbox.files.watch_dir("many")
    assert "watchers" in str(excinfo.value)
    for h in handles:
        h.stop()
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir("no-such-dir")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir("info.txt")
