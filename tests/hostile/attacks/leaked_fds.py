# Inherited file descriptors are a classic escape: a directory fd of the
# host lets openat(fd, "..") walk out. Inspect our fds and pid 1's.
path = env('HOST_SECRET_PATH')
for proc in ['self', '1']:
    try:
        fds = os.listdir('/proc/%s/fd' % proc)
    except OSError as ex:
        print('FDLIST %s %s' % (proc, ename(ex.errno)))
        continue
    for fd in sorted(fds, key=int):
        try:
            target = os.readlink('/proc/%s/fd/%s' % (proc, fd))
        except OSError as ex:
            target = '<%s>' % ename(ex.errno)
        print('FD %s %s %s' % (proc, fd, target))
        if proc != 'self':
            continue
        n = int(fd)
        try:
            st = os.fstat(n)
        except OSError:
            continue
        import stat as _s
        if _s.S_ISDIR(st.st_mode):
            rel = '../' * 16 + path.lstrip('/')
            try:
                fd2 = os.open(rel, os.O_RDONLY, dir_fd=n)
                print('LEAK fd-escape %d %r' % (n, os.read(fd2, 200)))
            except OSError:
                pass
print('DONE')
