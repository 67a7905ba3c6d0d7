# "Shocker": open_by_handle_at with a forged handle for the filesystem's
# root inode bypasses the mount tree (needs CAP_DAC_READ_SEARCH).
rootfd = os.open('/', os.O_RDONLY)
for ino in (2, 128):  # ext4 root inode, xfs/btrfs guesses
    handle = ctypes.create_string_buffer(struct.pack('=Ii', 8, 1) + struct.pack('=II', ino, 0))
    try_sys('open-by-handle-%d' % ino, 'open_by_handle_at', rootfd, handle, os.O_RDONLY)
# A real handle for a sandbox file, reopened by handle: also privileged.
h = ctypes.create_string_buffer(struct.pack('=Ii', 128, 0) + b'\0' * 128)
mount_id = ctypes.c_int(0)
r, e = sys_call('name_to_handle_at', -100, '/workspace', h, ctypes.byref(mount_id), 0)
print('NAME-TO-HANDLE', r, ename(e) if r < 0 else 'ok')
if r == 0:
    try_sys('open-by-real-handle', 'open_by_handle_at', rootfd, h, os.O_RDONLY)
else:
    blocked('open-by-real-handle', e)
print('DONE')
