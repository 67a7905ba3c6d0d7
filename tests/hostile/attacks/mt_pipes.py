# Pipe buffer exhaustion across sessions. The kernel accounts pipe buffers per user
# (/proc/sys/fs/pipe-user-pages-soft): once a user's pipes hold that many pages, its new pipes
# get the minimum size and cannot grow. MT['step']:
#
#   hog     (A) create pipes and grow each to pipe-max-size until the kernel refuses (the
#               soft limit is reached), then default-size ones until new pipes come out
#               minimal (it is passed); keep them all open in the session
#   probe   (B) a new pipe: its size, whether it grows to 1 MiB, how much it really holds
import fcntl

F_SETPIPE_SZ = getattr(fcntl, 'F_SETPIPE_SZ', 1031)
F_GETPIPE_SZ = getattr(fcntl, 'F_GETPIPE_SZ', 1032)
G = globals()
PIPES = G.setdefault('MT_PIPES', [])


def sysctl(name):
    try:
        return int(read_file('/proc/sys/fs/' + name).strip())
    except (OSError, ValueError):
        return -1


step = MT['step']
soft, max_size = sysctl('pipe-user-pages-soft'), sysctl('pipe-max-size')
print('LIMITS soft=%d max=%d' % (soft, max_size))

if step == 'hog':
    grow, stop = 'OK', 'none'
    for _ in range(3000):
        try:
            r, w = os.pipe()
        except OSError as ex:
            stop = 'pipe:' + ename(ex.errno)
            break
        PIPES.append((r, w))
        if fcntl.fcntl(w, F_GETPIPE_SZ) < 65536:
            stop = 'new-pipes-shrunk'  # over the soft limit: every new pipe is minimal
            break
        if grow == 'OK':
            try:
                fcntl.fcntl(w, F_SETPIPE_SZ, max_size)
            except OSError as ex:
                grow = ename(ex.errno)  # at the limit: go on with default-size pipes
    pages = sum(fcntl.fcntl(w, F_GETPIPE_SZ) for _, w in PIPES) // 4096
    print('HOG pipes=%d pages=%d grow=%s stop=%s' % (len(PIPES), pages, grow, stop))

elif step == 'probe':
    r, w = os.pipe()
    size = fcntl.fcntl(w, F_GETPIPE_SZ)
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        grow = 'OK'
    except OSError as ex:
        grow = ename(ex.errno)
    grown = fcntl.fcntl(w, F_GETPIPE_SZ)
    os.set_blocking(w, False)
    held = 0
    try:
        while held < (4 << 20):
            held += os.write(w, b'x' * 4096)
    except BlockingIOError:
        pass
    os.close(r)
    os.close(w)
    print('PROBE size=%d grow=%s grown=%d holds=%d' % (size, grow, grown, held))

print('DONE')
