# io_uring bypasses seccomp for the operations it performs.
params = ctypes.create_string_buffer(120)
try_sys('io-uring-setup', 'io_uring_setup', 8, params)
try_sys('io-uring-enter', 'io_uring_enter', 0, 1, 0, 0, 0, 0)
try_sys('io-uring-register', 'io_uring_register', 0, 0, 0, 0)
print('DONE')
