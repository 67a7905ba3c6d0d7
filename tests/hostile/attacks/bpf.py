# bpf(2): map creation and a trivial socket filter program.
attr = ctypes.create_string_buffer(struct.pack('=IIII', 2, 4, 4, 1) + b'\0' * 112)
try_sys('bpf-map-create', 'bpf', 0, attr, 128)  # BPF_MAP_CREATE, ARRAY
insns = ctypes.create_string_buffer(struct.pack('=BBhi', 0xb7, 0, 0, 0) + struct.pack('=BBhi', 0x95, 0, 0, 0))
lic = ctypes.create_string_buffer(b'GPL')
prog = ctypes.create_string_buffer(
    struct.pack('=IIQQ', 1, 2, ctypes.addressof(insns), ctypes.addressof(lic)) + b'\0' * 104)
try_sys('bpf-prog-load', 'bpf', 5, prog, 128)  # BPF_PROG_LOAD, SOCKET_FILTER
print('DONE')
