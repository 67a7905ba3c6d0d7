# clone(2) with namespace flags creates a process in new namespaces;
# clone3 must be unavailable (ENOSYS) so libc falls back to clone.
import threading
SIGCHLD = 17
flags = dict(newuser=0x10000000, newnet=0x40000000, newpid=0x20000000,
             newns=0x00020000)
for name, f in flags.items():
    try_sys('clone-' + name, 'clone', f | SIGCHLD, 0, 0, 0, 0, forks=True)
try_sys('clone-newuser-newnet', 'clone', flags['newuser'] | flags['newnet'] | SIGCHLD,
        0, 0, 0, 0, forks=True)
# struct clone_args (v0, 64 bytes): flags, pidfd, child_tid, parent_tid,
# exit_signal, stack, stack_size, tls.
for name, f in (('plain', 0), ('newuser', flags['newuser'])):
    args = ctypes.create_string_buffer(struct.pack('=8Q', f, 0, 0, 0, SIGCHLD, 0, 0, 0))
    r, e = sys_call('clone3', args, 64)
    if r == 0:
        os._exit(0)
    if r < 0:
        blocked('clone3-' + name, e)
    else:
        allowed('clone3-' + name)
        os.waitpid(r, 0)
# Ordinary process and thread creation still work.
pid = os.fork()
if pid == 0:
    os._exit(7)
print('FORK', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
t = threading.Thread(target=lambda: print('THREAD ok'))
t.start()
t.join()
print('DONE')
