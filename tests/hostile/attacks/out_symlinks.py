# Plant symlinks in the workspace that point at host secrets, so a naive
# copy-out (--out) follows them on the host.
secret = env('HOST_SECRET_PATH')
sdir = env('HOST_SECRET_DIR')
mark = env('MARK')
os.chdir('/workspace')
links = {
    'abs-secret': secret,
    'rel-chain': '../' * 16 + secret.lstrip('/'),
    'proc-root': '/proc/self/root',
    'proc-root-secret': '/proc/self/root' + secret,
    'dir-link': sdir,
    'etc-link': '/etc',
    'parent-escape': '../../../../..',
    'out-parent': '..',
    'host-tmp-dir': os.path.dirname(sdir),
}
for name, target in links.items():
    os.symlink(target, name)
    print('PLANTED', name)
os.makedirs('nested/deeper')
os.symlink('../../../../../../' + secret.lstrip('/'), 'nested/deeper/up')
os.symlink(os.path.dirname(sdir) + '/created-by-sandbox-' + mark, 'dangling-create')
with open('ok-%s.txt' % mark, 'w') as f:
    f.write('OK-' + mark)
attempt('hardlink-etc-passwd', lambda: os.link('/etc/passwd', 'pw-hard'))
attempt('hardlink-python', lambda: os.link(os.path.realpath(sys.executable), 'py-hard'))
print('DONE')
