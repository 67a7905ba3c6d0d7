"""Drive the unmodified E2B Python SDKs (`e2b`, `e2b-code-interpreter`) against Corral.

    pytest tests/e2b                                                # starts a server itself
    CORRAL_URL=http://127.0.0.1:PORT CORRAL_API_KEY=KEY pytest tests/e2b   # uses that one

Needs `pip install e2b-code-interpreter pytest`. conftest.py provides the server (and fails,
never skips, when it cannot) and points the SDK at it: both the control plane
(POST /v2/sandboxes, DELETE /sandboxes/{id}) and the sandbox plane (/execute, /files, /health,
/process.Process/*) go to the same Corral server. See docs/e2b.md for the wire protocol
these tests exercise.
"""

import base64
import time

import pytest

from e2b import (
    CommandExitException,
    FileNotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b_code_interpreter import Sandbox

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sandbox():
    """One sandbox shared by the tests below, so interpreter state carries over."""
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def test_create_returns_a_sandbox(sandbox, corral_server):
    assert sandbox.sandbox_id
    assert sandbox.is_running()  # GET /health on the sandbox plane
    # The SDK's local values: the domain the server gave, the access token it sends.
    port = corral_server.rsplit(":", 1)[1]
    assert sandbox.sandbox_domain == f"localhost:{port}"
    assert len(sandbox.traffic_access_token or "") >= 16


def test_templates_name_images():
    import datetime

    for template in ("default", "base"):
        sbx = Sandbox.create(template=template, envs={"FROM_CREATE": template}, timeout=120)
        try:
            assert sbx.run_code("1 + 1").text == "2"
            assert sbx.commands.run("echo $FROM_CREATE").stdout == f"{template}\n"
            left = sbx.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)
            assert datetime.timedelta(seconds=60) < left <= datetime.timedelta(seconds=121)
        finally:
            sbx.kill()
    with pytest.raises(SandboxException) as excinfo:
        Sandbox.create(template="no-such-image-here")
    assert "no-such-image-here" in str(excinfo.value)


def test_run_code_stdout(sandbox):
    execution = sandbox.run_code("print('hello')")
    assert execution.error is None
    assert "".join(execution.logs.stdout) == "hello\n"
    assert execution.logs.stderr == []


def test_run_code_stderr(sandbox):
    execution = sandbox.run_code("import sys\nprint('warn', file=sys.stderr)")
    assert execution.error is None
    assert "warn" in "".join(execution.logs.stderr)


def test_run_code_keeps_state_between_calls(sandbox):
    first = sandbox.run_code("x = 41")
    assert first.error is None
    assert first.text is None  # an assignment has no value to show

    second = sandbox.run_code("x + 1")
    assert second.error is None
    assert second.text == "42"


def test_run_code_matplotlib_png(sandbox):
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
    )
    assert execution.error is None
    pngs = [r.png for r in execution.results if r.png]
    assert pngs, f"no result with png in {execution.results}"
    assert base64.b64decode(pngs[0]).startswith(PNG_SIGNATURE)


def test_run_code_dataframe_html(sandbox):
    execution = sandbox.run_code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"
    )
    assert execution.error is None
    main = [r for r in execution.results if r.is_main_result]
    assert len(main) == 1, execution.results
    assert "<table" in (main[0].html or "")
    assert main[0].text  # the plain-text repr is always there too


def test_run_code_exception(sandbox):
    execution = sandbox.run_code("1/0")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert isinstance(execution.error.traceback, str)


def test_files_write_then_read(sandbox):
    info = sandbox.files.write("data.txt", "hello")
    assert info.name == "data.txt"
    assert info.path.endswith("data.txt")
    assert sandbox.files.read("data.txt") == "hello"


def test_files_read_missing_file(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("does-not-exist.txt")


def test_commands_run_stdout_stderr(sandbox):
    result = sandbox.commands.run("echo hi && echo err 1>&2")
    assert result.exit_code == 0
    assert result.stdout == "hi\n"
    assert "err" in result.stderr


def test_commands_run_nonzero_exit_raises(sandbox):
    with pytest.raises(CommandExitException) as excinfo:
        sandbox.commands.run("echo partial; exit 3")
    assert excinfo.value.exit_code == 3
    assert excinfo.value.stdout == "partial\n"


def test_commands_run_streams_to_callbacks_and_ends_at_its_timeout(sandbox):
    out, err = [], []
    result = sandbox.commands.run(
        "echo one; echo two >&2", on_stdout=out.append, on_stderr=err.append
    )
    assert "".join(out) == result.stdout == "one\n"
    assert "".join(err) == result.stderr == "two\n"
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1.5)
    assert time.monotonic() - started < 20
    # The stream ended, not the command (docs/e2b.md §11).
    left = [p.pid for p in sandbox.commands.list() if p.args[-1] == "sleep 30"]
    assert len(left) == 1
    assert sandbox.commands.kill(left[0]) is True
    assert sandbox.commands.run("echo next").stdout == "next\n"


