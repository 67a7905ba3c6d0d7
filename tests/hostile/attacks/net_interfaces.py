# Only a loopback interface may exist.
for line in read_file('/proc/net/dev').decode().splitlines()[2:]:
    print('IFACE', line.split(':')[0].strip())
try:
    for idx, name in socket.if_nameindex():
        print('IFINDEX', name)
except OSError as ex:
    print('IFINDEX-FAIL', ename(ex.errno))
# init (pid 1) runs nothing of ours, but its /proc/1/net shows the namespace it is in.
try:
    for line in read_file('/proc/1/net/dev').decode().splitlines()[2:]:
        print('INIT-IFACE', line.split(':')[0].strip())
except OSError as ex:
    print('INIT-IFACE-FAIL', ename(ex.errno))
routes = read_file('/proc/net/route').decode().splitlines()[1:]
print('ROUTES', len(routes))
print('DONE')
