# Leave processes behind: a double-forked setsid daemon that ignores
# SIGTERM/SIGHUP, a nohup'd background job, and a process in its own
# session. All carry "proc-<MARK>" in argv for the host to find.
tag = 'proc-' + env('MARK')
sleeper = ('import signal, time\n'
           'signal.signal(signal.SIGTERM, signal.SIG_IGN)\n'
           'signal.signal(signal.SIGHUP, signal.SIG_IGN)\n'
           'time.sleep(120)\n')
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    os.chdir('/')
    fd = os.open('/dev/null', os.O_RDWR)
    for i in (0, 1, 2):
        os.close(i)
        os.dup(fd)  # lowest free descriptor: i
    os.execv(sys.executable, [sys.executable, '-c', sleeper, tag, 'daemon'])
os.waitpid(pid, 0)
run(['/bin/bash', '-c', 'nohup bash -c "exec -a %s-nohup sleep 120" & disown' % tag])
spawn([sys.executable, '-c', sleeper, tag, 'session'], new_session=True)
# Files in the workspace, so teardown has something to remove.
for i in range(20):
    with open('/workspace/junk-%d' % i, 'w') as f:
        f.write('x' * 4096)
time.sleep(0.3)
seen = 0
for d in os.listdir('/proc'):
    if d.isdigit():
        try:
            if tag.encode() in read_file('/proc/%s/cmdline' % d):
                seen += 1
        except OSError:
            pass
print('DAEMONS', seen)
print('DONE')
