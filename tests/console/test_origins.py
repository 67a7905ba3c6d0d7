"""A sandbox's page never acts in the origin of the API and the console (issue 31,
docs/console.md#origins), in a real browser.

A sandbox serves a page through the path-based port route, which shares the server's origin.
The page sends its own policy letting inline script run and a service worker's scope over the
whole origin, and its script tries to read the API and to register a service worker over
`/`. Corral's headers replace the sandbox's: the script runs in an opaque origin of its own,
so the read is refused and no worker is registered. Then an operator logs into the console in
the same browser profile, and the sandbox's server, which logs the headers of every request it
gets, never sees the key.
"""

import json
import time

from console_support import open_console, wait

PAGE_SERVER = r'''
import http.server, json

PAGE = b"""<!doctype html><title>waiting</title><script>
const seen = {};
const done = () => { if ("fetch" in seen && "worker" in seen) document.title = "DONE " + JSON.stringify(seen); };
fetch("/v1/sandboxes").then(r => r.text().then(t => { seen.fetch = r.status + " " + t.slice(0, 80); done(); }))
  .catch(e => { seen.fetch = "error " + e; done(); });
try {
  navigator.serviceWorker.register("sw.js", {scope: "/"})
    .then(() => { seen.worker = "registered"; done(); })
    .catch(e => { seen.worker = "refused " + e; done(); });
} catch (e) { seen.worker = "refused " + e; done(); }
</script>"""
WORKER = b"self.addEventListener('fetch', e => fetch('/log-key?' + e.request.headers.get('authorization')));"

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open("/workspace/requests.log", "a") as log:
            log.write(json.dumps({"path": self.path, "headers": dict(self.headers.items())}) + "\n")
        worker = self.path.endswith("sw.js")
        body = WORKER if worker else PAGE
        self.send_response(200)
        self.send_header("Content-Type", "text/javascript" if worker else "text/html")
        self.send_header("Content-Security-Policy", "script-src 'unsafe-inline' 'self' *")
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Set-Cookie", "planted=1; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
'''

START = f"""
import socket, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {PAGE_SERVER!r}], start_new_session=True)
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        print("READY")
        break
    except OSError:
        time.sleep(0.1)
"""


def test_a_sandboxs_page_cannot_read_the_api_register_a_worker_or_see_a_key(browser, server):
    # The sandbox is the keyless local tenant's, as on a developer's machine: the easy case.
    status, _, body = server.call("POST", "/v1/sandboxes", body=b'{"image": "host"}')
    assert status == 201, body
    sandbox = json.loads(body)["id"]
    try:
        status, _, body = server.call(
            "POST", f"/v1/sandboxes/{sandbox}/execute", body=json.dumps({"code": START}).encode()
        )
        assert status == 200 and b"READY" in body, body

        browser.get(f"{server.url}/v1/sandboxes/{sandbox}/ports/8000/")
        wait(browser, lambda d: d.title.startswith("DONE"), message="the page's script did not finish")
        seen = json.loads(browser.title[len("DONE "):])
        assert not seen["fetch"].startswith("200"), f"the page read the API: {seen}"
        assert seen["worker"].startswith("refused"), f"the page registered a worker: {seen}"
        assert not browser.get_cookies(), "the sandbox's cookie was set on the API's origin"

        # The console's origin has no worker, and an operator who logs in there later sends
        # nothing to the sandbox.
        open_console(browser, server, key=server.operator_key)
        registrations = browser.execute_async_script(
            "const done = arguments[0];"
            "navigator.serviceWorker.getRegistrations().then(r => done(r.length), e => done(-1));"
        )
        assert registrations == 0, f"{registrations} service workers over the console's origin"
        for path in ("/v1/whoami", "/v1/sandboxes"):
            browser.execute_async_script(
                "const done = arguments[0];"
                f"fetch('{path}', {{headers: {{Authorization: 'Bearer {server.operator_key}'}}}})"
                ".then(() => done(), () => done());"
            )
        time.sleep(0.5)
        status, _, log = server.call("GET", f"/v1/sandboxes/{sandbox}/files/requests.log")
        assert status == 200, log
        assert server.operator_key.encode() not in log, "the operator's key reached the sandbox"
        assert b"log-key" not in log and b"authorization" not in log.lower(), log
    finally:
        server.call("DELETE", f"/v1/sandboxes/{sandbox}")
