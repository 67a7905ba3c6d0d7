"""A paused sandbox across a restart of the server, with the unmodified E2B SDK: paused, the
server stopped (SIGTERM) and started again on the same database, `Sandbox.connect(id)` resumes
it on its files with a fresh kernel, and `get_info()` says `"memory": "not kept"`.

This test starts a server of its own (a restart of the shared one would end the other tests'
sandboxes): the binary from $CORRAL_BIN or <repo>/target/debug/corral, as conftest.py finds it.
It points the SDK at that server for its duration and back afterwards.
"""

import os
import pathlib
import signal
import subprocess

import httpx
import pytest

from e2b_code_interpreter import Sandbox

from e2b_server import REPO, STOP_TIMEOUT_S, _free_port, _wait_until_healthy

SDK_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")


class OwnServer:
    def __init__(self, binary, db, log_path, port, args=()):
        self.binary, self.db, self.log_path, self.port = binary, db, log_path, port
        self.args = list(args)
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "serve", "--listen", f"127.0.0.1:{self.port}", "--db",
                 str(self.db), *self.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        _wait_until_healthy(self.proc, self.url, self.log_path)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(timeout=STOP_TIMEOUT_S) == 0
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail("corral serve did not stop on SIGTERM", pytrace=False)


@pytest.fixture()
def own_server(tmp_path):
    yield from serve_own(tmp_path)


def serve_own(tmp_path, args=()):
    """A server of this test's own (`corral serve` with `args`), the SDK pointed at it."""
    binary = pathlib.Path(os.environ.get("CORRAL_BIN") or REPO / "target" / "debug" / "corral")
    if not binary.is_file():
        pytest.fail(f"no corral binary at {binary} (set CORRAL_BIN)", pytrace=False)
    db = tmp_path / "corral.db"
    made = subprocess.run([str(binary), "key", "create", "--name", "restart", "--db", str(db)],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    server = OwnServer(binary, db, tmp_path / "server.log", _free_port(), args)
    server.start()
    saved = {name: os.environ.get(name) for name in SDK_ENV}
    os.environ.update(E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=key)
    try:
        yield server
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_a_paused_sandbox_resumes_on_its_files_after_a_restart(own_server):
    sbx = Sandbox.create(metadata={"purpose": "restart"})
    sbx.files.write("notes/kept.txt", "written before the restart")
    assert sbx.run_code("in_memory = 42").error is None
    assert sbx.pause() is True
    own_server.stop()
    own_server.start()

    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.state.value == "paused"
    assert info.metadata == {"purpose": "restart"}
    again = Sandbox.connect(sbx.sandbox_id)  # resumes it: a fresh kernel on the saved files
    assert again.sandbox_id == sbx.sandbox_id
    assert again.files.read("notes/kept.txt") == "written before the restart"
    assert again.run_code("'in_memory' in globals()").text == "False"
    assert again.get_info().state.value == "running"
    # Corral's `memory` is an extra key of the answer `get_info()` parses (its SandboxInfo
    # has no field for it): read from the same route.
    detail = httpx.get(
        f"{own_server.url}/sandboxes/{sbx.sandbox_id}",
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        timeout=30,
    ).json()
    assert detail["memory"] == "not kept"
    # Its commands run (the resumed sandbox's process agent).
    assert again.commands.run("cat notes/kept.txt; echo; pwd").stdout == (
        "written before the restart\n/workspace\n"
    )
    again.kill()
