"""Parsing shared by the sync and async clients (no server needed)."""

from __future__ import annotations

import json

import pytest

from corral import (
    InvalidPathError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    Result,
    RetryLaterError,
    RunResult,
    SandboxDeadError,
    SandboxError,
    ServiceUnavailableError,
    StreamError,
)
from corral._common import EventFolder, file_url
from corral._errors import error_from_response


def _lines(*events: dict) -> list:
    return [json.dumps(e) for e in events]


def test_folder_execution() -> None:
    folder = EventFolder()
    dispatched = []
    for line in _lines(
        {"type": "stdout", "text": "a"},
        {"type": "stderr", "text": "b"},
        {"type": "stdout", "text": "c"},
        {"type": "result", "is_main_result": True, "text": "42", "html": "<b>42</b>"},
        {"type": "error", "name": "E", "value": "v", "traceback": "tb"},
        {"type": "some_future_event"},
        {"type": "end", "status": "error", "execution_time_ms": 3, "cpu_time_ms": 2,
         "peak_memory_bytes": 9},
    ):
        dispatched.extend(folder.feed(line))
    assert [k for k, _ in dispatched] == ["stdout", "stderr", "stdout", "result", "error"]
    ex = folder.execution()
    assert ex.stdout == "ac" and ex.logs.stdout == ["a", "c"] and ex.stderr == "b"
    assert ex.text == "42" and ex.results[0].formats() == ["text", "html"]
    assert ex.error is not None and ex.error.name == "E"
    assert (ex.status, ex.execution_time_ms, ex.cpu_time_ms, ex.peak_memory_bytes) == (
        "error", 3, 2, 9)
    assert ex.network is None


def test_folder_keeps_the_end_events_network() -> None:
    network = {"connections": 1, "denied": 0, "failed": 0, "bytes_up": 80, "bytes_down": 5,
               "denials": [], "limit_reached": None}
    end = {"type": "end", "status": "success", "execution_time_ms": 1, "cpu_time_ms": 1,
           "peak_memory_bytes": 1, "network": network}
    folder = EventFolder()
    folder.feed(json.dumps(end))
    assert folder.execution().network == network
    folder = EventFolder()
    folder.feed(json.dumps(dict(end, exit_code=0)))
    assert folder.command_result().network == network
    # A folded result object (Accept: application/json) gives the same.
    folder = EventFolder()
    folder.feed(json.dumps({k: v for k, v in end.items() if k != "type"}))
    assert folder.execution().network == network


def test_folder_command_and_missing_end() -> None:
    folder = EventFolder()
    folder.feed('{"type":"stdout","text":"x\\n"}')
    with pytest.raises(StreamError):
        folder.command_result()
    folder.feed('{"type":"end","status":"error","exit_code":3}')
    r = folder.command_result()
    assert (r.stdout, r.exit_code, r.status) == ("x\n", 3, "error")


def test_folder_error_mid_stream_and_garbage() -> None:
    with pytest.raises(SandboxDeadError):
        EventFolder().feed('{"error":{"code":"sandbox_dead","message":"died"}}')
    with pytest.raises(StreamError):
        EventFolder().feed("not json")


def test_folder_accepts_a_folded_result_object() -> None:
    folder = EventFolder()
    kinds = [k for k, _ in folder.feed(json.dumps({
        "status": "success", "stdout": "out", "stderr": "", "results": [
            {"is_main_result": True, "text": "1"}], "error": None, "execution_time_ms": 1}))]
    assert kinds == ["stdout", "result"]
    assert folder.execution().text == "1"


def test_error_mapping() -> None:
    def err(status: int, code: str, headers: dict = {}) -> Exception:
        body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
        return error_from_response(status, headers, body)

    assert isinstance(err(404, "not_found"), NotFoundError)
    assert isinstance(err(404, "file_not_found"), NotFoundError)
    assert isinstance(err(400, "invalid_path"), InvalidPathError)
    assert isinstance(err(400, "invalid_path"), InvalidRequestError)
    assert isinstance(err(422, "unknown_image"), InvalidRequestError)
    assert isinstance(err(500, "sandbox_error"), SandboxError)
    rl = err(429, "too_many_sandboxes", {"retry-after": "5"})
    assert isinstance(rl, RateLimitError) and rl.retry_after == 5.0
    for code in ["zygote_restarting", "memory_budget_committed", "shutting_down"]:
        busy = err(503, code, {"retry-after": "3"})
        assert isinstance(busy, ServiceUnavailableError) and isinstance(busy, RetryLaterError)
        assert (busy.code, busy.retry_after) == (code, 3.0)
    assert err(503, "shutting_down").retry_after is None
    dated = err(503, "zygote_restarting", {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert dated.retry_after == 0.0  # a date in the past: now
    plain = error_from_response(502, {}, b"bad gateway")
    assert plain.status_code == 502 and "bad gateway" in str(plain)


def test_file_url_encoding() -> None:
    assert file_url("sbx-1", "a/b c.txt") == "/v1/sandboxes/sbx-1/files/a/b%20c.txt"
    assert file_url("sbx-1", "../etc/passwd") == "/v1/sandboxes/sbx-1/files/%2E%2E/etc/passwd"
    assert file_url("sbx-1", "/etc/passwd") == "/v1/sandboxes/sbx-1/files/%2Fetc/passwd"
    assert file_url("sbx-1", "q?#%") == "/v1/sandboxes/sbx-1/files/q%3F%23%25"


def test_run_result_and_png(tmp_path) -> None:
    import base64

    png = base64.b64encode(b"\x89PNG\r\n\x1a\nrest").decode()
    r = RunResult.from_dict({
        "status": "success", "exit_code": 0, "signal": None, "stdout": "42\n", "stderr": "",
        "results": [{"is_main_result": False, "png": png}], "error": None,
        "files": [{"path": "x", "size": 1}], "warnings": ["w"]})
    assert r.logs.stdout == ["42\n"] and r.files[0].size == 1 and r.text is None
    r.results[0].save_png(tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError):
        Result(text="t").save_png(tmp_path / "q.png")
