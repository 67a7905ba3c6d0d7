# Names this session's kernel process (prctl PR_SET_NAME, on every thread: the test finds it
# on the host by that name) and prints who it is inside. The test then reads the process's
# host uid from /proc/<pid>/status.
import ctypes

PR_SET_NAME = 15
name = MT['name'].encode()
r = LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
print('NAMED %s' % ('OK' if r == 0 else ename(ctypes.get_errno())))
print('COMM %s' % read_file('/proc/thread-self/comm').decode().strip())
print('IDS uid=%d euid=%d gid=%d pid=%d' % (os.getuid(), os.geteuid(), os.getgid(), os.getpid()))
print('DONE')
