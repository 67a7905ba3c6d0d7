# Shift the clock 5 s forward (detectable by the test, harmless if it
# succeeded) through every clock-setting interface.
class timeval(ctypes.Structure):
    _fields_ = [('sec', ctypes.c_long), ('usec', ctypes.c_long)]
class timespec(ctypes.Structure):
    _fields_ = [('sec', ctypes.c_long), ('nsec', ctypes.c_long)]
target = int(time.time()) + 5
try_sys('settimeofday', 'settimeofday', ctypes.byref(timeval(target, 0)), 0)
try_sys('clock-settime', 'clock_settime', 0, ctypes.byref(timespec(target, 0)))
timex = ctypes.create_string_buffer(struct.pack('=I', 0x0100) + b'\0' * 252)  # ADJ_SETOFFSET
struct.pack_into('=qq', timex, 72, 5, 0)
try_sys('clock-adjtime', 'clock_adjtime', 0, timex)
timex2 = ctypes.create_string_buffer(struct.pack('=I', 0x0001) + b'\0' * 252)  # ADJ_OFFSET
try_sys('adjtimex', 'adjtimex', timex2)
print('DONE')
