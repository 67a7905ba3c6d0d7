# userfaultfd widens kernel race windows (exploit primitive).
O_CLOEXEC, O_NONBLOCK, UFFD_USER_MODE_ONLY = 0o2000000, 0o4000, 1
try_sys('userfaultfd', 'userfaultfd', O_CLOEXEC | O_NONBLOCK)
try_sys('userfaultfd-user-mode', 'userfaultfd', O_CLOEXEC | UFFD_USER_MODE_ONLY)
attempt('dev-userfaultfd', lambda: os.open('/dev/userfaultfd', os.O_RDWR))
print('DONE')
