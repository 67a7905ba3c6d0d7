# Names this process (prctl PR_SET_NAME: the test finds it on the host by that name), leaves a
# file in the workspace, prints who it is inside and waits to be looked at from the host
# (which then kills it).
import ctypes

PR_SET_NAME = 15
name = os.environ['NAME'].encode()
r = LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
print('NAMED %s' % ('OK' if r == 0 else ename(ctypes.get_errno())))
with open('/workspace/owned', 'w') as f:
    f.write('the sandbox made this')
for line in read_file('/proc/self/status').decode().splitlines():
    key, _, value = line.partition(':')
    if key in ('Uid', 'Gid', 'Groups'):
        print('STATUS %s %s' % (key, ' '.join(value.split())))
print('READY')
time.sleep(60)
print('DONE')
