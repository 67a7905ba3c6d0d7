# perf_event_open: a software counter on ourselves, and a CPU-wide one.
attr = ctypes.create_string_buffer(struct.pack('=IIQ', 1, 128, 0) + b'\0' * 112)
try_sys('perf-self', 'perf_event_open', attr, 0, -1, -1, 0)
try_sys('perf-cpu-wide', 'perf_event_open', attr, -1, 0, -1, 0)
attr_hw = ctypes.create_string_buffer(struct.pack('=IIQ', 0, 128, 0) + b'\0' * 112)
try_sys('perf-hw', 'perf_event_open', attr_hw, 0, -1, -1, 0)
print('DONE')
