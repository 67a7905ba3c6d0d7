# Connect to a TCP listener the test bound on the host's 127.0.0.1.
port = int(env('PORT'))
mark = env('MARK')
def connect(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect((host, port))
    s.sendall(mark.encode())
    s.close()
attempt('tcp-127.0.0.1', lambda: connect('127.0.0.1'))
attempt('tcp-127.0.0.2', lambda: connect('127.0.0.2'))
attempt('tcp-localhost', lambda: connect('localhost'))
# Our own loopback works (the failure above is isolation, not a broken stack).
srv = socket.socket()
srv.bind(('127.0.0.1', 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname(), timeout=3)
print('OWN-LOOPBACK ok')
print('DONE')
