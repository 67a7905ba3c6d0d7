# Amplification through --out: sparse files and hard links take no space in
# the workspace, but a naive copy-out writes every link's apparent size as
# real blocks on the host.
mark = env('MARK')
size = int(env('SPARSE_BYTES'))
links = int(env('LINKS'))
os.chdir('/workspace')
with open('ok-%s.txt' % mark, 'w') as f:
    f.write('OK-' + mark)
for name in ('sparse-a', 'sparse-b'):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    os.close(fd)
    print('SPARSE', name, os.stat(name).st_size, os.stat(name).st_blocks)
made = 0
for i in range(links):
    try:
        os.link('sparse-a', 'link-%03d' % i)
        made += 1
    except OSError as ex:
        print('LINK', i, ename(ex.errno))
        break
print('LINKED', made)
print('DONE')
