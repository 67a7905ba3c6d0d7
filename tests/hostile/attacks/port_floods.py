# Hostile servers a sandbox's program runs for the port proxy (tests/hostile/multitenant/
# port_floods.rs), started in the background; prints READY once every one listens. Each
# answers any request, whatever it is:
#   8010: a status line, then one header line that never ends
#   8011: a head without a length, then a body of zeros that never ends
#   8012: "101 Switching Protocols" to a request that asked for no upgrade, then zeros forever
#   8013: bytes that are not HTTP, forever
#   8014: a status line and 200,000 header lines
#   8000: a plain HTTP server that answers "ok" (the control)
import socket, subprocess, sys, time

SERVERS = r'''
import socket, threading

ZEROS = b"\0" * 65536

def read_head(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return False
        data += chunk
    return True

def forever(conn, prefix, chunk):
    conn.sendall(prefix)
    while True:
        conn.sendall(chunk)

def endless_header(conn):
    forever(conn, b"HTTP/1.1 200 OK\r\nX-Endless: ", b"a" * 65536)

def endless_body(conn):
    forever(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n", ZEROS)

def unasked_upgrade(conn):
    forever(conn, b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: evil\r\n\r\n", ZEROS)

def garbage(conn):
    forever(conn, b"\x16\x03\x01\x02\x00", bytes(range(256)) * 256)

def many_headers(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for i in range(0, 200000, 1000):
        conn.sendall(b"".join(b"X-%d: v\r\n" % (i + j) for j in range(1000)))
    conn.sendall(b"Content-Length: 2\r\n\r\nok")

def control(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    conn.close()

def handle(conn, answer):
    try:
        if read_head(conn):
            answer(conn)
    except OSError:
        pass
    finally:
        conn.close()

def serve(port, answer):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(64)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=handle, args=(conn, answer), daemon=True).start()

servers = {8010: endless_header, 8011: endless_body, 8012: unasked_upgrade, 8013: garbage,
           8014: many_headers}
for port, answer in servers.items():
    threading.Thread(target=serve, args=(port, answer), daemon=True).start()
serve(8000, control)
'''

with open("/tmp/port_floods.py", "w") as f:
    f.write(SERVERS)
subprocess.Popen([sys.executable, "/tmp/port_floods.py"], stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=open("/tmp/port_floods.log", "w"),
                 start_new_session=True)
deadline = time.time() + 20
for port in (8000, 8010, 8011, 8012, 8013, 8014):
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                print("NOT READY", port, open("/tmp/port_floods.log").read())
                sys.exit(1)
            time.sleep(0.05)
print("READY")
