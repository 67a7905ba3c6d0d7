# What a session can learn about its neighbours' random state: a session forked from the same
# pre-imported interpreter as another starts from a copy of its memory. Prints this session's
# str hash seed (through hash()), its `random` and numpy streams, fresh kernel entropy and the
# address of a libc function (the ASLR layout is inherited through fork).
import ctypes
import json
import random
import sys

state = {
    'hash_x': hash('x'),
    'hash_bytes': hash(b'corral'),
    'hash_randomization': sys.flags.hash_randomization,
    'random': random.random(),
    'random_bits': random.getrandbits(64),
    'urandom': os.urandom(16).hex(),
    'libc_printf': ctypes.cast(LIBC.printf, ctypes.c_void_p).value,
}
try:
    import numpy
    state['numpy'] = float(numpy.random.random())
    state['numpy_bits'] = int(numpy.random.randint(0, 2**62))
except ImportError:
    state['numpy'] = None
print('STATE ' + json.dumps(state))
print('DONE')
