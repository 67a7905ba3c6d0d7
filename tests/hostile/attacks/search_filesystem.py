# Walk every directory the sandbox can see (except kernel/system trees)
# looking for the planted file's name, and list what each root dir holds.
name = os.path.basename(env('HOST_SECRET_PATH'))
dname = os.path.basename(os.path.dirname(env('HOST_SECRET_PATH')))
base = os.path.basename(os.path.dirname(os.path.dirname(env('HOST_SECRET_PATH'))))
skip = {'/proc', '/sys', '/usr', '/lib', '/lib64', '/lib32', '/libx32', '/bin', '/sbin'}
seen = 0
for root, dirs, files in os.walk('/', followlinks=False):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
    for n in dirs + files:
        seen += 1
        if n in (name, dname, base):
            p = os.path.join(root, n)
            try:
                data = read_file(p) if os.path.isfile(p) else os.listdir(p)
            except OSError as ex:
                data = ename(ex.errno)
            print('LEAK found %s %r' % (p, data))
print('WALKED', seen)
print('ROOTDIR', ' '.join(sorted(os.listdir('/'))))
print('DONE')
