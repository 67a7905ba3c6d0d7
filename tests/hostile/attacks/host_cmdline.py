# Host paths given to corral (--out DIR, its own location) must not be
# readable inside: command lines, exe links, mount table.
for d in sorted(os.listdir('/proc')):
    if not d.isdigit():
        continue
    for f in ('cmdline', 'environ'):
        try:
            print('PROCFILE %s/%s %r' % (d, f, read_file('/proc/%s/%s' % (d, f))))
        except OSError as ex:
            print('PROCFILE %s/%s %s' % (d, f, ename(ex.errno)))
    for f in ('exe', 'cwd', 'root'):
        try:
            print('PROCLINK %s/%s %s' % (d, f, os.readlink('/proc/%s/%s' % (d, f))))
        except OSError as ex:
            print('PROCLINK %s/%s %s' % (d, f, ename(ex.errno)))
print('MOUNTINFO %r' % read_file('/proc/self/mountinfo'))
print('DONE')
