# Sandbox B: look for sandbox A's secret everywhere, and try to disturb it.
import signal
mark = env('MARK')
for p in ['/workspace/a-secret', '/tmp/a-secret', '/dev/shm/a-secret']:
    probe('b-read-' + p.split('/')[1], lambda p=p: read_file(p))
for d in ['/tmp', '/workspace', '/dev/shm']:
    print('LIST %s %s' % (d, ' '.join(sorted(os.listdir(d)))))
pids = [d for d in os.listdir('/proc') if d.isdigit()]
print('B-PIDS', len(pids))
for pid in pids:
    for sub in ('root/workspace/a-secret', 'root/tmp/a-secret', 'cwd/a-secret', 'environ'):
        try:
            data = read_file('/proc/%s/%s' % (pid, sub))
        except OSError:
            continue
        print('READ /proc/%s/%s %r' % (pid, sub, data[:300]))
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect('\0a-' + mark)
attempt('b-abstract-connect', connect)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
print('DONE')
