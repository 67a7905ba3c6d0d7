"""The routes the console needs, from the HTTP side: who may do what (operators, plain keys,
keyless `local`), what every answer's headers say, and the console's files."""

import json

import pytest

CONSOLE_FILES = ["/", "/console/app.js", "/console/api.js", "/console/render.js",
                 "/console/console.css", "/console/favicon.svg"]


def body(raw):
    return json.loads(raw) if raw else None


def test_the_console_and_its_files_are_served_under_a_strict_policy(server):
    for path in CONSOLE_FILES:
        status, headers, raw = server.call("GET", path)
        assert status == 200, path
        csp = headers["Content-Security-Policy"]
        for directive in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'",
                          "object-src 'none'", "base-uri 'none'", "form-action 'none'"]:
            assert directive in csp, (path, csp)
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["X-Frame-Options"] == "DENY"
        assert raw
    status, headers, _ = server.call("GET", "/console/nothing.js")
    assert status == 404


def test_every_other_answer_is_an_inert_document(server):
    for method, path in [("GET", "/v1/sandboxes"), ("GET", "/nowhere"), ("GET", "/docs"),
                         ("GET", "/healthz"), ("GET", "/v1/keys")]:
        _, headers, _ = server.call(method, path)
        csp = headers["Content-Security-Policy"]
        assert "sandbox" in csp.split("; ") and "default-src 'none'" in csp, (path, csp)
        assert headers["X-Content-Type-Options"] == "nosniff"


def test_a_workspace_file_is_served_inert(server):
    status, _, raw = server.call("POST", "/v1/sandboxes", body=b"{}")
    assert status == 201
    sandbox = body(raw)["id"]
    try:
        status, _, _ = server.call("PUT", f"/v1/sandboxes/{sandbox}/files/x.html",
                                   body=b"<script>alert(1)</script>")
        assert status == 201
        status, headers, raw = server.call("GET", f"/v1/sandboxes/{sandbox}/files/x.html")
        assert status == 200 and raw == b"<script>alert(1)</script>"
        assert headers["Content-Type"] == "application/octet-stream"
        assert "sandbox" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
    finally:
        server.call("DELETE", f"/v1/sandboxes/{sandbox}")


def test_who_is_who(server):
    assert body(server.call("GET", "/v1/whoami")[2]) == {
        "key_id": "local", "name": None, "operator": False}
    me = body(server.call("GET", "/v1/whoami", server.operator_key)[2])
    assert me["operator"] is True and me["name"] == "ops"
    me = body(server.call("GET", "/v1/whoami", server.tenant_key)[2])
    assert me == {"key_id": server.tenant_key_id, "name": "tenant", "operator": False}
    assert server.call("GET", "/v1/whoami", "crl_wrong")[0] == 401
    # A keyless request from a page of another origin is refused, as for the whole API.
    status, _, _ = server.call("GET", "/v1/whoami", headers={"Origin": "http://evil.example"})
    assert status == 403


@pytest.mark.parametrize("key", ["tenant", "local"])
def test_only_an_operator_manages_keys_and_sees_every_sandbox(server, key):
    secret = server.tenant_key if key == "tenant" else None
    for method, path, payload in [
        ("GET", "/v1/keys", None),
        ("POST", "/v1/keys", b'{"name": "mine"}'),
        ("DELETE", f"/v1/keys/{server.tenant_key_id}", None),
        ("GET", "/v1/operator/sandboxes", None),
        ("GET", f"/v1/operator/sandboxes?key={server.tenant_key_id}", None),
    ]:
        status, _, raw = server.call(method, path, secret, payload)
        assert status == 403, (method, path, raw)
        assert body(raw)["error"]["code"] == "forbidden"
    # Nothing happened: the key still works and no key was made.
    assert server.call("GET", "/v1/whoami", server.tenant_key)[0] == 200
    names = [k["name"] for k in body(server.call("GET", "/v1/keys", server.operator_key)[2])["keys"]]
    assert "mine" not in names


def test_keys_made_through_the_api_are_plain_and_shown_once(server):
    status, _, raw = server.call("POST", "/v1/keys", server.operator_key, b'{"name": "api-made"}')
    assert status == 201
    made = body(raw)
    assert made["secret"].startswith("crl_") and made["name"] == "api-made"
    listed = body(server.call("GET", "/v1/keys", server.operator_key)[2])["keys"]
    entry = [k for k in listed if k["id"] == made["id"]][0]
    assert entry == {**entry, "operator": False, "revoked": False}
    assert made["secret"] not in json.dumps(listed)
    # The new key is a tenant of its own: it cannot manage keys.
    assert server.call("GET", "/v1/keys", made["secret"])[0] == 403
    # An operator key cannot be asked for, and bad names are refused.
    for payload in [b'{"name": "x", "operator": true}', b'{"name": ""}',
                    json.dumps({"name": "x" * 65}).encode(), b'{"name": "a\\u0000b"}',
                    b'{"name": "a\\nb"}', b"not json", b"{}"]:
        status, _, raw = server.call("POST", "/v1/keys", server.operator_key, payload)
        assert status == 400, (payload, raw)
    # Bodies are bounded at 4 KiB (a name is all they hold).
    for size in [4097, 2_000_000]:
        status, _, _ = server.call("POST", "/v1/keys", server.operator_key,
                                   b'{"name": "' + b"x" * size + b'"}')
        assert status == 413, size
    # Revoked at once; revoking again is 404.
    assert server.call("DELETE", f"/v1/keys/{made['id']}", server.operator_key)[0] == 204
    assert server.call("GET", "/v1/whoami", made["secret"])[0] == 401
    assert server.call("DELETE", f"/v1/keys/{made['id']}", server.operator_key)[0] == 404
    assert server.call("DELETE", "/v1/keys/key-nothing", server.operator_key)[0] == 404


