# kill -9 -1: every process we may signal. Only our namespace must die.
import signal
host_sleep = int(env('HOST_SLEEP_PID'))
inner = os.fork()
if inner == 0:
    os.execv('/bin/sleep', ['sleep', '30'])
time.sleep(0.2)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
attempt('kill-host-sleep', lambda: os.kill(host_sleep, signal.SIGKILL))
try:
    os.kill(-1, signal.SIGKILL)
    print('KILLED-ALL ok')
except OSError as ex:
    print('KILLED-ALL', ename(ex.errno))
_, st = os.waitpid(inner, 0)
print('INNER-SIGNAL', os.WTERMSIG(st) if os.WIFSIGNALED(st) else 'exited')
print('DONE')
