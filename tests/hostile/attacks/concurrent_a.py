# Sandbox A: hide a secret in every scratch place, hold an abstract
# socket, announce readiness to the host (a process with "ready-<MARK>"
# in argv), wait, then check nobody touched our files.
secret = env('A_SECRET')
tag = 'ready-' + env('MARK')
paths = ['/workspace/a-secret', '/tmp/a-secret', '/dev/shm/a-secret']
for p in paths:
    try:
        with open(p, 'w') as f:
            f.write(secret)
    except OSError as ex:
        print('NOWRITE %s %s' % (p, ename(ex.errno)))
srv = socket.socket(socket.AF_UNIX)
srv.bind('\0a-' + env('MARK'))
srv.listen(5)
srv.settimeout(0.1)
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(8)', tag])
deadline = time.time() + 8
conns = 0
while time.time() < deadline:
    try:
        c, _ = srv.accept()
        conns += 1
        c.close()
    except OSError:
        pass
os.waitpid(pid, 0)
intact = all(open(p).read() == secret for p in paths if os.path.exists(p))
print('A-CONNECTIONS', conns)
print('A-INTACT', intact and os.path.exists(paths[0]))
print('DONE')
