# Send datagrams to a UDP socket the test bound on the host's 127.0.0.1.
port = int(env('PORT'))
mark = env('MARK')
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
for _ in range(5):
    try:
        s.sendto(mark.encode(), ('127.0.0.1', port))
        print('SENT')
    except OSError as ex:
        print('SENDFAIL', ename(ex.errno))
# A connected socket reports ICMP port-unreachable from our own loopback.
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.settimeout(1)
c.connect(('127.0.0.1', port))
c.send(mark.encode())
def recv():
    return c.recv(100)
attempt('udp-reply', recv)
print('DONE')
