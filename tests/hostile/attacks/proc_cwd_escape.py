# Leave the sandbox root: chdir .. past /, chdir into /proc/*/cwd,
# chroot and pivot_root.
path = env('HOST_SECRET_PATH')
os.chdir('/')
for _ in range(20):
    os.chdir('..')
print('DOTDOT-ROOT', ' '.join(sorted(os.listdir('.'))))
os.chdir('/proc/self/cwd')
for _ in range(20):
    os.chdir('..')
print('CWD-ROOT', ' '.join(sorted(os.listdir('.'))))
probe('self-cwd-dotdot', lambda: read_file('/proc/self/cwd/../../../../../..' + path))
probe('pid1-cwd-dotdot', lambda: read_file('/proc/1/cwd/../../../../../..' + path))
os.mkdir('/tmp/newroot')
os.mkdir('/tmp/newroot/old')
try_sys('chroot', 'chroot', '/tmp/newroot')
try_sys('pivot-root', 'pivot_root', '/tmp/newroot', '/tmp/newroot/old')
print('DONE')
