# Grant ourselves every capability, raise ambient caps, drop no_new_privs.
hdr = ctypes.create_string_buffer(struct.pack('=Ii', 0x20080522, 0))
data = ctypes.create_string_buffer(struct.pack('=6I', *([0xffffffff] * 6)))
try_sys('capset-all', 'capset', hdr, data)
data_one = ctypes.create_string_buffer(struct.pack('=6I', 1 << 21, 1 << 21, 1 << 21, 0, 0, 0))
try_sys('capset-sys-admin', 'capset', hdr, data_one)
LIBC.prctl.restype = ctypes.c_int
def prctl(what, *args):
    ctypes.set_errno(0)
    r = LIBC.prctl(ctypes.c_int(what), *[ctypes.c_ulong(a) for a in args])
    if r < 0:
        raise OSError(ctypes.get_errno(), 'prctl')
    return r
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN = 47, 2, 21
attempt('ambient-raise', lambda: prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN, 0, 0))
attempt('clear-no-new-privs', lambda: prctl(38, 0, 0, 0, 0))  # PR_SET_NO_NEW_PRIVS
print('NNP', prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS
print('DONE')
