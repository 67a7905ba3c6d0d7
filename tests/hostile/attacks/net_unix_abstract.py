# Abstract unix sockets are scoped by network namespace: the host's must
# be unreachable.
name = env('ABSTRACT_NAME')
def connect(n, kind):
    s = socket.socket(socket.AF_UNIX, kind)
    s.settimeout(3)
    s.connect('\0' + n)
    s.send(b'hello')
attempt('abstract-stream', lambda: connect(name, socket.SOCK_STREAM))
attempt('abstract-seqpacket', lambda: connect(name, socket.SOCK_SEQPACKET))
# Well-known host abstract sockets (X11, containerd shims).
attempt('abstract-x11', lambda: connect('/tmp/.X11-unix/X0', socket.SOCK_STREAM))
# Our own abstract socket works (the failures are isolation).
srv = socket.socket(socket.AF_UNIX)
srv.bind('\0own-' + name)
srv.listen(1)
c = socket.socket(socket.AF_UNIX)
c.connect('\0own-' + name)
print('OWN-ABSTRACT ok')
print('DONE')
