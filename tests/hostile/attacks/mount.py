# Mount, remount, bind, unmount and the new mount API.
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MNT_DETACH = 1, 32, 4096, 16384, 2
before = read_file('/proc/self/mountinfo')
for d in ('/tmp/m', '/tmp/p', '/tmp/b'):
    os.mkdir(d)
try_sys('mount-tmpfs', 'mount', 'none', '/tmp/m', 'tmpfs', 0, 0)
try_sys('mount-proc', 'mount', 'proc', '/tmp/p', 'proc', 0, 0)
try_sys('mount-bind-root', 'mount', '/', '/tmp/b', 0, MS_BIND | MS_REC, 0)
try_sys('remount-root-rw', 'mount', 0, '/', 0, MS_REMOUNT | MS_BIND, 0)
try_sys('remount-usr-rw', 'mount', 0, '/usr', 0, MS_REMOUNT | MS_BIND, 0)
try_sys('umount-proc', 'umount2', '/proc', 0)
try_sys('umount-tmp-detach', 'umount2', '/tmp', MNT_DETACH)
try_sys('umount-root-detach', 'umount2', '/', MNT_DETACH)
try_sys('fsopen', 'fsopen', 'tmpfs', 0)
try_sys('open-tree-clone', 'open_tree', -100, '/', 1)  # OPEN_TREE_CLONE
try_sys('move-mount', 'move_mount', -100, '/tmp', -100, '/tmp/m', 0)
# The setuid mount(8) binary gains nothing either.
print('MOUNT-BINARY', run(['/usr/bin/mount', '-t', 'tmpfs', 'x', '/tmp/m']))
print('MOUNTINFO-UNCHANGED', read_file('/proc/self/mountinfo') == before)
print('DONE')
