# Reach the host root through the /proc magic links of pid 1 and of self.
path = env('HOST_SECRET_PATH')
for what, p in [
    ('proc1-root', '/proc/1/root' + path),
    ('self-root-dotdot', '/proc/self/root/..' + path),
    ('self-root-deep-dotdot', '/proc/self/root/../../../..' + path),
    ('proc1-cwd-dotdot', '/proc/1/cwd/../../../../../..' + path),
    ('thread-self-root', '/proc/thread-self/root' + path),
]:
    probe(what, lambda p=p: read_file(p))
# The root we see must be the sandbox's own (it has /workspace).
print('ROOT-HAS-WORKSPACE', os.path.isdir('/proc/1/root/workspace'))
print('DONE')
