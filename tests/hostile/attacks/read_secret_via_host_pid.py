# Guess host pids: the test's own pid and a sweep of low pids.
path = env('HOST_SECRET_PATH')
host_pid = int(env('HOST_PID'))
probe('hostpid-root', lambda: read_file('/proc/%d/root%s' % (host_pid, path)))
probe('hostpid-environ', lambda: read_file('/proc/%d/environ' % host_pid))
probe('hostpid-cmdline', lambda: read_file('/proc/%d/cmdline' % host_pid))
probe('hostpid-signal', lambda: os.kill(host_pid, 0))
leaks = 0
tried = 0
for pid in list(range(1, 4097)) + list(range(host_pid - 64, host_pid + 64)):
    if pid <= 0:
        continue
    tried += 1
    try:
        data = read_file('/proc/%d/root%s' % (pid, path))
    except OSError:
        continue
    leaks += 1
    print('LEAK pid-sweep %d %r' % (pid, data[:100]))
print('SWEPT', tried)
if not leaks:
    blocked('pid-sweep', errno.ENOENT)
print('DONE')
