# A crash must leave no core file, and with a piped core_pattern must never reach the host's
# core helper: the core limit is 1 (the kernel's "never pipe" marker) and cannot be raised.
import resource
import subprocess

soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
print('CORELIMIT %d %d' % (soft, hard), flush=True)
try:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    allowed('raise-core-limit')
except ValueError:
    blocked('raise-core-limit', 'EINVAL')
except OSError as e:
    blocked('raise-core-limit', e.errno)
crash = subprocess.run([sys.executable, '-c', 'import os; os.abort()'])
print('CRASH %d' % crash.returncode, flush=True)
print('CORES %d' % sum(1 for name in os.listdir('.') if name.startswith('core')), flush=True)
print('DONE')