def test_the_audit_log_is_per_key_and_whole_for_an_operator(server):
    mine = server.call("POST", "/v1/sandboxes", server.tenant_key, b"{}")
    assert mine[0] == 201
    mine = body(mine[2])["id"]
    local = body(server.call("POST", "/v1/sandboxes", body=b"{}")[2])["id"]
    try:
        for key, sandbox in [(server.tenant_key, mine), (None, local)]:
            status, _, _ = server.call("POST", f"/v1/sandboxes/{sandbox}/execute", key,
                                       b'{"code": "1"}', headers={"Accept": "application/json"})
            assert status == 200
        # A plain key: its own lines only; another key's are 403.
        entries = body(server.call("GET", "/v1/audit", server.tenant_key)[2])["entries"]
        assert entries and {e["key_id"] for e in entries} == {server.tenant_key_id}
        assert "code" not in entries[0] and len(entries[0]["code_sha256"]) == 64
        status, _, _ = server.call("GET", "/v1/audit?key=local", server.tenant_key)
        assert status == 403
        own = server.call("GET", f"/v1/audit?key={server.tenant_key_id}", server.tenant_key)
        assert own[0] == 200
        # Keyless local: its own too.
        entries = body(server.call("GET", "/v1/audit")[2])["entries"]
        assert entries and {e["key_id"] for e in entries} == {"local"}
        # An operator: everyone's, and filters.
        entries = body(server.call("GET", "/v1/audit", server.operator_key)[2])["entries"]
        assert {"local", server.tenant_key_id} <= {e["key_id"] for e in entries}
        entries = body(server.call("GET", f"/v1/audit?session={local}", server.operator_key)[2])["entries"]
        assert [e["session_id"] for e in entries] == [local]
        # Paging: one line a page, newest first, no line twice.
        first = body(server.call("GET", "/v1/audit?limit=1", server.operator_key)[2])
        second = body(server.call("GET", f"/v1/audit?limit=1&before={first['next']}",
                                  server.operator_key)[2])
        assert second["entries"][0]["id"] < first["entries"][0]["id"]
        for bad in ["limit=0", "limit=1001", "limit=x", "colour=red", "since=soon"]:
            assert server.call("GET", f"/v1/audit?{bad}", server.operator_key)[0] == 400, bad
        # The operator's listing of every key's sandboxes, and by key.
        listed = body(server.call("GET", "/v1/operator/sandboxes", server.operator_key)[2])
        owners = {s["id"]: s["key_id"] for s in listed["sandboxes"]}
        assert owners[mine] == server.tenant_key_id and owners[local] == "local"
        usage = {s["id"]: s["usage"] for s in listed["sandboxes"]}
        assert usage[mine]["memory_used_bytes"] > 0 and usage[mine]["memory_limit_bytes"] > 0
        listed = body(server.call("GET", "/v1/operator/sandboxes?key=local", server.operator_key)[2])
        assert {s["key_id"] for s in listed["sandboxes"]} == {"local"}
        # Seeing is not driving: another key's sandbox is still 404 to the operator.
        assert server.call("GET", f"/v1/sandboxes/{mine}", server.operator_key)[0] == 404
        assert server.call("DELETE", f"/v1/sandboxes/{mine}", server.operator_key)[0] == 404
        assert server.call("POST", f"/v1/sandboxes/{mine}/restart", server.operator_key)[0] == 404
    finally:
        server.call("DELETE", f"/v1/sandboxes/{mine}", server.tenant_key)
        server.call("DELETE", f"/v1/sandboxes/{local}")


def test_restart_keeps_files_and_drops_state(server):
    sandbox = body(server.call("POST", "/v1/sandboxes", body=b"{}")[2])["id"]
    run = lambda code: body(server.call(  # noqa: E731
        "POST", f"/v1/sandboxes/{sandbox}/execute", body=json.dumps({"code": code}).encode(),
        headers={"Accept": "application/json"})[2])
    try:
        run("x = 1\nopen('kept.txt', 'w').write('yes')")
        status, _, raw = server.call("POST", f"/v1/sandboxes/{sandbox}/restart")
        assert status == 200 and body(raw)["state"] == "running" and body(raw)["executions"] == 0
        assert run("print('x' in dir(), open('kept.txt').read())")["stdout"] == "False yes\n"
        assert server.call("POST", f"/v1/sandboxes/{sandbox}/pause")[0] == 200
        status, _, raw = server.call("POST", f"/v1/sandboxes/{sandbox}/restart")
        assert status == 409 and body(raw)["error"]["code"] == "sandbox_paused"
    finally:
        server.call("DELETE", f"/v1/sandboxes/{sandbox}")
