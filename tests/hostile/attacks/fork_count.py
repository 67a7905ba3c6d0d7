# Fork until the pids limit says no; each child execs a sleeper carrying
# the marker so the host can count and later look for survivors.
tag = 'proc-' + env('MARK')
n = 0
err = None
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as ex:
        err = ex.errno
        break
    if pid == 0:
        try:
            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', tag])
        finally:
            os._exit(1)
    n += 1
print('FORKED', n)
if err is None:
    allowed('fork-limit', 'forked %d' % n)
else:
    blocked('fork-limit', err)
print('DONE')
