# Dump every environment the sandbox can reach; the test looks for the
# secret value it set on the corral process.
print('ENV', sorted(os.environ.items()))
for p in ['/proc/self/environ', '/proc/1/environ'] + [
        '/proc/%s/environ' % d for d in os.listdir('/proc') if d.isdigit()]:
    try:
        data = read_file(p)
    except OSError as ex:
        print('ENVIRON-DENIED %s %s' % (p, ename(ex.errno)))
        continue
    print('ENVIRON %s %d %r' % (p, len(data), data))
print('DONE')
