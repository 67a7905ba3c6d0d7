# ptrace: become traced, attach to pid 1 and to our own child (which the
# kernel alone would allow for the same uid).
import signal
PTRACE_TRACEME, PTRACE_ATTACH, PTRACE_SEIZE = 0, 16, 0x4206
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
try_sys('ptrace-traceme', 'ptrace', PTRACE_TRACEME, 0, 0, 0)
try_sys('ptrace-attach-pid1', 'ptrace', PTRACE_ATTACH, 1, 0, 0)
try_sys('ptrace-seize-pid1', 'ptrace', PTRACE_SEIZE, 1, 0, 0)
try_sys('ptrace-attach-child', 'ptrace', PTRACE_ATTACH, child, 0, 0)
try_sys('ptrace-attach-hostpid', 'ptrace', PTRACE_ATTACH, int(env('HOST_PID')), 0, 0)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
print('DONE')