def test_kill_removes_the_sandbox():
    # A sandbox of its own, so killing it cannot disturb the shared one.
    sbx = Sandbox.create()
    assert sbx.run_code("1 + 1").text == "2"

    assert sbx.kill() is True  # DELETE /sandboxes/{id} -> 204

    with pytest.raises(SandboxException):
        sbx.run_code("1 + 1")
    assert sbx.is_running() is False  # GET /health -> 502 for a gone sandbox
    assert Sandbox.kill(sbx.sandbox_id) is False  # DELETE again -> 404


def test_set_timeout_moves_the_expiry(sandbox):
    import datetime

    sandbox.set_timeout(3600)  # POST /sandboxes/{id}/timeout
    info = sandbox.get_info()  # GET /sandboxes/{id}
    left = info.end_at - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(minutes=50) < left <= datetime.timedelta(hours=1, minutes=1)


def test_a_sandbox_is_killed_at_its_timeout():
    sbx = Sandbox.create()
    try:
        Sandbox.set_timeout(sbx.sandbox_id, 2)
        deadline = time.monotonic() + 20
        # Listing does not count as use (the sandbox's own plane would).
        while any(s.sandbox_id == sbx.sandbox_id for s in Sandbox.list().next_items()):
            assert time.monotonic() < deadline, "the sandbox outlived its timeout"
            time.sleep(0.2)
        with pytest.raises(SandboxException):
            Sandbox.get_info(sbx.sandbox_id)
        assert sbx.is_running() is False
        assert Sandbox.kill(sbx.sandbox_id) is False  # already gone
    finally:
        sbx.kill()


def test_pause_then_connect_resumes_with_state():
    # A sandbox of its own: while paused it answers nothing but the control plane.
    sbx = Sandbox.create()
    try:
        sbx.run_code("kept = 40 + 2")
        # A background command is frozen with the rest, and goes on after.
        running = sbx.commands.run("sleep 600", background=True)
        assert sbx.pause() is True  # POST /sandboxes/{id}/pause -> 204
        assert sbx.get_info().state.value == "paused"
        assert sbx.pause() is False  # already paused: 409
        with pytest.raises(SandboxException):
            sbx.run_code("kept")
        again = Sandbox.connect(sbx.sandbox_id)  # resumes it
        assert again.get_info().state.value == "running"
        assert again.run_code("kept").text == "42"
        assert running.pid in {p.pid for p in again.commands.list()}
        assert again.commands.kill(running.pid) is True
        # The class-level pause, then the instance's connect.
        assert Sandbox.pause(sbx.sandbox_id) is True
        assert sbx.connect() is sbx
        assert sbx.get_info().state.value == "running"
        assert sbx.run_code("kept").text == "42"
    finally:
        sbx.kill()


def test_list_by_metadata_and_state_with_pages_and_metrics():
    from e2b import SandboxQuery, SandboxState

    tag = f"list-{time.monotonic_ns()}"
    made = [Sandbox.create(metadata={"tag": tag, "n": str(i)}) for i in range(3)]
    try:
        assert made[0].get_info().metadata == {"tag": tag, "n": "0"}
        made[1].pause()

        def ids(**kwargs):
            paginator = Sandbox.list(**kwargs)
            found = []
            while paginator.has_next:
                found.extend(s.sandbox_id for s in paginator.next_items())
            return found

        everyone = [s.sandbox_id for s in made]
        assert ids(query=SandboxQuery(metadata={"tag": tag})) == everyone
        assert ids(query=SandboxQuery(metadata={"tag": tag, "n": "2"})) == [everyone[2]]
        paused = SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])
        assert ids(query=paused) == [everyone[1]]
        # Pages of one: the SDK follows x-next-token.
        assert ids(query=SandboxQuery(metadata={"tag": tag}), limit=1) == everyone

        made[0].run_code("keep = bytearray(32 << 20)")
        metrics = made[0].get_metrics()
        assert metrics, "no samples"
        last = metrics[-1]
        assert last.mem_used >= 32 << 20 and last.mem_total >= last.mem_used
        assert last.disk_total > 0 and last.cpu_count >= 1
        # start and end bound the samples.
        import datetime

        now = datetime.datetime.now(datetime.timezone.utc)
        hour = datetime.timedelta(hours=1)
        assert made[0].get_metrics(start=now + hour) == []
        assert Sandbox.get_metrics(made[0].sandbox_id, end=now - hour) == []
        assert Sandbox.get_metrics(made[0].sandbox_id, start=now - hour, end=now + hour)
    finally:
        for s in made:
            s.kill()
