# New namespaces (user namespaces give a fresh set of capabilities).
NS = dict(newuser=0x10000000, newns=0x00020000, newnet=0x40000000,
          newpid=0x20000000, newuts=0x04000000, newipc=0x08000000,
          newcgroup=0x02000000, newtime=0x00000080)
before = {n: os.readlink('/proc/self/ns/' + n) for n in ('user', 'mnt', 'net', 'pid')}
for name, flag in NS.items():
    try_sys('unshare-' + name, 'unshare', flag)
try_sys('unshare-user-net', 'unshare', NS['newuser'] | NS['newnet'])
after = {n: os.readlink('/proc/self/ns/' + n) for n in ('user', 'mnt', 'net', 'pid')}
print('NS-UNCHANGED', before == after)
# util-linux unshare(1) -r fails as well.
print('UNSHARE-BINARY', run(['/usr/bin/unshare', '-r', '/usr/bin/id', '-u']))
print('DONE')
