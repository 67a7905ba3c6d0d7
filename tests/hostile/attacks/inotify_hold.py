# Take every inotify instance the kernel allows this sandbox's user, then hold them for HOLD
# seconds while the host checks that its own user can still make one.
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 4096:
    if libc.inotify_init1(0) < 0:
        blocked('inotify-instances', ctypes.get_errno())
        break
    n += 1
print('INOTIFY', n)
time.sleep(float(env('HOLD')))
print('DONE')
