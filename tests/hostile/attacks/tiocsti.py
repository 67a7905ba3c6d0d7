# TIOCSTI pushes characters into a terminal's input queue: typed-in
# commands for whoever reads that tty next.
import fcntl
import termios
def sti(fd):
    fcntl.ioctl(fd, termios.TIOCSTI, b'x')
attempt('tiocsti-fd0', lambda: sti(0))
attempt('tiocsti-fd1', lambda: sti(1))
try:
    fd = os.open('/dev/tty', os.O_RDWR)
except OSError as ex:
    blocked('tiocsti-devtty', ex.errno)
else:
    attempt('tiocsti-devtty', lambda: sti(fd))
# A pty of our own: the kernel alone would allow it (legacy_tiocsti=1).
try:
    master, slave = os.openpty()
except OSError as ex:
    blocked('tiocsti-pty', ex.errno)
else:
    attempt('tiocsti-pty', lambda: sti(slave))
print('DONE')
