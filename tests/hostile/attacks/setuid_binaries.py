# Setuid-root programs: with no_new_privs and nosuid they gain nothing.
def try_run(argv):
    if not os.path.exists(argv[0]):
        print('EXIT %s absent' % argv[0])
        return
    null = os.open('/dev/null', os.O_RDONLY)
    print('EXIT %s %d' % (argv[0], run(argv, stdin_fd=null)))
    os.close(null)
os.mkdir('/tmp/x')
try_run(['/usr/bin/mount', '-t', 'tmpfs', 'x', '/tmp/x'])
try_run(['/usr/bin/su', '-c', 'id -u'])
try_run(['/usr/bin/passwd', '-d', 'root'])
try_run(['/usr/bin/newgrp', 'root'])
try_run(['/usr/bin/sudo', '-n', 'id', '-u'])
# Watch the effective uid of a setuid binary while it runs: su waits on a
# password from a pipe we never write to.
r, w = os.pipe()
pid = spawn(['/usr/bin/su', 'root'], stdin_fd=r)
euids = set()
for _ in range(50):
    try:
        for line in read_file('/proc/%d/status' % pid).decode().splitlines():
            if line.startswith('Uid:'):
                euids.add(line.split()[2])
    except OSError:
        pass
    if os.waitpid(pid, os.WNOHANG)[0]:
        pid = None
        break
    time.sleep(0.01)
if pid:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print('SU-EUIDS', ' '.join(sorted(euids)) or 'none')
print('XMOUNTED', os.path.ismount('/tmp/x'))
print('DONE')
