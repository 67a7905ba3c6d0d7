# The host's /tmp and /dev/shm must not be the sandbox's: look for files
# the test planted there, then create files the test will look for.
mark = env('MARK')
probe('host-tmp-file', lambda: read_file('/tmp/planted-' + mark))
probe('host-shm-file', lambda: read_file('/dev/shm/planted-' + mark))
for d in ['/tmp', '/dev/shm']:
    try:
        names = os.listdir(d)
    except OSError as ex:
        names = ['<%s>' % ename(ex.errno)]
    print('LIST %s %s' % (d, ' '.join(sorted(names))))
for d in ['/tmp', '/dev/shm', '/workspace']:
    try:
        with open('%s/created-%s' % (d, mark), 'w') as f:
            f.write('from the sandbox')
        print('CREATED', d)
    except OSError as ex:
        print('NOTCREATED %s %s' % (d, ename(ex.errno)))
print('DONE')
