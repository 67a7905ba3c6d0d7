# Device nodes that would give hardware or kernel memory access, and an
# inventory of /dev.
import stat
for name in ['kvm', 'mem', 'kmem', 'port', 'kmsg', 'vda', 'sda', 'nvme0n1',
             'fuse', 'net/tun', 'loop0', 'loop-control', 'vsock', 'vhost-net',
             'dri/card0', 'input/event0', 'cpu/0/msr', 'hwrng', 'watchdog']:
    probe('dev-' + name.replace('/', '-'), lambda n=name: os.open('/dev/' + n, os.O_RDONLY))
for n in sorted(os.listdir('/dev')):
    st = os.lstat('/dev/' + n)
    if stat.S_ISCHR(st.st_mode):
        kind = 'chr'
    elif stat.S_ISBLK(st.st_mode):
        kind = 'blk'
    elif stat.S_ISDIR(st.st_mode):
        kind = 'dir'
    elif stat.S_ISLNK(st.st_mode):
        kind = 'lnk'
    else:
        kind = 'other'
    print('DEV %s %s %d:%d' % (n, kind, os.major(st.st_rdev), os.minor(st.st_rdev)))
print('DONE')
