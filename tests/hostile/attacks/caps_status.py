# Our credentials as the kernel sees them.
for line in read_file('/proc/self/status').decode().splitlines():
    k, _, v = line.partition(':')
    if k in ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd',
             'CapAmb', 'NoNewPrivs', 'Seccomp'):
        print('STATUS %s %s' % (k, ' '.join(v.split())))
print('DONE')
