# Load and unload kernel modules.
image = ctypes.create_string_buffer(b'\x7fELF' + b'\0' * 60)
try_sys('init-module', 'init_module', image, 64, b'')
fd = os.open('/dev/null', os.O_RDONLY)
try_sys('finit-module', 'finit_module', fd, b'', 0)
try_sys('delete-module', 'delete_module', b'hx_no_such_module', 0o4000)  # O_NONBLOCK
print('DONE')
