# Join other namespaces through /proc/*/ns (our own, pid 1's).
for proc in ('self', '1'):
    for ns in ('user', 'mnt', 'net', 'pid', 'uts', 'ipc', 'cgroup'):
        what = 'setns-%s-%s' % (proc, ns)
        try:
            fd = os.open('/proc/%s/ns/%s' % (proc, ns), os.O_RDONLY)
        except OSError as ex:
            blocked(what, ex.errno)
            continue
        try_sys(what, 'setns', fd, 0)
        os.close(fd)
print('DONE')
