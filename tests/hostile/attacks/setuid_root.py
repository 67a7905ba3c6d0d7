# Become root by changing ids.
attempt('setuid-0', lambda: os.setuid(0))
attempt('setgid-0', lambda: os.setgid(0))
attempt('setresuid-0', lambda: os.setresuid(0, 0, 0))
attempt('setreuid-0', lambda: os.setreuid(0, 0))
attempt('setgroups-0', lambda: os.setgroups([0]))
try_sys('raw-setuid-0', 'setuid', 0)
try_sys('raw-setresgid-0', 'setresgid', 0, 0, 0)
# setfsuid returns the previous fsuid; read the current one back with -1.
sys_call('setfsuid', 0)
cur, _ = sys_call('setfsuid', -1)
if cur == 0:
    allowed('setfsuid-0')
else:
    blocked('setfsuid-0', errno.EPERM)
print('IDS', os.getresuid(), os.getresgid(), os.getgroups())
print('DONE')
