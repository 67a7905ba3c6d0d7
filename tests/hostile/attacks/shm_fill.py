# /dev/shm is tmpfs too: fill it (an unlimited one eats host RAM).
chunk = b'S' * (1 << 20)
total, err = 0, None
try:
    fd = os.open('/dev/shm/fill', os.O_WRONLY | os.O_CREAT, 0o644)
except OSError as ex:
    blocked('shm-fill', ex.errno)
else:
    while total < (256 << 20):
        try:
            total += os.write(fd, chunk)
        except OSError as ex:
            err = ex.errno
            break
        if total % (8 << 20) == 0:
            print('WROTE', total >> 20)
    print('WROTE', total >> 20)
    if err is None:
        allowed('shm-fill', '%d MiB' % (total >> 20))
    else:
        blocked('shm-fill', err)
print('DONE')
