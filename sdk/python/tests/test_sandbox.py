"""The synchronous client against a real `corral serve` (see conftest.py)."""

from __future__ import annotations

import base64
import io
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest

import corral
from corral import (
    CommandExitError,
    ExecutionError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    Result,
    RetryLaterError,
    Sandbox,
    ServiceUnavailableError,
)


@pytest.fixture
def sb(corral_url: str) -> Iterator[Sandbox]:
    with Sandbox(corral_url) as sandbox:
        yield sandbox


# ---- sessions -----------------------------------------------------------------------------


def test_create_run_kill(corral_url: str) -> None:
    sandbox = Sandbox(corral_url)
    try:
        assert sandbox.id
        assert sandbox.language == "python"
        assert sandbox.image == "default"
        assert sandbox.id in [s.id for s in Sandbox.list(corral_url)]
        info = sandbox.get_info()
        assert info.state == "running"
        execution = sandbox.run_code("print('hello')")
        assert execution.status == "success"
        assert execution.stdout == "hello\n"
        assert execution.error is None
    finally:
        assert sandbox.kill() is True
        sandbox.close()
    assert sandbox.id not in [s.id for s in Sandbox.list(corral_url)]
    assert sandbox.kill() is False  # already gone


def test_url_from_environment(corral_url: str) -> None:
    # conftest sets CORRAL_URL; no url given here.
    with Sandbox() as sandbox:
        assert sandbox.url == corral_url
        assert sandbox.run_code("1 + 2").text == "3"


def test_stdout_callback_streams_in_order(sb: Sandbox) -> None:
    seen: List[Tuple[float, str]] = []
    code = (
        "import time\n"
        "for i in range(3):\n"
        "    print(f'line {i}', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('last', flush=True)\n"
    )
    start = time.monotonic()
    execution = sb.run_code(code, on_stdout=lambda text: seen.append((time.monotonic(), text)))
    finished = time.monotonic()
    assert execution.status == "success"
    text = "".join(t for _, t in seen)
    assert text == "line 0\nline 1\nline 2\nlast\n"
    assert execution.stdout == text
    assert execution.logs.stdout == [t for _, t in seen]
    # The first lines arrived while the code was still sleeping, not all at the end.
    assert seen[0][0] - start < finished - start - 1.0


def test_state_kept_across_calls(sb: Sandbox) -> None:
    assert sb.run_code("x = 41").status == "success"
    assert sb.run_code("x + 1").text == "42"


def test_connect_to_existing_session(sb: Sandbox, corral_url: str) -> None:
    sb.run_code("shared = 'yes'")
    other = Sandbox.connect(sb.id, corral_url)
    try:
        assert other.id == sb.id
        assert other.language == "python"
        assert other.run_code("shared").text == "'yes'"
    finally:
        other.close()


def test_last_expression_text(sb: Sandbox) -> None:
    execution = sb.run_code("a = 20\na * 2 + 2")
    assert execution.text == "42"
    main = [r for r in execution.results if r.is_main_result]
    assert len(main) == 1
    assert "text" in main[0].formats()
    assert sb.run_code("a = 1").text is None


def test_dataframe_html(sb: Sandbox) -> None:
    execution = sb.run_code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"
    )
    assert execution.status == "success", execution.error
    main = [r for r in execution.results if r.is_main_result][0]
    assert main.html is not None and "<table" in main.html
    assert "html" in main.formats()


def test_matplotlib_png(sb: Sandbox, tmp_path: Path) -> None:
    got: List[Result] = []
    execution = sb.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()", on_result=got.append
    )
    assert execution.status == "success", execution.error
    pngs = [r for r in execution.results if r.png is not None]
    assert pngs, execution
    png = pngs[0]
    assert isinstance(png.png, str)
    assert base64.b64decode(png.png).startswith(b"\x89PNG")
    assert png.png_bytes().startswith(b"\x89PNG")
    assert "png" in png.formats()
    out = tmp_path / "chart.png"
    png.save_png(out)
    assert out.read_bytes().startswith(b"\x89PNG")
    assert got == execution.results


def test_exception(sb: Sandbox) -> None:
    errors: List[ExecutionError] = []
    execution = sb.run_code("1 / 0", on_error=errors.append)
    assert execution.status == "error"
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value
    assert execution.error.traceback
    assert errors == [execution.error]
    # The session survives an exception.
    assert sb.run_code("'still here'").text == "'still here'"


