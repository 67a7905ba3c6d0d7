# Hard links to files we cannot write: /etc/passwd, python, our exe.
os.chdir('/workspace')
attempt('hardlink-etc-passwd', lambda: os.link('/etc/passwd', 'pw'))
attempt('hardlink-etc-shadow', lambda: os.link('/etc/shadow', 'sh'))
attempt('hardlink-python', lambda: os.link(os.path.realpath(sys.executable), 'py'))
attempt('hardlink-tmp-from-usr', lambda: os.link('/usr/bin/env', '/tmp/env'))
attempt('linkat-proc-exe', lambda: os.link('/proc/self/exe', 'exe', follow_symlinks=True))
print('DONE')
