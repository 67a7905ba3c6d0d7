# Special files for the copy-out: setuid/setgid executables, a FIFO (a
# naive copier blocks on it), a sparse giant, deep nesting, odd names.
mark = env('MARK')
os.chdir('/workspace')
for name, mode in (('suid', 0o4755), ('sgid', 0o2755), ('suid-sgid-sticky', 0o7777)):
    with open(name, 'w') as f:
        f.write('#!/bin/sh\nid\n')
    os.chmod(name, mode)
os.mkfifo('fifo')
try:
    fd = os.open('sparse', os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, 1 << 30)
    os.close(fd)
    print('SPARSE created')
except OSError as ex:
    print('SPARSE', ename(ex.errno))
p = 'deep'
for i in range(20):
    p += '/d'
os.makedirs(p)
with open(p + '/leaf', 'w') as f:
    f.write('leaf')
for odd in ('new\nline', ' space', '-dash', '..dots', 'tab\tname'):
    with open(odd, 'w') as f:
        f.write('odd')
os.mkdir('setgid-dir')
os.chmod('setgid-dir', 0o2777)
with open('ok-%s.txt' % mark, 'w') as f:
    f.write('OK-' + mark)
print('DONE')
