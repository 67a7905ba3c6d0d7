# Rename the machine.
name = ('pwn' + env('MARK'))[:60].encode()
try_sys('sethostname', 'sethostname', name, len(name))
try_sys('setdomainname', 'setdomainname', name, len(name))
print('HOSTNAME', socket.gethostname())
print('DONE')
