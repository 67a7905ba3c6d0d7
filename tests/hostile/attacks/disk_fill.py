# Fill /tmp and the workspace until the filesystem says no.
mark = env('MARK')
chunk = b'F' * (1 << 20)
for area in ('/tmp', '/workspace'):
    path = '%s/fill-%s' % (area, mark)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    total = 0
    err = None
    while total < (64 << 20):
        try:
            total += os.write(fd, chunk)
        except OSError as ex:
            err = ex.errno
            break
    os.close(fd)
    print('WROTE %s %d' % (area, total))
    if err is None:
        allowed('fill-' + area.strip('/'), '%d bytes' % total)
    else:
        blocked('fill-' + area.strip('/'), err)
    os.unlink(path)
print('DONE')
