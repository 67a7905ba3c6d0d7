# One file far larger than --disk: sequentially, sparse, and by truncate.
chunk = b'H' * (1 << 20)
fd = os.open('/workspace/huge', os.O_WRONLY | os.O_CREAT, 0o644)
total, err = 0, None
while total < (64 << 20):
    try:
        total += os.write(fd, chunk)
    except OSError as ex:
        err = ex.errno
        break
print('SEQUENTIAL', total)
if err is None:
    allowed('huge-sequential')
else:
    blocked('huge-sequential', err)
os.close(fd)
os.unlink('/workspace/huge')
def sparse():
    fd = os.open('/workspace/sparse', os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.lseek(fd, 1 << 30, os.SEEK_SET)
        os.write(fd, b'x')
    finally:
        os.close(fd)
attempt('huge-sparse-write', sparse)
def trunc():
    fd = os.open('/workspace/trunc', os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 1 << 40)
    finally:
        os.close(fd)
attempt('huge-ftruncate', trunc)
print('DONE')
