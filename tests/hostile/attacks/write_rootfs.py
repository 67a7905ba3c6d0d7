# Write to the read-only root filesystem: /usr/bin, /etc and /.
mark = env('MARK')
def create(p):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
    os.write(fd, b'#!/bin/sh\necho pwned\n')
    os.close(fd)
attempt('create-usr-bin', lambda: create('/usr/bin/pwn-' + mark))
attempt('create-etc', lambda: create('/etc/pwn-' + mark))
attempt('create-root', lambda: create('/pwn-' + mark))
attempt('mkdir-root', lambda: os.mkdir('/pwndir-' + mark))
attempt('append-etc-passwd', lambda: open('/etc/passwd', 'a').write('evil::0:0::/:/bin/sh\n'))
attempt('chmod-python', lambda: os.chmod(os.path.realpath(sys.executable), 0o4777))
attempt('utime-python', lambda: os.utime(os.path.realpath(sys.executable), (0, 0)))
attempt('rename-in-usr-bin', lambda: os.rename('/usr/bin/pwn-none-' + mark, '/usr/bin/pwn2-' + mark))
attempt('symlink-in-lib', lambda: os.symlink('/workspace/x', '/usr/lib/pwn-' + mark))
# The runtime bound from the host's bytecode cache (the test filled it first).
import glob
runtime_bytecode = glob.glob('/run/corral/lib/__pycache__/*.pyc')
print('RUNTIME-BYTECODE', len(runtime_bytecode))
attempt('create-runtime', lambda: create('/run/corral/lib/pwn-' + mark))
attempt('overwrite-runtime-bytecode', lambda: open(runtime_bytecode[0], 'r+b').write(b'pwned'))
print('DONE')