def test_stderr(sb: Sandbox) -> None:
    chunks: List[str] = []
    execution = sb.run_code(
        "import sys\nsys.stderr.write('oops\\n')\nprint('fine')", on_stderr=chunks.append
    )
    assert execution.status == "success"
    assert execution.stderr == "oops\n"
    assert "".join(chunks) == "oops\n"
    assert execution.stdout == "fine\n"


def test_execution_metrics(sb: Sandbox) -> None:
    execution = sb.run_code("sum(range(100000))")
    assert execution.execution_time_ms >= 0
    assert execution.cpu_time_ms >= 0
    assert execution.peak_memory_bytes >= 0


def test_dropped_results_are_a_warning(sb: Sandbox) -> None:
    # 300 rich results: the server keeps 256 per execution and says so in the `end` event.
    seen: List[Result] = []
    execution = sb.run_code(
        "from IPython.display import display\nfor i in range(300):\n    display(i)",
        on_result=seen.append,
    )
    assert execution.status == "success", execution
    assert len(execution.results) == len(seen) == 256
    assert any("rich results over the" in w for w in execution.warnings), execution.warnings
    # Commands carry the session's warnings too (none dropped here).
    assert sb.commands.run("true").warnings == sb.get_info().warnings


def test_pause_and_resume(sb: Sandbox) -> None:
    sb.run_code("kept = 'across the pause'")
    info = sb.pause()
    assert info.state == "paused" and info.paused_at
    with pytest.raises(corral.SandboxStateError) as e:
        sb.run_code("1")
    assert e.value.code == "sandbox_paused"
    with pytest.raises(corral.SandboxStateError) as e:
        sb.files.list()
    assert e.value.code == "sandbox_paused"
    assert sb.get_info().state == "paused"
    info = sb.resume()
    assert info.state == "running" and info.paused_at is None
    assert sb.run_code("kept").text == "'across the pause'"
    with pytest.raises(corral.SandboxStateError) as e:
        sb.resume()
    assert e.value.code == "sandbox_not_paused"


def test_list_by_metadata_and_metrics(corral_url: str) -> None:
    tag = uuid.uuid4().hex
    made = [Sandbox(corral_url, metadata={"tag": tag, "n": str(i)}) for i in range(2)]
    try:
        assert made[0].info.metadata == {"tag": tag, "n": "0"}
        made[1].pause()
        listed = Sandbox.list(corral_url, metadata={"tag": tag})
        assert [s.id for s in listed] == [s.id for s in made]
        paused = Sandbox.list(corral_url, metadata={"tag": tag}, state=["paused"])
        assert [s.id for s in paused] == [made[1].id]
        made[0].run_code("keep = bytearray(32 << 20)")
        last = made[0].metrics()[-1]
        assert last.memory_used_bytes >= 32 << 20
        assert last.memory_limit_bytes == made[0].info.limits["memory_mb"] << 20
    finally:
        for s in made:
            s.kill()


def test_timeout(sb: Sandbox) -> None:
    execution = sb.run_code("import time\ntime.sleep(10)", timeout_s=1)
    assert execution.status == "timeout"


def test_wrong_language_is_refused(sb: Sandbox) -> None:
    # Another language of the image runs in its default code context; an unknown one is 422.
    with pytest.raises(InvalidRequestError) as info:
        sb.run_code("1", language="cobol")
    assert (info.value.status_code, info.value.code) == (422, "unsupported_language")


def test_bad_timeout_is_refused(sb: Sandbox) -> None:
    with pytest.raises(InvalidRequestError) as info:
        sb.run_code("1", timeout_s=-1)
    assert info.value.status_code == 400


