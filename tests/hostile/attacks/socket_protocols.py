# AF_INET/AF_INET6 sockets with another protocol than TCP or UDP reach other protocol
# modules of the kernel (MPTCP, UDP-Lite, SCTP, ping sockets), each its own attack surface:
# the seccomp filter allows protocol 0, IPPROTO_TCP and IPPROTO_UDP only.
IPPROTO_MPTCP = 262
IPPROTO_UDPLITE = 136
IPPROTO_SCTP = 132
for fam, name in ((socket.AF_INET, 'inet'), (socket.AF_INET6, 'inet6')):
    attempt('mptcp-%s' % name, lambda: socket.socket(fam, socket.SOCK_STREAM, IPPROTO_MPTCP))
    attempt('udplite-%s' % name, lambda: socket.socket(fam, socket.SOCK_DGRAM, IPPROTO_UDPLITE))
    attempt('sctp-%s' % name, lambda: socket.socket(fam, socket.SOCK_STREAM, IPPROTO_SCTP))
    attempt('sctp-seqpacket-%s' % name, lambda: socket.socket(fam, socket.SOCK_SEQPACKET, IPPROTO_SCTP))
attempt('ping-inet', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
attempt('ping-inet6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6))
# Bits above the int the kernel reads cannot smuggle a protocol past the filter.
SYS_SOCKET = {'x86_64': 41, 'aarch64': 198}[os.uname().machine]
ctypes.set_errno(0)
r = LIBC.syscall(ctypes.c_long(SYS_SOCKET), ctypes.c_long(socket.AF_INET),
                 ctypes.c_long(socket.SOCK_STREAM), ctypes.c_long((1 << 32) | IPPROTO_MPTCP))
if r < 0:
    blocked('mptcp-high-bits', ctypes.get_errno())
else:
    allowed('mptcp-high-bits', 'fd=%d' % r)


# TCP and UDP over the sandbox's own loopback still work, with every allowed protocol value.
def tcp_roundtrip(fam, host, proto):
    srv = socket.socket(fam, socket.SOCK_STREAM, proto)
    srv.bind((host, 0))
    srv.listen(1)
    cli = socket.socket(fam, socket.SOCK_STREAM, proto)
    cli.settimeout(5)
    cli.connect(srv.getsockname()[:2])
    conn, _ = srv.accept()
    cli.sendall(b'ping')
    got = conn.recv(4)
    for s in (conn, cli, srv):
        s.close()
    return got


def udp_roundtrip(fam, host, proto):
    a = socket.socket(fam, socket.SOCK_DGRAM, proto)
    a.bind((host, 0))
    b = socket.socket(fam, socket.SOCK_DGRAM, proto)
    b.settimeout(5)
    b.bind((host, 0))
    a.sendto(b'ping', b.getsockname()[:2])
    got = b.recv(4)
    a.close()
    b.close()
    return got


for kind, fn, protos in (('tcp', tcp_roundtrip, (0, socket.IPPROTO_TCP)),
                         ('udp', udp_roundtrip, (0, socket.IPPROTO_UDP))):
    for fam, host, name in ((socket.AF_INET, '127.0.0.1', 'inet'), (socket.AF_INET6, '::1', 'inet6')):
        for proto in protos:
            what = '%s-%s-%d' % (kind, name, proto)
            try:
                got = fn(fam, host, proto)
                print('WORKS %s %s' % (what, 'ok' if got == b'ping' else repr(got)), flush=True)
            except OSError as ex:
                print('WORKS %s %s' % (what, ename(ex.errno)), flush=True)
print('DONE')
