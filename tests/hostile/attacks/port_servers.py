# Servers a sandbox's program runs for the port-proxy tests (tests/hostile/multitenant/ports.rs),
# started in the background; prints READY once every one listens.
#   8000: HTTP, echoes the method, path, headers and the body's length and SHA-256 as JSON;
#         /hostile-page answers a page with headers that would take the origin it is served from
#   8001: takes an Upgrade (101), then echoes bytes (a WebSocket server as the proxy sees one)
#   8002: accepts and never answers (a server that hangs)
import hashlib, json, os, socket, subprocess, sys, time

SERVERS = r'''
import hashlib, json, socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        if self.path.startswith("/hostile-page"):
            # A page that would take the origin it is served from: its own policy letting
            # inline script run, a service worker's scope over the whole origin, a cookie,
            # and the origin's storage cleared.
            body = (b"<!doctype html><script>fetch('/v1/sandboxes').then(r => r.text())"
                    b".then(t => document.title = 'READ ' + t.length)</script>")
            self.send_response(200)
            for name, value in [
                ("content-type", "text/html"),
                ("content-security-policy", "script-src 'unsafe-inline' *"),
                ("service-worker-allowed", "/"),
                ("set-cookie", "stolen=1; Path=/"),
                ("clear-site-data", '"*"'),
                ("access-control-allow-origin", "*"),
                ("content-length", str(len(body))),
            ]:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            return
        n, h = 0, hashlib.sha256()
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunk = self.rfile.read(size)
                self.rfile.readline()
                n += len(chunk); h.update(chunk)
        length = int(self.headers.get("content-length") or 0)
        while n < length:
            chunk = self.rfile.read(min(65536, length - n))
            if not chunk:
                break
            n += len(chunk); h.update(chunk)
        body = json.dumps({"method": self.command, "path": self.path,
                           "headers": dict(self.headers.items()),
                           "body_len": n, "body_sha256": h.hexdigest()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = answer
    def log_message(self, *a):
        pass

def upgrade(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    rest = data.split(b"\r\n\r\n", 1)[1]
    if rest:
        conn.sendall(rest)
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        conn.sendall(chunk)

def serve(port, handle):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(64)
    held = []
    while True:
        conn, _ = s.accept()
        if handle is None:
            held.append(conn)
        else:
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

threading.Thread(target=serve, args=(8001, upgrade), daemon=True).start()
threading.Thread(target=serve, args=(8002, None), daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", 8000), Echo).serve_forever()
'''

with open("/tmp/port_servers.py", "w") as f:
    f.write(SERVERS)
subprocess.Popen([sys.executable, "/tmp/port_servers.py"], stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=open("/tmp/port_servers.log", "w"),
                 start_new_session=True)
deadline = time.time() + 20
for port in (8000, 8001, 8002):
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                print("NOT READY", port, open("/tmp/port_servers.log").read())
                sys.exit(1)
            time.sleep(0.05)
print("READY")