def test_bad_limits_are_refused(corral_url: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        Sandbox(corral_url, limits={"memory_mb": 1})
    assert info.value.code == "bad_request"


def test_unknown_image_is_refused(corral_url: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        Sandbox(corral_url, image="no-such-image")
    assert (info.value.status_code, info.value.code) == (422, "unknown_image")


# ---- files --------------------------------------------------------------------------------


def test_files_roundtrip(sb: Sandbox) -> None:
    info = sb.files.write("data.txt", "héllo\n")
    assert info.path == "data.txt"
    assert info.size == len("héllo\n".encode())
    assert sb.files.read("data.txt") == "héllo\n"
    assert sb.files.read("data.txt", format="bytes") == "héllo\n".encode()

    blob = bytes(range(256))
    assert sb.files.write("sub/dir/blob.bin", blob).size == 256
    assert sb.files.read("sub/dir/blob.bin", format="bytes") == blob
    sb.files.write("sub/from_io.bin", io.BytesIO(b"from io"))
    assert sb.files.read("sub/from_io.bin") == "from io"

    # The code sees what was written, in its working directory.
    assert sb.run_code("open('data.txt').read()").text == repr("héllo\n")

    listed = sb.files.list()
    paths = [f.path for f in listed]
    assert paths == sorted(paths)
    assert {"data.txt", "sub/dir/blob.bin", "sub/from_io.bin"} <= set(paths)
    assert [f.path for f in sb.files.list("sub")] == ["sub/dir/blob.bin", "sub/from_io.bin"]

    sb.files.write("data.txt", "replaced")
    assert sb.files.read("data.txt") == "replaced"

    sb.files.remove("data.txt")
    assert "data.txt" not in [f.path for f in sb.files.list()]
    with pytest.raises(NotFoundError):
        sb.files.read("data.txt")


def test_files_written_by_code_are_listed(sb: Sandbox) -> None:
    sb.run_code("with open('made.txt', 'w') as f:\n    f.write('abc')")
    assert sb.files.read("made.txt") == "abc"
    assert corral.FileInfo("made.txt", 3) in sb.files.list()


def test_read_missing_file(sb: Sandbox) -> None:
    with pytest.raises(NotFoundError):
        sb.files.read("no-such-file.txt")


def test_path_escape_is_refused(sb: Sandbox) -> None:
    with pytest.raises(InvalidRequestError) as info:
        sb.files.read("../etc/passwd")
    assert info.value.status_code == 400
    with pytest.raises(InvalidRequestError):
        sb.files.write("../escape.txt", "x")
    with pytest.raises(InvalidRequestError):
        sb.files.read("/etc/passwd")


# ---- commands -----------------------------------------------------------------------------


def test_command_echo(sb: Sandbox) -> None:
    chunks: List[str] = []
    result = sb.commands.run("echo hello", on_stdout=chunks.append)
    assert result.exit_code == 0
    assert result.status == "success"
    assert result.stdout == "hello\n"
    assert "".join(chunks) == "hello\n"


def test_command_args_without_shell(sb: Sandbox) -> None:
    result = sb.commands.run("echo", args=["a  b", "$HOME"])
    assert result.exit_code == 0
    assert result.stdout == "a  b $HOME\n"


def test_command_cwd_env_stderr(sb: Sandbox) -> None:
    result = sb.commands.run("pwd; echo $GREETING; echo err >&2", cwd="/tmp", env={"GREETING": "hi"})
    assert result.exit_code == 0
    assert result.stdout == "/tmp\nhi\n"
    assert result.stderr == "err\n"


def test_command_nonzero_exit_does_not_raise(sb: Sandbox) -> None:
    result = sb.commands.run("exit 3")
    assert result.exit_code == 3
    assert result.status != "success"


def test_command_check_raises(sb: Sandbox) -> None:
    with pytest.raises(CommandExitError) as info:
        sb.commands.run("echo out; exit 3", check=True)
    assert info.value.exit_code == 3
    assert info.value.stdout == "out\n"
    assert sb.commands.run("true", check=True).exit_code == 0


def test_command_sees_workspace_and_leaves_state(sb: Sandbox) -> None:
    sb.run_code("kept = 7")
    sb.files.write("f.txt", "content")
    assert sb.commands.run("cat f.txt").stdout == "content"
    assert sb.run_code("kept").text == "7"


# ---- one-shot -----------------------------------------------------------------------------


def test_one_shot_run(corral_url: str) -> None:
    result = corral.run("print(6*7)")
    assert result.status == "success"
    assert result.exit_code == 0
    assert result.stdout == "42\n"
    assert result.logs.stdout == ["42\n"]
    assert result.error is None


def test_one_shot_run_with_files_and_error(corral_url: str) -> None:
    result = corral.run(
        "print(open('in.txt').read())\nopen('out.bin', 'wb').write(open('b.bin', 'rb').read())\n1/0",
        url=corral_url,
        files={"in.txt": "input", "b.bin": b"\x00\x01\x02"},
        limits=corral.Limits(timeout_s=20),
    )
    assert result.status == "error"
    assert result.stdout == "input\n"
    assert result.error is not None and result.error.name == "ZeroDivisionError"
    assert corral.FileInfo("out.bin", 3) in result.files


def test_one_shot_results(corral_url: str) -> None:
    result = corral.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    assert result.status == "success", result.error_message
    assert any(r.png and r.png_bytes().startswith(b"\x89PNG") for r in result.results)


# ---- code policy --------------------------------------------------------------------------


def test_a_policy_refuses_code_before_it_runs(corral_url: str) -> None:
    result = corral.run(
        "print('ran')\nimport socket",
        policy=corral.Policy(allowed_modules=["json", "math"]),
    )
    assert (result.status, result.stdout) == ("error", "")
    assert result.error is not None and result.error.name == "PolicyViolation"
    assert result.error.violations == [corral.Violation("not_allowed", 2, "socket")]
    assert "allowed modules: json, math" in result.error.value

    with Sandbox(corral_url, policy={"denied_modules": ["socket"], "max_code_bytes": 200}) as sb:
        assert sb.info.policy == corral.Policy(None, ["socket"], 200)
        sb.run_code("x = 1")
        refused = sb.run_code("x = 2\nimport socket")
        assert refused.error is not None and refused.error.name == "PolicyViolation"
        assert refused.error.violations == [corral.Violation("denied", 2, "socket")]
        assert sb.run_code("x").text == "1"
        too_long = sb.run_code("#" * 201)
        assert too_long.error is not None
        assert too_long.error.violations == [corral.Violation("max_code_bytes")]


def test_a_policy_that_cannot_be_or_would_widen_the_keys_is_refused(serve_with: Any) -> None:
    with serve_with('pool_size = 0\n[code_policy]\nallowed_modules = ["json"]\n') as url:
        with pytest.raises(corral.ForbiddenError) as widened:
            corral.run("1", url=url, policy={"allowed_modules": ["json", "socket"]})
        assert widened.value.status_code == 403 and widened.value.code == "forbidden"
        assert "`socket` is not allowed by the policy in force" in widened.value.message
        with pytest.raises(InvalidRequestError) as bad:
            Sandbox(url, image="host", policy={"denied_modules": ["not a module"]})
        assert "policy.denied_modules" in bad.value.message


# ---- errors and lifetime ------------------------------------------------------------------


def test_unknown_sandbox(corral_url: str) -> None:
    missing = f"sbx-{uuid.uuid4().hex[:12]}"
    with pytest.raises(NotFoundError) as info:
        Sandbox.connect(missing, corral_url)
    assert info.value.status_code == 404
    assert info.value.code == "not_found"


def test_context_manager_kills(corral_url: str) -> None:
    with Sandbox(corral_url) as sandbox:
        sandbox.run_code("x = 1")
        sid = sandbox.id
    assert sid not in [s.id for s in Sandbox.list(corral_url)]
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid)
    with pytest.raises(NotFoundError):
        sandbox.run_code("x")


def test_refusals_carry_retry_after(serve_with: Any) -> None:
    # Two sessions per key, and a memory budget of 1.5 GiB: one session of 512 MiB memory and
    # 2 x 256 MiB disk (1 GiB promised) fits, a second is refused for memory (503), a small
    # one then fits and a third session for the key is refused for the count (429). Both
    # refusals come with the server's Retry-After, in seconds.
    config = (
        "pool_size = 0\nmax_sessions_per_key = 2\nmemory_budget_bytes = 1610612736\n"
        "memory_budget_per_key = 1610612736\n"
    )
    big = {"memory_mb": 512, "disk_mb": 256}
    small = {"memory_mb": 256, "disk_mb": 16}
    with serve_with(config) as url:
        first = Sandbox(url, image="host", limits=big)
        try:
            with pytest.raises(ServiceUnavailableError) as budget:
                Sandbox(url, image="host", limits=big)
            assert budget.value.status_code == 503
            assert budget.value.code == "memory_budget_committed"
            assert isinstance(budget.value, RetryLaterError)
            assert budget.value.retry_after is not None and budget.value.retry_after >= 1
            with Sandbox(url, image="host", limits=small):
                with pytest.raises(RateLimitError) as count:
                    Sandbox(url, image="host", limits=small)
                assert count.value.status_code == 429
                assert isinstance(count.value, RetryLaterError)
                assert count.value.retry_after is not None and count.value.retry_after >= 1
        finally:
            first.kill()
            first.close()


def test_connection_error_is_wrapped() -> None:
    # A port nothing listens on.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(corral.CorralConnectionError):
        Sandbox(f"http://127.0.0.1:{port}")
