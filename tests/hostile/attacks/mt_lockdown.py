# The lockdown a workload runs under, as seen from inside it (issue 18 item 5: one lockdown for
# one-shot sandboxes and forked sessions). Prints `LOCKDOWN <json>`: the lockdown lines of
# /proc/self/status, how each entry of /proc that is not a process is masked, the mounts below
# /proc, and the errno of every syscall the workload filter and Landlock refuse. The test
# compares these between workloads made every way the server makes them; none may be allowed.
import json
import signal
import stat as _stat

state = {'status': {}, 'proc': {}, 'proc_mounts': [], 'syscalls': {}}
for line in read_file('/proc/self/status').decode().splitlines():
    k, _, v = line.partition(':')
    if k in ('NoNewPrivs', 'Seccomp', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'):
        state['status'][k] = ' '.join(v.split())

proc_dev = os.stat('/proc').st_dev
for name in sorted(os.listdir('/proc')):
    if name.isdigit() or name in ('self', 'thread-self'):
        continue
    path = '/proc/' + name
    try:
        st = os.lstat(path)
    except OSError as e:
        state['proc'][name] = 'lstat ' + ename(e.errno)
        continue
    kind = 'dir' if _stat.S_ISDIR(st.st_mode) else 'link' if _stat.S_ISLNK(st.st_mode) else 'file'
    covered = 'covered' if st.st_dev != proc_dev else 'proc'
    try:
        if kind == 'dir':
            os.listdir(path)
        elif kind == 'file':
            with open(path, 'rb') as f:
                f.read(1)
        readable = 'readable'
    except OSError as e:
        readable = ename(e.errno)
    state['proc'][name] = ' '.join((kind, covered, readable, oct(st.st_mode & 0o7777)))

# A procfs mounted over another at /proc (a forked workload's own over its zygote's) hides the
# one below: that one is counted, not compared. The visible one must be this workload's own.
mounts = [line.partition(' - ') for line in read_file('/proc/self/mountinfo').decode().splitlines()]
over_proc = {left.split()[1] for left, _, _ in mounts if left.split()[4] == '/proc'}
covered = {left.split()[0] for left, _, _ in mounts
           if left.split()[4] == '/proc' and left.split()[0] in over_proc}
state['proc_covered'] = len(covered)
state['proc_is_own'] = os.readlink('/proc/self') == str(os.getpid())
for left, _, right in mounts:
    fields, super_fields = left.split(), right.split()
    point = fields[4]
    if fields[0] in covered:
        continue
    if point == '/proc' or point.startswith('/proc/'):
        # The owner of a mask's tmpfs is the sandbox's own host uid, which differs by design.
        options = ','.join(o.split('=')[0] + '=*' if o.startswith(('uid=', 'gid=')) else o
                           for o in super_fields[2].split(','))
        state['proc_mounts'].append([point, fields[3], fields[5], super_fields[0], options])
state['proc_mounts'].sort()

# What the filters and Landlock answer. Each call is made so that, were it allowed, it would
# fail with an errno of its own arguments (EFAULT, EBADF, EINVAL) or succeed, never with EPERM.
calls = [
    ('unshare_user', 'unshare', 0x10000000),
    ('unshare_mount', 'unshare', 0x00020000),
    ('unshare_net', 'unshare', 0x40000000),
    ('mount', 'mount', 'none', '/tmp', 'tmpfs', 0, 0),
    ('umount', 'umount2', '/proc', 0),
    ('pivot_root', 'pivot_root', '/tmp', '/tmp'),
    ('chroot', 'chroot', '/tmp'),
    ('ptrace_attach_init', 'ptrace', 16, 1, 0, 0),
    ('bpf', 'bpf', 0, 0, 0),
    ('perf_event_open', 'perf_event_open', 0, 0, -1, -1, 0),
    ('userfaultfd', 'userfaultfd', 0),
    ('io_uring_setup', 'io_uring_setup', 1, 0),
    ('keyctl', 'keyctl', 0, 0, 0, 0, 0),
    ('add_key', 'add_key', 'user', 'x', 0, 0, 0),
    ('setns', 'setns', -1, 0),
    ('open_by_handle_at', 'open_by_handle_at', -1, 0, 0),
    ('kexec_load', 'kexec_load', 0, 0, 0, 0),
    ('init_module', 'init_module', 0, 0, ''),
    ('syslog', 'syslog', 3, 0, 0),
    ('setuid_root', 'setuid', 0),
    ('setgroups', 'setgroups', 0, 0),
    ('sethostname', 'sethostname', 'x', 1),
    ('settimeofday', 'settimeofday', 0, 0),
    ('swapon', 'swapon', '/tmp', 0),
    ('reboot', 'reboot', 0, 0, 0, 0),
    ('fsopen', 'fsopen', 'tmpfs', 0),
    ('open_tree', 'open_tree', -100, '/', 0),
]
for what, name, *args in calls:
    r, e = sys_call(name, *args)
    state['syscalls'][what] = 'ret %d' % r if r >= 0 else ename(e)
# Signals out of the workload's Landlock domain (scoped where the kernel has it): init.
try:
    os.kill(1, 0)
    state['syscalls']['signal_init'] = 'ret 0'
except OSError as e:
    state['syscalls']['signal_init'] = ename(e.errno)

print('LOCKDOWN ' + json.dumps(state, sort_keys=True))
print('DONE')
