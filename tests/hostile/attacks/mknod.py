# Device nodes would reopen /dev/mem or a disk.
S_IFCHR, S_IFBLK, S_IFIFO = 0o020000, 0o060000, 0o010000
try_sys('mknodat-mem', 'mknodat', -100, b'/tmp/mem', S_IFCHR | 0o666, os.makedev(1, 1))
try_sys('mknodat-disk', 'mknodat', -100, b'/workspace/vda', S_IFBLK | 0o666, os.makedev(253, 0))
attempt('os-mknod-kmsg', lambda: os.mknod('/tmp/kmsg', S_IFCHR | 0o666, os.makedev(1, 11)))
if 'mknod' in NR:
    try_sys('mknod-port', 'mknod', b'/tmp/port', S_IFCHR | 0o666, os.makedev(1, 4))
for p in ('/tmp/mem', '/workspace/vda', '/tmp/kmsg', '/tmp/port'):
    print('EXISTS', p, os.path.lexists(p))
print('DONE')
