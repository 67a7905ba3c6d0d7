# Kernel memory and addresses: /proc/kcore, /proc/kallsyms (KASLR), the
# kernel log.
probe('proc-kcore', lambda: read_file('/proc/kcore', 64))
probe('proc-kmsg', lambda: read_file('/proc/kmsg', 64))
try:
    lines = read_file('/proc/kallsyms', 64 << 20).decode().splitlines()
except OSError as ex:
    blocked('kallsyms', ex.errno)
else:
    nonzero = sum(1 for l in lines if int(l.split()[0], 16) != 0)
    if nonzero:
        print('LEAK kallsyms %d of %d addresses' % (nonzero, len(lines)))
    else:
        blocked('kallsyms', 'ZEROED')
buf = ctypes.create_string_buffer(4096)
r, e = sys_call('syslog', 3, buf, 4096)  # SYSLOG_ACTION_READ_ALL
if r < 0:
    blocked('syslog-read', e)
else:
    print('LEAK syslog-read %r' % buf.raw[:min(r, 200)])
print('DONE')
