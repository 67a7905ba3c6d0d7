# Raw and packet sockets sniff or forge traffic.
ETH_P_ALL = 3
attempt('af-packet-raw', lambda: socket.socket(17, socket.SOCK_RAW, socket.htons(ETH_P_ALL)))
attempt('af-packet-dgram', lambda: socket.socket(17, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL)))
attempt('sock-raw-icmp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt('sock-raw-raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt('sock-raw-icmpv6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))
print('DONE')
