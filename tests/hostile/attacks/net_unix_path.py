# Connect to a unix socket the test created in the host's /tmp (0777).
path = env('SOCK_PATH')
def connect(p):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(p)
    s.sendall(b'hello')
attempt('unix-path', lambda: connect(path))
attempt('unix-path-proc1-root', lambda: connect('/proc/1/root' + path))
attempt('unix-docker', lambda: connect('/var/run/docker.sock'))
attempt('unix-systemd', lambda: connect('/run/systemd/private'))
attempt('unix-dbus', lambda: connect('/run/dbus/system_bus_socket'))
print('DONE')
