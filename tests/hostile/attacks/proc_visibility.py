# What processes can we see? Only our own few, never the host's.
host_pid = int(env('HOST_PID'))
pids = sorted(int(d) for d in os.listdir('/proc') if d.isdigit())
print('PIDS', len(pids))
for pid in pids:
    try:
        cmd = read_file('/proc/%d/cmdline' % pid).replace(b'\0', b' ').decode(errors='replace')
    except OSError as ex:
        cmd = '<%s>' % ename(ex.errno)
    print('PROC %d %s' % (pid, cmd[:200]))
    # Cgroup paths are shown relative to our cgroup namespace: one that climbs out of it
    # ("/..") names the host's cgroup tree.
    try:
        groups = read_file('/proc/%d/cgroup' % pid).decode(errors='replace').split()
    except OSError as ex:
        groups = ['<%s>' % ename(ex.errno)]
    print('CGROUP %d %s' % (pid, ' '.join(groups)))
probe('hostpid-proc', lambda: os.stat('/proc/%d' % host_pid))
probe('hostpid-kill0', lambda: os.kill(host_pid, 0))
# Brute-force signal 0 over a pid range: count who answers.
alive = 0
for pid in range(1, 32768):
    try:
        os.kill(pid, 0)
        alive += 1
    except ProcessLookupError:
        pass
    except PermissionError:
        alive += 1
print('KILL0-ALIVE', alive)
print('DONE')
