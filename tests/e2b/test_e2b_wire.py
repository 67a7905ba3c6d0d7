"""Edges of the E2B face the SDK tests do not reach, spoken as raw HTTP (httpx comes with
the SDK): credentials, the shape of errors, path mapping, and the Connect framing."""

import json
import os
import struct
import time

import httpx
import pytest

from e2b import InvalidArgumentException
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


@pytest.fixture(scope="module")
def client(corral_server):
    with httpx.Client(base_url=corral_server, timeout=60) as c:
        yield c


def plane(sandbox, token=None):
    return {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": token if token is not None else sandbox._envd_access_token,
    }


def assert_e2b_error(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status and isinstance(body["message"], str), body


def test_control_plane_errors_have_e2b_shape(client):
    r = client.post("/v2/sandboxes", json={}, headers={"X-API-KEY": "not-a-key"})
    assert_e2b_error(r, 401)
    r = client.delete("/sandboxes/sbx-unknown", headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    assert_e2b_error(r, 404)
    r = client.post(
        "/v2/sandboxes",
        content=b"{not json",
        headers={"X-API-KEY": os.environ["E2B_API_KEY"], "Content-Type": "application/json"},
    )
    assert_e2b_error(r, 400)


def test_sandbox_info(sbx):
    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == "code-interpreter-v1"


def test_sandbox_plane_needs_the_access_token(client, sbx):
    assert_e2b_error(client.get("/health", headers=plane(sbx, token="wrong")), 502)
    assert_e2b_error(client.post("/execute", json={"code": "1"}, headers=plane(sbx, token="")), 502)
    assert client.get("/health", headers=plane(sbx)).status_code == 204


def test_unauthorized_and_unknown_sandboxes_answer_alike(corral_server, sbx):
    """Without its token, another's sandbox is answered exactly as a sandbox that does not
    exist: the answer must not tell an id that exists from one that does not."""
    other = Sandbox.create()  # whose token another tenant would hold
    # A connection per request: the server may close one whose body it did not read.
    fresh = httpx.Limits(max_keepalive_connections=0)
    client = httpx.Client(base_url=corral_server, timeout=60, limits=fresh)
    try:
        requests = [
            ("GET", "/health", {}),
            ("POST", "/execute", {"json": {"code": "1"}}),
            ("GET", "/files", {"params": {"path": "a.txt"}}),
            (
                "POST",
                "/process.Process/Start",
                {"content": b"", "headers": {"Content-Type": "application/connect+json"}},
            ),
        ]

        def answer(sandbox_id, token, method, path, kwargs):
            headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
            if token is not None:
                headers["X-Access-Token"] = token
            kwargs = dict(kwargs)
            headers.update(kwargs.pop("headers", {}))
            r = client.request(method, path, headers=headers, **kwargs)
            # The id the client sent is echoed back; everything else must be the same.
            body = r.text.replace(sandbox_id, "<id>")
            return r.status_code, r.headers.get("content-type"), body

        unknown_id = "i" + sbx.sandbox_id[1:][::-1] + "x"
        for method, path, kwargs in requests:
            unknown = answer(unknown_id, other._envd_access_token, method, path, kwargs)
            assert unknown[0] == 502, unknown
            for token in (other._envd_access_token, "wrong", "", None):
                existing = answer(sbx.sandbox_id, token, method, path, kwargs)
                assert existing == unknown, (method, path, token)
        assert client.get("/health", headers=plane(sbx)).status_code == 204
    finally:
        client.close()
        other.kill()


def test_sandbox_plane_without_a_sandbox(client, sbx):
    assert client.get("/health").status_code == 204  # Corral's own
    assert_e2b_error(client.post("/execute", json={"code": "1"}), 404)
    assert_e2b_error(client.get("/files", params={"path": "x"}), 404)
    unknown = {"E2b-Sandbox-Id": "sbx-unknown", "X-Access-Token": "x"}
    r = client.get("/health", headers=unknown)
    assert_e2b_error(r, 502)
    assert "was not found" in r.json()["message"]


def test_execute_lines_are_json_objects(client, sbx):
    r = client.post(
        "/execute",
        json={"code": "print('a')\n6 * 7", "context_id": None, "language": None, "env_vars": None},
        headers=plane(sbx),
    )
    assert r.status_code == 200
    lines = r.text.split("\n")
    assert lines[-1] == ""  # the last line ends with a newline ...
    events = [json.loads(line) for line in lines[:-1]]  # ... and no line is blank
    types = [e["type"] for e in events]
    assert types[-2:] == ["number_of_executions", "end_of_execution"], types
    stdout = [e for e in events if e["type"] == "stdout"]
    assert "".join(e["text"] for e in stdout) == "a\n"
    assert all("T" in e["timestamp"] for e in stdout)
    result = next(e for e in events if e["type"] == "result")
    assert result == {"type": "result", "is_main_result": True, "text": "42"}


def test_file_paths_map_onto_the_workspace(sbx):
    info = sbx.files.write("/home/user/sub/a.txt", "A")
    assert info.path == "/workspace/sub/a.txt"
    assert sbx.files.read("/workspace/sub/a.txt") == "A"
    assert sbx.files.read("sub/a.txt") == "A"
    assert sbx.run_code("open('sub/a.txt').read()").text == "A"
    with pytest.raises(InvalidArgumentException):
        sbx.files.read("/etc/passwd")
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("../escape.txt", "x")


def test_binary_files_round_trip(sbx):
    data = bytes(range(256)) * 64
    sbx.files.write("bin/data.bin", data)
    assert bytes(sbx.files.read("bin/data.bin", format="bytes")) == data
    assert b"".join(sbx.files.read("bin/data.bin", format="stream")) == data


def test_several_files_are_written_at_once(sbx):
    written = sbx.files.write_files(
        [
            {"path": "many/one.txt", "data": "one"},
            {"path": "/home/user/many/two.bin", "data": b"\x07\x08\x09"},
        ]
    )
    assert [w.path for w in written] == ["/workspace/many/one.txt", "/workspace/many/two.bin"]
    assert sbx.files.read("many/one.txt") == "one"
    assert bytes(sbx.files.read("many/two.bin", format="bytes")) == b"\x07\x08\x09"


def test_commands_see_envs_and_cwd(sbx):
    result = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hej"}, cwd="/home/user")
    assert result.stdout == "hej\n/workspace\n"


def test_process_start_framing(client, sbx):
    request = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "echo hi"]}}).encode()

    def chunks():  # a chunked request body, split inside the envelope header
        framed = struct.pack(">BI", 0, len(request)) + request
        yield framed[:3]
        yield framed[3:]

    r = client.post(
        "/process.Process/Start",
        content=chunks(),
        headers={**plane(sbx), "Content-Type": "application/connect+json"},
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/connect+json"
    body, frames = r.content, []
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        frames.append((flags, json.loads(body[5 : 5 + length])))
        body = body[5 + length :]
    assert "start" in frames[0][1]["event"]
    assert frames[1][1] == {"event": {"data": {"stdout": "aGkK"}}}
    assert frames[-2][1]["event"]["end"]["exitCode"] == 0
    assert frames[-1] == (2, {})

    compressed = struct.pack(">BI", 1, len(request)) + request
    r = client.post("/process.Process/Start", content=compressed, headers=plane(sbx))
    assert r.status_code == 200
    flags, length = struct.unpack(">BI", r.content[:5])
    assert flags == 2
    assert json.loads(r.content[5:])["error"]["code"] == "invalid_argument"


def test_a_client_that_goes_away_interrupts_its_execution(client, sbx):
    code = "import time\nprint('started', flush=True)\ntime.sleep(25)\nprint('finished')"
    with client.stream("POST", "/execute", json={"code": code}, headers=plane(sbx)) as r:
        first = json.loads(next(r.iter_lines()))
        assert first["type"] == "stdout" and first["text"].startswith("started")
    started = time.monotonic()
    execution = sbx.run_code("'still here'")  # waits for the interrupted one to end
    assert execution.text == "still here"  # without quotes, as E2B shows strings
    assert time.monotonic() - started < 10


def test_refusals_leave_the_connection_usable(corral_server, sbx):
    """A request Corral refuses (a call it does not serve, a sandbox that is not there) is
    refused after its body is read, so the client's kept-alive connection carries its next
    request (the SDK pools connections)."""
    request = json.dumps({"process": {"pid": 1000}}).encode()

    def chunks():  # a streamed request body, as the SDK sends a server-streaming call
        framed = struct.pack(">BI", 0, len(request)) + request
        yield framed[:3]
        yield framed[3:]

    connect = {"Content-Type": "application/connect+json"}
    unknown = {"E2b-Sandbox-Id": "sbx-unknown", "X-Access-Token": "x"}
    refused = [
        ("POST", "/process.Process/Nope", {"content": chunks, "headers": connect}, 501),
        ("POST", "/process.Process/Connect", {"content": chunks, "headers": {**connect, **unknown}}, 502),
        ("POST", "/contexts", {"json": {"language": "python"}, "headers": unknown}, 502),
        ("POST", "/sandboxes/x/fork", {}, 501),
        ("GET", "/sandboxes/x/metrics", {}, 404),
        ("POST", "/execute", {"json": {"code": "1"}, "headers": unknown}, 502),
        ("POST", "/process.Process/Start", {"content": chunks, "headers": {**connect, **unknown}}, 502),
        ("POST", "/filesystem.Filesystem/WatchDir", {"content": chunks, "headers": {**connect, **unknown}}, 502),
        ("POST", "/process.Process/SendSignal", {"json": {"process": {"pid": 1}}, "headers": unknown}, 502),
        ("POST", "/filesystem.Filesystem/ListDir", {"json": {"path": "/home/user"}, "headers": unknown}, 502),
        ("POST", "/filesystem.Filesystem/Remove", {"json": {"path": "x"}, "headers": unknown}, 502),
    ]
    one_connection = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=corral_server, timeout=60, limits=one_connection) as client:
        for _ in range(3):
            for method, path, kwargs, status in refused:
                kwargs = dict(kwargs)
                if callable(kwargs.get("content")):
                    kwargs["content"] = kwargs["content"]()
                headers = {**plane(sbx), "X-API-KEY": os.environ["E2B_API_KEY"]}
                headers.update(kwargs.pop("headers", {}))
                r = client.request(method, path, headers=headers, **kwargs)
                assert r.status_code == status, (path, r.text)
                if status == 501:
                    assert "not supported by Corral" in r.json()["message"]
                assert client.get("/health", headers=plane(sbx)).status_code == 204
