# Workspace files whose names the host's --out directory already holds
# (an executable, a hard link to a file elsewhere, a FIFO, symlinks out): a
# copy-out through O_TRUNC would overwrite or follow them, or block.
mark = env('MARK')
os.chdir('/workspace')
for name in env('NAMES').split(','):
    d = os.path.dirname(name)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(name, 'w') as f:
        f.write('#!/bin/sh\necho SANDBOX-%s\n' % mark)
    os.chmod(name, 0o755)
    print('WROTE', name)
for name in ('aaa-%s.txt' % mark, 'zzz-%s.txt' % mark):
    with open(name, 'w') as f:
        f.write('OK-' + mark)
print('DONE')
