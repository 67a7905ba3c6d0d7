# Report the options of the sandbox's own mounts.
for line in read_file('/proc/self/mountinfo').decode().splitlines():
    f = line.split(' ')
    sep = f.index('-')
    point, opts, fstype, super_opts = f[4], f[5], f[sep + 1], f[sep + 3]
    print('MOUNT %s %s %s %s' % (point, fstype, opts, super_opts))
print('DONE')
