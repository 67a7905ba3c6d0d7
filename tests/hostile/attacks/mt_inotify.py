# inotify exhaustion across sessions. The same program runs in two sessions, in steps chosen
# by MT['step']; what a step opens stays open in the session's interpreter for later steps.
#
#   hog-instances   (A) open inotify instances until the kernel refuses one; keep them all
#   hog-watches     (A) keep at most 64 instances, add watches on every file of the image
#                       until the kernel refuses one (per-user max_user_watches)
#   setup           (B) open one instance (with a watch) before A attacks
#   probe           (B) a new instance and a watch on it; a new watch on the kept instance
#
# Every outcome is printed as "<WHAT> OK" or "<WHAT> <errno>"; the test decides.
import ctypes

IN_CLOEXEC = 0o2000000
IN_MODIFY, IN_ATTRIB = 0x2, 0x4
LIBC.inotify_init1.argtypes = [ctypes.c_int]
LIBC.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
G = globals()
HELD = G.setdefault('MT_INOTIFY_HELD', [])


def init1():
    ctypes.set_errno(0)
    fd = LIBC.inotify_init1(IN_CLOEXEC)
    return fd, (ctypes.get_errno() if fd < 0 else 0)


def add_watch(fd, path):
    ctypes.set_errno(0)
    wd = LIBC.inotify_add_watch(fd, path.encode(), IN_MODIFY | IN_ATTRIB)
    return wd, (ctypes.get_errno() if wd < 0 else 0)


def say(what, err):
    print('%s %s' % (what, 'OK' if not err else ename(err)), flush=True)


def sysctl(name):
    try:
        return int(read_file('/proc/sys/fs/inotify/' + name).strip())
    except (OSError, ValueError):
        return -1


def files_of_the_image(limit):
    """Up to `limit` paths of the read-only image, each its own inode."""
    found, stack = [], ['/usr', '/etc']
    while stack and len(found) < limit:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            if e.is_symlink():
                continue
            found.append(e.path)
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return found[:limit]


step = MT['step']
print('LIMITS instances=%d watches=%d' % (sysctl('max_user_instances'), sysctl('max_user_watches')))

if step == 'hog-instances':
    err = 0
    for _ in range(100000):
        fd, err = init1()
        if fd < 0:
            break
        HELD.append(fd)
    import resource
    print('INSTANCES %d %s nofile=%d' % (len(HELD), ename(err), resource.getrlimit(resource.RLIMIT_NOFILE)[0]))

elif step == 'hog-watches':
    for fd in HELD[64:]:
        os.close(fd)
    del HELD[64:]
    wanted = sysctl('max_user_watches')
    paths = files_of_the_image(wanted // max(len(HELD), 1) + 2048)
    added, err, deadline = 0, 0, time.time() + 40
    for fd in HELD:
        for p in paths:
            wd, e = add_watch(fd, p)
            if wd >= 0:
                added += 1
            elif e in (errno.ENOSPC, errno.ENOMEM):
                err = e
                break
        if err or time.time() > deadline:
            break
    print('WATCHES %d %s instances=%d paths=%d' % (added, ename(err) if err else 'none', len(HELD), len(paths)))

elif step == 'setup':
    fd, err = init1()
    say('SETUP-INIT', err)
    if fd >= 0:
        G['MT_INOTIFY_KEPT'] = fd
        wd, err = add_watch(fd, '/tmp')
        say('SETUP-WATCH', err)

elif step == 'probe':
    fd, err = init1()
    say('PROBE-INIT', err)
    if fd >= 0:
        wd, err = add_watch(fd, '/workspace')
        say('PROBE-WATCH-NEW', err)
        os.close(fd)
    else:
        print('PROBE-WATCH-NEW no-instance')
    kept = G.get('MT_INOTIFY_KEPT')
    if kept is not None:
        n = G['MT_INOTIFY_N'] = G.get('MT_INOTIFY_N', 0) + 1
        path = '/tmp/probe-%d' % n
        open(path, 'w').close()
        wd, err = add_watch(kept, path)
        say('PROBE-WATCH-KEPT', err)

print('DONE')
